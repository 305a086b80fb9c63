// The Llama CPU kernels: each forward against a straightforward double-precision
// re-implementation, each backward against central finite differences of a random-weighted
// scalar loss, and the contracts the model relies on (overwrite vs accumulate, RoPE's inverse,
// the fused cross-entropy's independence of its chunking). Outputs are poisoned with NaN first.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "examples/llama/llama_config.h"
#include "examples/llama/llama_kernels_cpu.h"
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

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> Poisoned(std::size_t n) { return std::vector<float>(n, kNaN); }

// Element-wise closeness of a float result to a double reference (worst pair printed).
void ExpectClose(const std::string& what, const std::vector<float>& actual,
                 const std::vector<double>& expected, double rel, double abs) {
  REQUIRE(actual.size() == expected.size());
  ExpectGradientsClose(what, actual.data(), expected, rel, abs);
}

void ExpectBitwiseEqual(const std::string& what, const std::vector<float>& a,
                        const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  testing::ExpectBitwiseEqual(what, a.data(), b.data(), static_cast<std::int64_t>(a.size()));
}

// ---- double-precision references --------------------------------------------------------

std::vector<double> RmsNormRef(const std::vector<float>& x, const std::vector<float>& w, int N,
                               int C, double eps) {
  std::vector<double> y(x.size());
  for (int n = 0; n < N; ++n) {
    double ms = 0.0;
    for (int i = 0; i < C; ++i) ms += double{x[n * C + i]} * x[n * C + i];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int i = 0; i < C; ++i) y[n * C + i] = x[n * C + i] * r * w[i];
  }
  return y;
}

std::vector<double> RopeRef(const std::vector<float>& x, const std::vector<float>& inv_freq, int N,
                            int T, int heads, int hd) {
  std::vector<double> y(x.size());
  const int half = hd / 2;
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < heads; ++h) {
      const float* v = x.data() + (n * heads + h) * hd;
      double* o = y.data() + (n * heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        const double a = double{inv_freq[i]} * (n % T);
        o[i] = v[i] * std::cos(a) - v[i + half] * std::sin(a);
        o[i + half] = v[i + half] * std::cos(a) + v[i] * std::sin(a);
      }
    }
  }
  return y;
}

// Causal GQA attention in double; lse (B, NH, T) too.
void AttentionRef(std::vector<double>& out, std::vector<double>& lse, const std::vector<float>& q,
                  const std::vector<float>& k, const std::vector<float>& v, int B, int T, int NH,
                  int NKV, int hd) {
  out.assign(static_cast<std::size_t>(B) * T * NH * hd, 0.0);
  lse.assign(static_cast<std::size_t>(B) * NH * T, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int g = h / (NH / NKV);
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int d = 0; d < hd; ++d) {
            dot += double{q[((b * T + t) * NH + h) * hd + d]} * k[((b * T + j) * NKV + g) * hd + d];
          }
          s[j] = dot / std::sqrt(double{1.0 * hd});
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += std::exp(s[j] - mx);
        lse[(b * NH + h) * T + t] = mx + std::log(sum);
        for (int j = 0; j <= t; ++j) {
          const double p = std::exp(s[j] - mx) / sum;
          for (int d = 0; d < hd; ++d) {
            out[((b * T + t) * NH + h) * hd + d] += p * v[((b * T + j) * NKV + g) * hd + d];
          }
        }
      }
    }
  }
}

// ---- RMSNorm ------------------------------------------------------------------------------

TEST_CASE("rmsnorm forward matches a double reference", "[llama][kernels]") {
  const int N = 5, C = 37;
  const float eps = 1e-5f;
  std::vector<float> x = RandomVector(N * C, 1, 2.0f);
  x[3] = 0.0f;  // a zero element, and a whole row near zero
  for (int i = 0; i < C; ++i) x[4 * C + i] = 1e-4f * x[4 * C + i];
  const std::vector<float> w = RandomVector(C, 2, 1.0f);
  std::vector<float> y = Poisoned(N * C), rstd = Poisoned(N);
  RmsNormForward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  ExpectClose("rmsnorm out", y, RmsNormRef(x, w, N, C, eps), 1e-6, 1e-7);
  for (int n = 0; n < N; ++n) {
    double ms = 0.0;
    for (int i = 0; i < C; ++i) ms += double{x[n * C + i]} * x[n * C + i];
    CAPTURE(n);
    CHECK(rstd[n] == Approx(1.0 / std::sqrt(ms / C + eps)).epsilon(1e-6));
  }
}

TEST_CASE("rmsnorm gradients match finite differences", "[llama][kernels]") {
  const int N = 4, C = 13;
  std::vector<float> x = RandomVector(N * C, 10, 1.5f);
  std::vector<float> w = RandomVector(C, 11, 1.0f);
  const std::vector<float> r = RandomVector(N * C, 12, 1.0f);
  std::vector<float> y(N * C), rstd(N);
  auto objective = [&] {
    RmsNormForward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    return WeightedSum(y, r);
  };
  objective();
  std::vector<float> dx = Poisoned(N * C);  // overwritten
  const std::vector<float> dw0 = RandomVector(C, 13, 1.0f);
  std::vector<float> dw = dw0;  // accumulated onto
  RmsNormBackward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  for (int i = 0; i < C; ++i) dw[i] -= dw0[i];
  ExpectGradientsClose("rmsnorm dinp", dx.data(),
                       NumericGradient(x.data(), N * C, 1e-2f, objective), 2e-3, 1e-4);
  ExpectGradientsClose("rmsnorm dweight", dw.data(), NumericGradient(w.data(), C, 1e-2f, objective),
                       2e-3, 1e-4);
}

// ---- RoPE ---------------------------------------------------------------------------------

TEST_CASE("rope forward matches a double reference, plain and llama3-scaled", "[llama][kernels]") {
  LlamaConfig config;
  config.head_dim = 16;
  config.rope_theta = 500000.0f;
  const bool scaled = GENERATE(false, true);
  if (scaled) {
    config.rope_scaling = RopeScaling::kLlama3;
    config.rope_original_max_positions = 64;  // so the tiny positions reach every band
  }
  const std::vector<float> inv_freq = RopeInvFreq(config);
  const int B = 2, T = 40, heads = 3, hd = config.head_dim, N = B * T;
  const std::vector<float> x0 = RandomVector(N * heads * hd, 20, 1.0f);
  std::vector<float> x = x0;
  RopeForward(x.data(), inv_freq.data(), N, T, heads, hd);
  CAPTURE(scaled);
  ExpectClose("rope out", x, RopeRef(x0, inv_freq, N, T, heads, hd), 1e-5, 1e-6);
  // Position 0 is the identity, bit for bit (cos 0 = 1, sin 0 = 0).
  for (int i = 0; i < heads * hd; ++i) CHECK(x[i] == x0[i]);
}

TEST_CASE("rope backward is the transpose and undoes the forward", "[llama][kernels]") {
  LlamaConfig config;
  config.head_dim = 8;
  const std::vector<float> inv_freq = RopeInvFreq(config);
  const int B = 2, T = 7, heads = 2, hd = 8, N = B * T;
  std::vector<float> x = RandomVector(N * heads * hd, 30, 1.0f);
  const std::vector<float> r = RandomVector(N * heads * hd, 31, 1.0f);
  // Gradient of sum(r * RoPE(x)) is RopeBackward(r).
  std::vector<float> y;
  auto objective = [&] {
    y = x;
    RopeForward(y.data(), inv_freq.data(), N, T, heads, hd);
    return WeightedSum(y, r);
  };
  std::vector<float> dx = r;
  RopeBackward(dx.data(), inv_freq.data(), N, T, heads, hd);
  ExpectGradientsClose("rope dx", dx.data(),
                       NumericGradient(x.data(), N * heads * hd, 1e-2f, objective), 1e-3, 1e-5);
  // backward o forward = identity within rounding (an orthogonal rotation and its inverse).
  std::vector<float> round_trip = x;
  RopeForward(round_trip.data(), inv_freq.data(), N, T, heads, hd);
  RopeBackward(round_trip.data(), inv_freq.data(), N, T, heads, hd);
  std::vector<double> expected(x.begin(), x.end());
  ExpectClose("rope backward(forward(x))", round_trip, expected, 1e-6, 1e-6);
}

// ---- Attention ----------------------------------------------------------------------------

TEST_CASE("attention forward matches a double reference (MHA, GQA, MQA)", "[llama][kernels]") {
  const int NKV = GENERATE(4, 2, 1);
  const int B = 2, T = 6, NH = 4, hd = 8, N = B * T;
  const std::vector<float> q = RandomVector(N * NH * hd, 40, 1.0f);
  const std::vector<float> k = RandomVector(N * NKV * hd, 41, 1.0f);
  const std::vector<float> v = RandomVector(N * NKV * hd, 42, 1.0f);
  std::vector<float> out = Poisoned(N * NH * hd), lse = Poisoned(B * NH * T), scratch(T);
  AttentionForward(out.data(), lse.data(), scratch.data(), q.data(), k.data(), v.data(), B, T, NH,
                   NKV, hd);
  std::vector<double> out_ref, lse_ref;
  AttentionRef(out_ref, lse_ref, q, k, v, B, T, NH, NKV, hd);
  CAPTURE(NKV);
  ExpectClose("attention out", out, out_ref, 1e-5, 1e-6);
  ExpectClose("attention lse", lse, lse_ref, 1e-6, 1e-6);
  // Causal: the first query of each sequence reads only its own value row.
  for (int h = 0; h < NH; ++h) {
    for (int d = 0; d < hd; ++d) {
      CHECK(out[h * hd + d] == Approx(v[(h / (NH / NKV)) * hd + d]).epsilon(1e-6));
    }
  }
}

TEST_CASE("attention gradients match finite differences (GQA)", "[llama][kernels]") {
  const int NKV = GENERATE(2, 1);
  const int B = 2, T = 5, NH = 4, hd = 4, N = B * T;
  std::vector<float> q = RandomVector(N * NH * hd, 50, 1.0f);
  std::vector<float> k = RandomVector(N * NKV * hd, 51, 1.0f);
  std::vector<float> v = RandomVector(N * NKV * hd, 52, 1.0f);
  const std::vector<float> r = RandomVector(N * NH * hd, 53, 1.0f);
  std::vector<float> out(N * NH * hd), lse(B * NH * T), scratch(2 * T);
  auto objective = [&] {
    AttentionForward(out.data(), lse.data(), scratch.data(), q.data(), k.data(), v.data(), B, T, NH,
                     NKV, hd);
    return WeightedSum(out, r);
  };
  objective();
  std::vector<float> dq = Poisoned(q.size()), dk = Poisoned(k.size()), dv = Poisoned(v.size());
  AttentionBackward(dq.data(), dk.data(), dv.data(), scratch.data(), r.data(), out.data(),
                    lse.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, hd);
  CAPTURE(NKV);
  ExpectGradientsClose("attention dq", dq.data(),
                       NumericGradient(q.data(), N * NH * hd, 1e-2f, objective), 2e-3, 1e-4);
  ExpectGradientsClose("attention dk", dk.data(),
                       NumericGradient(k.data(), N * NKV * hd, 1e-2f, objective), 2e-3, 1e-4);
  ExpectGradientsClose("attention dv", dv.data(),
                       NumericGradient(v.data(), N * NKV * hd, 1e-2f, objective), 2e-3, 1e-4);
}

// ---- SwiGLU -------------------------------------------------------------------------------

TEST_CASE("swiglu forward matches a double reference and its gradient finite differences",
          "[llama][kernels]") {
  const int N = 3, F = 11;
  std::vector<float> gu = RandomVector(N * 2 * F, 60, 3.0f);
  gu[0] = -100.0f;  // exp(-x) overflows: silu must be -0, not NaN
  gu[1] = 100.0f;
  std::vector<float> out = Poisoned(N * F);
  SwiGluForward(out.data(), gu.data(), N, F);
  std::vector<double> ref(N * F);
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < F; ++i) {
      const double g = gu[n * 2 * F + i];
      ref[n * F + i] = g / (1.0 + std::exp(-g)) * gu[n * 2 * F + F + i];
    }
  }
  ExpectClose("swiglu out", out, ref, 1e-6, 1e-7);

  gu[0] = -2.0f;  // keep finite differences in the smooth range
  gu[1] = 2.0f;
  const std::vector<float> r = RandomVector(N * F, 61, 1.0f);
  auto objective = [&] {
    SwiGluForward(out.data(), gu.data(), N, F);
    return WeightedSum(out, r);
  };
  std::vector<float> dgu = Poisoned(N * 2 * F);
  SwiGluBackward(dgu.data(), r.data(), gu.data(), N, F);
  ExpectGradientsClose("swiglu dgate_up", dgu.data(),
                       NumericGradient(gu.data(), N * 2 * F, 1e-2f, objective), 2e-3, 1e-4);
}

// ---- Embedding ----------------------------------------------------------------------------

TEST_CASE("embedding gathers rows and scatters gradients by token", "[llama][kernels]") {
  const int V = 7, H = 5, N = 6;
  const std::vector<float> table = RandomVector(V * H, 70, 1.0f);
  const std::int32_t tokens[N] = {3, 0, 3, 6, 3, 1};  // token 3 three times
  std::vector<float> out = Poisoned(N * H);
  EmbeddingForward(out.data(), tokens, table.data(), N, H);
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < H; ++i) CHECK(out[n * H + i] == table[tokens[n] * H + i]);
  }
  const std::vector<float> dout = RandomVector(N * H, 71, 1.0f);
  const std::vector<float> dtable0 = RandomVector(V * H, 72, 1.0f);
  std::vector<float> dtable = dtable0;
  EmbeddingBackward(dtable.data(), dout.data(), tokens, N, H);
  for (int v = 0; v < V; ++v) {
    for (int i = 0; i < H; ++i) {
      float expected = dtable0[v * H + i];  // rows ascending, in float: exact order
      for (int n = 0; n < N; ++n) {
        if (tokens[n] == v) expected += dout[n * H + i];
      }
      CAPTURE(v, i);
      CHECK(dtable[v * H + i] == expected);
    }
  }
}

// ---- Fused linear cross-entropy ---------------------------------------------------------

struct CeResult {
  double loss = 0.0;
  std::vector<float> dx, dw;
};

CeResult RunCe(const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<std::int32_t>& targets, const std::vector<float>& dw0, int N,
               int H, int V, int chunk, float grad_scale) {
  CeResult r;
  r.dx = Poisoned(x.size());
  r.dw = dw0;
  std::vector<float> scratch = Poisoned(static_cast<std::size_t>(chunk) * V);
  r.loss = FusedLinearCrossEntropy(r.dx.data(), r.dw.data(), scratch.data(), x.data(), w.data(),
                                   targets.data(), N, H, V, chunk, grad_scale);
  return r;
}

TEST_CASE("fused linear cross-entropy equals a naive full-logits cross-entropy",
          "[llama][kernels]") {
  const int N = 7, H = 9, V = 13;
  const float grad_scale = 0.37f;
  const std::vector<float> x = RandomVector(N * H, 80, 1.0f);
  const std::vector<float> w = RandomVector(V * H, 81, 1.0f);
  const std::vector<std::int32_t> targets = {0, 12, 5, 5, 7, 1, 11};
  const std::vector<float> zeros(V * H, 0.0f);
  const CeResult r = RunCe(x, w, targets, zeros, N, H, V, 3, grad_scale);
  // Naive, in double: logits, softmax, loss, and the gradients of grad_scale * sum(loss).
  double loss = 0.0;
  std::vector<double> dx(N * H, 0.0), dw(V * H, 0.0);
  for (int n = 0; n < N; ++n) {
    std::vector<double> l(V);
    double mx = -INFINITY;
    for (int v = 0; v < V; ++v) {
      l[v] = 0.0;
      for (int i = 0; i < H; ++i) l[v] += double{x[n * H + i]} * w[v * H + i];
      mx = std::max(mx, l[v]);
    }
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    loss += mx + std::log(sum) - l[targets[n]];
    for (int v = 0; v < V; ++v) {
      const double g = (std::exp(l[v] - mx) / sum - (v == targets[n] ? 1.0 : 0.0)) * grad_scale;
      for (int i = 0; i < H; ++i) {
        dx[n * H + i] += g * w[v * H + i];
        dw[v * H + i] += g * x[n * H + i];
      }
    }
  }
  CHECK(r.loss == Approx(loss).epsilon(1e-6));
  ExpectClose("fused ce dx", r.dx, dx, 1e-4, 1e-6);
  ExpectClose("fused ce dweight", r.dw, dw, 1e-4, 1e-6);
}

TEST_CASE("fused linear cross-entropy is bitwise independent of chunk_rows", "[llama][kernels]") {
  const int N = 10, H = 8, V = 17;
  const std::vector<float> x = RandomVector(N * H, 90, 1.0f);
  const std::vector<float> w = RandomVector(V * H, 91, 1.0f);
  std::vector<std::int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 5 + 3) % V;
  const std::vector<float> dw0 = RandomVector(V * H, 92, 1.0f);  // dweight accumulates
  const CeResult whole = RunCe(x, w, targets, dw0, N, H, V, N, 0.1f);
  for (int chunk : {1, 3, 4, 7, N + 5}) {
    CAPTURE(chunk);
    const CeResult c = RunCe(x, w, targets, dw0, N, H, V, chunk, 0.1f);
    CHECK(std::memcmp(&c.loss, &whole.loss, sizeof(double)) == 0);
    ExpectBitwiseEqual("dx", c.dx, whole.dx);
    ExpectBitwiseEqual("dweight", c.dw, whole.dw);
  }
}

TEST_CASE("fused linear cross-entropy gradients match finite differences", "[llama][kernels]") {
  const int N = 4, H = 6, V = 9;
  std::vector<float> x = RandomVector(N * H, 100, 1.0f);
  std::vector<float> w = RandomVector(V * H, 101, 1.0f);
  const std::vector<std::int32_t> targets = {2, 8, 0, 2};
  const std::vector<float> zeros(V * H, 0.0f);
  auto objective = [&] { return RunCe(x, w, targets, zeros, N, H, V, 2, 1.0f).loss; };
  const CeResult r = RunCe(x, w, targets, zeros, N, H, V, 2, 1.0f);
  ExpectGradientsClose("fused ce dx", r.dx.data(),
                       NumericGradient(x.data(), N * H, 1e-2f, objective), 2e-3, 1e-4);
  ExpectGradientsClose("fused ce dweight", r.dw.data(),
                       NumericGradient(w.data(), V * H, 1e-2f, objective), 2e-3, 1e-4);
}

}  // namespace
}  // namespace pipeoffload::llama
