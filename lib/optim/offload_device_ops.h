// The optimizer-offload engine's own arithmetic on the device (optimizer_offload.h), behind one
// interface with a CPU and a CUDA implementation, as layer sliding's SlideDeviceOps: the sum of
// squares of bf16 gradients, their upcast to fp32 and the Adam update of device-resident or
// staged state. Every call enqueues on the compute queue it is given (a Backend::CreateQueue
// lane or the built-in one) and returns; on the CPU backend every compute queue is the caller's
// thread, so the work has run when the call returns.
//
// Bits: the sum of squares is CpuAdam::SumOfSquaresBf16's fixed-block sum (the GPU kernels give
// the same bits, lib/optim/cuda/adam_kernel.h) added to the accumulator in one rounding; the
// upcast is exact; Adam is adam.h's contract. So a subgroup gets the same bits whichever
// device updates it, and the norm does not depend on who summed.
#ifndef PIPEOFFLOAD_LIB_OPTIM_OFFLOAD_DEVICE_OPS_H_
#define PIPEOFFLOAD_LIB_OPTIM_OFFLOAD_DEVICE_OPS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"

namespace pipeoffload::internal {

class OffloadDeviceOps {
 public:
  virtual ~OffloadDeviceOps() = default;

  // Doubles of scratch `partials` AccumulateSumOfSquaresBf16 needs for `count` elements: one
  // per block of kSumBlock (8192, CpuAdam's and the GPU's), at least 1.
  static std::int64_t PartialsFor(std::int64_t count);

  // *accumulator += sum over i < count of float(bf16 x[i])^2 (one device double). `partials`:
  // device scratch of PartialsFor(count) doubles that no other queue uses meanwhile. x: (count)
  // bf16 bits, device memory. count > 0.
  [[nodiscard]] virtual absl::Status AccumulateSumOfSquaresBf16(Queue queue,
                                                                const std::uint16_t* x,
                                                                std::int64_t count,
                                                                double* partials,
                                                                double* accumulator) = 0;
  // out[i] = float(bf16 in[i]) for i < count (exact). Device pointers.
  [[nodiscard]] virtual absl::Status Bf16ToFp32(Queue queue, const std::uint16_t* in, float* out,
                                                std::int64_t count) = 0;
  // Adam of a span of device memory: fp32 param, exp_avg, exp_avg_sq, grad; the new bf16
  // parameters into param_bf16.
  [[nodiscard]] virtual absl::Status Adam(Queue queue, const AdamStepScalars& scalars,
                                          const AdamSpan& span) = 0;
};

// The CUDA implementation for a CUDA backend (when built with CUDA), else the CPU one for a
// backend whose device memory is host memory (`cpu` sizes its CpuAdam).
// Errors: FailedPrecondition for any other backend; CpuAdam::Create's.
[[nodiscard]] absl::StatusOr<std::unique_ptr<OffloadDeviceOps>> CreateOffloadDeviceOps(
    Backend& backend, const CpuAdamOptions& cpu);

// The CUDA implementation (cuda/cuda_offload_device_ops.cc); nullptr when `backend` is not a
// CUDA backend or the build has no CUDA (no_cuda_offload_device_ops.cc).
[[nodiscard]] absl::StatusOr<std::unique_ptr<OffloadDeviceOps>> CreateCudaOffloadDeviceOps(
    Backend& backend);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_OFFLOAD_DEVICE_OPS_H_
