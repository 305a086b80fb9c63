// PlainTrainer: the reference step of plain_trainer.h, one operation after another on the
// calling thread (CpuAdam's threads aside), every activation kept.
#include "examples/llama/plain_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama {
namespace {

std::vector<float> Floats(std::int64_t bytes) {
  return std::vector<float>(static_cast<std::size_t>((bytes + 3) / 4), 0.0f);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlainTrainer>> PlainTrainer::Create(
    SlidingModel& model, const PlainTrainerOptions& options) {
  if (options.num_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plain trainer: num_microbatches = ", options.num_microbatches, ": must be >= 1"));
  }
  const SlidingModelShape& shape = model.Shape();
  PO_RETURN_IF_ERROR(Annotate(ValidateSlidingModelShape(shape), "plain trainer"));
  if (shape.param_dtype != SlideDtype::kFp32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plain trainer: param_dtype = ", std::string(SlideDtypeName(shape.param_dtype)),
        ": only fp32 models"));
  }
  PO_ASSIGN_OR_RETURN(std::unique_ptr<CpuAdam> adam, CpuAdam::Create(options.cpu));
  return std::unique_ptr<PlainTrainer>(new PlainTrainer(model, options, std::move(adam)));
}

PlainTrainer::PlainTrainer(SlidingModel& model, const PlainTrainerOptions& options,
                           std::unique_ptr<CpuAdam> adam)
    : model_(model), options_(options), adam_(std::move(adam)) {
  const SlidingModelShape& shape = model.Shape();
  const int num_units = static_cast<int>(shape.units.size());
  const int M = options.num_microbatches;
  std::int64_t workspace_bytes = 0;
  for (const SlidingUnitShape& s : shape.units) {
    Unit unit;
    unit.own = s.param_count;
    unit.borrowed = s.borrowed_unit >= 0 ? shape.units[s.borrowed_unit].param_count : 0;
    const auto view = static_cast<std::size_t>(unit.own + unit.borrowed);
    unit.params.assign(view, 0.0f);
    unit.grads.assign(view, 0.0f);
    unit.exp_avg.assign(static_cast<std::size_t>(unit.own), 0.0f);
    unit.exp_avg_sq.assign(static_cast<std::size_t>(unit.own), 0.0f);
    units_.push_back(std::move(unit));
    workspace_bytes = std::max(workspace_bytes, s.workspace_bytes);
  }
  outputs_.resize(static_cast<std::size_t>(num_units - 1));
  for (auto& per_mb : outputs_) per_mb.assign(M, Floats(shape.activation_bytes));
  grad_out_.assign(M, Floats(shape.activation_bytes));
  grad_in_.assign(M, Floats(shape.activation_bytes));
  workspace_ = Floats(workspace_bytes);
}

absl::Status PlainTrainer::SetUnitParams(int unit, std::span<const float> values) {
  if (unit < 0 || unit >= num_units()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plain trainer: unit ", unit, " out of range [0, ", num_units(), ")"));
  }
  if (static_cast<std::int64_t>(values.size()) != units_[unit].own) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plain trainer: unit ", unit, ": ", values.size(), " values, expected ", units_[unit].own));
  }
  std::copy(values.begin(), values.end(), units_[unit].params.begin());
  return absl::OkStatus();
}

absl::StatusOr<double> PlainTrainer::ComputeGradients(std::int64_t data_step) {
  const SlidingModelShape& shape = model_.Shape();
  const int U = num_units();
  const int M = options_.num_microbatches;
  // 1. Zero the accumulators; refresh the borrowers' copies of their owners' parameters.
  for (int u = 0; u < U; ++u) {
    Unit& unit = units_[u];
    std::fill(unit.grads.begin(), unit.grads.end(), 0.0f);
    const int owner = shape.units[u].borrowed_unit;
    if (owner >= 0) {
      std::copy(units_[owner].params.begin(), units_[owner].params.begin() + unit.borrowed,
                unit.params.begin() + unit.own);
    }
  }
  // 2.
  PO_RETURN_IF_ERROR(Annotate(model_.BeginStep(data_step, M), "plain trainer: BeginStep"));
  auto call_for = [&](int u, int mb) {
    UnitCall call;
    call.unit = u;
    call.mb = mb;
    call.num_microbatches = M;
    call.params = units_[u].params.data();
    call.input = u > 0 ? outputs_[u - 1][mb].data() : nullptr;
    call.workspace = workspace_.empty() ? nullptr : workspace_.data();
    return call;
  };
  auto context = [&](const char* what, int u, int mb) {
    return absl::StrCat("plain trainer: ", what, " ", shape.units[u].name, " mb ", mb);
  };
  // 3. Forward.
  for (int u = 0; u + 1 < U; ++u) {
    for (int mb = 0; mb < M; ++mb) {
      UnitCall call = call_for(u, mb);
      call.output = outputs_[u][mb].data();
      PO_RETURN_IF_ERROR(Annotate(model_.Forward(call), context("Forward", u, mb)));
    }
  }
  // 4. Backward, descending; grad_out_ holds the gradients of unit u's outputs.
  for (int u = U - 1; u >= 0; --u) {
    Unit& unit = units_[u];
    bool first_borrower = true;
    for (int b = u + 1; b < U; ++b) {
      if (shape.units[b].borrowed_unit != u) continue;
      const float* part = units_[b].grads.data() + units_[b].own;
      if (first_borrower) {
        std::memcpy(unit.grads.data(), part, sizeof(float) * static_cast<std::size_t>(unit.own));
        first_borrower = false;
      } else {
        for (std::int64_t i = 0; i < unit.own; ++i) unit.grads[i] += part[i];
      }
    }
    for (int mb = 0; mb < M; ++mb) {
      UnitCall call = call_for(u, mb);
      call.grad_output = u + 1 < U ? grad_out_[mb].data() : nullptr;
      call.grad_input = u > 0 ? grad_in_[mb].data() : nullptr;
      call.grad_accum = unit.grads.data();
      PO_RETURN_IF_ERROR(Annotate(model_.Backward(call), context("Backward", u, mb)));
    }
    std::swap(grad_out_, grad_in_);
  }
  // 5.
  PO_ASSIGN_OR_RETURN(const double loss, model_.StepLoss());
  return loss;
}

absl::Status PlainTrainer::UpdateUnit(int u, const AdamStepScalars& decay,
                                      const AdamStepScalars& no_decay) {
  Unit& unit = units_[u];
  auto update = [&](std::int64_t begin, std::int64_t end, const AdamStepScalars& scalars) {
    if (begin >= end) return absl::OkStatus();
    AdamSpan span;
    span.param = unit.params.data() + begin;
    span.exp_avg = unit.exp_avg.data() + begin;
    span.exp_avg_sq = unit.exp_avg_sq.data() + begin;
    span.grad = unit.grads.data() + begin;
    span.count = end - begin;
    return adam_->Update(scalars, span);
  };
  std::int64_t at = 0;
  for (const ParamRange& range : model_.Shape().units[u].decay) {
    PO_RETURN_IF_ERROR(update(at, range.offset, no_decay));
    PO_RETURN_IF_ERROR(update(range.offset, range.offset + range.count, decay));
    at = range.offset + range.count;
  }
  return update(at, unit.own, no_decay);
}

absl::StatusOr<PlainStepResult> PlainTrainer::Step(float learning_rate) {
  const std::int64_t data_step = data_steps_++;
  PlainStepResult result;
  PO_ASSIGN_OR_RETURN(result.loss, ComputeGradients(data_step));
  // 6. The global norm, units ascending.
  double total = 0.0;
  for (const Unit& unit : units_) total += adam_->SumOfSquares(unit.grads.data(), unit.own);
  result.grad_norm = std::sqrt(total);
  result.clip_coefficient = ClipCoefficient(result.grad_norm, options_.max_grad_norm);
  result.step = adam_step_;
  // 7. skipped: only clipping waits for the norm before updating, so only it can skip.
  if (options_.max_grad_norm > 0.0 && !std::isfinite(result.grad_norm)) return result;
  AdamOptions adam = options_.adam;
  adam.learning_rate = learning_rate;
  PO_ASSIGN_OR_RETURN(const AdamStepScalars decay,
                      MakeAdamStepScalars(adam, adam_step_ + 1, result.clip_coefficient));
  adam.weight_decay = 0.0f;
  PO_ASSIGN_OR_RETURN(const AdamStepScalars no_decay,
                      MakeAdamStepScalars(adam, adam_step_ + 1, result.clip_coefficient));
  for (int u = 0; u < num_units(); ++u) {
    PO_RETURN_IF_ERROR(
        Annotate(UpdateUnit(u, decay, no_decay),
                 absl::StrCat("plain trainer: update of ", model_.Shape().units[u].name)));
  }
  result.step = ++adam_step_;
  result.applied = true;
  return result;
}

}  // namespace pipeoffload::llama
