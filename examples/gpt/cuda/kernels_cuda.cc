// The checked entry points of kernels_cuda.h (all but the attention, kernels_attention.cc):
// argument checks on the host, then the launchers of kernels_launch.h, whose errors become
// Internal naming the kernel.
#include "examples/gpt/cuda/kernels_cuda.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/kernels_args.h"
#include "examples/gpt/cuda/kernels_launch.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt::cuda {
using internal::ArgCheck;
using internal::Launched;

absl::Status EncoderForward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe,
                            int B, int T, int C, cudaStream_t stream) {
  ArgCheck check("EncoderForward");
  check.Positive("B", B).Positive("T", T).Channels("C", C).Rows("B * T", std::int64_t{B} * T);
  check.NotNull("out", out).NotNull("tokens", tokens).NotNull("wte", wte).NotNull("wpe", wpe);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("EncoderForward",
                  internal::LaunchEncoderForward(out, tokens, wte, wpe, B, T, C, stream));
}

absl::Status EncoderBackward(float* dwte, float* dwpe, const bf16* dout, const std::int32_t* tokens,
                             int B, int T, int C, cudaStream_t stream) {
  ArgCheck check("EncoderBackward");
  check.Positive("B", B).Positive("T", T).Channels("C", C).Rows("B * T", std::int64_t{B} * T);
  check.NotNull("dwte", dwte).NotNull("dwpe", dwpe).NotNull("dout", dout);
  check.NotNull("tokens", tokens);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("EncoderBackward",
                  internal::LaunchEncoderBackward(dwte, dwpe, dout, tokens, B, T, C, stream));
}

absl::Status LayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w,
                              const bf16* b, int N, int C, cudaStream_t stream) {
  ArgCheck check("LayerNormForward");
  check.Rows("N", N).Channels("C", C);
  check.NotNull("out", out).NotNull("mean", mean).NotNull("rstd", rstd).NotNull("inp", inp);
  check.NotNull("w", w).NotNull("b", b);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("LayerNormForward",
                  internal::LaunchLayerNormForward(out, mean, rstd, inp, w, b, N, C, stream));
}

absl::Status LayerNormApply(bf16* out, const bf16* inp, const bf16* w, const bf16* b,
                            const float* mean, const float* rstd, int N, int C,
                            cudaStream_t stream) {
  ArgCheck check("LayerNormApply");
  check.Rows("N", N).Channels("C", C);
  check.NotNull("out", out).NotNull("inp", inp).NotNull("w", w).NotNull("b", b);
  check.NotNull("mean", mean).NotNull("rstd", rstd);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("LayerNormApply",
                  internal::LaunchLayerNormApply(out, inp, w, b, mean, rstd, N, C, stream));
}

absl::Status LayerNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* w,
                                    const float* mean, const float* rstd, int N, int C,
                                    cudaStream_t stream) {
  ArgCheck check("LayerNormBackwardInput");
  check.Rows("N", N).Channels("C", C);
  check.NotNull("dinp", dinp).NotNull("dout", dout).NotNull("inp", inp).NotNull("w", w);
  check.NotNull("mean", mean).NotNull("rstd", rstd);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("LayerNormBackwardInput", internal::LaunchLayerNormBackwardInput(
                                                dinp, dout, inp, w, mean, rstd, N, C, stream));
}

std::int64_t LayerNormWeightScratchFloats(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return internal::ColumnSumChunks(N) * 2 * std::int64_t{C};
}

absl::Status LayerNormBackwardWeight(float* dw, float* db, float* scratch, const bf16* dout,
                                     const bf16* inp, const float* mean, const float* rstd, int N,
                                     int C, cudaStream_t stream) {
  ArgCheck check("LayerNormBackwardWeight");
  check.Rows("N", N).Channels("C", C);
  check.NotNull("dw", dw).NotNull("db", db).NotNull("scratch", scratch).NotNull("dout", dout);
  check.NotNull("inp", inp).NotNull("mean", mean).NotNull("rstd", rstd);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("LayerNormBackwardWeight",
                  internal::LaunchLayerNormBackwardWeight(dw, db, scratch, dout, inp, mean, rstd, N,
                                                          C, stream));
}

std::int64_t BiasScratchFloats(int N, int OC) {
  if (N <= 0 || OC <= 0) return 0;
  return internal::ColumnSumChunks(N) * std::int64_t{OC};
}

absl::Status BiasBackward(float* dbias, float* scratch, const bf16* dout, int N, int OC,
                          cudaStream_t stream) {
  ArgCheck check("BiasBackward");
  check.Rows("N", N).Channels("OC", OC);
  check.NotNull("dbias", dbias).NotNull("scratch", scratch).NotNull("dout", dout);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("BiasBackward",
                  internal::LaunchBiasBackward(dbias, scratch, dout, N, OC, stream));
}

absl::Status GeluForward(bf16* out, const bf16* inp, std::int64_t n, cudaStream_t stream) {
  ArgCheck check("GeluForward");
  check.Count("n", n).NotNull("out", out).NotNull("inp", inp);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("GeluForward", internal::LaunchGeluForward(out, inp, n, stream));
}

absl::Status GeluBackward(bf16* dinp, const bf16* inp, const bf16* dout, std::int64_t n,
                          cudaStream_t stream) {
  ArgCheck check("GeluBackward");
  check.Count("n", n).NotNull("dinp", dinp).NotNull("inp", inp).NotNull("dout", dout);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("GeluBackward", internal::LaunchGeluBackward(dinp, inp, dout, n, stream));
}

absl::Status Add(bf16* out, const bf16* a, const bf16* b, std::int64_t n, cudaStream_t stream) {
  ArgCheck check("Add");
  check.Count("n", n).NotNull("out", out).NotNull("a", a).NotNull("b", b);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("Add", internal::LaunchAdd(out, a, b, n, stream));
}

absl::Status Fp32ToBf16(bf16* out, const float* in, std::int64_t n, cudaStream_t stream) {
  ArgCheck check("Fp32ToBf16");
  check.Count("n", n).NotNull("out", out).NotNull("in", in);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("Fp32ToBf16", internal::LaunchFp32ToBf16(out, in, n, stream));
}

absl::Status Bf16ToFp32(float* out, const bf16* in, std::int64_t n, cudaStream_t stream) {
  ArgCheck check("Bf16ToFp32");
  check.Count("n", n).NotNull("out", out).NotNull("in", in);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("Bf16ToFp32", internal::LaunchBf16ToFp32(out, in, n, stream));
}

absl::Status SoftmaxCrossEntropyForward(float* losses, float* lse, const bf16* logits,
                                        const std::int32_t* targets, int N, int V,
                                        cudaStream_t stream) {
  ArgCheck check("SoftmaxCrossEntropyForward");
  check.Rows("N", N).Channels("V", V);
  check.NotNull("losses", losses).NotNull("lse", lse).NotNull("logits", logits);
  check.NotNull("targets", targets);
  PO_RETURN_IF_ERROR(check.status());
  return Launched("SoftmaxCrossEntropyForward",
                  internal::LaunchCrossEntropyForward(losses, lse, logits, targets, N, V, stream));
}

absl::Status SoftmaxCrossEntropyBackward(bf16* dlogits, const bf16* logits, const float* lse,
                                         const std::int32_t* targets, float dloss, int N, int V,
                                         cudaStream_t stream) {
  ArgCheck check("SoftmaxCrossEntropyBackward");
  check.Rows("N", N).Channels("V", V);
  check.NotNull("dlogits", dlogits).NotNull("logits", logits).NotNull("lse", lse);
  check.NotNull("targets", targets);
  PO_RETURN_IF_ERROR(check.status());
  return Launched(
      "SoftmaxCrossEntropyBackward",
      internal::LaunchCrossEntropyBackward(dlogits, logits, lse, targets, dloss, N, V, stream));
}

}  // namespace pipeoffload::gpt::cuda
