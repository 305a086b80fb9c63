// The engine's own arithmetic on the device, behind one interface with a CPU and a CUDA
// implementation (the model's math is the model's; this is the engine's): turning the fp32
// gradient accumulator into wire gradients with their sum of squares, and the Adam update of
// resident units. Every call enqueues on the backend's compute queue (the CPU
// backend's compute queue is the caller's thread: it runs at once) and returns.
//
// Bits: the sums of squares are CpuAdam::SumOfSquares's fixed-block sums (GPU: the same bits,
// lib/optim/cuda/adam_kernel.h); the gradients' cast is FloatToBf16Bits's rounding; Adam is
// adam.h's contract (with the split master of bf16 models on both sides). So a unit gives the same bits whether the CPU or the GPU updates it, and the norm
// does not depend on who summed.
#ifndef PIPEOFFLOAD_LIB_SLIDE_DEVICE_OPS_H_
#define PIPEOFFLOAD_LIB_SLIDE_DEVICE_OPS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::internal {

class SlideDeviceOps {
 public:
  virtual ~SlideDeviceOps() = default;

  // Doubles of scratch `partials` CastGrads needs for `count` elements.
  static std::int64_t PartialsFor(std::int64_t count);

  // wire (count elements of the dtype) = accum rounded to the dtype; *sum_of_squares (one
  // device double) = the sum of squares of the wire values. `partials`: device scratch of
  // PartialsFor(count) doubles. Device pointers.
  [[nodiscard]] virtual absl::Status CastGrads(const float* accum, void* wire, std::int64_t count,
                                               double* sum_of_squares, double* partials) = 0;
  // Adam of a span of device memory: fp32 models: param (the master and the parameters),
  // exp_avg, exp_avg_sq, grad; bf16 models: a split master (param_bf16 the parameters, param_lo
  // the master's low halves), exp_avg, exp_avg_sq, grad_bf16.
  [[nodiscard]] virtual absl::Status Adam(const AdamStepScalars& scalars,
                                          const AdamSpan& span) = 0;
};

// The CPU implementation for a backend whose device memory is host memory, the CUDA one for a
// CUDA backend (when built with CUDA). Errors: FailedPrecondition for any other backend.
[[nodiscard]] absl::StatusOr<std::unique_ptr<SlideDeviceOps>> CreateSlideDeviceOps(
    Backend& backend, SlideDtype dtype);

// The CUDA implementation (cuda/cuda_device_ops.cc); nullptr when `backend` is not a CUDA
// backend or the build has no CUDA.
[[nodiscard]] absl::StatusOr<std::unique_ptr<SlideDeviceOps>> CreateCudaSlideDeviceOps(
    Backend& backend, SlideDtype dtype);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_DEVICE_OPS_H_
