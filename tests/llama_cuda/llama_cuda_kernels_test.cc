// The Llama CUDA kernels (llama_cuda_kernels.h) against the fp32 CPU kernels
// (llama_kernels_cpu.h): inputs rounded to bf16 first so the CPU sees exactly what the GPU
// reads, outputs poisoned (NaN) before every run, each kernel run twice for bitwise
// determinism, and the packed (16-byte) and scalar (misaligned) paths checked for the same bits.
// Tolerances (ExpectClose: norm-relative, and element-wise against |want| + rms):
//  - bf16 outputs of fp32 math: 4e-3 norm, 2^-7 element (one bf16 ulp of rounding the fp32
//    result, plus the fp32 differences of expf / the reductions' order);
//  - RoPE and the embedding: bitwise (the same IEEE operations on the same floats, one
//    rounding; the embedding's sums in the CPU's row order);
//  - fp32 column sums (RMSNorm dweight): 1e-5 norm, 1e-4 element (fixed-tree vs sequential
//    order of a few hundred fp32 terms).
#include "examples/llama/cuda/llama_cuda_kernels.h"

#include <cstdint>
#include <vector>

#include "examples/llama/llama_config.h"
#include "examples/llama/llama_kernels_cpu.h"
#include "tests/llama_cuda/llama_cuda_test_util.h"

namespace pipeoffload::llama::cuda::testing {
namespace {

constexpr double kBf16Norm = 4e-3;
constexpr double kBf16Elem = 1.0 / 128;

// Segment s = (n, h) of a (N, row_stride) tensor, `heads` segments of C from column `col`,
// copied out contiguously ((N * heads, C), the CPU kernels' layout) or back in.
std::vector<float> Gather(const std::vector<float>& t, int N, int heads, int C,
                          std::int64_t row_stride, std::int64_t col) {
  std::vector<float> out;
  for (int n = 0; n < N; ++n) {
    for (int i = 0; i < heads * C; ++i) out.push_back(t[n * row_stride + col + i]);
  }
  return out;
}

struct NormCase {
  int N;
  int heads;
  int C;
  std::int64_t row_stride;  // of every tensor; the segments start at column 0
};

// RMSNorm forward, input and weight backward on a (N, row_stride) layout, at `offset`
// elements off 16-byte alignment (1: the scalar path); rstd from the CPU for the backward.
struct NormRun {
  std::vector<bf16> out, dinp;
  std::vector<float> rstd, dweight;
};
NormRun RunNorm(const NormCase& c, std::int64_t offset, const std::vector<float>& x,
                const std::vector<float>& w, const std::vector<float>& dy,
                const std::vector<float>& res, const std::vector<float>& cpu_rstd,
                const std::vector<float>& dweight0, bool in_place) {
  TestStream stream;
  const std::int64_t elems = c.N * c.row_stride;
  DeviceArray<bf16> d_x(elems, offset), d_out(elems, offset), d_dy(elems, offset);
  DeviceArray<bf16> d_res(elems, offset), d_dinp(elems, offset), d_w(c.C, offset);
  DeviceArray<float> d_rstd(std::int64_t{c.N} * c.heads), d_dw(c.C);
  const RmsNormShape shape{c.N, c.heads, c.C, c.row_stride};
  DeviceArray<float> d_scratch(RmsNormWeightScratchFloats(shape));
  d_x.Upload(ToBf16(x));
  d_w.Upload(ToBf16(w));
  d_dy.Upload(ToBf16(dy));
  d_res.Upload(ToBf16(res));
  d_out.Poison();
  d_rstd.Poison();
  NormRun run;
  PO_TEST_OK(RmsNormForward(d_out.data(), d_rstd.data(), d_x.data(), d_w.data(), shape, 1e-5f,
                            stream.get()));
  run.out = d_out.Download();
  run.rstd = d_rstd.Download();
  d_rstd.Upload(cpu_rstd);
  d_dw.Upload(dweight0);
  PO_TEST_OK(RmsNormBackwardWeight(d_dw.data(), d_scratch.data(), d_dy.data(), d_x.data(),
                                   d_rstd.data(), shape, stream.get()));
  run.dweight = d_dw.Download();
  bf16* dinp = in_place ? d_dy.data() : d_dinp.data();
  if (!in_place) d_dinp.Poison();
  PO_TEST_OK(RmsNormBackwardInput(dinp, d_dy.data(), in_place ? nullptr : d_res.data(), d_x.data(),
                                  d_w.data(), d_rstd.data(), shape, stream.get()));
  run.dinp = in_place ? d_dy.Download() : d_dinp.Download();
  return run;
}

TEST_CASE("RMSNorm matches the CPU on rows and on heads inside a wider row, packed or not",
          "[llama_cuda][kernels][rmsnorm]") {
  const NormCase c = GENERATE(NormCase{37, 1, 64, 64}, NormCase{600, 1, 100, 100},
                              NormCase{300, 1, 1032, 1032}, NormCase{300, 1, 4096, 4096},
                              // qk_norm's q heads in a fused QKV row (4 q, 2 k, 2 v heads)
                              NormCase{100, 4, 64, 512}, NormCase{70, 2, 128, 640});
  const bool in_place = c.heads > 1;  // the qk_norm backward runs in place on dqkv
  CAPTURE(c.N, c.heads, c.C, c.row_stride, in_place);
  const std::int64_t elems = c.N * c.row_stride;
  const std::vector<float> x = NormalBf16(elems, 1.5f, 1);
  const std::vector<float> w = NormalBf16(c.C, 0.2f, 2, 1.0f);
  const std::vector<float> dy = NormalBf16(elems, 1.0f, 3);
  const std::vector<float> res = NormalBf16(elems, 1.0f, 4);
  const std::vector<float> dweight0 = NormalBf16(c.C, 1.0f, 5);
  const int rows = c.N * c.heads;
  const std::vector<float> xs = Gather(x, c.N, c.heads, c.C, c.row_stride, 0);
  const std::vector<float> dys = Gather(dy, c.N, c.heads, c.C, c.row_stride, 0);
  std::vector<float> want_out(xs.size()), want_rstd(rows), want_dinp(xs.size());
  std::vector<float> want_dw = dweight0;
  llama::RmsNormForward(want_out.data(), want_rstd.data(), xs.data(), w.data(), rows, c.C, 1e-5f);
  llama::RmsNormBackward(want_dinp.data(), want_dw.data(), dys.data(), xs.data(), w.data(),
                         want_rstd.data(), rows, c.C);
  if (!in_place) {
    for (std::size_t i = 0; i < want_dinp.size(); ++i) want_dinp[i] += res[i];
  }

  const NormRun run = RunNorm(c, 0, x, w, dy, res, want_rstd, dweight0, in_place);
  const std::vector<float> out = ToFloat(run.out);
  ExpectClose("RmsNormForward out", Gather(out, c.N, c.heads, c.C, c.row_stride, 0), want_out,
              kBf16Norm, kBf16Elem);
  ExpectClose("RmsNormForward rstd", run.rstd, want_rstd, 1e-6, 1e-6);
  ExpectClose("RmsNormBackwardInput", Gather(ToFloat(run.dinp), c.N, c.heads, c.C, c.row_stride, 0),
              want_dinp, kBf16Norm, kBf16Elem);
  ExpectClose("RmsNormBackwardWeight (+=)", run.dweight, want_dw, 1e-5, 1e-4);
  // Columns past the segments are not written: still poison (forward), still dy (in place).
  const std::vector<float> dinp = ToFloat(run.dinp);
  std::int64_t written_outside = 0;
  for (int n = 0; n < c.N; ++n) {
    for (std::int64_t col = std::int64_t{c.heads} * c.C; col < c.row_stride; ++col) {
      const std::size_t i = static_cast<std::size_t>(n * c.row_stride + col);
      if (!std::isnan(out[i]) || (in_place && dinp[i] != dy[i])) ++written_outside;
    }
  }
  CHECK(written_outside == 0);
  // Deterministic, and the scalar path (every pointer misaligned) gives the same bits.
  const NormRun again = RunNorm(c, 0, x, w, dy, res, want_rstd, dweight0, in_place);
  const NormRun scalar = RunNorm(c, 1, x, w, dy, res, want_rstd, dweight0, in_place);
  for (const NormRun* other : {&again, &scalar}) {
    CHECK(BitMismatches(run.out, other->out) == 0);
    CHECK(BitMismatches(run.rstd, other->rstd) == 0);
    CHECK(BitMismatches(run.dinp, other->dinp) == 0);
    CHECK(BitMismatches(run.dweight, other->dweight) == 0);
  }
}

TEST_CASE("RmsNormRowsPerChunk and the scratch size depend on the sizes only",
          "[llama_cuda][kernels][rmsnorm]") {
  CHECK(RmsNormRowsPerChunk(1) == 256);
  CHECK(RmsNormRowsPerChunk(65536) == 256);        // 256 chunks
  CHECK(RmsNormRowsPerChunk(65537) == 272);        // rounded up to a multiple of 16
  CHECK(RmsNormRowsPerChunk(16384 * 32) == 2048);  // N 16384, 32 heads: 256 chunks
  CHECK(RmsNormWeightScratchFloats({2048, 1, 4096, 0}) == 8 * 4096);
  CHECK(RmsNormWeightScratchFloats({0, 1, 4096, 0}) == 0);
}

// x (N, row_stride) with `heads` heads of hd from column 0 rotated by the GPU, at `offset`.
std::vector<bf16> RunRope(const std::vector<float>& x, const std::vector<float>& table, int N,
                          int T, int heads, int hd, std::int64_t row_stride, bool backward,
                          std::int64_t offset) {
  TestStream stream;
  DeviceArray<bf16> d_x(N * row_stride, offset);
  DeviceArray<float> d_table(static_cast<std::int64_t>(table.size()));
  d_x.Upload(ToBf16(x));
  d_table.Upload(table);
  if (backward) {
    PO_TEST_OK(RopeBackward(d_x.data(), d_table.data(), N, T, heads, hd, row_stride, stream.get()));
  } else {
    PO_TEST_OK(RopeForward(d_x.data(), d_table.data(), N, T, heads, hd, row_stride, stream.get()));
  }
  return d_x.Download();
}

TEST_CASE("RoPE on the q and k columns of a fused QKV row is the CPU's, bit for bit",
          "[llama_cuda][kernels][rope]") {
  struct RopeCase {
    int N, T, hd;
    bool llama3;
  };
  const RopeCase rc = GENERATE(RopeCase{48, 24, 64, false}, RopeCase{48, 24, 128, true},
                               RopeCase{4096, 4096, 128, true});
  const bool backward = GENERATE(false, true);
  CAPTURE(rc.N, rc.T, rc.hd, rc.llama3, backward);
  LlamaConfig config;
  config.head_dim = rc.hd;
  config.rope_theta = 500000.0f;
  config.rope_scaling = rc.llama3 ? RopeScaling::kLlama3 : RopeScaling::kNone;
  config.rope_original_max_positions = 64;  // so the Llama 3.1 bands matter at these T
  const std::vector<float> inv_freq = RopeInvFreq(config);
  const std::vector<float> table = RopeCosSinTable(inv_freq.data(), rc.T, rc.hd);
  const int nh = 4, nkv = rc.N > 1000 ? 1 : 2, heads = nh + nkv;
  const std::int64_t stride = std::int64_t{nh + 2 * nkv} * rc.hd;
  const std::vector<float> x = NormalBf16(rc.N * stride, 1.0f, 7);
  std::vector<float> want = Gather(x, rc.N, heads, rc.hd, stride, 0);
  if (backward) {
    llama::RopeBackward(want.data(), inv_freq.data(), rc.N, rc.T, heads, rc.hd);
  } else {
    llama::RopeForward(want.data(), inv_freq.data(), rc.N, rc.T, heads, rc.hd);
  }
  const std::vector<bf16> got = RunRope(x, table, rc.N, rc.T, heads, rc.hd, stride, backward, 0);
  const std::vector<float> got_f = ToFloat(got);
  const std::vector<float> got_qk = Gather(got_f, rc.N, heads, rc.hd, stride, 0);
  const std::int64_t mismatches = BitMismatches(ToBf16(got_qk), ToBf16(want));
  INFO(mismatches << " of " << want.size() << " rotated elements differ from bf16(CPU)");
  ExpectClose("Rope q|k", got_qk, want, kBf16Norm, kBf16Elem);
  CHECK(mismatches == 0);
  // v columns untouched.
  CHECK(Gather(got_f, rc.N, nkv, rc.hd, stride, std::int64_t{heads} * rc.hd) ==
        Gather(x, rc.N, nkv, rc.hd, stride, std::int64_t{heads} * rc.hd));
  CHECK(BitMismatches(got, RunRope(x, table, rc.N, rc.T, heads, rc.hd, stride, backward, 0)) == 0);
  CHECK(BitMismatches(got, RunRope(x, table, rc.N, rc.T, heads, rc.hd, stride, backward, 1)) == 0);
}

TEST_CASE("SwiGLU forward and backward (in place over gate_up) match the CPU",
          "[llama_cuda][kernels][swiglu]") {
  const int F = GENERATE(176, 100);
  const std::int64_t offset = GENERATE(0, 1);
  const std::int64_t N = 33;
  CAPTURE(F, offset);
  TestStream stream;
  const std::vector<float> gu = NormalBf16(N * 2 * F, 3.0f, 11);
  const std::vector<float> dy = NormalBf16(N * F, 1.0f, 12);
  std::vector<float> want_out(N * F), want_dgu(N * 2 * F);
  llama::SwiGluForward(want_out.data(), gu.data(), N, F);
  llama::SwiGluBackward(want_dgu.data(), dy.data(), gu.data(), N, F);
  DeviceArray<bf16> d_gu(N * 2 * F, offset), d_dy(N * F, offset), d_out(N * F, offset);
  d_dy.Upload(ToBf16(dy));
  std::vector<bf16> outs[2], dgus[2];
  for (int run = 0; run < 2; ++run) {
    d_gu.Upload(ToBf16(gu));
    d_out.Poison();
    PO_TEST_OK(SwiGluForward(d_out.data(), d_gu.data(), N, F, stream.get()));
    outs[run] = d_out.Download();
    PO_TEST_OK(SwiGluBackward(d_gu.data(), d_dy.data(), d_gu.data(), N, F, stream.get()));
    dgus[run] = d_gu.Download();
  }
  ExpectClose("SwiGluForward", ToFloat(outs[0]), want_out, kBf16Norm, kBf16Elem);
  ExpectClose("SwiGluBackward (in place)", ToFloat(dgus[0]), want_dgu, kBf16Norm, kBf16Elem);
  CHECK(BitMismatches(outs[0], outs[1]) == 0);
  CHECK(BitMismatches(dgus[0], dgus[1]) == 0);
}

TEST_CASE("BuildTokenRowIndex groups rows by token, ascending, in one array",
          "[llama_cuda][kernels][embedding]") {
  const std::vector<std::int32_t> tokens = {3, 1, 3, 0, 1, 3};
  const TokenRowIndex index = BuildTokenRowIndex(tokens.data(), 6);
  CHECK(index.segments == 3);
  const std::vector<std::int32_t> want = {3, 1, 4, 0, 2, 5,  // rows by token, stable
                                          0, 1, 3, 6,        // starts
                                          0, 1, 3};          // distinct tokens
  CHECK(index.ints == want);
  CHECK(static_cast<std::int64_t>(index.ints.size()) <= TokenRowIndexInts(6));
}

TEST_CASE("Embedding forward copies rows and the backward adds them in the CPU's order",
          "[llama_cuda][kernels][embedding]") {
  const int H = GENERATE(64, 100);
  const std::int64_t offset = GENERATE(0, 1);
  const int V = 50, N = 300;
  CAPTURE(H, offset);
  TestStream stream;
  std::vector<std::int32_t> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 7 + n / 13) % V;  // repeats, some ids unused
  tokens[5] = tokens[6] = tokens[7] = V - 1;
  const std::vector<float> table = NormalBf16(std::int64_t{V} * H, 1.0f, 21);
  const std::vector<float> dout = NormalBf16(std::int64_t{N} * H, 1.0f, 22);
  const std::vector<float> dtable0 = NormalBf16(std::int64_t{V} * H, 1.0f, 23);
  std::vector<float> want_out(std::int64_t{N} * H);
  std::vector<float> want_dtable = dtable0;
  llama::EmbeddingForward(want_out.data(), tokens.data(), table.data(), N, H);
  llama::EmbeddingBackward(want_dtable.data(), dout.data(), tokens.data(), N, H);
  const TokenRowIndex index = BuildTokenRowIndex(tokens.data(), N);
  DeviceArray<std::int32_t> d_tokens(N), d_index(static_cast<std::int64_t>(index.ints.size()));
  DeviceArray<bf16> d_table(std::int64_t{V} * H, offset), d_out(std::int64_t{N} * H, offset);
  DeviceArray<bf16> d_dout(std::int64_t{N} * H, offset);
  DeviceArray<float> d_dtable(std::int64_t{V} * H, offset);
  d_tokens.Upload(tokens);
  d_index.Upload(index.ints);
  d_table.Upload(ToBf16(table));
  d_dout.Upload(ToBf16(dout));
  std::vector<float> dtables[2];
  for (std::vector<float>& dtable : dtables) {
    d_out.Poison();
    PO_TEST_OK(EmbeddingForward(d_out.data(), d_tokens.data(), d_table.data(), N, H, stream.get()));
    CHECK(ToFloat(d_out.Download()) == want_out);
    d_dtable.Upload(dtable0);
    PO_TEST_OK(EmbeddingBackward(d_dtable.data(), d_dout.data(), d_index.data(), index.segments, N,
                                 H, stream.get()));
    dtable = d_dtable.Download();
  }
  INFO(BitMismatches(dtables[0], want_dtable) << " table elements differ from the CPU's");
  CHECK(BitMismatches(dtables[0], want_dtable) == 0);
  CHECK(BitMismatches(dtables[0], dtables[1]) == 0);
}

TEST_CASE("The kernels reject bad arguments before enqueueing anything",
          "[llama_cuda][kernels][args]") {
  TestStream stream;
  DeviceArray<bf16> buf(1024);
  DeviceArray<float> f(1024);
  CHECK(RmsNormForward(buf.data(), f.data(), buf.data(), buf.data(), {4, 1, 0, 0}, 1e-5f,
                       stream.get())
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(RmsNormForward(buf.data(), f.data(), buf.data(), buf.data(), {4, 2, 64, 100}, 1e-5f,
                       stream.get())
            .code() == absl::StatusCode::kInvalidArgument);  // stride < heads * C
  CHECK(
      RmsNormForward(buf.data(), f.data(), nullptr, buf.data(), {4, 1, 64, 0}, 1e-5f, stream.get())
          .code() == absl::StatusCode::kInvalidArgument);
  CHECK(RopeForward(buf.data(), f.data(), 4, 4, 1, 63, 0, stream.get()).code() ==
        absl::StatusCode::kInvalidArgument);  // odd head dim
  CHECK(SwiGluForward(buf.data(), buf.data(), 0, 8, stream.get()).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(EmbeddingBackward(f.data(), buf.data(), nullptr, 1, 4, 8, stream.get()).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload::llama::cuda::testing
