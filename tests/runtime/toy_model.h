// A toy StageModel with real arithmetic for the runtime tests, its single-process reference,
// and a harness that runs a schedule's stages on threads with the CPU backend and the local
// transport.
//
// Virtual stage l holds parameters a_l, b_l (width n) and computes y = a_l * x + b_l
// elementwise; the last virtual stage's loss is 0.5 * sum(y^2), so its output gradient is y.
// Backward: dx = a * dy; weight gradients ga += dy * x, gb += dy, accumulated per microbatch.
// The stash entry holds a stamp (mb, chunk, magic), x, dy when the backward is split (B leaves
// it for W), and `extra_words(chunk)` words of a pattern B checks, so every byte of the entry
// must survive offload and reload.
// Recompute: kFull keeps the stamp and x (the chunk's input); kLean also keeps the first half
// of the extra words. RecomputeSaved rebuilds the rest, so a recomputed entry is bitwise the
// entry Forward writes. With backward_reads_lean, B of an unsplit lean entry reads the retained
// block itself (the model remembers which entries ForwardRetaining wrote lean).
#ifndef PIPEOFFLOAD_TESTS_RUNTIME_TOY_MODEL_H_
#define PIPEOFFLOAD_TESTS_RUNTIME_TOY_MODEL_H_

#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/stage_model.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::testing {

struct ToyConfig {
  int num_stages = 2;
  int chunks_per_stage = 1;
  int num_microbatches = 2;
  int width = 64;  // n, floats per boundary activation
  // Extra words saved per chunk: chunk c saves extra_words * (c + 1), so chunks differ in size.
  int extra_words = 0;
  Placement placement = Placement::kLoop;  // which virtual stage (layers) a chunk computes
  // BackwardReadsRetained for kLean without split backward: B reads a lean retained block as
  // it is (checking only the extra words lean keeps), so the runtime rebuilds nothing.
  bool backward_reads_lean = false;
};

// Parameter gradients of one virtual stage.
struct ToyGrads {
  std::vector<float> a;
  std::vector<float> b;
  friend bool operator==(const ToyGrads&, const ToyGrads&) = default;
};

class ToyStageModel final : public StageModel {
 public:
  ToyStageModel(const ToyConfig& config, int stage);

  std::int64_t SavedBytes(int chunk, bool split_backward) const override;
  std::int64_t BoundaryBytes() const override;
  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override;
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input,
                        void* saved, bool with_weight_grad) override;
  absl::Status BackwardWeight(int mb, int chunk, void* saved) override;
  std::int64_t RetainedBytes(int chunk, Recompute mode, bool split_backward) const override;
  absl::Status ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                void* retained, Recompute mode) override;
  absl::Status RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                              Recompute mode) override;
  bool BackwardReadsRetained(int chunk, Recompute mode, bool split_backward) const override;

  // Gradients of chunk c (virtual stage c * p + stage).
  const ToyGrads& grads(int chunk) const { return grads_[static_cast<std::size_t>(chunk)]; }
  // Loss of each microbatch (last virtual stage only, else zeros).
  const std::vector<float>& losses() const { return losses_; }

 private:
  int VirtualStage(int chunk) const {
    return VirtualStageMap{config_.placement, config_.num_stages, config_.chunks_per_stage}
        .virtual_stage(stage_, chunk);
  }
  std::int64_t Words(int chunk, bool split) const;
  // Extra words an entry of `chunk` holds: all of them, or the ones `mode` keeps.
  int KeptExtraWords(int chunk, Recompute mode) const;
  // The stamp and the first `extra` extra words of an entry.
  absl::Status CheckStamp(int mb, int chunk, const float* saved, int extra) const;
  // Forward writing the stamp, x and the first `extra` extra words to `words`.
  absl::Status RunForward(int mb, int chunk, const void* input, void* output, float* words,
                          int extra);

  const ToyConfig config_;
  const int stage_;
  std::vector<std::vector<float>> a_, b_;  // [chunk][n]
  std::vector<ToyGrads> grads_;            // [chunk]
  std::vector<float> losses_;              // [mb]
  // (mb, chunk) whose entry is a lean retained block B reads as it is (backward_reads_lean).
  std::set<std::pair<int, int>> lean_entries_;
};

// The microbatch's input on virtual stage 0 and the parameters of virtual stage l.
float ToyInput(int mb, int i);
float ToyParamA(int l, int i);
float ToyParamB(int l, int i);

// Runs every microbatch through all virtual stages in one process: F of all virtual stages,
// then B in reverse, microbatch by microbatch (the order of gradient accumulation every
// pipeline schedule keeps per chunk). Returns the gradients per virtual stage.
std::vector<ToyGrads> ToyReference(const ToyConfig& config);

// `family` with `policy` compiled for config's stages, chunks and microbatches (unit costs,
// offload ratio 0.5), with the toy model's activation bytes (chunk 0, unsplit backward).
absl::StatusOr<Schedule> CompileToy(const ToyConfig& config, Family family,
                                    OffloadPolicy policy);

struct HarnessOptions {
  std::int64_t arena_budget_bytes = 1 << 20;
  bool poison = true;
  CpuBackendOptions backend;
  ExecutorOptions executor;
  int iterations = 1;
  int extra_words = 0;
  int width = 64;
  bool backward_reads_lean = false;  // ToyConfig's
};

struct StageOutcome {
  absl::Status status;  // Create's or the first failing Run's
  std::vector<IterationStats> iterations;
  std::vector<ToyGrads> grads;  // [chunk], after the last iteration
  BackendStats backend_stats;
  std::int64_t host_pool_capacity = 0;
  std::int64_t arena_in_use_after = 0;  // requested bytes of every category after the run
};

// Runs `schedule` with one thread per stage (own CPU backend, arena, toy model and executor,
// one local transport). Gradients accumulate over iterations.
std::vector<StageOutcome> RunToyPipeline(const Schedule& schedule,
                                         const HarnessOptions& options);

// The same on the caller's backends and transports: stage d runs on backends[d] and
// transports[d] (both must outlive the call); options.backend is not used.
std::vector<StageOutcome> RunToyStages(const Schedule& schedule,
                                       const std::vector<Backend*>& backends,
                                       const std::vector<Transport*>& transports,
                                       const HarnessOptions& options);

// Gradients of all virtual stages, indexed by virtual stage, from the stages' outcomes.
std::vector<ToyGrads> GradsByVirtualStage(const std::vector<StageOutcome>& outcomes,
                                          int num_stages, int chunks_per_stage,
                                          Placement placement = Placement::kLoop);

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_RUNTIME_TOY_MODEL_H_
