// The checked entry points of llama_cuda_kernels.h: argument checks on the host (the GPT's
// ArgCheck), then the launchers of llama_cuda_launch.h, whose errors become Internal naming the
// kernel. Also the host-side tables: the RoPE cos / sin table and the token row index.
#include "examples/llama/cuda/llama_cuda_kernels.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/kernels_args.h"
#include "examples/llama/cuda/llama_cuda_launch.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama::cuda {
namespace {

using gpt::cuda::internal::ArgCheck;
using gpt::cuda::internal::Launched;

// Shape checks every RMSNorm entry point shares; the resolved segments on success.
internal::NormSegments CheckNorm(ArgCheck& check, const RmsNormShape& shape) {
  check.Rows("rows", shape.rows).Positive("heads", shape.heads).Channels("C", shape.C);
  const std::int64_t row = std::int64_t{shape.heads} * shape.C;
  const std::int64_t stride = shape.row_stride == 0 ? row : shape.row_stride;
  check.Require(stride >= row, absl::StrCat("row_stride = ", shape.row_stride,
                                            " is shorter than heads * C = ", row));
  check.Require(shape.segments() <= INT64_MAX / 1024, "too many segments");
  internal::NormSegments s;
  s.segments = shape.segments();
  s.heads = shape.heads;
  s.C = shape.C;
  s.row_stride = stride;
  return s;
}

// Checks of the RoPE entry points.
void CheckRope(ArgCheck& check, const void* x, const float* cos_sin, int N, int T, int heads,
               int hd, std::int64_t row_stride) {
  check.Rows("N", N).Positive("T", T).Positive("heads", heads).Channels("hd", hd);
  check.Require(hd % 2 == 0, absl::StrCat("hd = ", hd, " must be even (rotary pairs)"));
  check.Require(row_stride == 0 || row_stride >= std::int64_t{heads} * hd,
                absl::StrCat("row_stride = ", row_stride,
                             " is shorter than heads * hd = ", std::int64_t{heads} * hd));
  check.NotNull("x", x).NotNull("cos_sin", cos_sin);
}

}  // namespace

absl::Status RmsNormForward(bf16* out, float* rstd, const bf16* inp, const bf16* weight,
                            const RmsNormShape& shape, float eps, cudaStream_t stream) {
  ArgCheck check("RmsNormForward");
  const internal::NormSegments s = CheckNorm(check, shape);
  check.Require(std::isfinite(eps) && eps > 0.0f, absl::StrCat("eps = ", eps, " must be > 0"));
  check.NotNull("out", out).NotNull("rstd", rstd).NotNull("inp", inp).NotNull("weight", weight);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("RmsNormForward",
                  internal::LaunchRmsNormForward(out, rstd, inp, weight, s, eps, stream));
}

absl::Status RmsNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* residual,
                                  const bf16* inp, const bf16* weight, const float* rstd,
                                  const RmsNormShape& shape, cudaStream_t stream) {
  ArgCheck check("RmsNormBackwardInput");
  const internal::NormSegments s = CheckNorm(check, shape);
  check.NotNull("dinp", dinp).NotNull("dout", dout).NotNull("inp", inp);
  check.NotNull("weight", weight).NotNull("rstd", rstd);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("RmsNormBackwardInput", internal::LaunchRmsNormBackwardInput(
                                              dinp, dout, residual, inp, weight, rstd, s, stream));
}

int RmsNormRowsPerChunk(std::int64_t segments) {
  constexpr std::int64_t kMinRows = 256;
  constexpr std::int64_t kMaxChunks = 256;
  constexpr std::int64_t kLanes = 16;  // a multiple of every block's lane count
  std::int64_t rows = std::max(kMinRows, (segments + kMaxChunks - 1) / kMaxChunks);
  rows = (rows + kLanes - 1) / kLanes * kLanes;
  return static_cast<int>(std::min<std::int64_t>(rows, std::int64_t{1} << 30));
}

std::int64_t RmsNormWeightScratchFloats(const RmsNormShape& shape) {
  if (shape.rows <= 0 || shape.heads <= 0 || shape.C <= 0) return 0;
  const std::int64_t rows = RmsNormRowsPerChunk(shape.segments());
  return (shape.segments() + rows - 1) / rows * shape.C;
}

absl::Status RmsNormBackwardWeight(float* dweight, float* scratch, const bf16* dout,
                                   const bf16* inp, const float* rstd, const RmsNormShape& shape,
                                   cudaStream_t stream) {
  ArgCheck check("RmsNormBackwardWeight");
  const internal::NormSegments s = CheckNorm(check, shape);
  check.NotNull("dweight", dweight).NotNull("scratch", scratch).NotNull("dout", dout);
  check.NotNull("inp", inp).NotNull("rstd", rstd);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("RmsNormBackwardWeight",
                  internal::LaunchRmsNormBackwardWeight(dweight, scratch, dout, inp, rstd, s,
                                                        RmsNormRowsPerChunk(s.segments), stream));
}

std::vector<float> RopeCosSinTable(const float* inv_freq, int T, int hd) {
  PO_CHECK(T >= 1 && hd >= 2 && hd % 2 == 0 && inv_freq != nullptr);
  const int half = hd / 2;
  std::vector<float> table(static_cast<std::size_t>(T) * half * 2);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      // The CPU's RopeTables (llama_kernels_cpu.cc): angle, cos and sin in double, rounded once.
      const double angle = static_cast<double>(t) * static_cast<double>(inv_freq[i]);
      const std::size_t at = (static_cast<std::size_t>(t) * half + i) * 2;
      table[at] = static_cast<float>(std::cos(angle));
      table[at + 1] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

absl::Status RopeForward(bf16* x, const float* cos_sin, int N, int T, int heads, int hd,
                         std::int64_t row_stride, cudaStream_t stream) {
  ArgCheck check("RopeForward");
  CheckRope(check, x, cos_sin, N, T, heads, hd, row_stride);
  PO_RETURN_IF_ERROR(check.status());
  const std::int64_t stride = row_stride == 0 ? std::int64_t{heads} * hd : row_stride;
  return Launched("RopeForward", internal::LaunchRope(x, cos_sin, N, T, heads, hd, stride,
                                                      /*transpose=*/false, stream));
}

absl::Status RopeBackward(bf16* dx, const float* cos_sin, int N, int T, int heads, int hd,
                          std::int64_t row_stride, cudaStream_t stream) {
  ArgCheck check("RopeBackward");
  CheckRope(check, dx, cos_sin, N, T, heads, hd, row_stride);
  PO_RETURN_IF_ERROR(check.status());
  const std::int64_t stride = row_stride == 0 ? std::int64_t{heads} * hd : row_stride;
  return Launched("RopeBackward", internal::LaunchRope(dx, cos_sin, N, T, heads, hd, stride,
                                                       /*transpose=*/true, stream));
}

absl::Status SwiGluForward(bf16* out, const bf16* gate_up, std::int64_t N, int F,
                           cudaStream_t stream) {
  ArgCheck check("SwiGluForward");
  check.Rows("N", N).Channels("F", F).NotNull("out", out).NotNull("gate_up", gate_up);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("SwiGluForward", internal::LaunchSwiGluForward(out, gate_up, N, F, stream));
}

absl::Status SwiGluBackward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, std::int64_t N,
                            int F, cudaStream_t stream) {
  ArgCheck check("SwiGluBackward");
  check.Rows("N", N).Channels("F", F).NotNull("dgate_up", dgate_up).NotNull("dout", dout);
  check.NotNull("gate_up", gate_up);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("SwiGluBackward",
                  internal::LaunchSwiGluBackward(dgate_up, dout, gate_up, N, F, stream));
}

absl::Status EmbeddingForward(bf16* out, const std::int32_t* tokens, const bf16* table, int N,
                              int H, cudaStream_t stream) {
  ArgCheck check("EmbeddingForward");
  check.Rows("N", N).Channels("H", H).NotNull("out", out).NotNull("tokens", tokens);
  check.NotNull("table", table);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("EmbeddingForward",
                  internal::LaunchEmbeddingForward(out, tokens, table, N, H, stream));
}

TokenRowIndex BuildTokenRowIndex(const std::int32_t* tokens, int N) {
  PO_CHECK(N >= 1 && tokens != nullptr);
  std::vector<std::int32_t> rows(static_cast<std::size_t>(N));
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(),
                   [tokens](std::int32_t a, std::int32_t b) { return tokens[a] < tokens[b]; });
  std::vector<std::int32_t> starts;
  std::vector<std::int32_t> distinct;
  for (int j = 0; j < N; ++j) {
    const std::int32_t token = tokens[rows[static_cast<std::size_t>(j)]];
    PO_CHECK(token >= 0);
    if (distinct.empty() || distinct.back() != token) {
      starts.push_back(j);
      distinct.push_back(token);
    }
  }
  starts.push_back(N);
  TokenRowIndex index;
  index.segments = static_cast<int>(distinct.size());
  index.ints = std::move(rows);
  index.ints.insert(index.ints.end(), starts.begin(), starts.end());
  index.ints.insert(index.ints.end(), distinct.begin(), distinct.end());
  return index;
}

absl::Status EmbeddingBackward(float* dtable, const bf16* dout, const std::int32_t* index,
                               int segments, int N, int H, cudaStream_t stream) {
  ArgCheck check("EmbeddingBackward");
  check.Rows("N", N).Channels("H", H).Range("segments", segments, 1, N);
  check.NotNull("dtable", dtable).NotNull("dout", dout).NotNull("index", index);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("EmbeddingBackward",
                  internal::LaunchEmbeddingBackward(dtable, dout, index, segments, N, H, stream));
}

}  // namespace pipeoffload::llama::cuda
