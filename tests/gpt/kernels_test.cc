// Finite-difference gradient checks of each GPT CPU kernel, plus the forward properties the
// backward relies on (softmax rows sum to 1, causal masking, accumulate-vs-overwrite contracts).
#include <cmath>
#include <cstring>
#include <vector>

#include "examples/gpt/kernels_cpu.h"
#include "tests/gpt/grad_check.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

using Catch::Approx;  // Catch2 v3 has no global Approx

using testing::ExpectGradientsClose;
using testing::NumericGradient;
using testing::RandomVector;
using testing::WeightedSum;

TEST_CASE("matmul forward matches a double-precision reference", "[gpt][kernels]") {
  const int N = 3, IC = 19, OC = 5;  // IC exercises both the 8-lane body and the tail
  std::vector<float> x = RandomVector(N * IC, 1, 1.0f);
  std::vector<float> w = RandomVector(OC * IC, 2, 1.0f);
  std::vector<float> b = RandomVector(OC, 3, 1.0f);
  std::vector<float> y(N * OC);
  MatmulForward(y.data(), x.data(), w.data(), b.data(), N, IC, OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double expected = b[o];
      for (int i = 0; i < IC; ++i) expected += double{x[n * IC + i]} * w[o * IC + i];
      CAPTURE(n, o);
      CHECK(y[n * OC + o] == Approx(expected).epsilon(1e-5).margin(1e-5));
    }
  }
  // Without bias.
  MatmulForward(y.data(), x.data(), w.data(), nullptr, N, IC, OC);
  double expected = 0.0;
  for (int i = 0; i < IC; ++i) expected += double{x[i]} * w[i];
  CHECK(y[0] == Approx(expected).epsilon(1e-5).margin(1e-5));
}

TEST_CASE("matmul gradients match finite differences", "[gpt][kernels]") {
  const int N = 4, IC = 11, OC = 6;
  std::vector<float> x = RandomVector(N * IC, 10, 1.0f);
  std::vector<float> w = RandomVector(OC * IC, 11, 0.5f);
  std::vector<float> b = RandomVector(OC, 12, 0.5f);
  std::vector<float> r = RandomVector(N * OC, 13, 1.0f);  // objective weights = dout
  std::vector<float> y(N * OC);
  auto objective = [&] {
    MatmulForward(y.data(), x.data(), w.data(), b.data(), N, IC, OC);
    return WeightedSum(y, r);
  };
  std::vector<float> dx(N * IC, 123.0f);  // overwritten, not accumulated
  MatmulBackwardInput(dx.data(), r.data(), w.data(), N, IC, OC);
  std::vector<float> dw(OC * IC, 0.0f), db(OC, 0.0f);
  MatmulBackwardWeight(dw.data(), db.data(), r.data(), x.data(), N, IC, OC);

  ExpectGradientsClose("matmul dinp", dx.data(),
                       NumericGradient(x.data(), N * IC, 1e-2f, objective), 1e-3, 1e-4);
  ExpectGradientsClose("matmul dweight", dw.data(),
                       NumericGradient(w.data(), OC * IC, 1e-2f, objective), 1e-3, 1e-4);
  ExpectGradientsClose("matmul dbias", db.data(), NumericGradient(b.data(), OC, 1e-2f, objective),
                       1e-3, 1e-4);

  SECTION("weight gradients accumulate") {
    std::vector<float> dw2 = dw, db2 = db;
    MatmulBackwardWeight(dw2.data(), db2.data(), r.data(), x.data(), N, IC, OC);
    for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw2[i] == Approx(2.0 * dw[i]));
    for (std::size_t i = 0; i < db.size(); ++i) CHECK(db2[i] == Approx(2.0 * db[i]));
  }
}

TEST_CASE("layernorm gradients match finite differences", "[gpt][kernels]") {
  const int N = 5, C = 13;
  std::vector<float> x = RandomVector(N * C, 20, 2.0f);
  std::vector<float> w = RandomVector(C, 21, 1.0f);
  std::vector<float> b = RandomVector(C, 22, 1.0f);
  std::vector<float> r = RandomVector(N * C, 23, 1.0f);
  std::vector<float> y(N * C), mean(N), rstd(N);
  auto objective = [&] {
    LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return WeightedSum(y, r);
  };
  objective();
  // Normalized rows have mean 0 and variance 1 before the affine part.
  for (int n = 0; n < N; ++n) {
    double m = 0.0;
    for (int i = 0; i < C; ++i) m += x[n * C + i];
    CHECK(mean[n] == Approx(m / C).margin(1e-6));
  }
  const std::vector<float> residual = RandomVector(N * C, 24, 1.0f);
  std::vector<float> dx = residual;  // LayerNormBackwardInput accumulates onto this
  LayerNormBackwardInput(dx.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] -= residual[i];
  std::vector<float> dw(C, 0.0f), db(C, 0.0f);
  LayerNormBackwardWeight(dw.data(), db.data(), r.data(), x.data(), mean.data(), rstd.data(), N, C);
  ExpectGradientsClose("layernorm dinp", dx.data(),
                       NumericGradient(x.data(), N * C, 1e-2f, objective), 2e-3, 1e-4);
  ExpectGradientsClose("layernorm dweight", dw.data(),
                       NumericGradient(w.data(), C, 1e-2f, objective), 2e-3, 1e-4);
  ExpectGradientsClose("layernorm dbias", db.data(), NumericGradient(b.data(), C, 1e-2f, objective),
                       2e-3, 1e-4);
}

TEST_CASE("attention gradients match finite differences", "[gpt][kernels]") {
  const int B = 2, T = 5, C = 8, NH = 2;
  std::vector<float> qkv = RandomVector(B * T * 3 * C, 30, 1.0f);
  std::vector<float> r = RandomVector(B * T * C, 31, 1.0f);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  auto objective = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return WeightedSum(out, r);
  };
  objective();
  std::vector<float> dqkv(B * T * 3 * C, 77.0f), scratch(T);  // overwritten
  AttentionBackward(dqkv.data(), scratch.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  ExpectGradientsClose("attention dqkv", dqkv.data(),
                       NumericGradient(qkv.data(), B * T * 3 * C, 1e-2f, objective), 2e-3, 1e-4);
}

TEST_CASE("attention is causal and its rows are distributions", "[gpt][kernels]") {
  const int B = 2, T = 6, C = 12, NH = 3;
  std::vector<float> qkv = RandomVector(B * T * 3 * C, 40, 1.0f);
  std::vector<float> out(B * T * C), att(B * NH * T * T, 9.0f);
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int row = 0; row < B * NH * T; ++row) {
    const int t = row % T;
    double sum = 0.0;
    for (int t2 = 0; t2 < T; ++t2) {
      const float a = att[row * T + t2];
      if (t2 > t) {
        CHECK(a == 0.0f);
      } else {
        CHECK(a > 0.0f);
      }
      sum += a;
    }
    CHECK(sum == Approx(1.0).epsilon(1e-5));
  }
  // Changing the last position's q, k, v changes nothing at earlier positions, bit for bit.
  std::vector<float> out2(out.size());
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < 3 * C; ++i) qkv[(b * T + T - 1) * 3 * C + i] += 1.0f;
  }
  AttentionForward(out2.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int b = 0; b < B; ++b) {
    CHECK(std::memcmp(out.data() + b * T * C, out2.data() + b * T * C,
                      sizeof(float) * (T - 1) * C) == 0);
  }
}

TEST_CASE("gelu matches its formula and finite differences", "[gpt][kernels]") {
  // Tanh-approximation values (Hendrycks & Gimpel 2016): gelu(1) = 0.8411920, gelu(-1) =
  // -0.1588080.
  const float in[3] = {1.0f, -1.0f, 0.0f};
  float out[3];
  GeluForward(out, in, 3);
  CHECK(out[0] == Approx(0.841192).epsilon(1e-5));
  CHECK(out[1] == Approx(-0.158808).epsilon(1e-5));
  CHECK(out[2] == 0.0f);

  const int n = 64;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = -6.0f + 12.0f * static_cast<float>(i) / (n - 1);
  std::vector<float> r = RandomVector(n, 50, 1.0f);
  std::vector<float> y(n);
  auto objective = [&] {
    GeluForward(y.data(), x.data(), n);
    return WeightedSum(y, r);
  };
  std::vector<float> dx(n);
  GeluBackward(dx.data(), x.data(), r.data(), n);
  ExpectGradientsClose("gelu dinp", dx.data(), NumericGradient(x.data(), n, 1e-3f, objective), 2e-3,
                       1e-4);
}

TEST_CASE("softmax cross-entropy matches its definition and finite differences", "[gpt][kernels]") {
  const int N = 4, V = 10;
  std::vector<float> logits = RandomVector(N * V, 60, 2.0f);
  const std::vector<std::int32_t> targets = {3, 0, 9, 3};
  std::vector<float> probs(N * V), losses(N);
  SoftmaxCrossEntropyForward(probs.data(), losses.data(), logits.data(), targets.data(), N, V);
  for (int n = 0; n < N; ++n) {
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += probs[n * V + v];
    CHECK(sum == Approx(1.0).epsilon(1e-6));
    CHECK(losses[n] == Approx(-std::log(probs[n * V + targets[n]])).epsilon(1e-5));
  }
  // In place (probs aliasing logits), as the model runs it: the same bits.
  std::vector<float> inplace = logits;
  std::vector<float> losses2(N);
  SoftmaxCrossEntropyForward(inplace.data(), losses2.data(), inplace.data(), targets.data(), N, V);
  CHECK(std::memcmp(inplace.data(), probs.data(), sizeof(float) * N * V) == 0);
  CHECK(std::memcmp(losses2.data(), losses.data(), sizeof(float) * N) == 0);

  const float dloss = 0.25f;
  auto objective = [&] {
    SoftmaxCrossEntropyForward(probs.data(), losses.data(), logits.data(), targets.data(), N, V);
    double sum = 0.0;
    for (float l : losses) sum += double{dloss} * l;
    return sum;
  };
  objective();
  std::vector<float> dlogits(N * V);
  SoftmaxCrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  ExpectGradientsClose("softmax-xent dlogits", dlogits.data(),
                       NumericGradient(logits.data(), N * V, 1e-2f, objective), 2e-3, 1e-4);
}

TEST_CASE("encoder gradients scatter by token and position", "[gpt][kernels]") {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<std::int32_t> tokens = {1, 4, 1, 1, 0, 4};  // repeated tokens accumulate
  std::vector<float> wte = RandomVector(V * C, 70, 1.0f);
  std::vector<float> wpe = RandomVector(T * C, 71, 1.0f);
  std::vector<float> r = RandomVector(B * T * C, 72, 1.0f);
  std::vector<float> out(B * T * C);
  auto objective = [&] {
    EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return WeightedSum(out, r);
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  EncoderBackward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  ExpectGradientsClose("encoder dwte", dwte.data(),
                       NumericGradient(wte.data(), V * C, 1e-2f, objective), 1e-3, 1e-4);
  ExpectGradientsClose("encoder dwpe", dwpe.data(),
                       NumericGradient(wpe.data(), T * C, 1e-2f, objective), 1e-3, 1e-4);
  // Tokens 2 and 3 never occur: their rows get exactly zero.
  for (int c = 0; c < C; ++c) {
    CHECK(dwte[2 * C + c] == 0.0f);
    CHECK(dwte[3 * C + c] == 0.0f);
  }
}

}  // namespace
}  // namespace pipeoffload::gpt
