// The launchers behind kernels_cuda.h: plain functions that enqueue one kernel (or a fixed pair)
// and return the launch's error (cudaGetLastError after it), free of Abseil so the .cu files
// that define them need nothing nvcc might choke on. The checked API (kernels_cuda.h) validates
// every argument before calling these; they assume valid sizes and non-null pointers.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_LAUNCH_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_LAUNCH_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::gpt::cuda::internal {

using bf16 = __nv_bfloat16;

// Rows per chunk of the two-stage column sums (LayerNorm weight and bias gradients): stage one
// writes one partial sum per chunk and column, stage two adds the chunks in order.
inline constexpr int kColumnSumRowsPerChunk = 32;

inline std::int64_t ColumnSumChunks(int rows) {
  return (std::int64_t{rows} + kColumnSumRowsPerChunk - 1) / kColumnSumRowsPerChunk;
}

// kernels_elementwise.cu
cudaError_t LaunchGeluForward(bf16* out, const bf16* inp, std::int64_t n, cudaStream_t stream);
cudaError_t LaunchGeluBackward(bf16* dinp, const bf16* inp, const bf16* dout, std::int64_t n,
                               cudaStream_t stream);
cudaError_t LaunchAdd(bf16* out, const bf16* a, const bf16* b, std::int64_t n, cudaStream_t stream);
cudaError_t LaunchFp32ToBf16(bf16* out, const float* in, std::int64_t n, cudaStream_t stream);
cudaError_t LaunchBf16ToFp32(float* out, const bf16* in, std::int64_t n, cudaStream_t stream);

// kernels_encoder.cu
cudaError_t LaunchEncoderForward(bf16* out, const std::int32_t* tokens, const bf16* wte,
                                 const bf16* wpe, int B, int T, int C, cudaStream_t stream);
cudaError_t LaunchEncoderBackward(float* dwte, float* dwpe, const bf16* dout,
                                  const std::int32_t* tokens, int B, int T, int C,
                                  cudaStream_t stream);

// kernels_layernorm.cu
cudaError_t LaunchLayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp,
                                   const bf16* w, const bf16* b, int N, int C, cudaStream_t stream);
// The forward's output step alone, from its saved mean and rstd (bitwise the forward's out).
cudaError_t LaunchLayerNormApply(bf16* out, const bf16* inp, const bf16* w, const bf16* b,
                                 const float* mean, const float* rstd, int N, int C,
                                 cudaStream_t stream);
cudaError_t LaunchLayerNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* inp,
                                         const bf16* w, const float* mean, const float* rstd, int N,
                                         int C, cudaStream_t stream);
// scratch: ColumnSumChunks(N) * 2 * C floats.
cudaError_t LaunchLayerNormBackwardWeight(float* dw, float* db, float* scratch, const bf16* dout,
                                          const bf16* inp, const float* mean, const float* rstd,
                                          int N, int C, cudaStream_t stream);
// scratch: ColumnSumChunks(N) * OC floats.
cudaError_t LaunchBiasBackward(float* dbias, float* scratch, const bf16* dout, int N, int OC,
                               cudaStream_t stream);

// kernels_cross_entropy.cu
cudaError_t LaunchCrossEntropyForward(float* losses, float* lse, const bf16* logits,
                                      const std::int32_t* targets, int N, int V,
                                      cudaStream_t stream);
cudaError_t LaunchCrossEntropyBackward(bf16* dlogits, const bf16* logits, const float* lse,
                                       const std::int32_t* targets, float dloss, int N, int V,
                                       cudaStream_t stream);

}  // namespace pipeoffload::gpt::cuda::internal

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_LAUNCH_H_
