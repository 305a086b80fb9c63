// Lean saved activations (LayerDims::lean_saved, gpt_cuda_layer.h) against the full layout, one
// layer at h = 256 and 1024 on the same random weights, input and output gradient:
//  - forward output, every saved slot both layouts hold, the input gradient and the output
//    gradients B leaves for W: bitwise equal;
//  - the LayerNorm outputs recomputed for W (LayerNormApply): bitwise equal to what forward
//    wrote; gelu(fch) recomputed by GeluForward: within the bound below of forward's (bitwise
//    when cuBLASLt offered no GELU epilogue, so forward ran the same kernel), the measured
//    difference printed;
//  - weight gradients: bitwise equal except the fc-proj weight's, which reads g (relative error
//    printed, within kFcProjTolerance);
//  - the weight backward really recomputes: the lean scratch is poisoned (NaN) between B and W.
// The lean layer against the CPU fp32 model, and split vs unsplit backward, run in
// gpt_cuda_layer_test.cc (parametrised on lean); the lean stack under the executor, in
// gpt_cuda_pipeline_test.cc.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "examples/gpt/cuda/gpt_cuda_layer.h"
#include "pipeoffload/cuda_stream.h"
#include "tests/gpt_cuda/gpt_cuda_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

using model_testing::BitwiseEqual;
using model_testing::CopyToDevice;
using model_testing::CopyToHost;
using model_testing::DeviceBytes;
using model_testing::DownloadBf16;
using model_testing::FillDevice;
using model_testing::RandomBf16Values;
using model_testing::RelativeError;
using model_testing::Report;
using model_testing::ToBf16Bits;
using model_testing::ValueOrFail;

// g = gelu(fch): forward's fused epilogue applies the GELU to the fp32 accumulator, the recompute
// to fch rounded to bf16 (2^-9 relative), and |gelu'| <= 1.13; each result is rounded to bf16
// (2^-9 of |g| each), and the epilogue's tanh may be an approximation (~2^-11 relative). Per
// element: |g_recomputed - g_forward| <= 2^-7 (|fch| + |g_forward|), twice that sum of terms.
constexpr double kGeluBound = 1.0 / 128;
// The fc-proj weight gradient (dout^T g) inherits g's relative error: where the epilogue is
// fused, roughly every other element of g is one bf16 ulp off (2^-8..2^-7 relative), about
// 2e-3 relative overall, independent across rows; 1e-2 keeps a margin of 5 and stays at half
// the CPU comparison's 2e-2.
constexpr double kFcProjTolerance = 1e-2;
constexpr int kFcProjWeight = 10;  // index in LayerTensorSet order

// The 12 tensors of one layer (LayerTensorSet order) at 256-byte aligned offsets of one buffer.
struct TensorTable {
  std::vector<std::int64_t> count;
  std::vector<std::int64_t> offset;  // in elements
  std::int64_t total = 0;
  explicit TensorTable(std::int64_t C) {
    count = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    for (const std::int64_t n : count) {
      offset.push_back(total);
      total += (n + 127) / 128 * 128;  // 256 bytes of bf16, 512 of fp32: aligned either way
    }
  }
  template <typename T>
  LayerTensorSet<T> At(T* base) const {
    auto p = [&](int k) { return base + offset[static_cast<std::size_t>(k)]; };
    return LayerTensorSet<T>{p(0), p(1), p(2), p(3), p(4), p(5),
                             p(6), p(7), p(8), p(9), p(10), p(11)};
  }
};

// What one layer's forward, backward-input and backward-weight produced.
struct LayerRun {
  std::vector<float> out, dinp;
  std::vector<std::vector<float>> saved_common;  // x, qkv, atty, res2, fch (bf16 widened)
  std::vector<std::vector<float>> stats;         // ln1 mean, rstd, lse, ln2 mean, rstd (fp32)
  std::vector<std::vector<float>> grads_for_w;   // d_fch, d_ln2out, dres2, d_qkv, d_ln1out
  std::vector<float> ln1, ln2, g;                // as forward wrote them
  std::vector<float> ln1_recomputed, ln2_recomputed, g_recomputed;  // lean only
  std::vector<std::vector<float>> dw;            // 12 tensors
};

std::vector<float> DownloadF32(const void* device, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  CopyToHost(out.data(), device, n * 4);
  return out;
}

LayerRun RunLayer(const LayerDims& dims, const std::vector<float>& weights,
                  const std::vector<float>& x, const std::vector<float>& dout) {
  auto backend = testing::NewCudaBackend();
  cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
  auto context = ValueOrFail(GptCudaContext::Create(dims, 0, stream));
  const std::int64_t n = dims.N();
  const std::int64_t nc = n * dims.C;
  const TensorTable table(dims.C);
  DeviceBytes w_dev(table.total * 2), dw_dev(table.total * 4);
  const std::vector<std::uint16_t> w_bits = ToBf16Bits(weights);
  CopyToDevice(w_dev.data(), w_bits.data(), table.total * 2);
  dw_dev.Zero();
  const LayerWeights w = table.At(static_cast<const bf16*>(w_dev.data()));
  const LayerWeightGrads dw = table.At(static_cast<float*>(dw_dev.data()));

  const LayerSavedLayout layout = MakeLayerSavedLayout(dims);
  const LayerGradLayout grad_layout = MakeLayerGradLayout(dims);
  DeviceBytes saved(layout.bytes), grads(grad_layout.bytes), dout_dev(nc * 2), out_dev(nc * 2),
      dinp_dev(nc * 2);
  const LayerActivations a = LayerActivationsAt(saved.bytes_ptr(), layout);
  REQUIRE((a.ln1_out == nullptr) == dims.lean_saved);
  REQUIRE((a.ln2_out == nullptr) == dims.lean_saved);
  REQUIRE((a.fch_gelu == nullptr) == dims.lean_saved);
  const std::vector<std::uint16_t> x_bits = ToBf16Bits(x);
  const std::vector<std::uint16_t> dout_bits = ToBf16Bits(dout);
  CopyToDevice(a.x, x_bits.data(), nc * 2);
  CopyToDevice(dout_dev.data(), dout_bits.data(), nc * 2);
  const LayerGradBuffers g =
      LayerGradBuffersAt(grads.bytes_ptr(), grad_layout, static_cast<const bf16*>(dout_dev.data()));

  PO_MODEL_TEST_OK(LayerForward(*context, w, a, static_cast<bf16*>(out_dev.data())));
  LayerRun run;
  run.out = DownloadBf16(out_dev.data(), nc);
  run.saved_common = {DownloadBf16(a.x, nc), DownloadBf16(a.qkv, 3 * nc),
                      DownloadBf16(a.atty, nc), DownloadBf16(a.res2, nc),
                      DownloadBf16(a.fch, 4 * nc)};
  run.stats = {DownloadF32(a.ln1_mean, n), DownloadF32(a.ln1_rstd, n),
               DownloadF32(a.lse, std::int64_t{dims.B} * dims.NH * dims.T),
               DownloadF32(a.ln2_mean, n), DownloadF32(a.ln2_rstd, n)};
  bf16* ln1 = dims.lean_saved ? context->lean_ln1_out() : a.ln1_out;
  bf16* ln2 = dims.lean_saved ? context->lean_ln2_out() : a.ln2_out;
  bf16* gelu = dims.lean_saved ? context->lean_fch_gelu() : a.fch_gelu;
  REQUIRE(ln1 != nullptr);
  REQUIRE(ln2 != nullptr);
  REQUIRE(gelu != nullptr);
  run.ln1 = DownloadBf16(ln1, nc);
  run.ln2 = DownloadBf16(ln2, nc);
  run.g = DownloadBf16(gelu, 4 * nc);
  if (dims.lean_saved) {
    // Poison what forward left in the scratch: the recompute must write every element.
    FillDevice(ln1, nc * 2, 0xFF);
    FillDevice(ln2, nc * 2, 0xFF);
    FillDevice(gelu, 4 * nc * 2, 0xFF);
    const LayerActivations r = ValueOrFail(RecomputeLeanActivations(*context, w, a));
    CHECK(r.ln1_out == ln1);
    CHECK(r.ln2_out == ln2);
    CHECK(r.fch_gelu == gelu);
    CHECK(r.qkv == a.qkv);
    run.ln1_recomputed = DownloadBf16(ln1, nc);
    run.ln2_recomputed = DownloadBf16(ln2, nc);
    run.g_recomputed = DownloadBf16(gelu, 4 * nc);
  }

  PO_MODEL_TEST_OK(LayerBackwardInput(*context, w, a, g, static_cast<bf16*>(dinp_dev.data())));
  run.dinp = DownloadBf16(dinp_dev.data(), nc);
  run.grads_for_w = {DownloadBf16(g.d_fch, 4 * nc), DownloadBf16(g.d_ln2out, nc),
                     DownloadBf16(g.dres2, nc), DownloadBf16(g.d_qkv, 3 * nc),
                     DownloadBf16(g.d_ln1out, nc)};
  if (dims.lean_saved) {
    // W must recompute for itself: NaN here would poison every weight gradient that reads it.
    FillDevice(ln1, nc * 2, 0xFF);
    FillDevice(ln2, nc * 2, 0xFF);
    FillDevice(gelu, 4 * nc * 2, 0xFF);
  }
  PO_MODEL_TEST_OK(LayerBackwardWeight(*context, w, dw, a, g));
  std::vector<float> all_dw = DownloadF32(dw_dev.data(), table.total);
  for (std::size_t k = 0; k < table.count.size(); ++k) {
    const auto begin = all_dw.begin() + table.offset[k];
    run.dw.emplace_back(begin, begin + table.count[k]);
  }
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  return run;
}

// Random weights of a plausible scale: LayerNorm weights near 1, small biases, matrices with
// std 0.05 (so fch spans the GELU's curved and flat parts).
std::vector<float> RandomWeights(std::int64_t C, std::uint32_t seed) {
  const TensorTable table(C);
  std::vector<float> all(static_cast<std::size_t>(table.total), 0.0f);
  for (std::size_t k = 0; k < table.count.size(); ++k) {
    const bool norm_weight = k == 0 || k == 6;
    const bool matrix = k == 2 || k == 4 || k == 8 || k == 10;
    const std::vector<float> values = RandomBf16Values(table.count[k], matrix ? 0.05f : 0.1f,
                                                       seed + static_cast<std::uint32_t>(k));
    for (std::size_t i = 0; i < values.size(); ++i) {
      all[static_cast<std::size_t>(table.offset[k]) + i] =
          norm_weight ? RoundToBf16(1.0f + values[i]) : values[i];
    }
  }
  return all;
}

bool AllFinite(const std::vector<float>& values) {
  for (const float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

TEST_CASE("Lean saved activations: bitwise the full layer's outputs and input gradients",
          "[gpt_cuda][gpt_cuda_lean]") {
  const int C = GENERATE(256, 1024);
  const LayerDims full_dims{2, 64, C, C / 64, false};
  LayerDims lean_dims = full_dims;
  lean_dims.lean_saved = true;
  CAPTURE(C);
  const std::int64_t nc = std::int64_t{full_dims.N()} * C;
  const std::vector<float> weights = RandomWeights(C, 100);
  const std::vector<float> x = RandomBf16Values(nc, 1.0f, 21);
  const std::vector<float> dout = RandomBf16Values(nc, 1.0f, 22);
  const LayerRun full = RunLayer(full_dims, weights, x, dout);
  const LayerRun lean = RunLayer(lean_dims, weights, x, dout);

  // Nothing unwritten (poisoned NaN) anywhere, so bitwise equality below is not NaN == NaN.
  REQUIRE(AllFinite(full.out));
  REQUIRE(AllFinite(full.dinp));
  for (const auto& t : full.dw) REQUIRE(AllFinite(t));
  for (const auto& t : lean.dw) REQUIRE(AllFinite(t));

  CHECK(BitwiseEqual(lean.out, full.out));
  CHECK(BitwiseEqual(lean.dinp, full.dinp));
  for (std::size_t k = 0; k < full.saved_common.size(); ++k) {
    INFO("saved bf16 slot " << k << " (x, qkv, atty, res2, fch)");
    CHECK(BitwiseEqual(lean.saved_common[k], full.saved_common[k]));
  }
  for (std::size_t k = 0; k < full.stats.size(); ++k) {
    INFO("saved fp32 slot " << k << " (ln1 mean, rstd, lse, ln2 mean, rstd)");
    CHECK(BitwiseEqual(lean.stats[k], full.stats[k]));
  }
  for (std::size_t k = 0; k < full.grads_for_w.size(); ++k) {
    INFO("output gradient " << k << " (d_fch, d_ln2out, dres2, d_qkv, d_ln1out)");
    CHECK(BitwiseEqual(lean.grads_for_w[k], full.grads_for_w[k]));
  }
  // Forward wrote the same ln1, ln2 and g, into the scratch instead of the saved region.
  CHECK(BitwiseEqual(lean.ln1, full.ln1));
  CHECK(BitwiseEqual(lean.ln2, full.ln2));
  CHECK(BitwiseEqual(lean.g, full.g));

  // The recomputed LayerNorm outputs: forward's bits.
  CHECK(BitwiseEqual(lean.ln1_recomputed, full.ln1));
  CHECK(BitwiseEqual(lean.ln2_recomputed, full.ln2));
  // The recomputed GELU: within the bound; measure how far.
  const std::vector<float>& fch = full.saved_common[4];
  REQUIRE(lean.g_recomputed.size() == full.g.size());
  std::int64_t differing = 0, out_of_bound = 0;
  double max_abs = 0.0, max_ratio = 0.0;
  for (std::size_t i = 0; i < full.g.size(); ++i) {
    const double got = lean.g_recomputed[i];
    const double want = full.g[i];
    const double diff = std::fabs(got - want);
    const double bound = kGeluBound * (std::fabs(fch[i]) + std::fabs(want)) + 1e-30;
    if (!(diff <= bound)) ++out_of_bound;  // NaN counts as out of bound
    if (got != want) ++differing;
    if (diff > max_abs) max_abs = diff;
    if (diff / bound > max_ratio) max_ratio = diff / bound;
  }
  std::printf(
      "[lean] C=%d recomputed gelu vs forward's: %lld of %zu elements differ, max |diff| %.3e, "
      "max diff / bound %.3f (bitwise: %s)\n",
      C, static_cast<long long>(differing), full.g.size(), max_abs, max_ratio,
      differing == 0 ? "yes, no fused epilogue" : "no, fused epilogue");
  std::fflush(stdout);
  CHECK(out_of_bound == 0);

  // Weight gradients: all but fc-proj's bitwise; fc-proj's close (bitwise too if g was).
  REQUIRE(lean.dw.size() == 12);
  for (std::size_t k = 0; k < 12; ++k) {
    INFO("weight gradient " << k << " (LayerTensorSet order)");
    if (k == kFcProjWeight) {
      const double error = RelativeError(lean.dw[k], full.dw[k]);
      Report("lean", "fcproj_w grad, C=" + std::to_string(C), error, kFcProjTolerance);
      CHECK(error <= kFcProjTolerance);
      if (differing == 0) CHECK(BitwiseEqual(lean.dw[k], full.dw[k]));
    } else {
      CHECK(BitwiseEqual(lean.dw[k], full.dw[k]));
    }
  }
}

TEST_CASE("A lean layout without a lean context is InvalidArgument", "[gpt_cuda][gpt_cuda_lean]") {
  auto backend = testing::NewCudaBackend();
  cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
  const LayerDims full_dims{1, 64, 128, 2, false};
  LayerDims lean_dims = full_dims;
  lean_dims.lean_saved = true;
  auto context = ValueOrFail(GptCudaContext::Create(full_dims, 0, stream));
  CHECK(context->lean_ln1_out() == nullptr);
  const TensorTable table(128);
  DeviceBytes w_dev(table.total * 2), out(std::int64_t{64} * 128 * 2),
      saved(MakeLayerSavedLayout(lean_dims).bytes);
  const LayerWeights w = table.At(static_cast<const bf16*>(w_dev.data()));
  const LayerActivations a =
      LayerActivationsAt(saved.bytes_ptr(), MakeLayerSavedLayout(lean_dims));
  CHECK(LayerForward(*context, w, a, static_cast<bf16*>(out.data())).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(RecomputeLeanActivations(*context, w, a).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A full layout needs no scratch: nothing to recompute, the same pointers back.
  const LayerActivations full =
      LayerActivationsAt(saved.bytes_ptr(), MakeLayerSavedLayout(full_dims));
  const LayerActivations same = ValueOrFail(RecomputeLeanActivations(*context, w, full));
  CHECK(same.ln1_out == full.ln1_out);
  CHECK(same.fch_gelu == full.fch_gelu);
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
