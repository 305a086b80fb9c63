// The launchers behind llama_cuda_kernels.h and fused_cross_entropy.h: plain functions that
// enqueue a kernel (or a fixed pair) and return the launch's error (cudaGetLastError after it),
// free of Abseil so the .cu files that define them need nothing nvcc might choke on. The
// checked entry points validate every argument first; these assume valid sizes and non-null
// pointers. Internal to po_llama_cuda.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_LAUNCH_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_LAUNCH_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::llama::cuda::internal {

using bf16 = __nv_bfloat16;

// The RMSNorm's segments (llama_cuda_kernels.h RmsNormShape with row_stride resolved).
struct NormSegments {
  std::int64_t segments = 0;
  int heads = 1;
  int C = 0;
  std::int64_t row_stride = 0;
};

// llama_cuda_kernels.cu
cudaError_t LaunchRmsNormForward(bf16* out, float* rstd, const bf16* inp, const bf16* weight,
                                 const NormSegments& s, float eps, cudaStream_t stream);
cudaError_t LaunchRmsNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* residual,
                                       const bf16* inp, const bf16* weight, const float* rstd,
                                       const NormSegments& s, cudaStream_t stream);
// scratch: ceil(segments / rows_per_chunk) * C floats; rows_per_chunk a multiple of 16.
cudaError_t LaunchRmsNormBackwardWeight(float* dweight, float* scratch, const bf16* dout,
                                        const bf16* inp, const float* rstd, const NormSegments& s,
                                        int rows_per_chunk, cudaStream_t stream);
cudaError_t LaunchRope(bf16* x, const float* cos_sin, int N, int T, int heads, int hd,
                       std::int64_t row_stride, bool transpose, cudaStream_t stream);
cudaError_t LaunchSwiGluForward(bf16* out, const bf16* gate_up, std::int64_t N, int F,
                                cudaStream_t stream);
cudaError_t LaunchSwiGluBackward(bf16* dgate_up, const bf16* dout, const bf16* gate_up,
                                 std::int64_t N, int F, cudaStream_t stream);
cudaError_t LaunchEmbeddingForward(bf16* out, const std::int32_t* tokens, const bf16* table, int N,
                                   int H, cudaStream_t stream);
cudaError_t LaunchEmbeddingBackward(float* dtable, const bf16* dout, const std::int32_t* index,
                                    int segments, int N, int H, cudaStream_t stream);

// fused_cross_entropy.cu
// Per row r of logits (rows, V), in place: losses[r] = lse - logit[target] (NaN for a target
// outside [0, V)), then the row := (softmax - onehot(target)) * grad_scale.
cudaError_t LaunchCrossEntropyRows(bf16* logits, float* losses, const std::int32_t* targets,
                                   int rows, int V, float grad_scale, cudaStream_t stream);
// *result (one double) = sum of values[0, n) in double, in a fixed order (one block).
cudaError_t LaunchSumToDouble(double* result, const float* values, int n, cudaStream_t stream);

}  // namespace pipeoffload::llama::cuda::internal

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_LAUNCH_H_
