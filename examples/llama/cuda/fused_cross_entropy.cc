// The fused linear cross-entropy's driver (fused_cross_entropy.h): chunk sizing, argument
// checks, and the per-chunk sequence of three GEMMs around the row kernel. Everything is
// enqueued on one stream; nothing here synchronizes or allocates.
#include "examples/llama/cuda/fused_cross_entropy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/gpt/cuda/kernels_args.h"
#include "examples/llama/cuda/llama_cuda_launch.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama::cuda {
namespace {

using gpt::cuda::internal::ArgCheck;
using gpt::cuda::internal::Launched;

void CheckDims(ArgCheck& check, const FusedCrossEntropyDims& d) {
  check.Rows("N", d.N).Channels("H", d.H).Channels("V", d.V).Range("chunk_rows", d.chunk_rows, 1,
                                                                   d.N);
  check.Require(d.H % 8 == 0 && d.V % 8 == 0,
                absl::StrCat("H = ", d.H, " and V = ", d.V,
                             " must be multiples of 8 (cuBLASLt's 16-byte bf16 rows)"));
}

}  // namespace

absl::Status CrossEntropyRows(bf16* logits, float* losses, const std::int32_t* targets, int rows,
                              int V, float grad_scale, cudaStream_t stream) {
  ArgCheck check("CrossEntropyRows");
  check.Rows("rows", rows).Channels("V", V).NotNull("logits", logits).NotNull("losses", losses);
  check.NotNull("targets", targets);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("CrossEntropyRows", internal::LaunchCrossEntropyRows(
                                          logits, losses, targets, rows, V, grad_scale, stream));
}

absl::Status SumToDouble(double* result, const float* values, int n, cudaStream_t stream) {
  ArgCheck check("SumToDouble");
  check.Rows("n", n).NotNull("result", result).NotNull("values", values);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("SumToDouble", internal::LaunchSumToDouble(result, values, n, stream));
}

int LigerChunkRows(int N, int H, int V) {
  if (N <= 0 || H <= 0 || V <= 0) return 1;
  const std::int64_t inc = (std::int64_t{V} + H - 1) / H;
  const std::int64_t rows = (N + inc - 1) / inc;
  std::int64_t pow2 = 1;
  while (pow2 < rows) pow2 *= 2;
  return static_cast<int>(std::min<std::int64_t>(pow2, N));
}

int EvenChunkRows(int N, int V, std::int64_t max_chunk_bytes) {
  if (N <= 0 || V <= 0) return 1;
  const std::int64_t row_bytes = std::int64_t{V} * 2;
  const std::int64_t fit = std::max<std::int64_t>(1, max_chunk_bytes / row_bytes);
  if (fit >= N) return N;
  // The fewest chunks of at most `fit` rows, then equal rows rounded up to a multiple of 8 while
  // that still fits (the last chunk takes the rest).
  const std::int64_t chunks = (N + fit - 1) / fit;
  std::int64_t rows = (N + chunks - 1) / chunks;
  const std::int64_t rounded = (rows + 7) / 8 * 8;
  if (rounded <= fit) rows = rounded;
  return static_cast<int>(std::min<std::int64_t>(rows, N));
}

std::int64_t FusedCrossEntropyWorkspaceBytes(const FusedCrossEntropyDims& d) {
  if (d.N <= 0 || d.V <= 0 || d.chunk_rows <= 0 || d.chunk_rows > d.N) return 0;
  return gpt::cuda::AlignSlot(std::int64_t{d.chunk_rows} * d.V * 2);
}

absl::Status FusedLinearCrossEntropy(gpt::cuda::Linear& linear, bf16* dx, float* dweight,
                                     float* losses, void* workspace, const bf16* x,
                                     const bf16* weight, const std::int32_t* targets,
                                     const FusedCrossEntropyDims& d, float grad_scale,
                                     cudaStream_t stream) {
  ArgCheck check("FusedLinearCrossEntropy");
  CheckDims(check, d);
  check.NotNull("dx", dx).NotNull("dweight", dweight).NotNull("losses", losses);
  check.NotNull("workspace", workspace).NotNull("x", x).NotNull("weight", weight);
  check.NotNull("targets", targets);
  PO_RETURN_IF_ERROR(check.status());
  bf16* chunk = static_cast<bf16*>(workspace);  // (rows, V): logits, then their gradient
  for (int r0 = 0; r0 < d.N; r0 += d.chunk_rows) {
    const int rows = std::min(d.chunk_rows, d.N - r0);
    const std::int64_t at = std::int64_t{r0} * d.H;
    const gpt::cuda::LinearDims dims{.N = rows, .IC = d.H, .OC = d.V};
    PO_RETURN_IF_ERROR(linear.Forward(chunk, x + at, weight, nullptr, nullptr, nullptr, dims));
    PO_RETURN_IF_ERROR(
        CrossEntropyRows(chunk, losses + r0, targets + r0, rows, d.V, grad_scale, stream));
    PO_RETURN_IF_ERROR(linear.BackwardInput(dx + at, chunk, weight, nullptr, dims));
    PO_RETURN_IF_ERROR(linear.BackwardWeight(dweight, chunk, x + at, dims));
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::llama::cuda
