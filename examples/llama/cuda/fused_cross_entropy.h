// Fused linear cross-entropy on the GPU (Liger's FLCE; reference/offload-systems.md 3.7): the
// loss of x W^T against targets and its gradients for x and W, without the (N, V) logits ever
// existing as a whole. The CUDA mirror of llama_kernels_cpu.h FusedLinearCrossEntropy.
//
// Per chunk of `chunk_rows` rows (ascending; the last may be shorter), all on one stream:
//   logits_c (rows, V) bf16 = x_c W^T            cuBLASLt (the GPT's Linear), fp32 accumulate
//   CrossEntropyRows, in place:                 per row, online over V in fp32:
//     lse = max + log(sum exp(l - max)), loss_n = lse - l[target]; the row becomes
//     g = (softmax - onehot(target)) * grad_scale (bf16)
//   dx_c (rows, H) = g_c W                       OVERWRITES those rows of dx
//   dW (V, H) fp32 += g_c^T x_c                  beta = 1, chunks in order
// so the workspace is one (chunk_rows, V) bf16 chunk. With chunk_rows = N it is the
// materialised-logits path (one GEMM each way over the whole (N, V) logits): the reference the
// benchmark compares against.
//
// Cost model (H200, V = 128256, H = 4096): every chunk's dW update reads and writes the whole
// (V, H) fp32 accumulator (4.2 GB, ~1 ms), whatever its rows; the GEMMs are compute-bound from
// a few hundred rows on. So the fewer chunks the faster, and the chunk should be as large as the
// memory budget allows (EvenChunkRows), not Liger's minimum (LigerChunkRows), which at
// N = 2048 makes 32 chunks.
//
// Deterministic: the Linear pins one algorithm per GEMM signature (no split-K atomics), the row
// kernel reduces in a fixed tree, and dW receives the chunks in ascending order.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_FUSED_CROSS_ENTROPY_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_FUSED_CROSS_ENTROPY_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "examples/gpt/cuda/linear.h"

namespace pipeoffload::llama::cuda {

using bf16 = __nv_bfloat16;

// Per row r of logits (rows, V), in place: losses[r] = lse - logits[r, targets[r]] (NaN when
// the target is outside [0, V)), then the row := (exp(l - lse) - onehot(target)) * grad_scale,
// rounded to bf16. lse in fp32: an online max and rescaled sum per thread, combined in a fixed
// butterfly. One block per row. Errors: InvalidArgument for bad sizes or null pointers.
[[nodiscard]] absl::Status CrossEntropyRows(bf16* logits, float* losses,
                                            const std::int32_t* targets, int rows, int V,
                                            float grad_scale, cudaStream_t stream);

// *result (one device double) = the sum of values[0, n) in double, in a fixed order (one block:
// strided per-thread sums, then a fixed tree). Errors: InvalidArgument for n < 1 or nulls.
[[nodiscard]] absl::Status SumToDouble(double* result, const float* values, int n,
                                       cudaStream_t stream);

struct FusedCrossEntropyDims {
  int N = 0;           // rows of x (tokens)
  int H = 0;           // x (N, H), W (V, H); a multiple of 8
  int V = 0;           // vocabulary; a multiple of 8 (cuBLASLt's 16-byte rows)
  int chunk_rows = 0;  // in [1, N]
};

// Liger's rule: inc = ceil(V / H), chunk = next_pow2(ceil(N / inc)) rows (so a chunk has about
// as many elements as x), at most N. V = 128256, H = 4096: 64 rows at N = 2048, 512 at 16384.
int LigerChunkRows(int N, int H, int V);
// The fewest equal chunks whose (rows, V) bf16 logits fit `max_chunk_bytes`: rows =
// ceil(N / chunks) rounded up to a multiple of 8 (the last chunk takes the rest), at least 1 and
// at most N. With max_chunk_bytes >= N * V * 2, N (one chunk: the materialised path).
int EvenChunkRows(int N, int V, std::int64_t max_chunk_bytes);

// Bytes of workspace FusedLinearCrossEntropy needs: the (chunk_rows, V) bf16 chunk, rounded up
// to 256. 0 for invalid dims.
std::int64_t FusedCrossEntropyWorkspaceBytes(const FusedCrossEntropyDims& dims);

// The fused loss and gradients (see the file comment): losses (N) fp32 per row, dx (N, H) bf16
// OVERWRITTEN with the gradient of grad_scale * sum_n loss_n, dweight (V, H) fp32 += that
// objective's W gradient. x (N, H), weight (V, H) bf16, targets (N) in [0, V).
// REQUIRES: `linear` launches on `stream` (the GEMMs and the kernels are ordered by it); the
// workspace (FusedCrossEntropyWorkspaceBytes) is not used by anything else meanwhile.
// Errors: InvalidArgument for bad dims or null pointers (nothing enqueued); the Linear's and
// kernels' errors otherwise.
[[nodiscard]] absl::Status FusedLinearCrossEntropy(gpt::cuda::Linear& linear, bf16* dx,
                                                   float* dweight, float* losses, void* workspace,
                                                   const bf16* x, const bf16* weight,
                                                   const std::int32_t* targets,
                                                   const FusedCrossEntropyDims& dims,
                                                   float grad_scale, cudaStream_t stream);

}  // namespace pipeoffload::llama::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_FUSED_CROSS_ENTROPY_H_
