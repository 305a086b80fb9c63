// The launchers behind flash_attention.h: plain functions that enqueue one kernel each and return
// the launch's error (cudaGetLastError after it), free of Abseil so that flash_attention.cu
// needs nothing nvcc might choke on. FlashAttentionForward / Backward (flash_attention.cc) check
// every argument first; the launchers trust them.
#ifndef PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_LAUNCH_H_
#define PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_LAUNCH_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::examples::cuda::internal {

using bf16 = __nv_bfloat16;

// Everything a flash kernel reads, by value (it is the kernels' parameter block). Row n = b * T
// + t of q / dq starts at n * q_stride, of k, v, dk, dv at n * kv_stride, of out / dout at
// n * out_stride (elements); head h's hd columns start at h * hd within the row. Pointers a
// launch does not use may be null.
struct FlashArgs {
  // Forward inputs (and backward inputs).
  const bf16* q = nullptr;    // (N, NH, hd)
  const bf16* k = nullptr;    // (N, NKV, hd)
  const bf16* v = nullptr;    // (N, NKV, hd)
  // Forward outputs; backward inputs (out through `out_in`, lse through `lse_in`).
  bf16* out = nullptr;        // (N, NH, hd)
  float* lse = nullptr;       // (B, NH, T), natural log
  const bf16* out_in = nullptr;
  const float* lse_in = nullptr;
  const bf16* dout = nullptr;  // (N, NH, hd)
  float* dsum = nullptr;       // (B, NH, T): D = rowsum(dout * out), the backward's workspace
  bf16* dq = nullptr;          // (N, NH, hd)
  bf16* dk = nullptr;          // (N, NKV, hd)
  bf16* dv = nullptr;          // (N, NKV, hd)
  std::int64_t q_stride = 0;
  std::int64_t kv_stride = 0;
  std::int64_t out_stride = 0;
  int B = 0;
  int T = 0;
  int NH = 0;
  int NKV = 0;
  int group = 0;  // NH / NKV: query heads per kv head
  int hd = 0;     // 64 or 128
};

// Rows of the forward's query blocks: grid.y of every kernel counts blocks of at least 64 rows,
// so T may be at most 65535 * 64 (flash_attention.cc checks).
inline constexpr int kFlashMinBlockRows = 64;
inline constexpr std::int64_t kFlashMaxT = std::int64_t{65535} * kFlashMinBlockRows;

// out, lse from q, k, v.
cudaError_t LaunchFlashForward(const FlashArgs& args, cudaStream_t stream);
// The same with one of the forward's block shapes (flash_attention_kernels.cuh): 0, 4 warps x
// 32 rows; 1, 8 warps x 16 rows at 2 blocks per SM; 2, the same at 1 block per SM; others
// cudaErrorInvalidValue. LaunchFlashForward runs kFlashForwardDefaultVariant; the hidden
// benchmark "[.flash_bench]" times them all.
inline constexpr int kFlashForwardVariants = 3;
inline constexpr int kFlashForwardDefaultVariant = 0;
cudaError_t LaunchFlashForwardVariant(const FlashArgs& args, int variant, cudaStream_t stream);
// The backward's three kernels, in this order on one stream: dsum from dout and out_in; dk, dv
// from q, k, v, dout, lse_in, dsum; dq from the same.
cudaError_t LaunchFlashBackwardDot(const FlashArgs& args, cudaStream_t stream);
cudaError_t LaunchFlashBackwardKV(const FlashArgs& args, cudaStream_t stream);
cudaError_t LaunchFlashBackwardQ(const FlashArgs& args, cudaStream_t stream);

}  // namespace pipeoffload::examples::cuda::internal

#endif  // PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_LAUNCH_H_
