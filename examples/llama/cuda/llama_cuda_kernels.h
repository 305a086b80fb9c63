// The Llama model's CUDA kernels (bf16 activations, fp32 statistics, accumulation and parameter
// gradients): the CUDA mirror of examples/llama/llama_kernels_cpu.h minus the attention
// (flash_attention.h), the linear layers (the GPT's cuBLASLt Linear, examples/gpt/cuda/
// linear.h) and the fused cross-entropy (fused_cross_entropy.h).
//
// Conventions, as the GPT's kernels (examples/gpt/cuda/kernels_cuda.h):
// - Every function only enqueues work on `stream` (never synchronizes or allocates) and returns
//   InvalidArgument for bad sizes or null pointers (checked on the host, before anything is
//   enqueued), Internal naming the kernel and CUDA's error when a launch fails.
// - Shapes as llama_kernels_cpu.h: N = B * T rows (row n at position t = n % T), H hidden, hd
//   head dim, F the SwiGLU width, V vocab. Row-major.
// - Deterministic: no float atomics; every reduction has an order fixed by the sizes alone, so
//   the same inputs give the same bits on every run. Accumulating functions ("+=") add one
//   call's contribution to what is there.
// - Any alignment works: 128-bit accesses when every pointer is 16-byte aligned and every row
//   length / stride a multiple of 8, a scalar path otherwise, with the same bits (each thread
//   sees the same elements in the same order with the same explicitly rounded arithmetic).
// - Elementwise arithmetic is rounded per operation (__fmul_rn, __fadd_rn, ...) in the CPU's
//   order, so where the CPU's fp32 result is rounded once to bf16 (RoPE) the GPU gives exactly
//   that bf16 value; reductions differ from the CPU's (double, sequential) by fp32 rounding.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_KERNELS_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_KERNELS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace pipeoffload::llama::cuda {

using bf16 = __nv_bfloat16;

// ---- RMSNorm (llama_kernels_cpu.h RmsNormForward / Backward) --------------------------------
// The rows of a call are cut into `heads` consecutive segments of C elements each, normalized
// independently: heads = 1, C = H for the layer norms; heads = NH (or NKV), C = hd for qk_norm
// on the q (or k) columns of the fused QKV buffer. Segment s = n * heads + h starts at element
// n * row_stride + h * C of every tensor of the call; statistics are indexed by s.
struct RmsNormShape {
  int rows = 0;   // N
  int heads = 1;  // segments per row
  int C = 0;      // elements per segment (the weight's length)
  // Elements between consecutive rows of every (N, ...) tensor of the call; 0: heads * C.
  std::int64_t row_stride = 0;
  std::int64_t segments() const { return std::int64_t{rows} * heads; }
};

// Per segment x: rstd[s] = 1 / sqrt(mean(x^2) + eps) (sum of squares in fp32, fixed tree),
// out = (x * rstd) * weight (C), rounded once to bf16. rstd: segments() floats. out may alias
// inp (in place).
[[nodiscard]] absl::Status RmsNormForward(bf16* out, float* rstd, const bf16* inp,
                                          const bf16* weight, const RmsNormShape& shape, float eps,
                                          cudaStream_t stream);
// dinp = [residual +] the RMSNorm's input gradient from dout, rstd saved by the forward:
//   coef = mean(w dy x) * r * r;  dinp = (w dy - x coef) * r  (+ residual, in fp32, one rounding)
// OVERWRITES dinp (the CPU's RmsNormBackward plus, with residual not null, the residual
// branch's gradient, e.g. the layer's output gradient). dinp may alias dout or residual.
[[nodiscard]] absl::Status RmsNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* residual,
                                                const bf16* inp, const bf16* weight,
                                                const float* rstd, const RmsNormShape& shape,
                                                cudaStream_t stream);
// Segments per chunk of RmsNormBackwardWeight's first pass: at least 256, and enough that there
// are at most 256 chunks (so the second pass, one fixed-order sum per column, stays short).
int RmsNormRowsPerChunk(std::int64_t segments);
// Floats of scratch RmsNormBackwardWeight needs: one partial per chunk and column.
std::int64_t RmsNormWeightScratchFloats(const RmsNormShape& shape);
// dweight (C) += sum over segments of dout * (x * rstd): each chunk's partial, summed in a fixed
// order, into scratch, then the chunks in order (two kernels, no atomics). scratch:
// RmsNormWeightScratchFloats(shape) floats, clobbered.
[[nodiscard]] absl::Status RmsNormBackwardWeight(float* dweight, float* scratch, const bf16* dout,
                                                 const bf16* inp, const float* rstd,
                                                 const RmsNormShape& shape, cudaStream_t stream);

// ---- Rotary embeddings (llama_kernels_cpu.h RopeForward / Backward) -------------------------
// The (T, hd/2) cos / sin table, interleaved (cos, sin) per (t, i): the angle t * inv_freq[i] in
// double, cos and sin in double, rounded once to float, exactly the CPU's RopeTables, so the
// device rotates by the very floats the CPU does. 2 * T * (hd/2) floats. REQUIRES: T >= 1,
// hd even, inv_freq holds hd/2 floats.
std::vector<float> RopeCosSinTable(const float* inv_freq, int T, int hd);

// In place on `heads` consecutive heads of hd elements starting at x in every row (row n at
// x + n * row_stride; 0: heads * hd), position t = n % T, rotate_half convention:
//   x'[i] = x[i] c - x[i + hd/2] s,  x'[i + hd/2] = x[i + hd/2] c + x[i] s
// in fp32 with the CPU's roundings, then once to bf16: the bf16 rounding of the CPU's fp32
// result on the same inputs. For the fused QKV buffer, q and k are one call (NH + NKV heads from
// column 0, row_stride (NH + 2 NKV) hd). cos_sin: RopeCosSinTable's T * hd floats on the device.
[[nodiscard]] absl::Status RopeForward(bf16* x, const float* cos_sin, int N, int T, int heads,
                                       int hd, std::int64_t row_stride, cudaStream_t stream);
// The transposed rotation (angle -t * inv_freq) in place on the gradient dx, same layout.
[[nodiscard]] absl::Status RopeBackward(bf16* dx, const float* cos_sin, int N, int T, int heads,
                                        int hd, std::int64_t row_stride, cudaStream_t stream);

// ---- SwiGLU (llama_kernels_cpu.h SwiGluForward / Backward) ----------------------------------
// gate_up (N, 2F): gate = [:, 0:F), up = [:, F:2F); out (N, F) = silu(gate) * up.
[[nodiscard]] absl::Status SwiGluForward(bf16* out, const bf16* gate_up, std::int64_t N, int F,
                                         cudaStream_t stream);
// dgate_up (N, 2F) OVERWRITTEN: dgate = (dout * up) * silu'(gate), dup = dout * silu(gate).
// dgate_up may alias gate_up (each element is read before it is written, by one thread).
[[nodiscard]] absl::Status SwiGluBackward(bf16* dgate_up, const bf16* dout, const bf16* gate_up,
                                          std::int64_t N, int F, cudaStream_t stream);

// ---- Embedding (llama_kernels_cpu.h EmbeddingForward / Backward) ----------------------------
// out (N, H) = table[tokens[n], :] (a copy). tokens: N device ints in [0, V) (not checked on the
// device: an id out of range reads out of bounds; TokenData::CheckCompatible guards the data).
[[nodiscard]] absl::Status EmbeddingForward(bf16* out, const std::int32_t* tokens,
                                            const bf16* table, int N, int H, cudaStream_t stream);

// The rows of a microbatch grouped by token, built on the host from the tokens (known when the
// step begins), so the backward can add each token's rows in ascending order without atomics
// and without sorting on the device. As one int32 array (what the device holds):
//   [0, N)               rows sorted by token, ascending row within a token (a stable sort)
//   [N, N + U + 1)       starts: token u's rows are rows[starts[u], starts[u + 1])
//   [N + U + 1, N + 2U + 1)  the U distinct tokens, ascending
// Sized for the worst case (U = N): TokenRowIndexInts(N) ints; `segments` = U.
struct TokenRowIndex {
  std::vector<std::int32_t> ints;
  int segments = 0;  // U
};
inline std::int64_t TokenRowIndexInts(int N) { return 3 * std::int64_t{N} + 1; }
// REQUIRES: tokens holds N ids, each >= 0.
TokenRowIndex BuildTokenRowIndex(const std::int32_t* tokens, int N);

// dtable (V, H) fp32 += dout (N, H) rows scattered by token, each table row receiving its rows'
// contributions in ascending row order (the CPU's order: bitwise the CPU's sums of the same
// bf16 values). index: the device copy of BuildTokenRowIndex(tokens, N).ints, segments its U.
[[nodiscard]] absl::Status EmbeddingBackward(float* dtable, const bf16* dout,
                                             const std::int32_t* index, int segments, int N, int H,
                                             cudaStream_t stream);

}  // namespace pipeoffload::llama::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_KERNELS_H_
