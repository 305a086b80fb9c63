// The raw launchers behind adam_kernel.h, free of Abseil so that adam_kernel.cu (compiled by
// nvcc) needs no Abseil headers. Each returns cudaGetLastError() after its launches; argument
// checks happen in adam_kernel.cc before any of these is called.
#ifndef PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_INTERNAL_H_
#define PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "lib/optim/simd_kernels.h"

namespace pipeoffload::internal {

// The kernel's one by-value argument: the step's scalars and the span, as the very structs the
// CPU's SIMD kernels take (simd_kernels.h mirrors AdamStepScalars and AdamSpan field for field,
// without Abseil, so nvcc can take it). One mirror for both back ends: a field added to the
// public types is added once. Fields are reached by name (a.beta1, a.param) as before; an
// aggregate, so a flat initializer list fills KernelScalars' fields, then KernelSpan's.
struct AdamKernelArgs : KernelScalars, KernelSpan {};
static_assert(sizeof(AdamKernelArgs) == sizeof(KernelScalars) + sizeof(KernelSpan),
              "no padding between the scalars and the span");

cudaError_t LaunchAdamKernel(const AdamKernelArgs& args, cudaStream_t stream);

// in: (count) bf16 bits; out: (count) fp32. count > 0.
cudaError_t LaunchBf16ToFp32Kernel(const std::uint16_t* in, float* out, std::int64_t count,
                                   cudaStream_t stream);

// in: (count) fp32; out: (count) bf16 bits, rounded as FloatToBf16Bits. count > 0.
cudaError_t LaunchFp32ToBf16Kernel(const float* in, std::uint16_t* out, std::int64_t count,
                                   cudaStream_t stream);

// x: (count) fp32 or bf16 bits (x_is_bf16); partials: (ceil(count / block)) doubles;
// result: one double. count > 0.
cudaError_t LaunchSumOfSquaresKernels(const void* x, bool x_is_bf16, std::int64_t count,
                                      std::int64_t block, double* partials, double* result,
                                      bool accumulate, cudaStream_t stream);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_INTERNAL_H_
