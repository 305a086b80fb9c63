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
#ifndef PIPEOFFLOAD_STAGE_MODEL_H_
#define PIPEOFFLOAD_STAGE_MODEL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace pipeoffload {

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
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_STAGE_MODEL_H_
