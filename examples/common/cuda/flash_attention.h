// Causal grouped-query attention on the GPU, flash-style (Dao et al. 2022, 2023): scores and
// probabilities live only in registers and shared memory, never as a T x T tensor; the forward
// saves the log-sum-exp per (sequence, head, query), the backward recomputes the probabilities
// from it. The CPU references are examples/llama/llama_kernels_cpu.h AttentionForward / Backward
// (same math, fp32) and, for the GPT's layout (NKV = NH), examples/gpt/kernels_cpu.h. One kernel
// for both example models: the Llama layer (GQA) and the GPT layer (kernels_cuda.h's attention)
// call it on column ranges of their fused QKV projections.
//
// Layout: q rows of NH heads, k and v rows of NKV heads, hd elements each, inside row-major
// matrices whose row n (= b * T + t) starts every `*_row_stride` elements, so q, k, v may be
// column ranges of one fused QKV projection output (N, (NH + 2 NKV) * hd) and dq, dk, dv column
// ranges of its gradient. Query head h reads kv head h / (NH / NKV). bf16 inputs and outputs,
// fp32 accumulation and softmax statistics; scale 1 / sqrt(hd).
//
// Deterministic: the same inputs give the same bits on every run (no float atomics; dK / dV
// and dQ are reduced in a fixed order), which the engine's "two budgets, same bits" rests on.
// Launchers only enqueue on `stream`; nothing synchronizes or allocates.
#ifndef PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_H_
#define PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace pipeoffload::examples::cuda {

using bf16 = __nv_bfloat16;

// The longest sequence the kernels take: grid.y counts query blocks of at least 64 rows.
inline constexpr int kFlashAttentionMaxT = 65535 * 64;

struct AttentionDims {
  int B = 0;    // sequences
  int T = 0;    // tokens per sequence
  int NH = 0;   // query heads
  int NKV = 0;  // key/value heads, NH % NKV == 0
  int hd = 0;   // head dim: 64 or 128 (others: InvalidArgument)
  // Elements between consecutive rows of each tensor (>= heads * hd); 0 means heads * hd.
  std::int64_t q_row_stride = 0;
  std::int64_t kv_row_stride = 0;   // k and v (and dk, dv)
  std::int64_t out_row_stride = 0;  // out and dout (and dq uses q_row_stride)
};

// out (N, NH, hd) and lse (B, NH, T) fp32 from q, k, v. out may not alias the inputs.
// Errors: InvalidArgument for bad dims (naming the field), null pointers, or bf16 pointers not
// 16-byte aligned / strides not multiples of 8 (vector loads), fp32 pointers (lse, the
// backward's workspace) not 4-byte aligned; Internal for a failed launch (naming the kernel).
// Also T <= kFlashAttentionMaxT and B * NH < 2^31 (grid dimensions).
[[nodiscard]] absl::Status FlashAttentionForward(bf16* out, float* lse, const bf16* q,
                                                 const bf16* k, const bf16* v,
                                                 const AttentionDims& dims, cudaStream_t stream);

// Device scratch FlashAttentionBackward needs (the per-query dot(dout, out) and any partial
// sums of its fixed-order reductions), in bytes.
std::int64_t FlashAttentionBackwardWorkspaceBytes(const AttentionDims& dims);

// dq (rows of q_row_stride), dk, dv (rows of kv_row_stride) OVERWRITTEN from dout, out and lse
// of the forward. `workspace` holds FlashAttentionBackwardWorkspaceBytes(dims) bytes. Only the
// heads' columns of dq, dk, dv are written (the rest of a fused gradient row is untouched);
// none of dq, dk, dv, workspace may alias an input. Three kernels in order on `stream`.
// Errors: as the forward.
[[nodiscard]] absl::Status FlashAttentionBackward(bf16* dq, bf16* dk, bf16* dv, void* workspace,
                                                  const bf16* dout, const bf16* out,
                                                  const float* lse, const bf16* q, const bf16* k,
                                                  const bf16* v, const AttentionDims& dims,
                                                  cudaStream_t stream);

}  // namespace pipeoffload::examples::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_H_
