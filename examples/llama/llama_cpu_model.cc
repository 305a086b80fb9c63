// LlamaCpuModel: call validation, microbatch staging and the dispatch of each UnitCall to the
// unit's math in LlamaCpuUnits; the step's loss. All calls run synchronously on the caller.
#include "examples/llama/llama_cpu_model.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama {
namespace {


}  // namespace

std::vector<SlidingUnitShape> LlamaUnitShapes(const LlamaConfig& config) {
  std::vector<SlidingUnitShape> units(NumUnits(config));
  for (int u = 0; u < NumUnits(config); ++u) {
    SlidingUnitShape& unit = units[u];
    unit.name = u == EmbeddingUnit()    ? std::string("embed")
                : u == HeadUnit(config) ? std::string("head")
                                        : absl::StrCat("layer.", u - 1);
    unit.param_count = UnitParamCount(config, u);
    if (u == HeadUnit(config) && config.tie_word_embeddings) unit.borrowed_unit = EmbeddingUnit();
    for (const LlamaTensor& t : UnitTensors(config, u)) {
      if (!t.weight_decay) continue;
      if (!unit.decay.empty() && unit.decay.back().offset + unit.decay.back().count == t.offset) {
        unit.decay.back().count += t.numel();
      } else {
        unit.decay.push_back({t.offset, t.numel()});
      }
    }
  }
  return units;
}

absl::StatusOr<std::unique_ptr<LlamaCpuModel>> LlamaCpuModel::Create(
    const LlamaConfig& config, const TokenData& data, const LlamaCpuModelOptions& options) {
  PO_RETURN_IF_ERROR(ValidateLlamaConfig(config));
  auto bad = [](const char* field, std::int64_t value, const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama cpu model: ", field, " = ", value, ": ", why));
  };
  if (options.batch_size < 1) return bad("batch_size", options.batch_size, "must be >= 1");
  if (options.seq_len < 1) return bad("seq_len", options.seq_len, "must be >= 1");
  if (options.max_microbatches < 1) {
    return bad("max_microbatches", options.max_microbatches, "must be >= 1");
  }
  if (options.ce_chunk_rows < 0) {
    return bad("ce_chunk_rows", options.ce_chunk_rows, "must be >= 0 (0: all rows)");
  }
  // The kernels index rows (N * heads of the qk-norm) and a microbatch's tokens with int.
  const std::int64_t rows = std::int64_t{options.batch_size} * options.seq_len;
  if (rows * config.num_heads > std::numeric_limits<int>::max()) {
    return bad("batch_size * seq_len", rows, "too many rows for the CPU kernels");
  }
  PO_RETURN_IF_ERROR(data.CheckCompatible(config.vocab_size, options.seq_len));
  return std::unique_ptr<LlamaCpuModel>(new LlamaCpuModel(config, data, options));
}

LlamaCpuModel::LlamaCpuModel(const LlamaConfig& config, const TokenData& data,
                             const LlamaCpuModelOptions& options)
    : config_(config),
      data_(&data),
      options_(options),
      N_(options.batch_size * options.seq_len),
      units_(config, options.batch_size, options.seq_len,
             options.ce_chunk_rows > 0 ? options.ce_chunk_rows : N_) {
  const std::int64_t slots = std::int64_t{options.max_microbatches} * N_;
  tokens_.assign(static_cast<std::size_t>(slots), 0);
  targets_.assign(static_cast<std::size_t>(slots), 0);
  loss_sums_.assign(static_cast<std::size_t>(options.max_microbatches), 0.0);
  has_loss_.assign(static_cast<std::size_t>(options.max_microbatches), 0);
  shape_.units = LlamaUnitShapes(config);
  for (int u = 0; u < NumUnits(config); ++u) {
    const std::int64_t floats = u == EmbeddingUnit()    ? 0
                                : u == HeadUnit(config) ? units_.HeadWorkspaceFloats()
                                                        : units_.DecoderWorkspaceFloats();
    shape_.units[u].workspace_bytes = floats * 4;
  }
  shape_.param_dtype = SlideDtype::kFp32;
  shape_.activation_bytes = std::int64_t{N_} * config.hidden_size * 4;
  shape_.model_device_bytes =
      slots * 2 * std::int64_t{sizeof(std::int32_t)} +
      std::int64_t{options.max_microbatches} * static_cast<std::int64_t>(sizeof(double) + 1);
}

absl::Status LlamaCpuModel::BeginStep(std::int64_t step, int num_microbatches) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama cpu model: BeginStep: step = ", step, ": must be >= 0"));
  }
  if (num_microbatches < 1 || num_microbatches > options_.max_microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama cpu model: BeginStep: num_microbatches = ", num_microbatches,
                     ": must be in [1, max_microbatches = ", options_.max_microbatches, "]"));
  }
  num_microbatches_ = num_microbatches;
  for (int mb = 0; mb < num_microbatches; ++mb) {
    data_->Microbatch(options_.data_seed, step, mb, options_.batch_size, options_.seq_len,
                      tokens_.data() + std::int64_t{mb} * N_,
                      targets_.data() + std::int64_t{mb} * N_);
  }
  std::fill(has_loss_.begin(), has_loss_.end(), 0);
  return absl::OkStatus();
}

absl::Status LlamaCpuModel::CheckCall(const UnitCall& call, bool backward) const {
  return CheckUnitCall(shape_, call, backward, num_microbatches_, "llama cpu model");
}

absl::Status LlamaCpuModel::Forward(const UnitCall& call) {
  PO_RETURN_IF_ERROR(CheckCall(call, /*backward=*/false));
  const auto* params = static_cast<const float*>(call.params);
  auto* out = static_cast<float*>(call.output);
  if (call.unit == EmbeddingUnit()) {
    units_.EmbeddingForward(params, tokens(call.mb), out);
  } else {
    units_.DecoderForward(params, static_cast<const float*>(call.input), out,
                          static_cast<float*>(call.workspace));
  }
  return absl::OkStatus();
}

absl::Status LlamaCpuModel::Backward(const UnitCall& call) {
  PO_RETURN_IF_ERROR(CheckCall(call, /*backward=*/true));
  const auto* params = static_cast<const float*>(call.params);
  const auto* input = static_cast<const float*>(call.input);
  const auto* dout = static_cast<const float*>(call.grad_output);
  auto* dx = static_cast<float*>(call.grad_input);
  auto* ws = static_cast<float*>(call.workspace);
  if (call.unit == EmbeddingUnit()) {
    units_.EmbeddingBackward(tokens(call.mb), dout, call.grad_accum);
  } else if (call.unit == HeadUnit(config_)) {
    // The step's objective is the mean over its M * N tokens.
    const float grad_scale =
        static_cast<float>(1.0 / (static_cast<double>(num_microbatches_) * N_));
    loss_sums_[call.mb] = units_.HeadLossBackward(params, input, targets(call.mb), grad_scale, dx,
                                                  call.grad_accum, ws);
    has_loss_[call.mb] = 1;
  } else {
    units_.DecoderBackward(params, input, dout, dx, call.grad_accum, ws);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> LlamaCpuModel::StepLoss() {
  if (num_microbatches_ == 0) {
    return absl::FailedPreconditionError("llama cpu model: StepLoss before BeginStep");
  }
  double sum = 0.0;
  for (int mb = 0; mb < num_microbatches_; ++mb) {
    if (!has_loss_[mb]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "llama cpu model: StepLoss: the head's Backward of mb ", mb, " has not run"));
    }
    sum += loss_sums_[mb];
  }
  return sum / (static_cast<double>(num_microbatches_) * N_);
}

}  // namespace pipeoffload::llama
