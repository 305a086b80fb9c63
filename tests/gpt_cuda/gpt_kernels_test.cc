// The GPT's CUDA kernels against the fp32 CPU reference (examples/gpt/kernels_cpu.h): inputs
// are rounded to bf16 first and the CPU gets the same values; outputs are poisoned with NaN
// before every run; every kernel runs twice and must give the same bits. Tolerances (|got -
// want| <= bound; NaN never passes) are stated per kernel: bf16 outputs get one ulp (2^-7
// relative) for rounding the fp32 result, fp32 sums a bound from the magnitude of their terms.
// The attention has its own file (gpt_attention_test.cc).
#include <cmath>
#include <cstdint>
#include <vector>

#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/gpt/kernels_cpu.h"
#include "tests/gpt_cuda/kernel_test_util.h"

namespace pipeoffload::gpt::cuda::testing {
namespace {

TEST_CASE("Elementwise kernels match the CPU, packed and misaligned",
          "[gpt_kernels][elementwise]") {
  const std::int64_t n = GENERATE(1, 7, 8, 1000, 1000003);
  const std::int64_t offset = GENERATE(0, 1);  // 1: every pointer misaligned: the scalar path
  CAPTURE(n, offset);
  TestStream stream;
  const std::vector<float> x = RandomBf16Values(n, -6.0f, 6.0f, 11);
  const std::vector<float> dy = RandomBf16Values(n, -2.0f, 2.0f, 12);
  DeviceArray<bf16> d_x(n, offset);
  DeviceArray<bf16> d_dy(n, offset);
  DeviceArray<bf16> d_out(n, offset);
  d_x.Upload(ToBf16(x));
  d_dy.Upload(ToBf16(dy));
  std::vector<float> want(static_cast<std::size_t>(n));

  SECTION("GeluForward: within 1 ulp") {
    gpt::GeluForward(want.data(), x.data(), n);
    d_out.Poison();
    PO_TEST_OK(cuda::GeluForward(d_out.data(), d_x.data(), n, stream.get()));
    const std::vector<bf16> first = d_out.Download();
    RequireClose(ToFloat(first), want, kBf16UlpRelative, 1e-6, "GeluForward");
    d_out.Poison();
    PO_TEST_OK(cuda::GeluForward(d_out.data(), d_x.data(), n, stream.get()));
    CHECK(SameBits(first, d_out.Download()));
  }
  SECTION("GeluBackward in place over dout: within 1 ulp") {
    gpt::GeluBackward(want.data(), x.data(), dy.data(), n);
    std::vector<bf16> runs[2];
    for (std::vector<bf16>& run : runs) {
      d_out.Upload(ToBf16(dy));  // dinp aliases dout
      PO_TEST_OK(cuda::GeluBackward(d_out.data(), d_x.data(), d_out.data(), n, stream.get()));
      run = d_out.Download();
    }
    RequireClose(ToFloat(runs[0]), want, kBf16UlpRelative, 1e-6, "GeluBackward");
    CHECK(SameBits(runs[0], runs[1]));
  }
  SECTION("Add with out aliasing a: one rounding of the exact sum") {
    gpt::ResidualForward(want.data(), x.data(), dy.data(), n);
    std::vector<bf16> runs[2];
    for (std::vector<bf16>& run : runs) {
      d_out.Upload(ToBf16(x));
      PO_TEST_OK(cuda::Add(d_out.data(), d_out.data(), d_dy.data(), n, stream.get()));
      run = d_out.Download();
    }
    RequireClose(ToFloat(runs[0]), want, kBf16Roundoff, 0.0, "Add");
    CHECK(SameBits(runs[0], runs[1]));
  }
  SECTION("Fp32ToBf16 rounds to nearest even, Bf16ToFp32 is exact: bitwise") {
    std::vector<float> wide = RandomFloats(n, -1000.0f, 1000.0f, 13);
    wide[0] = 3.0e38f;                             // near bf16's largest finite value
    if (n > 1) wide[1] = 1.0e-40f;                 // fp32 subnormal
    if (n > 2) wide[2] = 1.0f + 1.0f / 256.0f;     // a tie: rounds to even (1.0)
    if (n > 3) wide[3] = -(1.0f + 3.0f / 256.0f);  // a tie: rounds to even (away)
    DeviceArray<float> d_wide(n, offset);
    DeviceArray<float> d_back(n, offset);
    d_wide.Upload(wide);
    d_out.Poison();
    PO_TEST_OK(cuda::Fp32ToBf16(d_out.data(), d_wide.data(), n, stream.get()));
    const std::vector<bf16> narrow = d_out.Download();
    CHECK(SameBits(narrow, ToBf16(wide)));
    d_back.Poison();
    PO_TEST_OK(cuda::Bf16ToFp32(d_back.data(), d_out.data(), n, stream.get()));
    CHECK(SameBits(d_back.Download(), ToFloat(narrow)));
  }
}

TEST_CASE("Elementwise kernels accept n = 0 and enqueue nothing", "[gpt_kernels][elementwise]") {
  TestStream stream;
  DeviceArray<bf16> a(8);
  DeviceArray<float> f(8);
  a.Poison();
  PO_TEST_OK(cuda::GeluForward(a.data(), a.data(), 0, stream.get()));
  PO_TEST_OK(cuda::GeluBackward(a.data(), a.data(), a.data(), 0, stream.get()));
  PO_TEST_OK(cuda::Add(a.data(), a.data(), a.data(), 0, stream.get()));
  PO_TEST_OK(cuda::Fp32ToBf16(a.data(), f.data(), 0, stream.get()));
  PO_TEST_OK(cuda::Bf16ToFp32(f.data(), a.data(), 0, stream.get()));
  const std::vector<bf16> after = a.Download();
  const std::vector<bf16> poisoned(8, Bf16FromBits(0xFFFF));
  CHECK(SameBits(after, poisoned));
}

struct EncoderCase {
  int B, T, C, V;
};

TEST_CASE("Encoder forward within half an ulp, backward bitwise equal to the CPU",
          "[gpt_kernels][encoder]") {
  // Small vocabularies so tokens repeat; C = 100 and 4 take the scalar path.
  for (const EncoderCase& c :
       {EncoderCase{1, 1, 8, 3}, EncoderCase{2, 5, 100, 7}, EncoderCase{3, 64, 256, 50},
        EncoderCase{4, 33, 72, 5}, EncoderCase{2, 256, 1024, 300}, EncoderCase{3, 7, 4, 2}}) {
    CAPTURE(c.B, c.T, c.C, c.V);
    TestStream stream;
    const std::int64_t N = std::int64_t{c.B} * c.T;
    const std::vector<std::int32_t> tokens = RandomTokens(N, c.V, 21);
    const std::vector<float> wte = RandomBf16Values(std::int64_t{c.V} * c.C, -1.0f, 1.0f, 22);
    const std::vector<float> wpe = RandomBf16Values(std::int64_t{c.T} * c.C, -1.0f, 1.0f, 23);
    const std::vector<float> dout = RandomBf16Values(N * c.C, -1.0f, 1.0f, 24);
    const std::vector<float> dwte0 = RandomFloats(std::int64_t{c.V} * c.C, -1.0f, 1.0f, 25);
    const std::vector<float> dwpe0 = RandomFloats(std::int64_t{c.T} * c.C, -1.0f, 1.0f, 26);
    DeviceArray<std::int32_t> d_tokens(N);
    DeviceArray<bf16> d_wte(std::int64_t{c.V} * c.C), d_wpe(std::int64_t{c.T} * c.C);
    DeviceArray<bf16> d_out(N * c.C), d_dout(N * c.C);
    DeviceArray<float> d_dwte(std::int64_t{c.V} * c.C), d_dwpe(std::int64_t{c.T} * c.C);
    d_tokens.Upload(tokens);
    d_wte.Upload(ToBf16(wte));
    d_wpe.Upload(ToBf16(wpe));
    d_dout.Upload(ToBf16(dout));

    // Forward: one rounding of the exact fp32 sum.
    std::vector<float> want(static_cast<std::size_t>(N * c.C));
    gpt::EncoderForward(want.data(), tokens.data(), wte.data(), wpe.data(), c.B, c.T, c.C);
    std::vector<bf16> runs[2];
    for (std::vector<bf16>& run : runs) {
      d_out.Poison();
      PO_TEST_OK(cuda::EncoderForward(d_out.data(), d_tokens.data(), d_wte.data(), d_wpe.data(),
                                      c.B, c.T, c.C, stream.get()));
      run = d_out.Download();
    }
    RequireClose(ToFloat(runs[0]), want, kBf16Roundoff, 0.0, "EncoderForward");
    CHECK(SameBits(runs[0], runs[1]));

    // Backward: the same fp32 additions in the same order as the CPU, so the same bits.
    std::vector<float> want_dwte = dwte0;
    std::vector<float> want_dwpe = dwpe0;
    gpt::EncoderBackward(want_dwte.data(), want_dwpe.data(), dout.data(), tokens.data(), c.B, c.T,
                         c.C);
    for (int run = 0; run < 2; ++run) {
      d_dwte.Upload(dwte0);
      d_dwpe.Upload(dwpe0);
      PO_TEST_OK(cuda::EncoderBackward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tokens.data(),
                                       c.B, c.T, c.C, stream.get()));
      const std::vector<float> got_dwte = d_dwte.Download();
      const std::vector<float> got_dwpe = d_dwpe.Download();
      RequireClose(got_dwte, want_dwte, 0.0, 0.0, "EncoderBackward dwte");
      RequireClose(got_dwpe, want_dwpe, 0.0, 0.0, "EncoderBackward dwpe");
      CHECK(SameBits(got_dwte, want_dwte));
      CHECK(SameBits(got_dwpe, want_dwpe));
    }
  }
}

// Per-element bound for an fp32 column sum (LayerNorm weight, bias): 1e-5 of the sum of the
// magnitudes of its terms (and of the initial value). Both sides' rounding errors are far below
// it for these sizes (the GPU's partial sums are short), while one missing or doubled row, a
// term of order 1 / N of that magnitude, is far above it.
constexpr double kColumnSumRelative = 1e-5;

struct RowsCase {
  int N, C;
};

TEST_CASE("LayerNorm forward and backward match the CPU", "[gpt_kernels][layernorm]") {
  // C = 100, 4 and 1 take the scalar path; 8, 768, 1000, 2048, 4096 and 8192 the row-in-registers
  // kernels (1, 1, 1, 2, 4 and 8 packs per thread); 8200 the packed loop; N = 33, 300 leave
  // partial chunks of 32 rows in the weight gradient.
  for (const RowsCase& c : {RowsCase{1, 8}, RowsCase{7, 100}, RowsCase{5, 4}, RowsCase{3, 1},
                            RowsCase{300, 768}, RowsCase{33, 8192}, RowsCase{65, 1000},
                            RowsCase{17, 2048}, RowsCase{9, 4096}, RowsCase{3, 8200}}) {
    CAPTURE(c.N, c.C);
    TestStream stream;
    const std::int64_t size = std::int64_t{c.N} * c.C;
    const std::vector<float> x = RandomBf16Values(size, -1.0f, 3.0f, 31);
    const std::vector<float> w = RandomBf16Values(c.C, 0.5f, 1.5f, 32);
    const std::vector<float> b = RandomBf16Values(c.C, -0.5f, 0.5f, 33);
    const std::vector<float> dout = RandomBf16Values(size, -1.0f, 1.0f, 34);
    const std::vector<float> dinp0 = RandomBf16Values(size, -1.0f, 1.0f, 35);
    const std::vector<float> dw0 = RandomFloats(c.C, -1.0f, 1.0f, 36);
    const std::vector<float> db0 = RandomFloats(c.C, -1.0f, 1.0f, 37);
    std::vector<float> want_out(static_cast<std::size_t>(size));
    std::vector<float> want_mean(static_cast<std::size_t>(c.N));
    std::vector<float> want_rstd(static_cast<std::size_t>(c.N));
    gpt::LayerNormForward(want_out.data(), want_mean.data(), want_rstd.data(), x.data(), w.data(),
                          b.data(), c.N, c.C);

    DeviceArray<bf16> d_x(size), d_w(c.C), d_b(c.C), d_out(size), d_dout(size), d_dinp(size);
    DeviceArray<float> d_mean(c.N), d_rstd(c.N), d_dw(c.C), d_db(c.C);
    DeviceArray<float> d_scratch(LayerNormWeightScratchFloats(c.N, c.C));
    d_x.Upload(ToBf16(x));
    d_w.Upload(ToBf16(w));
    d_b.Upload(ToBf16(b));
    d_dout.Upload(ToBf16(dout));

    {  // forward: out within 1 ulp + 1e-5, mean and rstd within 1e-5 relative + 1e-5
      std::vector<bf16> outs[2];
      std::vector<float> means[2];
      std::vector<float> rstds[2];
      for (int run = 0; run < 2; ++run) {
        d_out.Poison();
        d_mean.Poison();
        d_rstd.Poison();
        PO_TEST_OK(cuda::LayerNormForward(d_out.data(), d_mean.data(), d_rstd.data(), d_x.data(),
                                          d_w.data(), d_b.data(), c.N, c.C, stream.get()));
        outs[run] = d_out.Download();
        means[run] = d_mean.Download();
        rstds[run] = d_rstd.Download();
      }
      RequireClose(ToFloat(outs[0]), want_out, kBf16UlpRelative, 1e-5, "LayerNormForward out");
      RequireClose(means[0], want_mean, 1e-5, 1e-5, "LayerNormForward mean");
      RequireClose(rstds[0], want_rstd, 1e-5, 1e-5, "LayerNormForward rstd");
      CHECK(SameBits(outs[0], outs[1]));
      CHECK(SameBits(means[0], means[1]));
      CHECK(SameBits(rstds[0], rstds[1]));
    }
    // The backward kernels get the CPU's statistics, so both sides start from the same values.
    d_mean.Upload(want_mean);
    d_rstd.Upload(want_rstd);
    {  // backward input (+=): within 1 ulp + 1e-5
      std::vector<float> want = dinp0;
      gpt::LayerNormBackwardInput(want.data(), dout.data(), x.data(), w.data(), want_mean.data(),
                                  want_rstd.data(), c.N, c.C);
      std::vector<bf16> runs[2];
      for (std::vector<bf16>& run : runs) {
        d_dinp.Upload(ToBf16(dinp0));
        PO_TEST_OK(cuda::LayerNormBackwardInput(d_dinp.data(), d_dout.data(), d_x.data(),
                                                d_w.data(), d_mean.data(), d_rstd.data(), c.N, c.C,
                                                stream.get()));
        run = d_dinp.Download();
      }
      RequireClose(ToFloat(runs[0]), want, kBf16UlpRelative, 1e-5, "LayerNormBackwardInput");
      CHECK(SameBits(runs[0], runs[1]));
    }
    {  // backward weight (+=): within kColumnSumRelative of the terms' magnitude
      std::vector<float> want_dw = dw0;
      std::vector<float> want_db = db0;
      gpt::LayerNormBackwardWeight(want_dw.data(), want_db.data(), dout.data(), x.data(),
                                   want_mean.data(), want_rstd.data(), c.N, c.C);
      std::vector<float> bound_dw(static_cast<std::size_t>(c.C));
      std::vector<float> bound_db(static_cast<std::size_t>(c.C));
      for (int i = 0; i < c.C; ++i) {
        double magnitude_w = std::fabs(dw0[i]);
        double magnitude_b = std::fabs(db0[i]);
        for (int n = 0; n < c.N; ++n) {
          const std::size_t k = static_cast<std::size_t>(std::int64_t{n} * c.C + i);
          magnitude_w += std::fabs((x[k] - want_mean[n]) * want_rstd[n] * dout[k]);
          magnitude_b += std::fabs(dout[k]);
        }
        bound_dw[i] = static_cast<float>(kColumnSumRelative * magnitude_w);
        bound_db[i] = static_cast<float>(kColumnSumRelative * magnitude_b);
      }
      std::vector<float> dws[2];
      std::vector<float> dbs[2];
      for (int run = 0; run < 2; ++run) {
        d_dw.Upload(dw0);
        d_db.Upload(db0);
        d_scratch.Poison();  // its contents must not matter
        PO_TEST_OK(cuda::LayerNormBackwardWeight(d_dw.data(), d_db.data(), d_scratch.data(),
                                                 d_dout.data(), d_x.data(), d_mean.data(),
                                                 d_rstd.data(), c.N, c.C, stream.get()));
        dws[run] = d_dw.Download();
        dbs[run] = d_db.Download();
      }
      RequireWithin(dws[0], want_dw, bound_dw, "LayerNormBackwardWeight dw");
      RequireWithin(dbs[0], want_db, bound_db, "LayerNormBackwardWeight db");
      CHECK(SameBits(dws[0], dws[1]));
      CHECK(SameBits(dbs[0], dbs[1]));
    }
  }
}

TEST_CASE("BiasBackward adds the column sums", "[gpt_kernels][bias]") {
  for (const RowsCase& c : {RowsCase{1, 8}, RowsCase{37, 100}, RowsCase{257, 3072},
                            RowsCase{64, 50}, RowsCase{1000, 24}}) {
    CAPTURE(c.N, c.C);
    TestStream stream;
    const std::int64_t size = std::int64_t{c.N} * c.C;
    const std::vector<float> dout = RandomBf16Values(size, -1.0f, 1.0f, 41);
    const std::vector<float> dbias0 = RandomFloats(c.C, -1.0f, 1.0f, 42);
    // The CPU computes the bias gradient inside MatmulBackwardWeight: one input channel of zeros.
    std::vector<float> want = dbias0;
    std::vector<float> dweight(static_cast<std::size_t>(c.C), 0.0f);
    const std::vector<float> zeros(static_cast<std::size_t>(c.N), 0.0f);
    gpt::MatmulBackwardWeight(dweight.data(), want.data(), dout.data(), zeros.data(), c.N, 1, c.C);
    std::vector<float> bound(static_cast<std::size_t>(c.C));
    for (int i = 0; i < c.C; ++i) {
      double magnitude = std::fabs(dbias0[i]);
      for (int n = 0; n < c.N; ++n) magnitude += std::fabs(dout[std::int64_t{n} * c.C + i]);
      bound[i] = static_cast<float>(kColumnSumRelative * magnitude);
    }
    DeviceArray<bf16> d_dout(size);
    DeviceArray<float> d_dbias(c.C);
    DeviceArray<float> d_scratch(BiasScratchFloats(c.N, c.C));
    d_dout.Upload(ToBf16(dout));
    std::vector<float> runs[2];
    for (std::vector<float>& run : runs) {
      d_dbias.Upload(dbias0);
      d_scratch.Poison();
      PO_TEST_OK(cuda::BiasBackward(d_dbias.data(), d_scratch.data(), d_dout.data(), c.N, c.C,
                                    stream.get()));
      run = d_dbias.Download();
    }
    RequireWithin(runs[0], want, bound, "BiasBackward");
    CHECK(SameBits(runs[0], runs[1]));
  }
}

// The packed kernels (128-bit accesses, rows cached in registers) and the element-by-element
// ones take the same elements per thread in the same order with the same rounding, so where a
// buffer lies never changes a result: the offload on/off equality may not depend on addresses.
TEST_CASE("Kernels give the same bits at any alignment", "[gpt_kernels][alignment]") {
  TestStream stream;
  for (const int C : {768, 8200}) {  // the cached and the loop kernel when aligned
    CAPTURE(C);
    constexpr int kN = 5;
    const std::int64_t size = std::int64_t{kN} * C;
    const std::vector<bf16> x = ToBf16(RandomBf16Values(size, -1.0f, 3.0f, 81));
    const std::vector<bf16> w = ToBf16(RandomBf16Values(C, 0.5f, 1.5f, 82));
    const std::vector<bf16> b = ToBf16(RandomBf16Values(C, -0.5f, 0.5f, 83));
    const std::vector<bf16> dout = ToBf16(RandomBf16Values(size, -1.0f, 1.0f, 84));
    const std::vector<bf16> dinp0 = ToBf16(RandomBf16Values(size, -1.0f, 1.0f, 85));
    std::vector<bf16> outs[2];
    std::vector<float> means[2];
    std::vector<float> rstds[2];
    std::vector<bf16> dinps[2];
    for (int offset = 0; offset < 2; ++offset) {
      DeviceArray<bf16> d_x(size, offset), d_w(C, offset), d_b(C, offset), d_out(size, offset);
      DeviceArray<bf16> d_dout(size, offset), d_dinp(size, offset);
      DeviceArray<float> d_mean(kN), d_rstd(kN);
      d_x.Upload(x);
      d_w.Upload(w);
      d_b.Upload(b);
      d_dout.Upload(dout);
      d_dinp.Upload(dinp0);
      d_out.Poison();
      PO_TEST_OK(cuda::LayerNormForward(d_out.data(), d_mean.data(), d_rstd.data(), d_x.data(),
                                        d_w.data(), d_b.data(), kN, C, stream.get()));
      PO_TEST_OK(cuda::LayerNormBackwardInput(d_dinp.data(), d_dout.data(), d_x.data(), d_w.data(),
                                              d_mean.data(), d_rstd.data(), kN, C, stream.get()));
      outs[offset] = d_out.Download();
      means[offset] = d_mean.Download();
      rstds[offset] = d_rstd.Download();
      dinps[offset] = d_dinp.Download();
    }
    CHECK(SameBits(outs[0], outs[1]));
    CHECK(SameBits(means[0], means[1]));
    CHECK(SameBits(rstds[0], rstds[1]));
    CHECK(SameBits(dinps[0], dinps[1]));
  }
  {
    constexpr int kN = 4;
    constexpr int kV = 1000;
    const std::vector<bf16> logits = ToBf16(RandomBf16Values(kN * kV, -4.0f, 4.0f, 86));
    const std::vector<std::int32_t> targets = RandomTokens(kN, kV, 87);
    std::vector<float> lses[2];
    std::vector<bf16> dlogits[2];
    for (int offset = 0; offset < 2; ++offset) {
      DeviceArray<bf16> d_logits(kN * kV, offset), d_dlogits(kN * kV, offset);
      DeviceArray<std::int32_t> d_targets(kN);
      DeviceArray<float> d_losses(kN), d_lse(kN);
      d_logits.Upload(logits);
      d_targets.Upload(targets);
      PO_TEST_OK(cuda::SoftmaxCrossEntropyForward(d_losses.data(), d_lse.data(), d_logits.data(),
                                                  d_targets.data(), kN, kV, stream.get()));
      PO_TEST_OK(cuda::SoftmaxCrossEntropyBackward(d_dlogits.data(), d_logits.data(), d_lse.data(),
                                                   d_targets.data(), 0.5f, kN, kV, stream.get()));
      lses[offset] = d_lse.Download();
      dlogits[offset] = d_dlogits.Download();
    }
    CHECK(SameBits(lses[0], lses[1]));
    CHECK(SameBits(dlogits[0], dlogits[1]));
  }
  {
    constexpr std::int64_t kCount = 4096;
    const std::vector<bf16> x = ToBf16(RandomBf16Values(kCount, -6.0f, 6.0f, 88));
    const std::vector<bf16> dy = ToBf16(RandomBf16Values(kCount, -2.0f, 2.0f, 89));
    std::vector<bf16> forwards[2];
    std::vector<bf16> backwards[2];
    for (int offset = 0; offset < 2; ++offset) {
      DeviceArray<bf16> d_x(kCount, offset), d_dy(kCount, offset), d_out(kCount, offset);
      d_x.Upload(x);
      d_dy.Upload(dy);
      PO_TEST_OK(cuda::GeluForward(d_out.data(), d_x.data(), kCount, stream.get()));
      forwards[offset] = d_out.Download();
      PO_TEST_OK(cuda::GeluBackward(d_out.data(), d_x.data(), d_dy.data(), kCount, stream.get()));
      backwards[offset] = d_out.Download();
    }
    CHECK(SameBits(forwards[0], forwards[1]));
    CHECK(SameBits(backwards[0], backwards[1]));
  }
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda::testing
