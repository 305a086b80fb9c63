// The trainer's side of the runtime contract: what one pipeline stage computes.
//
// The runtime (Executor) walks a StageProgram and calls these methods for the compute ops; it
// owns every buffer it passes in. A StageModel never keeps pointers to those buffers across
// calls: between F and B the runtime may move a stash entry to host memory and back to a
// different address (DESIGN.md section 5, ActivationStash).
//
// Memory is plain bytes from the runtime's backend ("device" memory: the arena on the CPU
// backend, GPU memory on the CUDA backend). A chunk's saved-activation size must be known up
// front and be the same for every microbatch, so the compiler's byte predictions are exact.
//
// Contracts (pipeline.h states the same from the runner's side):
//  - Queue. Each call enqueues its device work on the COMPUTE queue of the stage's backend
//    (backend.h QueueKind::kCompute; CUDA: CudaComputeStream(backend), cuda_stream.h; CPU: the
//    calling thread, so the work is done when the call returns) and may return before that
//    work has finished. The runtime records an event on that queue after each call and orders
//    every later use of the call's buffers after it (offload copies, sends, the next op), so
//    work enqueued anywhere else (another stream, another thread) is not ordered and races.
//  - Buffers. The pointers are valid for the work enqueued by the call, not past it: the next
//    call may get other addresses for the same entry.
//  - Threads. The runtime calls one StageModel from one thread at a time (the stage's runner:
//    PipelineStage::Open with measured costs, then each Run), never two calls at once. Stages
//    of one process (LocalPipeline) call their models from different threads at the same
//    time, so state shared between stage models needs its own locking.
//  - Errors. A non-OK status fails the op: Run returns it annotated with the stage and op, and
//    frees the iteration's memory.
#ifndef PIPEOFFLOAD_STAGE_MODEL_H_
#define PIPEOFFLOAD_STAGE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipeoffload {

// What F keeps of an entry that the program recomputes before its B (op kinds RECOMPUTE and
// RECOMPUTE_LEAN, schedule.h). kNone: F keeps the full saved entry (SavedBytes).
enum class Recompute : std::uint8_t {
  kNone,
  kLean,  // F keeps the lean layout (the expensive parts, e.g. matmul outputs); the cheap parts
          // (LayerNorm, GELU) are recomputed.
  kFull,  // F keeps only what re-running the chunk needs, normally its input.
};

// "none", "lean", "full" (the po-schedule --recompute spellings).
inline const char* RecomputeName(Recompute mode) {
  switch (mode) {
    case Recompute::kNone: return "none";
    case Recompute::kLean: return "lean";
    case Recompute::kFull: return "full";
  }
  return "?";
}
// Inverse of RecomputeName; nullopt for any other string.
inline std::optional<Recompute> RecomputeFromName(std::string_view name) {
  for (const Recompute mode : {Recompute::kNone, Recompute::kLean, Recompute::kFull}) {
    if (name == RecomputeName(mode)) return mode;
  }
  return std::nullopt;
}

class StageModel {
 public:
  virtual ~StageModel() = default;

  // Bytes of the stash entry F(mb, chunk) fills and B / W read. When the schedule splits W,
  // the entry also holds whatever B leaves for W (e.g. output gradients), so the size may
  // depend on `split_backward`.
  virtual std::int64_t SavedBytes(int chunk, bool split_backward) const = 0;
  // Bytes of the activation passed between virtual stages (and of its gradient).
  virtual std::int64_t BoundaryBytes() const = 0;

  // Forward of this stage's `chunk` for microbatch `mb`. `input` holds BoundaryBytes() bytes
  // from the previous virtual stage, or is null on virtual stage 0 (the model reads its own
  // tokens). Writes BoundaryBytes() bytes to `output` (ignored, may be null, on the last virtual
  // stage, which computes the loss instead) and SavedBytes() bytes to `saved`.
  [[nodiscard]] virtual absl::Status Forward(int mb, int chunk, const void* input, void* output,
                                             void* saved) = 0;

  // Backward for inputs of (mb, chunk). `grad_output` is the gradient of this chunk's output
  // (null on the last virtual stage, which starts from the loss). Writes the gradient of the
  // chunk's input to `grad_input` (null on virtual stage 0). When `with_weight_grad`, also
  // accumulates the weight gradients (full backward); otherwise leaves what W needs in `saved`.
  [[nodiscard]] virtual absl::Status Backward(int mb, int chunk, const void* grad_output,
                                              void* grad_input, void* saved,
                                              bool with_weight_grad) = 0;

  // Weight-gradient backward of (mb, chunk), after its Backward(with_weight_grad = false).
  [[nodiscard]] virtual absl::Status BackwardWeight(int mb, int chunk, void* saved) = 0;

  // Recomputation (optional; a model that does not override these refuses every program that
  // asks for it, before the first op runs).
  //
  // Bytes F keeps for an entry of `chunk` that will be recomputed with `mode` (kLean or kFull):
  // the retained block. -1 means the model does not offer `mode` for `chunk` (the default); the
  // runtime then refuses a program asking for it, naming the chunk and the mode. Like
  // SavedBytes, the same for every microbatch.
  virtual std::int64_t RetainedBytes(int chunk, Recompute mode, bool split_backward) const {
    (void)chunk;
    (void)mode;
    (void)split_backward;
    return -1;
  }

  // Forward of (mb, chunk) for an entry that will be recomputed with `mode` (never kNone): the
  // same `input` and `output` as Forward (bitwise the same output), but writes only the
  // RetainedBytes(chunk, mode, ...) bytes of `retained` instead of the full saved entry.
  [[nodiscard]] virtual absl::Status ForwardRetaining(int mb, int chunk, const void* input,
                                                      void* output, void* retained,
                                                      Recompute mode) {
    (void)input;
    (void)output;
    (void)retained;
    return absl::UnimplementedError(absl::StrCat(
        "StageModel::ForwardRetaining(mb ", mb, ", chunk ", chunk, ", mode ",
        RecomputeName(mode), ") is not implemented by this model"));
  }

  // Rebuilds the full saved entry (SavedBytes bytes, exactly what Forward would have written)
  // of (mb, chunk) from the retained block that ForwardRetaining(mode) wrote, on the compute
  // queue. No side effects beyond `saved`: the loss is not accounted twice, no state advances.
  // The runtime then passes `saved` to Backward / BackwardWeight as usual and frees `retained`.
  [[nodiscard]] virtual absl::Status RecomputeSaved(int mb, int chunk, const void* retained,
                                                    void* saved, Recompute mode) {
    (void)retained;
    (void)saved;
    return absl::UnimplementedError(absl::StrCat(
        "StageModel::RecomputeSaved(mb ", mb, ", chunk ", chunk, ", mode ",
        RecomputeName(mode), ") is not implemented by this model"));
  }

  // True when Backward / BackwardWeight of an entry that ForwardRetaining(mode) kept read that
  // retained block as it is, rebuilding what they need from it inside themselves (into the
  // model's own scratch): the runtime's RECOMPUTE* then allocates no full block, copies
  // nothing and does not call RecomputeSaved, and B / W get the retained block as `saved`. A
  // model that says true tells a retained block from a full entry itself (it saw whether
  // Forward or ForwardRetaining wrote the entry). The stash counts only the retained block
  // from there on, and the planner knows (the pipeline's setup gives the cost model
  // lean_rebuild_bytes = 0 for such chunks), so plans fit more in the same memory. Default
  // false: every RECOMPUTE* rebuilds into a new block of SavedBytes.
  virtual bool BackwardReadsRetained(int chunk, Recompute mode, bool split_backward) const {
    (void)chunk;
    (void)mode;
    (void)split_backward;
    return false;
  }
};


}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_STAGE_MODEL_H_
