// The softmax cross-entropy kernels against the CPU reference (losses and gradients) and a
// double-precision log-sum-exp, with the conventions of gpt_kernels_test.cc.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/gpt/kernels_cpu.h"
#include "tests/gpt_cuda/kernel_test_util.h"

namespace pipeoffload::gpt::cuda::testing {
namespace {

// log sum_v exp(logits[n, v]) in double.
std::vector<float> ReferenceLse(const std::vector<float>& logits, int N, int V) {
  std::vector<float> lse(static_cast<std::size_t>(N));
  for (int n = 0; n < N; ++n) {
    const float* z = logits.data() + std::int64_t{n} * V;
    double m = -INFINITY;
    for (int v = 0; v < V; ++v) m = z[v] > m ? z[v] : m;
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    lse[n] = static_cast<float>(m + std::log(sum));
  }
  return lse;
}

struct CrossEntropyCase {
  int N, V;
};

// Tolerances: losses within 1e-4 absolute of the CPU's (both sum up to 50304 exponentials in
// fp32, in different orders: relative errors of the sum of ~1e-5 at most, log-space absolute);
// lse within 1e-5 + 1e-6 relative of double; gradients within 1 ulp (probabilities from the
// two lse's differ by ~1e-5 relative, far below bf16's 2^-8).
TEST_CASE("Softmax cross-entropy matches the CPU", "[gpt_kernels][cross_entropy]") {
  // V = 7, 37 and 50257 take the scalar path; 50304 (GPT-2's padded vocabulary) the packed one.
  for (const CrossEntropyCase& c :
       {CrossEntropyCase{1, 7}, CrossEntropyCase{5, 37}, CrossEntropyCase{64, 1000},
        CrossEntropyCase{8, 50304}, CrossEntropyCase{3, 50257}}) {
    CAPTURE(c.N, c.V);
    TestStream stream;
    const std::int64_t size = std::int64_t{c.N} * c.V;
    const std::vector<float> logits = RandomBf16Values(size, -4.0f, 4.0f, 51);
    const std::vector<std::int32_t> targets = RandomTokens(c.N, c.V, 52);
    const float dloss = 0.37f;
    std::vector<float> probs(static_cast<std::size_t>(size));
    std::vector<float> want_losses(static_cast<std::size_t>(c.N));
    gpt::SoftmaxCrossEntropyForward(probs.data(), want_losses.data(), logits.data(), targets.data(),
                                    c.N, c.V);
    std::vector<float> want_dlogits(static_cast<std::size_t>(size));
    gpt::SoftmaxCrossEntropyBackward(want_dlogits.data(), probs.data(), targets.data(), dloss, c.N,
                                     c.V);

    DeviceArray<bf16> d_logits(size), d_dlogits(size);
    DeviceArray<std::int32_t> d_targets(c.N);
    DeviceArray<float> d_losses(c.N), d_lse(c.N);
    d_logits.Upload(ToBf16(logits));
    d_targets.Upload(targets);

    std::vector<float> losses[2];
    std::vector<float> lses[2];
    for (int run = 0; run < 2; ++run) {
      d_losses.Poison();
      d_lse.Poison();
      PO_TEST_OK(cuda::SoftmaxCrossEntropyForward(d_losses.data(), d_lse.data(), d_logits.data(),
                                                  d_targets.data(), c.N, c.V, stream.get()));
      losses[run] = d_losses.Download();
      lses[run] = d_lse.Download();
    }
    RequireClose(losses[0], want_losses, 0.0, 1e-4, "SoftmaxCrossEntropyForward losses");
    RequireClose(lses[0], ReferenceLse(logits, c.N, c.V), 1e-6, 1e-5,
                 "SoftmaxCrossEntropyForward lse");
    CHECK(SameBits(losses[0], losses[1]));
    CHECK(SameBits(lses[0], lses[1]));

    // Backward, out of place and in place over the logits: the same bits either way.
    d_dlogits.Poison();
    PO_TEST_OK(cuda::SoftmaxCrossEntropyBackward(d_dlogits.data(), d_logits.data(), d_lse.data(),
                                                 d_targets.data(), dloss, c.N, c.V, stream.get()));
    const std::vector<bf16> out_of_place = d_dlogits.Download();
    RequireClose(ToFloat(out_of_place), want_dlogits, kBf16UlpRelative, 1e-12,
                 "SoftmaxCrossEntropyBackward");
    PO_TEST_OK(cuda::SoftmaxCrossEntropyBackward(d_logits.data(), d_logits.data(), d_lse.data(),
                                                 d_targets.data(), dloss, c.N, c.V, stream.get()));
    CHECK(SameBits(d_logits.Download(), out_of_place));
  }
}

TEST_CASE("A target outside the vocabulary gives a NaN loss, and only for its row",
          "[gpt_kernels][cross_entropy]") {
  constexpr int kN = 3;
  constexpr int kV = 37;
  TestStream stream;
  const std::vector<float> logits = RandomBf16Values(kN * kV, -4.0f, 4.0f, 53);
  const std::vector<std::int32_t> targets = {5, kV, -1};
  DeviceArray<bf16> d_logits(kN * kV);
  DeviceArray<std::int32_t> d_targets(kN);
  DeviceArray<float> d_losses(kN), d_lse(kN);
  d_logits.Upload(ToBf16(logits));
  d_targets.Upload(targets);
  d_losses.Poison();
  PO_TEST_OK(cuda::SoftmaxCrossEntropyForward(d_losses.data(), d_lse.data(), d_logits.data(),
                                              d_targets.data(), kN, kV, stream.get()));
  const std::vector<float> losses = d_losses.Download();
  const std::vector<float> lse = ReferenceLse(logits, kN, kV);
  CHECK(std::fabs(losses[0] - (lse[0] - logits[5])) <= 1e-5f);
  CHECK(std::isnan(losses[1]));
  CHECK(std::isnan(losses[2]));
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda::testing
