// The raw launchers behind adam_kernel.h, free of Abseil so that adam_kernel.cu (compiled by
// nvcc) needs no Abseil headers. Each returns cudaGetLastError() after its launches; argument
// checks happen in adam_kernel.cc before any of these is called.
#ifndef PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_INTERNAL_H_
#define PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::internal {

// AdamStepScalars and AdamSpan flattened into one by-value kernel argument (adam.h's field
// meanings; include/pipeoffload/adam.h is not included here because it pulls in Abseil).
struct AdamKernelArgs {
  float grad_scale;
  float weight_decay;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float decay_factor;
  float inv_sqrt_bias_correction2;
  float epsilon;
  float step_size;
  float* param;        // (count) fp32
  float* exp_avg;      // (count) fp32
  float* exp_avg_sq;   // (count) fp32
  const float* grad;   // (count) fp32
  std::uint16_t* param_bf16;  // (count) bf16 bits, or null
  std::int64_t count;  // > 0
};

cudaError_t LaunchAdamKernel(const AdamKernelArgs& args, cudaStream_t stream);

// in: (count) bf16 bits; out: (count) fp32. count > 0.
cudaError_t LaunchBf16ToFp32Kernel(const std::uint16_t* in, float* out, std::int64_t count,
                                   cudaStream_t stream);

// x: (count) fp32 or bf16 bits (x_is_bf16); partials: (ceil(count / block)) doubles;
// result: one double. count > 0.
cudaError_t LaunchSumOfSquaresKernels(const void* x, bool x_is_bf16, std::int64_t count,
                                      std::int64_t block, double* partials, double* result,
                                      bool accumulate, cudaStream_t stream);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_INTERNAL_H_
