// The GPT's CUDA kernels (bf16 activations, fp32 accumulation and statistics): the CUDA mirror of
// examples/gpt/kernels_cpu.h, minus the linear layers (cuBLASLt, the chunk's) and Adam
// (lib/optim/cuda/adam_kernel.h).
//
// Conventions shared by every function here:
// - Every function only enqueues work on `stream` (never synchronizes) and returns
//   InvalidArgument for bad sizes or null pointers (checked on the host, before anything is
//   enqueued) and Internal naming the kernel and CUDA's error when a launch fails.
// - Shapes as in kernels_cpu.h: B batch, T time, C channels, NH heads, hs = C / NH, V vocab,
//   N = B * T rows; row-major, innermost index last. Activations and gradients of activations
//   are bf16; statistics (mean, rstd, lse, losses) and parameter gradients are fp32.
// - Deterministic: the same inputs give the same output bits on every run (no float atomics;
//   every reduction has a fixed order that depends only on the sizes, never on timing). The
//   offload-on/off bitwise equality of the pipeline rests on this.
// - Accumulating functions (documented "+=") add one call's contribution to what is there, so
//   gradients summed over microbatches have a fixed order too.
// - Pointers are device memory. Any alignment works: 128-bit vector loads are used when the
//   pointers are 16-byte aligned and the row length is a multiple of 8, a scalar path otherwise;
//   both give the same bits (results depend on sizes and values only, never on addresses).
//   The attention is the shared flash kernel (examples/common/cuda/flash_attention.h), which
//   needs 16-byte aligned tensors (checked).
// - Token ids and targets must lie in [0, V); the encoder cannot check them (it does not know V)
//   and reads out of bounds otherwise; the cross-entropy writes NaN losses for a bad target.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_CUDA_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_CUDA_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "examples/common/cuda/flash_attention.h"

namespace pipeoffload::gpt::cuda {

using bf16 = __nv_bfloat16;

// ---- Encoder ------------------------------------------------------------------------------

// out (B,T,C) = wte[tokens[b,t], :] + wpe[t, :], summed in fp32 and rounded once.
[[nodiscard]] absl::Status EncoderForward(bf16* out, const std::int32_t* tokens, const bf16* wte,
                                          const bf16* wpe, int B, int T, int C,
                                          cudaStream_t stream);
// dwte (V,C) += dout scattered by token, each row's contributions added in ascending (b, t);
// dwpe (T,C) += dout summed over b in ascending order.
[[nodiscard]] absl::Status EncoderBackward(float* dwte, float* dwpe, const bf16* dout,
                                           const std::int32_t* tokens, int B, int T, int C,
                                           cudaStream_t stream);

// ---- LayerNorm ----------------------------------------------------------------------------

// Per row of inp (N,C): out = (inp - mean) * rstd * w + b, eps kLayerNormEps (1e-5) as the CPU;
// mean and rstd (N, fp32) are saved for the backward.
[[nodiscard]] absl::Status LayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp,
                                            const bf16* w, const bf16* b, int N, int C,
                                            cudaStream_t stream);
// LayerNormForward's `out` again, from the inp, mean and rstd it saw and saved: the same
// arithmetic, so the same bits (what a lean layer uses to recompute the LayerNorm outputs it does
// not save, gpt_cuda_layer.h). Elementwise; out may not alias inp.
[[nodiscard]] absl::Status LayerNormApply(bf16* out, const bf16* inp, const bf16* w, const bf16* b,
                                          const float* mean, const float* rstd, int N, int C,
                                          cudaStream_t stream);
// dinp (N,C) += d(out)/d(inp)^T dout (dinp already holds the residual gradient).
[[nodiscard]] absl::Status LayerNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* inp,
                                                  const bf16* w, const float* mean,
                                                  const float* rstd, int N, int C,
                                                  cudaStream_t stream);
// Floats of scratch LayerNormBackwardWeight needs (partial sums per chunk of rows).
std::int64_t LayerNormWeightScratchFloats(int N, int C);
// dw, db (C) += the parameter gradients of the same LayerNorm. scratch: device memory of
// LayerNormWeightScratchFloats(N, C) floats (contents ignored, clobbered).
[[nodiscard]] absl::Status LayerNormBackwardWeight(float* dw, float* db, float* scratch,
                                                   const bf16* dout, const bf16* inp,
                                                   const float* mean, const float* rstd, int N,
                                                   int C, cudaStream_t stream);

// ---- Bias of a linear layer ---------------------------------------------------------------

// Floats of scratch BiasBackward needs.
std::int64_t BiasScratchFloats(int N, int OC);
// dbias (OC) += column sums of dout (N,OC). scratch: BiasScratchFloats(N, OC) floats.
[[nodiscard]] absl::Status BiasBackward(float* dbias, float* scratch, const bf16* dout, int N,
                                        int OC, cudaStream_t stream);

// ---- Elementwise (n >= 0; n == 0 enqueues nothing) -----------------------------------------

// GELU, tanh approximation, as kernels_cpu.h.
[[nodiscard]] absl::Status GeluForward(bf16* out, const bf16* inp, std::int64_t n,
                                       cudaStream_t stream);
// dinp = gelu'(inp) * dout; dinp may alias dout.
[[nodiscard]] absl::Status GeluBackward(bf16* dinp, const bf16* inp, const bf16* dout,
                                        std::int64_t n, cudaStream_t stream);
// out = a + b (the residual connection); out may alias a or b.
[[nodiscard]] absl::Status Add(bf16* out, const bf16* a, const bf16* b, std::int64_t n,
                               cudaStream_t stream);
// Round to nearest even.
[[nodiscard]] absl::Status Fp32ToBf16(bf16* out, const float* in, std::int64_t n,
                                      cudaStream_t stream);
// Exact.
[[nodiscard]] absl::Status Bf16ToFp32(float* out, const bf16* in, std::int64_t n,
                                      cudaStream_t stream);

// ---- Causal self-attention ----------------------------------------------------------------
//
// The flash kernel of examples/common/cuda/flash_attention.h (shared with the Llama) on the
// GPT's fused QKV layout: qkv (B,T,3C) holds q | k | v, head h at channels [h*hs, (h+1)*hs) of
// each, so q, k, v are the column blocks [0,C), [C,2C), [2C,3C) of rows 3C apart, with as many
// kv heads as query heads (NKV = NH); out (B,T,C) is dense. Scores and probabilities never
// leave the kernel (nothing of size T x T anywhere); the forward saves lse, the backward
// recomputes the probabilities from it and needs dot(dout, out) per query (its workspace).

struct AttentionShape {
  int B = 0;
  int T = 0;
  int NH = 0;
  int hs = 0;  // C = NH * hs; the flash kernel's head sizes: 64 or 128
};

// The longest sequence the attention takes (the flash kernel's grid limit; the layer's 32-bit
// indexing, gpt_cuda_layer.h CheckLayerDims, bounds B * T * 4C further).
inline constexpr int kMaxAttentionT = examples::cuda::kFlashAttentionMaxT;

// The flash kernel's view of `shape` (row strides 3C for q, k, v; dense out).
examples::cuda::AttentionDims FlashDims(const AttentionShape& shape);
// Bytes of the `workspace` AttentionBackward needs: B * NH * T fp32 (the per-query
// dot(dout, out)); 0 for an invalid shape. Nothing in it outlives a call.
std::int64_t AttentionBackwardWorkspaceBytes(const AttentionShape& shape);

// out (B,T,C) = softmax(mask(q k^T / sqrt(hs))) v per head; lse (B,NH,T) = the log-sum-exp of
// each row of scaled, masked scores (natural log; what the backward needs to recompute the
// probabilities). Probabilities are rounded to bf16 before the PV product, as the cuBLAS path
// this replaces did. Errors: InvalidArgument naming the field for a bad shape (hs other than
// 64 or 128 among them) or null qkv; FlashAttentionForward's (alignment: 16 bytes for out and
// qkv, 4 for lse); Internal for a failed launch.
[[nodiscard]] absl::Status AttentionForward(bf16* out, float* lse, const bf16* qkv,
                                            const AttentionShape& shape, cudaStream_t stream);
// dqkv (B,T,3C) = the gradient of qkv (overwritten, every element) from dout (B,T,C), the
// forward's qkv, out and lse. `workspace`: AttentionBackwardWorkspaceBytes(shape) bytes of
// device memory, 4-byte aligned. Deterministic (fixed-order reductions, no atomics).
// Errors: as the forward (null dqkv among them).
[[nodiscard]] absl::Status AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                             const bf16* out, const float* lse, void* workspace,
                                             const AttentionShape& shape, cudaStream_t stream);

// ---- Softmax cross-entropy ----------------------------------------------------------------

// Per row of logits (N,V): lse[n] = log sum_v exp(logits[n,v]) and
// losses[n] = lse[n] - logits[n, targets[n]] (NaN when targets[n] is outside [0, V)).
[[nodiscard]] absl::Status SoftmaxCrossEntropyForward(float* losses, float* lse, const bf16* logits,
                                                      const std::int32_t* targets, int N, int V,
                                                      cudaStream_t stream);
// dlogits (N,V) = (softmax(logits) - onehot(target)) * dloss, the softmax recomputed as
// exp(logits - lse). dlogits may alias logits.
[[nodiscard]] absl::Status SoftmaxCrossEntropyBackward(bf16* dlogits, const bf16* logits,
                                                       const float* lse,
                                                       const std::int32_t* targets, float dloss,
                                                       int N, int V, cudaStream_t stream);

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_CUDA_H_
