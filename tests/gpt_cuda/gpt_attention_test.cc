// The GPT's causal attention (the shared flash kernel on the fused QKV layout, kernels_cuda.h)
// against the GPT's CPU reference (kernels_cpu.h), with the conventions of gpt_kernels_test.cc:
// bf16-rounded inputs shared with the CPU, outputs AND the workspace poisoned before every run
// (a read of anything nobody wrote turns into NaN), two runs with the same bits. The flash
// kernel's own tests (other layouts, GQA) are tests/llama_cuda/flash_attention_test.cc; this one
// checks the GPT's mapping: q | k | v column blocks of rows 3C apart, head h at h * hs.
//
// Tolerance, per element: the GPU rounds the probabilities P (forward, and dV) and the score
// gradients dS = P (dP - D) (dQ, dK) to bf16 before the second product, each off by at most
// 2^-8 of its value; that moves an output by at most 2^-8 times the sum of the magnitudes of
// its terms (for dS, bounded through |dS| <= P (|dP| + |D|)). The bound is twice that, plus one
// ulp (2^-7) of the value for the output's own rounding, plus 1e-6. The backward also takes
// D = dot(dout, out) from the GPU's bf16 out (the CPU from its fp32 probabilities): that moves
// D by at most sum_d |dout_d| * bound(out_d) (the forward's bound, which the forward check
// asserts), and dS = P (dP - D) by P times that, added as is.
#include <cmath>
#include <cstdint>
#include <vector>

#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/gpt/kernels_cpu.h"
#include "tests/gpt_cuda/kernel_test_util.h"

namespace pipeoffload::gpt::cuda::testing {
namespace {

constexpr double kTermBound = 2.0 * kBf16Roundoff;

// Index helpers over qkv (B,T,3C), out (B,T,C) and att (B,NH,T,T).
struct Layout {
  AttentionShape s;
  int C() const { return s.NH * s.hs; }
  std::int64_t Qkv(int b, int t, int part, int h, int d) const {
    return (std::int64_t{b} * s.T + t) * 3 * C() + std::int64_t{part} * C() + h * s.hs + d;
  }
  std::int64_t Out(int b, int t, int h, int d) const {
    return (std::int64_t{b} * s.T + t) * C() + h * s.hs + d;
  }
  std::int64_t Att(int b, int h, int i, int j) const {
    return ((std::int64_t{b} * s.NH + h) * s.T + i) * s.T + j;
  }
};

// Forward bounds (see the top) and lse in double.
void ForwardReference(const Layout& l, const std::vector<float>& qkv, const std::vector<float>& att,
                      const std::vector<float>& out, std::vector<float>& bound,
                      std::vector<float>& lse) {
  const AttentionShape& s = l.s;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hs));
  bound.assign(out.size(), 0.0f);
  lse.assign(static_cast<std::size_t>(std::int64_t{s.B} * s.NH * s.T), 0.0f);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int i = 0; i < s.T; ++i) {
        std::vector<double> scores(static_cast<std::size_t>(i + 1));
        double max_score = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int d = 0; d < s.hs; ++d)
            dot += double{qkv[l.Qkv(b, i, 0, h, d)]} * qkv[l.Qkv(b, j, 1, h, d)];
          scores[j] = dot * scale;
          max_score = scores[j] > max_score ? scores[j] : max_score;
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += std::exp(scores[j] - max_score);
        lse[(std::int64_t{b} * s.NH + h) * s.T + i] = static_cast<float>(max_score + std::log(sum));
        for (int d = 0; d < s.hs; ++d) {
          double terms = 0.0;
          for (int j = 0; j <= i; ++j)
            terms += att[l.Att(b, h, i, j)] * std::fabs(qkv[l.Qkv(b, j, 2, h, d)]);
          const std::int64_t o = l.Out(b, i, h, d);
          bound[o] =
              static_cast<float>(kTermBound * terms + kBf16UlpRelative * std::fabs(out[o]) + 1e-6);
        }
      }
    }
  }
}

// Backward bounds for dqkv (see the top).
std::vector<float> BackwardBound(const Layout& l, const std::vector<float>& qkv,
                                 const std::vector<float>& att, const std::vector<float>& dout,
                                 const std::vector<float>& out_bound,
                                 const std::vector<float>& dqkv) {
  const AttentionShape& s = l.s;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hs));
  std::vector<double> terms(dqkv.size(), 0.0);
  std::vector<double> shift(dqkv.size(), 0.0);  // from the GPU's D (see the top), not scaled
  std::vector<double> weight(static_cast<std::size_t>(s.T));  // P_ij (|dP_ij| + |D_i|) of a row
  std::vector<double> dprob(static_cast<std::size_t>(s.T));
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int i = 0; i < s.T; ++i) {
        double D = 0.0;
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int d = 0; d < s.hs; ++d)
            dot += double{dout[l.Out(b, i, h, d)]} * qkv[l.Qkv(b, j, 2, h, d)];
          dprob[j] = dot;
          D += att[l.Att(b, h, i, j)] * dot;
        }
        double d_error = 0.0;
        for (int d = 0; d < s.hs; ++d)
          d_error += std::fabs(dout[l.Out(b, i, h, d)]) * out_bound[l.Out(b, i, h, d)];
        for (int j = 0; j <= i; ++j) {
          weight[j] = att[l.Att(b, h, i, j)] * (std::fabs(dprob[j]) + std::fabs(D));
        }
        for (int j = 0; j <= i; ++j) {
          const double p = att[l.Att(b, h, i, j)];
          for (int d = 0; d < s.hs; ++d) {
            terms[l.Qkv(b, i, 0, h, d)] += scale * weight[j] * std::fabs(qkv[l.Qkv(b, j, 1, h, d)]);
            terms[l.Qkv(b, j, 1, h, d)] += scale * weight[j] * std::fabs(qkv[l.Qkv(b, i, 0, h, d)]);
            shift[l.Qkv(b, i, 0, h, d)] += scale * p * d_error * std::fabs(qkv[l.Qkv(b, j, 1, h, d)]);
            shift[l.Qkv(b, j, 1, h, d)] += scale * p * d_error * std::fabs(qkv[l.Qkv(b, i, 0, h, d)]);
            terms[l.Qkv(b, j, 2, h, d)] += p * std::fabs(dout[l.Out(b, i, h, d)]);
          }
        }
      }
    }
  }
  std::vector<float> bound(dqkv.size());
  for (std::size_t k = 0; k < dqkv.size(); ++k) {
    bound[k] = static_cast<float>(kTermBound * terms[k] + shift[k] +
                                  kBf16UlpRelative * std::fabs(dqkv[k]) + 1e-6);
  }
  return bound;
}

TEST_CASE("Attention forward and backward match the CPU", "[gpt_kernels][attention]") {
  // T = 1 (one masked diagonal block), odd T (tails inside one and two query blocks), hs 64 and
  // 128, one and several heads (a head offset or row stride off by one shows), B > 1 (the
  // sequence offsets), T = 1024 (many key blocks).
  for (const AttentionShape& shape :
       {AttentionShape{1, 1, 1, 64}, AttentionShape{2, 37, 3, 64}, AttentionShape{1, 128, 4, 128},
        AttentionShape{2, 65, 5, 64}, AttentionShape{1, 256, 2, 64},
        AttentionShape{1, 1024, 2, 128}, AttentionShape{2, 1100, 1, 64}}) {
    CAPTURE(shape.B, shape.T, shape.NH, shape.hs);
    const Layout l{shape};
    const int C = l.C();
    const std::int64_t N = std::int64_t{shape.B} * shape.T;
    TestStream stream;
    // q and k in [-2, 2) so that the softmax is far from uniform; v and dout in [-1, 1).
    std::vector<float> qkv = RandomBf16Values(N * 3 * C, -2.0f, 2.0f, 61);
    for (std::int64_t n = 0; n < N; ++n) {
      for (int c = 0; c < C; ++c) qkv[n * 3 * C + 2 * C + c] *= 0.5f;  // exact: a power of two
    }
    const std::vector<float> dout = RandomBf16Values(N * C, -1.0f, 1.0f, 62);
    std::vector<float> want_out(static_cast<std::size_t>(N * C));
    std::vector<float> att(
        static_cast<std::size_t>(std::int64_t{shape.B} * shape.NH * shape.T * shape.T));
    gpt::AttentionForward(want_out.data(), att.data(), qkv.data(), shape.B, shape.T, C, shape.NH);
    std::vector<float> want_dqkv(static_cast<std::size_t>(N * 3 * C));
    std::vector<float> scratch(static_cast<std::size_t>(shape.T));
    gpt::AttentionBackward(want_dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                           shape.B, shape.T, C, shape.NH);
    std::vector<float> out_bound;
    std::vector<float> want_lse;
    ForwardReference(l, qkv, att, want_out, out_bound, want_lse);
    const std::vector<float> dqkv_bound = BackwardBound(l, qkv, att, dout, out_bound, want_dqkv);

    const std::int64_t lse_count = std::int64_t{shape.B} * shape.NH * shape.T;
    const std::int64_t workspace_bytes = AttentionBackwardWorkspaceBytes(shape);
    REQUIRE(workspace_bytes == 4 * lse_count);
    DeviceArray<unsigned char> workspace(workspace_bytes);
    DeviceArray<bf16> d_qkv(N * 3 * C), d_out(N * C), d_dout(N * C), d_dqkv(N * 3 * C);
    DeviceArray<float> d_lse(lse_count);
    d_qkv.Upload(ToBf16(qkv));
    d_dout.Upload(ToBf16(dout));

    std::vector<bf16> outs[2];
    std::vector<float> lses[2];
    std::vector<bf16> dqkvs[2];
    for (int run = 0; run < 2; ++run) {
      d_out.Poison();
      d_lse.Poison();
      PO_TEST_OK(
          cuda::AttentionForward(d_out.data(), d_lse.data(), d_qkv.data(), shape, stream.get()));
      outs[run] = d_out.Download();
      lses[run] = d_lse.Download();
      workspace.Poison();
      d_dqkv.Poison();  // every element must be written (no NaN left)
      PO_TEST_OK(cuda::AttentionBackward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(),
                                         d_lse.data(), workspace.data(), shape, stream.get()));
      dqkvs[run] = d_dqkv.Download();
    }
    RequireWithin(ToFloat(outs[0]), want_out, out_bound, "AttentionForward out");
    RequireClose(lses[0], want_lse, 1e-6, 3e-5, "AttentionForward lse");
    RequireWithin(ToFloat(dqkvs[0]), want_dqkv, dqkv_bound, "AttentionBackward dqkv");
    CHECK(SameBits(outs[0], outs[1]));
    CHECK(SameBits(lses[0], lses[1]));
    CHECK(SameBits(dqkvs[0], dqkvs[1]));
  }
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda::testing
