// The Llama units on the CPU (llama_layer_cpu.h): each unit's forward against a double-precision
// re-implementation written from Hugging Face's formulas (tensors found by their HF names, so a
// layout mistake fails too), each unit's backward against finite differences for every
// parameter tensor (sampled elements) and the input, and the whole model's gradient (the
// LlamaCpuModel driven by PlainTrainer's loop) against finite differences of its step loss.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "examples/llama/llama_config.h"
#include "examples/llama/llama_cpu_model.h"
#include "examples/llama/llama_data.h"
#include "examples/llama/llama_init.h"
#include "examples/llama/llama_layer_cpu.h"
#include "examples/llama/plain_trainer.h"
#include "tests/gpt/grad_check.h"
#include "tests/llama/cpu_test_models.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama {
namespace {

using Catch::Approx;  // Catch2 v3 has no global Approx
using gpt::testing::ExpectGradientsClose;
using gpt::testing::NumericGradient;
using gpt::testing::RandomVector;
using gpt::testing::WeightedSum;
using testing::ExpectBitwiseEqual;
using testing::ExpectSampledGradientsClose;
using testing::GradCheckConfig;
using testing::RandomUnitParams;
using testing::SampledNumericGradient;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kB = 2, kT = 5;
// Finite differences of the double-precision references: a small step (truncation error
// ~1e-6 relative) and tolerances set by the float backward's rounding.
constexpr float kStep = 1e-3f;
constexpr double kRel = 1e-3, kAbs = 1e-5;

// A unit's tensors by the tail of their HF name ("q_proj.weight").
const float* Tensor(const LlamaConfig& c, int unit, const std::vector<float>& p,
                    const std::string& suffix) {
  for (const LlamaTensor& t : UnitTensors(c, unit)) {
    if (t.hf_name.size() >= suffix.size() &&
        t.hf_name.compare(t.hf_name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return p.data() + t.offset;
    }
  }
  FAIL("no tensor " << suffix);
  return nullptr;
}

// ---- double-precision references (row-major (rows, cols) doubles) ----------------------

using Mat = std::vector<double>;

Mat RmsNorm(const Mat& x, const float* w, int rows, int C, double eps) {
  Mat y(x.size());
  for (int n = 0; n < rows; ++n) {
    double ms = 0.0;
    for (int i = 0; i < C; ++i) ms += x[n * C + i] * x[n * C + i];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int i = 0; i < C; ++i) y[n * C + i] = x[n * C + i] * r * w[i];
  }
  return y;
}

// x (rows, in) W^T, W (out, in) floats.
Mat Linear(const Mat& x, const float* w, const float* bias, int rows, int in, int out) {
  Mat y(static_cast<std::size_t>(rows) * out);
  for (int n = 0; n < rows; ++n) {
    for (int o = 0; o < out; ++o) {
      double s = bias != nullptr ? bias[o] : 0.0;
      for (int i = 0; i < in; ++i) s += x[n * in + i] * w[o * in + i];
      y[n * out + o] = s;
    }
  }
  return y;
}

void Rope(Mat& x, const std::vector<float>& inv_freq, int N, int heads, int hd) {
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < heads; ++h) {
      double* v = x.data() + (n * heads + h) * hd;
      for (int i = 0; i < hd / 2; ++i) {
        const double a = double{inv_freq[i]} * (n % kT);
        const double x1 = v[i], x2 = v[i + hd / 2];
        v[i] = x1 * std::cos(a) - x2 * std::sin(a);
        v[i + hd / 2] = x2 * std::cos(a) + x1 * std::sin(a);
      }
    }
  }
}

Mat DecoderRef(const LlamaConfig& c, const std::vector<float>& p, const std::vector<float>& x) {
  const int N = kB * kT, H = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int NH = c.num_heads, NKV = c.num_kv_heads;
  const double eps = c.rms_norm_eps;
  const int u = LayerUnit(0);
  const Mat xd(x.begin(), x.end());
  auto bias = [&](const char* name) { return c.attention_bias ? Tensor(c, u, p, name) : nullptr; };
  const Mat xn1 = RmsNorm(xd, Tensor(c, u, p, "input_layernorm.weight"), N, H, eps);
  Mat q = Linear(xn1, Tensor(c, u, p, "q_proj.weight"), bias("q_proj.bias"), N, H, NH * hd);
  Mat k = Linear(xn1, Tensor(c, u, p, "k_proj.weight"), bias("k_proj.bias"), N, H, NKV * hd);
  const Mat v = Linear(xn1, Tensor(c, u, p, "v_proj.weight"), bias("v_proj.bias"), N, H, NKV * hd);
  if (c.qk_norm) {
    q = RmsNorm(q, Tensor(c, u, p, "q_norm.weight"), N * NH, hd, eps);
    k = RmsNorm(k, Tensor(c, u, p, "k_norm.weight"), N * NKV, hd, eps);
  }
  const std::vector<float> inv_freq = RopeInvFreq(c);
  Rope(q, inv_freq, N, NH, hd);
  Rope(k, inv_freq, N, NKV, hd);
  Mat att(static_cast<std::size_t>(N) * NH * hd, 0.0);
  for (int b = 0; b < kB; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int g = h / (NH / NKV);
      for (int t = 0; t < kT; ++t) {
        std::vector<double> s(t + 1);
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int d = 0; d < hd; ++d) {
            dot += q[((b * kT + t) * NH + h) * hd + d] * k[((b * kT + j) * NKV + g) * hd + d];
          }
          s[j] = dot / std::sqrt(double{1.0 * hd});
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= t; ++j) sum += std::exp(s[j] - mx);
        for (int j = 0; j <= t; ++j) {
          for (int d = 0; d < hd; ++d) {
            att[((b * kT + t) * NH + h) * hd + d] +=
                std::exp(s[j] - mx) / sum * v[((b * kT + j) * NKV + g) * hd + d];
          }
        }
      }
    }
  }
  Mat h = Linear(att, Tensor(c, u, p, "o_proj.weight"), nullptr, N, NH * hd, H);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] += xd[i];
  const Mat xn2 = RmsNorm(h, Tensor(c, u, p, "post_attention_layernorm.weight"), N, H, eps);
  const Mat gate = Linear(xn2, Tensor(c, u, p, "gate_proj.weight"), nullptr, N, H, F);
  const Mat up = Linear(xn2, Tensor(c, u, p, "up_proj.weight"), nullptr, N, H, F);
  Mat act(gate.size());
  for (std::size_t i = 0; i < act.size(); ++i)
    act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  Mat out = Linear(act, Tensor(c, u, p, "down_proj.weight"), nullptr, N, F, H);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] += h[i];
  return out;
}

// sum_n cross-entropy(RMSNorm(x) * view[0, H) . view[H, ...)^T, targets[n]).
double HeadLossRef(const LlamaConfig& c, const std::vector<float>& view,
                   const std::vector<float>& x, const std::vector<std::int32_t>& targets) {
  const int N = kB * kT, H = c.hidden_size, V = c.vocab_size;
  const Mat xn = RmsNorm(Mat(x.begin(), x.end()), view.data(), N, H, c.rms_norm_eps);
  const Mat logits = Linear(xn, view.data() + H, nullptr, N, H, V);
  double loss = 0.0;
  for (int n = 0; n < N; ++n) {
    double mx = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[n * V + v]);
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - mx);
    loss += mx + std::log(sum) - logits[n * V + targets[n]];
  }
  return loss;
}

// ---- decoder ----------------------------------------------------------------------------

struct DecoderCase {
  bool qk_norm;
  bool attention_bias;
};

TEST_CASE("decoder forward matches a double-precision Hugging Face re-implementation",
          "[llama][layer]") {
  const DecoderCase dc = GENERATE(DecoderCase{false, false}, DecoderCase{true, false},
                                  DecoderCase{false, true}, DecoderCase{true, true});
  const LlamaConfig c = GradCheckConfig(dc.qk_norm, dc.attention_bias, false);
  const LlamaCpuUnits units(c, kB, kT, 3);
  const int N = units.rows(), H = c.hidden_size;
  const std::vector<float> params = RandomUnitParams(c, LayerUnit(0), 5);
  const std::vector<float> x = RandomVector(N * H, 6, 1.0f);
  std::vector<float> ws(static_cast<std::size_t>(units.DecoderWorkspaceFloats()), kNaN);
  std::vector<float> out(N * H, kNaN);
  units.DecoderForward(params.data(), x.data(), out.data(), ws.data());
  CAPTURE(dc.qk_norm, dc.attention_bias);
  ExpectGradientsClose("decoder out", out.data(), DecoderRef(c, params, x), 1e-5, 1e-5);
}

TEST_CASE("decoder backward matches finite differences (GQA, qk_norm, attention_bias)",
          "[llama][layer]") {
  const DecoderCase dc = GENERATE(DecoderCase{false, false}, DecoderCase{true, false},
                                  DecoderCase{false, true}, DecoderCase{true, true});
  const LlamaConfig c = GradCheckConfig(dc.qk_norm, dc.attention_bias, false);
  const LlamaCpuUnits units(c, kB, kT, 3);
  const int N = units.rows(), H = c.hidden_size;
  std::vector<float> params = RandomUnitParams(c, LayerUnit(0), 10);
  std::vector<float> x = RandomVector(N * H, 11, 1.0f);
  const std::vector<float> r = RandomVector(N * H, 12, 1.0f);  // dout
  std::vector<float> ws(static_cast<std::size_t>(units.DecoderWorkspaceFloats()), kNaN);
  std::vector<float> out(N * H);
  // The unit's loss sum(r * out), evaluated by the double-precision reference (checked against
  // the float forward above): differences of it are exact to ~1e-8, the float model's are not.
  auto objective = [&] {
    const Mat ref = DecoderRef(c, params, x);
    double sum = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i) sum += r[i] * ref[i];
    return sum;
  };
  std::vector<float> dx(N * H, kNaN);
  std::vector<float> dparams(params.size(), 0.0f);
  std::fill(ws.begin(), ws.end(), kNaN);  // the backward must not read what it did not write
  units.DecoderBackward(params.data(), x.data(), r.data(), dx.data(), dparams.data(), ws.data());
  CAPTURE(dc.qk_norm, dc.attention_bias);
  ExpectGradientsClose("decoder dx", dx.data(), NumericGradient(x.data(), N * H, kStep, objective),
                       kRel, kAbs);
  int seed = 100;
  for (const LlamaTensor& t : UnitTensors(c, LayerUnit(0))) {
    std::vector<std::int64_t> picked;
    const std::vector<double> numeric = SampledNumericGradient(
        params.data() + t.offset, t.numel(), 48, ++seed, kStep, objective, &picked);
    ExpectSampledGradientsClose(t.hf_name, dparams.data() + t.offset, picked, numeric, kRel, kAbs);
  }

  SECTION("dx may alias dout; parameter gradients accumulate") {
    std::vector<float> inout = r;  // dout, then dx
    std::vector<float> dparams2 = dparams;
    units.DecoderBackward(params.data(), x.data(), inout.data(), inout.data(), dparams2.data(),
                          ws.data());
    ExpectBitwiseEqual("dx aliased with dout", inout.data(), dx.data(), N * H);
    for (std::size_t i = 0; i < dparams.size(); ++i) {
      CAPTURE(i);
      REQUIRE(dparams2[i] == Approx(2.0 * dparams[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

// ---- embedding --------------------------------------------------------------------------

TEST_CASE("embedding unit gradients match finite differences", "[llama][layer]") {
  const LlamaConfig c = GradCheckConfig(false, false, false);
  const LlamaCpuUnits units(c, kB, kT, 3);
  const int N = units.rows(), H = c.hidden_size, V = c.vocab_size;
  std::vector<float> table = RandomUnitParams(c, EmbeddingUnit(), 20);
  std::vector<std::int32_t> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 7) % 4;  // repeated tokens, unused rows
  const std::vector<float> r = RandomVector(N * H, 21, 1.0f);
  std::vector<float> out(N * H, kNaN);
  auto objective = [&] {
    units.EmbeddingForward(table.data(), tokens.data(), out.data());
    return WeightedSum(out, r);
  };
  std::vector<float> dtable(table.size(), 0.0f);
  units.EmbeddingBackward(tokens.data(), r.data(), dtable.data());
  ExpectGradientsClose("embed_tokens", dtable.data(),
                       NumericGradient(table.data(), V * H, 1e-2f, objective), 1e-3, 1e-5);
}

// ---- head -------------------------------------------------------------------------------

TEST_CASE("head loss matches a double reference and its gradients finite differences",
          "[llama][layer]") {
  const bool tied = GENERATE(false, true);
  const LlamaConfig c = GradCheckConfig(false, false, tied);
  const LlamaCpuUnits units(c, kB, kT, 3);  // 3 rows per chunk: N = 10 is not a multiple
  const int N = units.rows(), H = c.hidden_size, V = c.vocab_size;
  // The head's view: own params, then (tied) the borrowed embedding table.
  std::vector<float> view = RandomUnitParams(c, HeadUnit(c), 30);
  REQUIRE(static_cast<std::int64_t>(view.size()) == (tied ? H : H + std::int64_t{V} * H));
  if (tied) {
    const std::vector<float> table = RandomUnitParams(c, EmbeddingUnit(), 31);
    view.insert(view.end(), table.begin(), table.end());
  }
  std::vector<float> x = RandomVector(N * H, 32, 1.0f);
  std::vector<std::int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 5 + 1) % V;
  const float grad_scale = 0.125f;
  std::vector<float> ws(static_cast<std::size_t>(units.HeadWorkspaceFloats()), kNaN);
  std::vector<float> dx_scratch(N * H), dview_scratch(view.size());
  auto loss = [&] {
    return units.HeadLossBackward(view.data(), x.data(), targets.data(), grad_scale,
                                  dx_scratch.data(), dview_scratch.data(), ws.data());
  };
  CHECK(loss() == Approx(HeadLossRef(c, view, x, targets)).epsilon(1e-6));
  std::vector<float> dx(N * H, kNaN), dview(view.size(), 0.0f);
  std::fill(ws.begin(), ws.end(), kNaN);
  units.HeadLossBackward(view.data(), x.data(), targets.data(), grad_scale, dx.data(), dview.data(),
                         ws.data());
  auto objective = [&] { return grad_scale * HeadLossRef(c, view, x, targets); };
  CAPTURE(tied);
  ExpectGradientsClose("head dx", dx.data(), NumericGradient(x.data(), N * H, kStep, objective),
                       kRel, kAbs);
  ExpectGradientsClose("model.norm.weight", dview.data(),
                       NumericGradient(view.data(), H, kStep, objective), kRel, kAbs);
  std::vector<std::int64_t> picked;
  const std::vector<double> numeric = SampledNumericGradient(view.data() + H, std::int64_t{V} * H,
                                                             64, 33, kStep, objective, &picked);
  ExpectSampledGradientsClose(tied ? "embed_tokens (borrowed)" : "lm_head.weight", dview.data() + H,
                              picked, numeric, kRel, kAbs);
}

// ---- the whole model --------------------------------------------------------------------

TEST_CASE("whole-model gradients match finite differences of the step loss", "[llama][model]") {
  const bool tied = GENERATE(false, true);
  LlamaConfig c = GradCheckConfig(/*qk_norm=*/tied, /*attention_bias=*/!tied, tied);
  // Tokens in [0, V) with structure (a noisy counter), long enough for any window.
  std::vector<std::uint32_t> stream(400);
  gpt::Rng rng(3);
  std::uint32_t state = 0;
  for (std::uint32_t& token : stream) {
    state = rng.Below(3) == 0 ? static_cast<std::uint32_t>(rng.Below(c.vocab_size))
                              : (state + 1) % c.vocab_size;
    token = state;
  }
  const TokenData data = TokenData::FromTokens(stream, "counter");
  LlamaCpuModelOptions options;
  options.batch_size = 2;
  options.seq_len = 4;
  options.max_microbatches = 2;
  options.data_seed = 11;
  options.ce_chunk_rows = 3;
  auto model = LlamaCpuModel::Create(c, data, options);
  REQUIRE(model.ok());
  PlainTrainerOptions trainer_options;
  trainer_options.num_microbatches = 2;
  trainer_options.cpu.threads = 1;
  auto trainer = PlainTrainer::Create(**model, trainer_options);
  REQUIRE(trainer.ok());
  PlainTrainer& tr = **trainer;
  std::vector<std::vector<float>> params;
  for (int u = 0; u < NumUnits(c); ++u) {
    params.push_back(InitUnitParams(c, u, 77 + u));
    // Norm weights away from 1, so that their gradients differ from those of a plain scale.
    for (const LlamaTensor& t : UnitTensors(c, u)) {
      if (!t.is_norm) continue;
      for (std::int64_t i = 0; i < t.numel(); ++i) params[u][t.offset + i] += 0.01f * (i % 7);
    }
    REQUIRE(tr.SetUnitParams(u, params[u]).ok());
  }
  auto loss_now = tr.ComputeGradients(/*data_step=*/4);
  REQUIRE(loss_now.ok());
  std::vector<std::vector<float>> grads;
  for (int u = 0; u < NumUnits(c); ++u) {
    grads.emplace_back(tr.grads(u).begin(), tr.grads(u).end());
  }
  CHECK(*loss_now > 1.0);  // near log(19) at this init, far from 0
  CAPTURE(tied);
  int seed = 500;
  for (int u = 0; u < NumUnits(c); ++u) {
    auto objective = [&] {
      REQUIRE(tr.SetUnitParams(u, params[u]).ok());
      auto loss = tr.ComputeGradients(4);
      REQUIRE(loss.ok());
      return *loss;
    };
    for (const LlamaTensor& t : UnitTensors(c, u)) {
      std::vector<std::int64_t> picked;
      const std::vector<double> numeric = SampledNumericGradient(
          params[u].data() + t.offset, t.numel(), 24, ++seed, 1e-2f, objective, &picked);
      REQUIRE(tr.SetUnitParams(u, params[u]).ok());
      ExpectSampledGradientsClose(t.hf_name, grads[u].data() + t.offset, picked, numeric, 1e-2,
                                  2e-5);
    }
  }
}

}  // namespace
}  // namespace pipeoffload::llama
