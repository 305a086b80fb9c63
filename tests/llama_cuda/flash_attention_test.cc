// Flash attention (examples/common/cuda/flash_attention.h) against the CPU reference
// (llama_kernels_cpu.h AttentionForward / Backward) on bf16-rounded random inputs, with the
// conventions of tests/gpt_cuda: outputs and workspace poisoned (NaN) before every run, two runs
// with the same bits, the worst element printed. Hidden "[.flash_bench]": timings of the API
// and of each of the forward's block shapes.
//
// Tolerance, per element (as gpt_attention_test.cc): the kernels round P (forward, dV) and
// dS = P (dP - D) (dQ, dK) to bf16 before their second product, each off by at most 2^-8 of its
// value, which moves an output by at most 2^-8 times the sum of the magnitudes of its terms
// (|dS| <= P (|dP| + |D|)); everything else is fp32. The bound is twice that, plus one ulp
// (2^-7) of the value for the output's own rounding, plus 1e-6. The backward reference takes
// the GPU's own out and lse, so the two backwards see identical inputs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "examples/common/cuda/flash_attention.h"
#include "examples/common/cuda/flash_attention_launch.h"
#include "examples/llama/llama_kernels_cpu.h"
#include "tests/gpt_cuda/kernel_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::examples::cuda {
namespace {

using gpt::cuda::testing::DeviceArray;
using gpt::cuda::testing::kBf16Roundoff;
using gpt::cuda::testing::kBf16UlpRelative;
using gpt::cuda::testing::RandomBf16Values;
using gpt::cuda::testing::RequireClose;
using gpt::cuda::testing::RequireWithin;
using gpt::cuda::testing::SameBits;
using gpt::cuda::testing::TestStream;
using gpt::cuda::testing::ToBf16;
using gpt::cuda::testing::ToFloat;

constexpr double kTermBound = 2.0 * kBf16Roundoff;

struct Shape {
  int B, T, NH, NKV, hd;
  // q, k, v (and dq, dk, dv) as column ranges of one (N, (NH + 2 NKV) hd) matrix and out / dout
  // rows padded by 8 elements; else each dense, strides left 0 (the default).
  bool fused;
};

// Where each tensor lives on the device: q, k, v (and dq, dk, dv) inside one buffer of
// N (NH + 2 NKV) hd elements, out / dout in buffers of N * out_stride.
struct Layout {
  explicit Layout(const Shape& shape) : s(shape) {
    N = std::int64_t{s.B} * s.T;
    const std::int64_t width = std::int64_t{s.NH + 2 * s.NKV} * s.hd;
    if (s.fused) {
      q_stride = kv_stride = width;
      q_offset = 0;
      k_offset = std::int64_t{s.NH} * s.hd;
      v_offset = std::int64_t{s.NH + s.NKV} * s.hd;
      out_stride = std::int64_t{s.NH} * s.hd + 8;
    } else {
      q_stride = out_stride = std::int64_t{s.NH} * s.hd;
      kv_stride = std::int64_t{s.NKV} * s.hd;
      q_offset = 0;
      k_offset = N * q_stride;
      v_offset = k_offset + N * kv_stride;
    }
    qkv_count = N * width;
    out_count = N * out_stride;
  }
  AttentionDims Dims() const {
    AttentionDims d{s.B, s.T, s.NH, s.NKV, s.hd, 0, 0, 0};
    if (s.fused) {
      d.q_row_stride = q_stride;
      d.kv_row_stride = kv_stride;
      d.out_row_stride = out_stride;
    }
    return d;
  }
  Shape s;
  std::int64_t N, q_stride, kv_stride, out_stride, q_offset, k_offset, v_offset;
  std::int64_t qkv_count, out_count;
};

// Dense (N, heads, hd) <-> rows of `stride` elements starting at `offset` of a buffer.
void Scatter(std::vector<bf16>& buffer, const std::vector<float>& dense, std::int64_t offset,
             std::int64_t stride, std::int64_t N, int width) {
  for (std::int64_t n = 0; n < N; ++n) {
    for (int c = 0; c < width; ++c) {
      buffer[offset + n * stride + c] = __float2bfloat16_rn(dense[n * width + c]);
    }
  }
}
std::vector<float> Gather(const std::vector<bf16>& buffer, std::int64_t offset,
                          std::int64_t stride, std::int64_t N, int width) {
  std::vector<float> dense(static_cast<std::size_t>(N * width));
  for (std::int64_t n = 0; n < N; ++n) {
    for (int c = 0; c < width; ++c) {
      dense[n * width + c] = __bfloat162float(buffer[offset + n * stride + c]);
    }
  }
  return dense;
}

// Elements of an out / dout buffer outside the heads (the fused layout's row padding) that are
// not the poison pattern: the kernels wrote past their columns.
std::int64_t PaddingWritten(const Layout& l, const std::vector<bf16>& out) {
  std::int64_t written = 0;
  for (std::int64_t n = 0; n < l.N; ++n) {
    for (std::int64_t c = std::int64_t{l.s.NH} * l.s.hd; c < l.out_stride; ++c) {
      std::uint16_t bits;
      std::memcpy(&bits, &out[n * l.out_stride + c], sizeof(bits));
      written += bits != 0xFFFF;
    }
  }
  return written;
}

std::int64_t Index(const Shape& s, int b, int t, int heads, int h) {
  return ((std::int64_t{b} * s.T + t) * heads + h) * s.hd;
}

// The forward bounds (see the top) and lse in double, from dense q, k, v and the reference out.
void ForwardBounds(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, const std::vector<float>& out,
                   std::vector<float>& bound, std::vector<float>& lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  const int group = s.NH / s.NKV;
  bound.assign(out.size(), 0.0f);
  lse.assign(static_cast<std::size_t>(std::int64_t{s.B} * s.NH * s.T), 0.0f);
  std::vector<double> p(static_cast<std::size_t>(s.T));
  std::vector<double> terms(static_cast<std::size_t>(s.hd));
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < s.T; ++t) {
        const float* qt = &q[Index(s, b, t, s.NH, h)];
        double max_score = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* kj = &k[Index(s, b, j, s.NKV, h / group)];
          double dot = 0.0;
          for (int d = 0; d < s.hd; ++d) dot += double{qt[d]} * kj[d];
          p[j] = dot * scale;
          max_score = std::max(max_score, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += std::exp(p[j] - max_score);
        lse[(std::int64_t{b} * s.NH + h) * s.T + t] = static_cast<float>(max_score + std::log(sum));
        std::fill(terms.begin(), terms.end(), 0.0);
        for (int j = 0; j <= t; ++j) {
          const double pj = std::exp(p[j] - max_score) / sum;
          const float* vj = &v[Index(s, b, j, s.NKV, h / group)];
          for (int d = 0; d < s.hd; ++d) terms[d] += pj * std::fabs(vj[d]);
        }
        const std::int64_t o = Index(s, b, t, s.NH, h);
        for (int d = 0; d < s.hd; ++d) {
          bound[o + d] = static_cast<float>(kTermBound * terms[d] +
                                            kBf16UlpRelative * std::fabs(out[o + d]) + 1e-6);
        }
      }
    }
  }
}

struct BackwardBound {
  std::vector<float> dq, dk, dv;
};

// The backward bounds (see the top) from the same inputs as the reference backward.
BackwardBound BackwardBounds(const Shape& s, const std::vector<float>& q,
                             const std::vector<float>& k, const std::vector<float>& v,
                             const std::vector<float>& dout, const std::vector<float>& out,
                             const std::vector<float>& lse, const std::vector<float>& want_dq,
                             const std::vector<float>& want_dk,
                             const std::vector<float>& want_dv) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  const int group = s.NH / s.NKV;
  std::vector<double> tq(want_dq.size(), 0.0), tk(want_dk.size(), 0.0), tv(want_dv.size(), 0.0);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < s.T; ++t) {
        const std::int64_t qo = Index(s, b, t, s.NH, h);
        double D = 0.0;
        for (int d = 0; d < s.hd; ++d) D += double{dout[qo + d]} * out[qo + d];
        const double l = lse[(std::int64_t{b} * s.NH + h) * s.T + t];
        for (int j = 0; j <= t; ++j) {
          const std::int64_t ko = Index(s, b, j, s.NKV, h / group);
          double dot = 0.0;
          double dp = 0.0;
          for (int d = 0; d < s.hd; ++d) {
            dot += double{q[qo + d]} * k[ko + d];
            dp += double{dout[qo + d]} * v[ko + d];
          }
          const double p = std::exp(dot * scale - l);
          const double w = scale * p * (std::fabs(dp) + std::fabs(D));
          for (int d = 0; d < s.hd; ++d) {
            tq[qo + d] += w * std::fabs(k[ko + d]);
            tk[ko + d] += w * std::fabs(q[qo + d]);
            tv[ko + d] += p * std::fabs(dout[qo + d]);
          }
        }
      }
    }
  }
  const auto finish = [](const std::vector<double>& terms, const std::vector<float>& want) {
    std::vector<float> bound(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      bound[i] = static_cast<float>(kTermBound * terms[i] +
                                    kBf16UlpRelative * std::fabs(want[i]) + 1e-6);
    }
    return bound;
  };
  return {finish(tq, want_dq), finish(tk, want_dk), finish(tv, want_dv)};
}

void CheckShape(const Shape& s) {
  CAPTURE(s.B, s.T, s.NH, s.NKV, s.hd, s.fused);
  const Layout l(s);
  const std::int64_t N = l.N;
  const int qw = s.NH * s.hd;
  const int kvw = s.NKV * s.hd;
  // q and k in [-2, 2) so that the softmax is far from uniform; v and dout in [-1, 1).
  const std::vector<float> q = RandomBf16Values(N * qw, -2.0f, 2.0f, 101 + s.T);
  const std::vector<float> k = RandomBf16Values(N * kvw, -2.0f, 2.0f, 102 + s.T);
  const std::vector<float> v = RandomBf16Values(N * kvw, -1.0f, 1.0f, 103 + s.T);
  const std::vector<float> dout = RandomBf16Values(N * qw, -1.0f, 1.0f, 104 + s.T);
  std::vector<bf16> host_qkv(static_cast<std::size_t>(l.qkv_count), __float2bfloat16_rn(0.0f));
  Scatter(host_qkv, q, l.q_offset, l.q_stride, N, qw);
  Scatter(host_qkv, k, l.k_offset, l.kv_stride, N, kvw);
  Scatter(host_qkv, v, l.v_offset, l.kv_stride, N, kvw);
  std::vector<bf16> host_dout(static_cast<std::size_t>(l.out_count), __float2bfloat16_rn(0.0f));
  Scatter(host_dout, dout, 0, l.out_stride, N, qw);

  const AttentionDims dims = l.Dims();
  const std::int64_t lse_count = std::int64_t{s.B} * s.NH * s.T;
  REQUIRE(FlashAttentionBackwardWorkspaceBytes(dims) == 4 * lse_count);
  TestStream stream;
  DeviceArray<bf16> d_qkv(l.qkv_count), d_out(l.out_count), d_dout(l.out_count);
  DeviceArray<bf16> d_grad(l.qkv_count);
  DeviceArray<float> d_lse(lse_count);
  DeviceArray<unsigned char> workspace(FlashAttentionBackwardWorkspaceBytes(dims));
  d_qkv.Upload(host_qkv);
  d_dout.Upload(host_dout);
  const bf16* k_in = d_qkv.data() + l.k_offset;
  const bf16* v_in = d_qkv.data() + l.v_offset;

  std::vector<bf16> outs[2], grads[2];
  std::vector<float> lses[2];
  for (int run = 0; run < 2; ++run) {
    d_out.Poison();
    d_lse.Poison();
    PO_TEST_OK(FlashAttentionForward(d_out.data(), d_lse.data(), d_qkv.data() + l.q_offset, k_in,
                                     v_in, dims, stream.get()));
    outs[run] = d_out.Download();
    lses[run] = d_lse.Download();
    workspace.Poison();
    d_grad.Poison();
    PO_TEST_OK(FlashAttentionBackward(
        d_grad.data() + l.q_offset, d_grad.data() + l.k_offset, d_grad.data() + l.v_offset,
        workspace.data(), d_dout.data(), d_out.data(), d_lse.data(), d_qkv.data() + l.q_offset,
        k_in, v_in, dims, stream.get()));
    grads[run] = d_grad.Download();
  }
  CHECK(SameBits(outs[0], outs[1]));
  CHECK(SameBits(lses[0], lses[1]));
  CHECK(SameBits(grads[0], grads[1]));
  CHECK(PaddingWritten(l, outs[0]) == 0);

  // Forward against the CPU (fp32) with the bounds above; lse against double.
  std::vector<float> want_out(static_cast<std::size_t>(N * qw));
  std::vector<float> cpu_lse(static_cast<std::size_t>(lse_count));
  std::vector<float> scratch(static_cast<std::size_t>(2 * s.T));
  llama::AttentionForward(want_out.data(), cpu_lse.data(), scratch.data(), q.data(), k.data(),
                          v.data(), s.B, s.T, s.NH, s.NKV, s.hd);
  std::vector<float> out_bound, want_lse;
  ForwardBounds(s, q, k, v, want_out, out_bound, want_lse);
  const std::vector<float> got_out = Gather(outs[0], 0, l.out_stride, N, qw);
  RequireWithin(got_out, want_out, out_bound, "FlashAttentionForward out");
  RequireClose(lses[0], want_lse, 1e-6, 3e-5, "FlashAttentionForward lse");

  // Backward against the CPU from the GPU's out and lse.
  std::vector<float> want_dq(static_cast<std::size_t>(N * qw));
  std::vector<float> want_dk(static_cast<std::size_t>(N * kvw));
  std::vector<float> want_dv(static_cast<std::size_t>(N * kvw));
  llama::AttentionBackward(want_dq.data(), want_dk.data(), want_dv.data(), scratch.data(),
                           dout.data(), got_out.data(), lses[0].data(), q.data(), k.data(),
                           v.data(), s.B, s.T, s.NH, s.NKV, s.hd);
  const BackwardBound bound =
      BackwardBounds(s, q, k, v, dout, got_out, lses[0], want_dq, want_dk, want_dv);
  RequireWithin(Gather(grads[0], l.q_offset, l.q_stride, N, qw), want_dq, bound.dq,
                "FlashAttentionBackward dq");
  RequireWithin(Gather(grads[0], l.k_offset, l.kv_stride, N, kvw), want_dk, bound.dk,
                "FlashAttentionBackward dk");
  RequireWithin(Gather(grads[0], l.v_offset, l.kv_stride, N, kvw), want_dv, bound.dv,
                "FlashAttentionBackward dv");
}

// T = 1 (one masked diagonal block), 17 and 200 (tails inside one and two 128-row blocks), 128
// (exactly one), 1024 (many key blocks, unmasked ones); MHA and GQA with several kv heads (a
// wrong query-to-kv-head map shows); fused (strided) and dense layouts.
TEST_CASE("Flash attention forward and backward match the CPU", "[flash]") {
  for (const int hd : {64, 128}) {
    for (const int heads : {0, 1}) {
      const int NH = heads == 0 ? 2 : 8;
      const int NKV = 2;
      for (const int T : {1, 17, 128, 200, 1024}) {
        const bool fused = T == 17 || T == 128 || T == 1024;
        CheckShape(Shape{2, T, NH, NKV, hd, fused});
      }
    }
  }
}

TEST_CASE("Flash attention with one kv head for all query heads", "[flash]") {
  CheckShape(Shape{1, 300, 4, 1, 128, true});
  CheckShape(Shape{3, 65, 3, 1, 64, false});
}

// ---- Argument errors -------------------------------------------------------------------------

void RequireInvalid(const absl::Status& status, const std::string& field) {
  INFO(status.ToString());
  REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message().find(field) != absl::string_view::npos);
}

TEST_CASE("Flash attention rejects bad arguments", "[flash]") {
  const AttentionDims good{1, 8, 4, 2, 64, 0, 0, 0};
  TestStream stream;
  DeviceArray<bf16> q(8 * 4 * 64 + 8), kv(8 * 2 * 64 + 8), out(8 * 4 * 64 + 8);
  DeviceArray<bf16> dq(8 * 4 * 64), dk(8 * 2 * 64), dv(8 * 2 * 64);
  DeviceArray<float> lse(4 * 8 + 1);
  DeviceArray<unsigned char> workspace(4 * 8 * 4 + 16);
  const auto forward = [&](const AttentionDims& d) {
    return FlashAttentionForward(out.data(), lse.data(), q.data(), kv.data(), kv.data(), d,
                                 stream.get());
  };
  const auto backward = [&](const AttentionDims& d) {
    return FlashAttentionBackward(dq.data(), dk.data(), dv.data(), workspace.data(), out.data(),
                                  out.data(), lse.data(), q.data(), kv.data(), kv.data(), d,
                                  stream.get());
  };
  struct Bad {
    AttentionDims dims;
    const char* field;
  };
  const Bad bads[] = {
      {{0, 8, 4, 2, 64, 0, 0, 0}, "B = 0"},
      {{1, 0, 4, 2, 64, 0, 0, 0}, "T = 0"},
      {{1, 8, 0, 2, 64, 0, 0, 0}, "NH = 0"},
      {{1, 8, 4, 0, 64, 0, 0, 0}, "NKV = 0"},
      {{1, 8, 4, 2, 96, 0, 0, 0}, "hd = 96 is not 64 or 128"},
      {{1, 8, 4, 3, 64, 0, 0, 0}, "NH = 4 is not a multiple of NKV = 3"},
      {{1, 8, 4, 2, 64, 200, 0, 0}, "q_row_stride = 200 is out of range"},
      {{1, 8, 4, 2, 64, 260, 0, 0}, "q_row_stride = 260 is not a multiple of 8"},
      {{1, 8, 4, 2, 64, 0, -8, 0}, "kv_row_stride = -8 is out of range"},
      {{1, 8, 4, 2, 64, 0, 0, 100}, "out_row_stride = 100 is out of range"},
  };
  for (const Bad& bad : bads) {
    CAPTURE(bad.field);
    RequireInvalid(forward(bad.dims), bad.field);
    RequireInvalid(backward(bad.dims), bad.field);
  }
  RequireInvalid(FlashAttentionForward(out.data(), lse.data(), nullptr, kv.data(), kv.data(),
                                       good, stream.get()),
                 "q is null");
  RequireInvalid(FlashAttentionForward(out.data(), nullptr, q.data(), kv.data(), kv.data(), good,
                                       stream.get()),
                 "lse is null");
  RequireInvalid(FlashAttentionForward(out.data() + 1, lse.data(), q.data(), kv.data(),
                                       kv.data(), good, stream.get()),
                 "out is not 16-byte aligned");
  RequireInvalid(FlashAttentionForward(out.data(), lse.data(), q.data(), kv.data() + 4,
                                       kv.data(), good, stream.get()),
                 "k is not 16-byte aligned");
  RequireInvalid(
      FlashAttentionBackward(dq.data(), dk.data(), dv.data(), nullptr, out.data(), out.data(),
                             lse.data(), q.data(), kv.data(), kv.data(), good, stream.get()),
      "workspace is null");
  RequireInvalid(FlashAttentionBackward(dq.data(), dk.data(), dv.data(), workspace.data() + 2,
                                        out.data(), out.data(), lse.data(), q.data(), kv.data(),
                                        kv.data(), good, stream.get()),
                 "workspace is not 4-byte aligned");
  RequireInvalid(FlashAttentionBackward(dq.data(), dk.data(), nullptr, workspace.data(),
                                        out.data(), out.data(), lse.data(), q.data(), kv.data(),
                                        kv.data(), good, stream.get()),
                 "dv is null");
  CHECK(FlashAttentionBackwardWorkspaceBytes(AttentionDims{0, 8, 4, 2, 64, 0, 0, 0}) == 0);
  // The good arguments do run (so the failures above are the checks', not the buffers').
  PO_TEST_OK(forward(good));
  PO_TEST_OK(backward(good));
  PO_TEST_CUDA(cudaStreamSynchronize(stream.get()));
}

// ---- Timings ---------------------------------------------------------------------------------

// Median milliseconds of `launch` on `stream`: device events around each launch, 3 warm-ups, 20
// runs. The inputs are GBs (far past the 50 MB L2), so no flush between runs.
template <typename Launch>
double MedianMs(cudaStream_t stream, Launch&& launch) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  PO_TEST_CUDA(cudaEventCreate(&start));
  PO_TEST_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) PO_TEST_OK(launch());
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    PO_TEST_CUDA(cudaEventRecord(start, stream));
    PO_TEST_OK(launch());
    PO_TEST_CUDA(cudaEventRecord(stop, stream));
    PO_TEST_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    PO_TEST_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Random bf16 in [-1, 1): one random block of 2^22 values repeated over the buffer (generating
// GBs on the host would dominate the test; the timing does not depend on the values).
void FillRandom(const DeviceArray<bf16>& buffer, std::uint64_t seed) {
  constexpr std::int64_t kBlock = std::int64_t{1} << 22;
  const std::vector<bf16> block = ToBf16(RandomBf16Values(kBlock, -1.0f, 1.0f, seed));
  for (std::int64_t at = 0; at < buffer.count(); at += kBlock) {
    const std::int64_t n = std::min(kBlock, buffer.count() - at);
    PO_TEST_CUDA(cudaMemcpy(buffer.data() + at, block.data(), sizeof(bf16) * n,
                            cudaMemcpyHostToDevice));
  }
}

TEST_CASE("Flash attention timings", "[.flash_bench]") {
  struct Config {
    int B, T, NH, NKV, hd;
  };
  for (const Config& c :
       {Config{1, 2048, 32, 8, 128}, Config{1, 4096, 32, 8, 128}, Config{8, 2048, 32, 8, 128},
        Config{32, 2048, 32, 8, 128}, Config{32, 2048, 32, 32, 128}, Config{8, 2048, 32, 8, 64}}) {
    const AttentionDims dims{c.B, c.T, c.NH, c.NKV, c.hd, 0, 0, 0};
    const std::int64_t N = std::int64_t{c.B} * c.T;
    TestStream stream;
    cudaStream_t s = stream.get();
    const std::int64_t q_count = N * c.NH * c.hd;
    const std::int64_t kv_count = N * c.NKV * c.hd;
    DeviceArray<bf16> q(q_count), k(kv_count), v(kv_count), out(q_count), dout(q_count);
    DeviceArray<bf16> dq(q_count), dk(kv_count), dv(kv_count);
    DeviceArray<float> lse(std::int64_t{c.B} * c.NH * c.T);
    DeviceArray<unsigned char> workspace(FlashAttentionBackwardWorkspaceBytes(dims));
    FillRandom(q, 1);
    FillRandom(k, 2);
    FillRandom(v, 3);
    FillRandom(dout, 4);
    const double forward = MedianMs(s, [&] {
      return FlashAttentionForward(out.data(), lse.data(), q.data(), k.data(), v.data(), dims, s);
    });
    const double backward = MedianMs(s, [&] {
      return FlashAttentionBackward(dq.data(), dk.data(), dv.data(), workspace.data(),
                                    dout.data(), out.data(), lse.data(), q.data(), k.data(),
                                    v.data(), dims, s);
    });
    // Useful causal FLOPs (half of each T x T product): 2 products in the forward, 5 in the
    // backward (the scores recomputed once), T^2 hd multiply-adds each per head.
    const double product = 1.0 * c.B * c.NH * c.T * c.T * c.hd;
    std::printf(
        "bench FlashAttention B=%d T=%d NH=%d NKV=%d hd=%d: forward %8.3f ms (%5.1f causal "
        "TFLOP/s), backward %8.3f ms (%5.1f)\n",
        c.B, c.T, c.NH, c.NKV, c.hd, forward, 2 * product / (forward * 1e-3) / 1e12, backward,
        5 * product / (backward * 1e-3) / 1e12);
    // The forward's other block shapes (flash_attention_launch.h), through the internal
    // launcher with the dense layout's arguments.
    internal::FlashArgs args;
    args.q = q.data();
    args.k = k.data();
    args.v = v.data();
    args.out = out.data();
    args.lse = lse.data();
    args.q_stride = args.out_stride = std::int64_t{c.NH} * c.hd;
    args.kv_stride = std::int64_t{c.NKV} * c.hd;
    args.B = c.B;
    args.T = c.T;
    args.NH = c.NH;
    args.NKV = c.NKV;
    args.group = c.NH / c.NKV;
    args.hd = c.hd;
    for (int variant = 0; variant < internal::kFlashForwardVariants; ++variant) {
      const double ms = MedianMs(s, [&] {
        const cudaError_t error = internal::LaunchFlashForwardVariant(args, variant, s);
        return error == cudaSuccess ? absl::OkStatus()
                                    : absl::InternalError(cudaGetErrorString(error));
      });
      std::printf("bench   forward variant %d%s: %8.3f ms (%5.1f causal TFLOP/s)\n", variant,
                  variant == internal::kFlashForwardDefaultVariant ? " (default)" : "", ms,
                  2 * product / (ms * 1e-3) / 1e12);
    }
  }
}

}  // namespace
}  // namespace pipeoffload::examples::cuda
