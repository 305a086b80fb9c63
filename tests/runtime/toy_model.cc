// The toy StageModel, its reference, and the threaded pipeline harness (toy_model.h).
#include "tests/runtime/toy_model.h"

#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload::testing {
namespace {

constexpr std::uint32_t kStampMagic = 0x51A5C0DEu;
constexpr int kStampWords = 3;  // mb, chunk, magic

std::uint32_t ExtraWord(int l, int k) {
  return static_cast<std::uint32_t>(l) * 100003u + static_cast<std::uint32_t>(k) * 7u + 11u;
}

}  // namespace

float ToyInput(int mb, int i) { return std::sin(0.37f * static_cast<float>(i) + mb * 1.3f); }
float ToyParamA(int l, int i) { return 0.9f + 0.01f * static_cast<float>((l * 31 + i) % 17); }
float ToyParamB(int l, int i) { return 0.05f * static_cast<float>((l * 7 + i * 3) % 11) - 0.2f; }

ToyStageModel::ToyStageModel(const ToyConfig& config, int stage)
    : config_(config), stage_(stage) {
  const std::size_t n = static_cast<std::size_t>(config.width);
  for (int chunk = 0; chunk < config.chunks_per_stage; ++chunk) {
    const int l = VirtualStage(chunk);
    std::vector<float> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = ToyParamA(l, static_cast<int>(i));
      b[i] = ToyParamB(l, static_cast<int>(i));
    }
    a_.push_back(std::move(a));
    b_.push_back(std::move(b));
    grads_.push_back(ToyGrads{std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)});
  }
  losses_.assign(static_cast<std::size_t>(config.num_microbatches), 0.0f);
}

std::int64_t ToyStageModel::Words(int chunk, bool split) const {
  return kStampWords + config_.width + config_.extra_words * (chunk + 1) +
         (split ? config_.width : 0);
}

std::int64_t ToyStageModel::SavedBytes(int chunk, bool split_backward) const {
  return 4 * Words(chunk, split_backward);
}

std::int64_t ToyStageModel::BoundaryBytes() const { return 4 * config_.width; }

absl::Status ToyStageModel::CheckStamp(int mb, int chunk, const float* saved, int extra) const {
  std::uint32_t stamp[kStampWords];
  std::memcpy(stamp, saved, sizeof(stamp));
  if (stamp[0] != static_cast<std::uint32_t>(mb) ||
      stamp[1] != static_cast<std::uint32_t>(chunk) || stamp[2] != kStampMagic) {
    return absl::InternalError(absl::StrCat("toy model: the stash entry of (mb ", mb, ", chunk ",
                                            chunk, ") holds stamp (", stamp[0], ", ", stamp[1],
                                            ", ", stamp[2], ")"));
  }
  const float* extra_words = saved + kStampWords + config_.width;
  for (int k = 0; k < extra; ++k) {
    std::uint32_t word;
    std::memcpy(&word, extra_words + k, 4);
    if (word != ExtraWord(VirtualStage(chunk), k)) {
      return absl::InternalError(absl::StrCat("toy model: extra word ", k, " of (mb ", mb,
                                              ", chunk ", chunk, ") is ", word));
    }
  }
  return absl::OkStatus();
}

int ToyStageModel::KeptExtraWords(int chunk, Recompute mode) const {
  const int extra = config_.extra_words * (chunk + 1);
  switch (mode) {
    case Recompute::kNone: return extra;
    case Recompute::kLean: return extra / 2;
    case Recompute::kFull: return 0;
  }
  return extra;
}

std::int64_t ToyStageModel::RetainedBytes(int chunk, Recompute mode, bool) const {
  if (mode == Recompute::kNone) return -1;
  return 4 * (kStampWords + config_.width + KeptExtraWords(chunk, mode));
}

bool ToyStageModel::BackwardReadsRetained(int, Recompute mode, bool split_backward) const {
  return config_.backward_reads_lean && mode == Recompute::kLean && !split_backward;
}

absl::Status ToyStageModel::Forward(int mb, int chunk, const void* input, void* output,
                                    void* saved) {
  lean_entries_.erase({mb, chunk});
  return RunForward(mb, chunk, input, output, static_cast<float*>(saved),
                    KeptExtraWords(chunk, Recompute::kNone));
}

absl::Status ToyStageModel::ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                             void* retained, Recompute mode) {
  if (mode == Recompute::kNone) {
    return absl::InvalidArgumentError("toy model: ForwardRetaining with mode none");
  }
  if (mode == Recompute::kLean && config_.backward_reads_lean) {
    lean_entries_.insert({mb, chunk});
  } else {
    lean_entries_.erase({mb, chunk});
  }
  return RunForward(mb, chunk, input, output, static_cast<float*>(retained),
                    KeptExtraWords(chunk, mode));
}

absl::Status ToyStageModel::RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                                           Recompute mode) {
  if (mode == Recompute::kNone) {
    return absl::InvalidArgumentError("toy model: RecomputeSaved with mode none");
  }
  lean_entries_.erase({mb, chunk});  // a full entry from here on
  const auto* kept = static_cast<const float*>(retained);
  std::uint32_t stamp[kStampWords];
  std::memcpy(stamp, kept, sizeof(stamp));
  if (stamp[0] != static_cast<std::uint32_t>(mb) ||
      stamp[1] != static_cast<std::uint32_t>(chunk) || stamp[2] != kStampMagic) {
    return absl::InternalError(absl::StrCat("toy model: the retained block of (mb ", mb,
                                            ", chunk ", chunk, ") holds stamp (", stamp[0], ", ",
                                            stamp[1], ", ", stamp[2], ")"));
  }
  const int kept_extra = KeptExtraWords(chunk, mode);
  for (int k = 0; k < kept_extra; ++k) {
    std::uint32_t word;
    std::memcpy(&word, kept + kStampWords + config_.width + k, 4);
    if (word != ExtraWord(VirtualStage(chunk), k)) {
      return absl::InternalError(absl::StrCat("toy model: kept extra word ", k, " of (mb ", mb,
                                              ", chunk ", chunk, ") is ", word));
    }
  }
  // Stamp, x and the kept extra words come from the retained block; the rest is recomputed.
  const int kept_words = kStampWords + config_.width + kept_extra;
  auto* words = static_cast<float*>(saved);
  std::memcpy(words, kept, 4 * static_cast<std::size_t>(kept_words));
  float* extra = words + kStampWords + config_.width;
  for (int k = kept_extra; k < config_.extra_words * (chunk + 1); ++k) {
    const std::uint32_t word = ExtraWord(VirtualStage(chunk), k);
    std::memcpy(extra + k, &word, 4);
  }
  return absl::OkStatus();
}

absl::Status ToyStageModel::RunForward(int mb, int chunk, const void* input, void* output,
                                       float* words, int extra_words) {
  const int n = config_.width;
  const int l = VirtualStage(chunk);
  const int last = config_.num_stages * config_.chunks_per_stage - 1;
  if ((l == 0) != (input == nullptr) || (l == last) != (output == nullptr)) {
    return absl::InternalError(absl::StrCat("toy model: F of virtual stage ", l,
                                            " got input ", input != nullptr, ", output ",
                                            output != nullptr));
  }
  const std::uint32_t stamp[kStampWords] = {static_cast<std::uint32_t>(mb),
                                            static_cast<std::uint32_t>(chunk), kStampMagic};
  std::memcpy(words, stamp, sizeof(stamp));
  float* x = words + kStampWords;
  for (int i = 0; i < n; ++i) {
    x[i] = input != nullptr ? static_cast<const float*>(input)[i] : ToyInput(mb, i);
  }
  float* extra = x + n;
  for (int k = 0; k < extra_words; ++k) {
    const std::uint32_t word = ExtraWord(l, k);
    std::memcpy(extra + k, &word, 4);
  }
  const std::vector<float>& a = a_[static_cast<std::size_t>(chunk)];
  const std::vector<float>& b = b_[static_cast<std::size_t>(chunk)];
  float loss = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float y = a[static_cast<std::size_t>(i)] * x[i] + b[static_cast<std::size_t>(i)];
    if (output != nullptr) {
      static_cast<float*>(output)[i] = y;
    } else {
      loss += 0.5f * y * y;
    }
  }
  if (output == nullptr) losses_[static_cast<std::size_t>(mb)] = loss;
  return absl::OkStatus();
}

absl::Status ToyStageModel::Backward(int mb, int chunk, const void* grad_output,
                                     void* grad_input, void* saved, bool with_weight_grad) {
  const int n = config_.width;
  const int l = VirtualStage(chunk);
  auto* words = static_cast<float*>(saved);
  // A lean retained block (never split: BackwardReadsRetained) holds only the kept words.
  const bool lean = lean_entries_.erase({mb, chunk}) > 0;
  if (lean && !with_weight_grad) {
    return absl::InternalError(absl::StrCat("toy model: a split B of (mb ", mb, ", chunk ", chunk,
                                            ") got a lean retained block"));
  }
  const int extra = KeptExtraWords(chunk, lean ? Recompute::kLean : Recompute::kNone);
  if (absl::Status ok = CheckStamp(mb, chunk, words, extra); !ok.ok()) return ok;
  if ((l == 0) != (grad_input == nullptr)) {
    return absl::InternalError(absl::StrCat("toy model: B of virtual stage ", l, " got ",
                                            grad_input == nullptr ? "no" : "a", " grad_input"));
  }
  const float* x = words + kStampWords;
  const std::vector<float>& a = a_[static_cast<std::size_t>(chunk)];
  const std::vector<float>& b = b_[static_cast<std::size_t>(chunk)];
  ToyGrads& grads = grads_[static_cast<std::size_t>(chunk)];
  float* dy_saved = words + kStampWords + n + config_.extra_words * (chunk + 1);
  for (int i = 0; i < n; ++i) {
    const auto s = static_cast<std::size_t>(i);
    // d(0.5 y^2)/dy = y on the last virtual stage.
    const float dy = grad_output != nullptr ? static_cast<const float*>(grad_output)[i]
                                            : a[s] * x[i] + b[s];
    if (grad_input != nullptr) static_cast<float*>(grad_input)[i] = a[s] * dy;
    if (with_weight_grad) {
      grads.a[s] += dy * x[i];
      grads.b[s] += dy;
    } else {
      dy_saved[i] = dy;
    }
  }
  return absl::OkStatus();
}

absl::Status ToyStageModel::BackwardWeight(int mb, int chunk, void* saved) {
  const int n = config_.width;
  auto* words = static_cast<float*>(saved);
  if (absl::Status ok = CheckStamp(mb, chunk, words, KeptExtraWords(chunk, Recompute::kNone));
      !ok.ok()) {
    return ok;
  }
  const float* x = words + kStampWords;
  const float* dy = words + kStampWords + n + config_.extra_words * (chunk + 1);
  ToyGrads& grads = grads_[static_cast<std::size_t>(chunk)];
  for (int i = 0; i < n; ++i) {
    const auto s = static_cast<std::size_t>(i);
    grads.a[s] += dy[i] * x[i];
    grads.b[s] += dy[i];
  }
  return absl::OkStatus();
}

std::vector<ToyGrads> ToyReference(const ToyConfig& config) {
  const int n = config.width;
  const int num_virtual = config.num_stages * config.chunks_per_stage;
  const auto size = static_cast<std::size_t>(n);
  std::vector<ToyGrads> grads(static_cast<std::size_t>(num_virtual),
                              ToyGrads{std::vector<float>(size, 0.0f),
                                       std::vector<float>(size, 0.0f)});
  for (int mb = 0; mb < config.num_microbatches; ++mb) {
    std::vector<std::vector<float>> inputs;  // x of each virtual stage
    std::vector<float> x(size);
    for (int i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = ToyInput(mb, i);
    for (int l = 0; l < num_virtual; ++l) {
      inputs.push_back(x);
      for (int i = 0; i < n; ++i) {
        const auto s = static_cast<std::size_t>(i);
        x[s] = ToyParamA(l, i) * inputs.back()[s] + ToyParamB(l, i);
      }
    }
    std::vector<float> dy = x;  // y of the last virtual stage
    for (int l = num_virtual - 1; l >= 0; --l) {
      ToyGrads& g = grads[static_cast<std::size_t>(l)];
      for (int i = 0; i < n; ++i) {
        const auto s = static_cast<std::size_t>(i);
        g.a[s] += dy[s] * inputs[static_cast<std::size_t>(l)][s];
        g.b[s] += dy[s];
        dy[s] = ToyParamA(l, i) * dy[s];
      }
    }
  }
  return grads;
}

absl::StatusOr<Schedule> CompileToy(const ToyConfig& config, Family family,
                                    OffloadPolicy policy) {
  PipelineSpec spec;
  spec.family = family;
  spec.num_stages = config.num_stages;
  spec.num_microbatches = config.num_microbatches;
  spec.chunks_per_stage = config.chunks_per_stage;
  spec.offload = policy;
  CostModel cost = UnitCostModel(0.5);
  cost.activation_bytes = ToyStageModel(config, 0).SavedBytes(0, false);
  return Compile(spec, cost);
}

std::vector<StageOutcome> RunToyStages(const Schedule& schedule,
                                       const std::vector<Backend*>& backends,
                                       const std::vector<Transport*>& transports,
                                       const HarnessOptions& options) {
  const PipelineSpec& spec = schedule.spec;
  const int p = spec.num_stages;
  std::vector<StageOutcome> outcomes(static_cast<std::size_t>(p));
  const ToyConfig config{p,
                         spec.chunks_per_stage,
                         spec.num_microbatches,
                         options.width,
                         options.extra_words,
                         spec.placement,
                         options.backward_reads_lean};
  auto run_stage = [&](int d) {
    StageOutcome& outcome = outcomes[static_cast<std::size_t>(d)];
    Backend& backend = *backends[static_cast<std::size_t>(d)];
    DeviceArenaOptions arena_options;
    arena_options.budget_bytes = options.arena_budget_bytes;
    arena_options.poison_on_free = options.poison;
    absl::StatusOr<std::unique_ptr<DeviceArena>> arena =
        DeviceArena::Create(backend, arena_options);
    if (!arena.ok()) {
      outcome.status = arena.status();
      return;
    }
    ToyStageModel model(config, d);
    absl::StatusOr<std::unique_ptr<Executor>> executor =
        Executor::Create(spec, schedule.stages[static_cast<std::size_t>(d)], model, backend,
                         **arena, *transports[static_cast<std::size_t>(d)], options.executor);
    if (!executor.ok()) {
      outcome.status = executor.status();
    } else {
      outcome.host_pool_capacity = (*executor)->host_pool().capacity_bytes();
      for (int it = 0; it < options.iterations; ++it) {
        absl::StatusOr<IterationStats> stats = (*executor)->Run();
        if (!stats.ok()) {
          outcome.status = stats.status();
          break;
        }
        outcome.iterations.push_back(std::move(*stats));
      }
      executor->reset();
    }
    for (int c = 0; c < spec.chunks_per_stage; ++c) outcome.grads.push_back(model.grads(c));
    outcome.backend_stats = backend.Stats();
    for (MemoryCategory category :
         {MemoryCategory::kStash, MemoryCategory::kP2P, MemoryCategory::kOther}) {
      outcome.arena_in_use_after += (*arena)->Usage(category).in_use_bytes;
    }
  };
  std::vector<std::thread> threads;
  for (int d = 0; d < p; ++d) threads.emplace_back(run_stage, d);
  for (std::thread& thread : threads) thread.join();
  return outcomes;
}

std::vector<StageOutcome> RunToyPipeline(const Schedule& schedule,
                                         const HarnessOptions& options) {
  const int p = schedule.spec.num_stages;
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> transports =
      CreateLocalTransports(static_cast<int>(schedule.stages.size()));
  absl::Status status = transports.status();
  std::vector<std::unique_ptr<Backend>> backends;
  for (int d = 0; d < p && status.ok(); ++d) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(options.backend);
    status = backend.status();
    if (backend.ok()) backends.push_back(std::move(*backend));
  }
  if (!status.ok()) {
    std::vector<StageOutcome> outcomes(static_cast<std::size_t>(p));
    for (StageOutcome& outcome : outcomes) outcome.status = status;
    return outcomes;
  }
  std::vector<Backend*> backend_pointers;
  std::vector<Transport*> transport_pointers;
  for (int d = 0; d < p; ++d) {
    backend_pointers.push_back(backends[static_cast<std::size_t>(d)].get());
    transport_pointers.push_back((*transports)[static_cast<std::size_t>(d)].get());
  }
  return RunToyStages(schedule, backend_pointers, transport_pointers, options);
}

std::vector<ToyGrads> GradsByVirtualStage(const std::vector<StageOutcome>& outcomes,
                                          int num_stages, int chunks_per_stage,
                                          Placement placement) {
  const VirtualStageMap map{placement, num_stages, chunks_per_stage};
  std::vector<ToyGrads> grads(static_cast<std::size_t>(num_stages * chunks_per_stage));
  for (int d = 0; d < num_stages; ++d) {
    const StageOutcome& outcome = outcomes[static_cast<std::size_t>(d)];
    for (int c = 0; c < chunks_per_stage && c < static_cast<int>(outcome.grads.size()); ++c) {
      grads[static_cast<std::size_t>(map.virtual_stage(d, c))] =
          outcome.grads[static_cast<std::size_t>(c)];
    }
  }
  return grads;
}

}  // namespace pipeoffload::testing
