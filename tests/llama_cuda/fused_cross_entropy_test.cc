// The fused linear cross-entropy on the GPU (fused_cross_entropy.h) against the CPU's
// FusedLinearCrossEntropy (fp32 logits), chunked and materialised; its chunk rules; and, hidden
// ("[.llama_cuda_bench]"), the memory and time of the fused path against the materialised one at
// Llama-3's head shape (V 128256, H 4096).
// Tolerances: the GPU's logits are bf16 (rounded from fp32 accumulators, 2^-9 relative), so the
// per-row losses get 1e-3 norm-relative (the CPU's lse and target logit are fp32 of the same
// products); dx and dW are GEMMs over bf16 gradients (each rounded, 2^-9), 1e-2 norm-relative
// and 5e-2 element-wise against |want| + rms.
#include "examples/llama/cuda/fused_cross_entropy.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "examples/gpt/cuda/linear.h"
#include "examples/llama/llama_kernels_cpu.h"
#include "tests/llama_cuda/llama_cuda_test_util.h"

namespace pipeoffload::llama::cuda::testing {
namespace {

struct CeResult {
  std::vector<float> losses, dx, dweight;
  double loss_sum = 0.0;
};

// One FusedLinearCrossEntropy run (plus SumToDouble) with everything uploaded fresh.
CeResult RunCe(gpt::cuda::Linear& linear, cudaStream_t stream, const std::vector<float>& x,
               const std::vector<float>& w, const std::vector<std::int32_t>& targets,
               const std::vector<float>& dweight0, const FusedCrossEntropyDims& d,
               float grad_scale) {
  DeviceArray<bf16> d_x(std::int64_t{d.N} * d.H), d_w(std::int64_t{d.V} * d.H);
  DeviceArray<bf16> d_dx(std::int64_t{d.N} * d.H);
  DeviceArray<float> d_dw(std::int64_t{d.V} * d.H), d_losses(d.N);
  DeviceArray<double> d_sum(1);
  DeviceArray<std::int32_t> d_targets(d.N);
  DeviceArray<unsigned char> d_ws(FusedCrossEntropyWorkspaceBytes(d));
  d_x.Upload(ToBf16(x));
  d_w.Upload(ToBf16(w));
  d_targets.Upload(targets);
  d_dw.Upload(dweight0);
  d_dx.Poison();
  d_losses.Poison();
  d_ws.Poison();
  PO_TEST_OK(FusedLinearCrossEntropy(linear, d_dx.data(), d_dw.data(), d_losses.data(), d_ws.data(),
                                     d_x.data(), d_w.data(), d_targets.data(), d, grad_scale,
                                     stream));
  PO_TEST_OK(SumToDouble(d_sum.data(), d_losses.data(), d.N, stream));
  CeResult r;
  r.losses = d_losses.Download();
  r.dx = ToFloat(d_dx.Download());
  r.dweight = d_dw.Download();
  r.loss_sum = d_sum.Download()[0];
  return r;
}

TEST_CASE("The fused cross-entropy matches the CPU's, chunked or materialised, bitwise stable",
          "[llama_cuda][fused_ce]") {
  const int N = 150, H = 64, V = 200;
  const int chunk_rows = GENERATE(150, 64, 37);
  CAPTURE(chunk_rows);
  TestStream stream;
  auto linear = ValueOrFail(gpt::cuda::Linear::Create(stream.get()));
  const std::vector<float> x = NormalBf16(std::int64_t{N} * H, 1.0f, 31);
  const std::vector<float> w = NormalBf16(std::int64_t{V} * H, 0.3f, 32);
  std::vector<std::int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 37 + 11) % V;
  const float grad_scale = 1.0f / N;
  // The accumulator starts non-zero (the comparison is of what was added): about the size of
  // the gradient itself, so its rounding does not blur the comparison.
  const std::vector<float> dweight0 = NormalBf16(std::int64_t{V} * H, 2e-3f, 33);

  std::vector<float> want_dx(std::int64_t{N} * H), want_dw(std::int64_t{V} * H, 0.0f);
  std::vector<float> scratch(std::int64_t{chunk_rows} * V);
  const double want_sum =
      llama::FusedLinearCrossEntropy(want_dx.data(), want_dw.data(), scratch.data(), x.data(),
                                     w.data(), targets.data(), N, H, V, chunk_rows, grad_scale);
  // The CPU's per-row losses: the same function one row at a time (its rows do not interact).
  std::vector<float> want_losses(N);
  {
    std::vector<float> dx1(H), dw1(std::int64_t{V} * H), s1(V);
    for (int n = 0; n < N; ++n) {
      want_losses[n] = static_cast<float>(llama::FusedLinearCrossEntropy(
          dx1.data(), dw1.data(), s1.data(), x.data() + std::int64_t{n} * H, w.data(),
          targets.data() + n, 1, H, V, 1, grad_scale));
    }
  }

  const FusedCrossEntropyDims dims{N, H, V, chunk_rows};
  const CeResult got = RunCe(*linear, stream.get(), x, w, targets, dweight0, dims, grad_scale);
  std::vector<float> added(got.dweight.size());
  for (std::size_t i = 0; i < added.size(); ++i) added[i] = got.dweight[i] - dweight0[i];
  ExpectClose("per-row losses", got.losses, want_losses, 1e-3, 2e-3);
  INFO("loss sum: got " << got.loss_sum << ", want " << want_sum);
  CHECK(std::fabs(got.loss_sum - want_sum) <= 1e-3 * std::fabs(want_sum));
  double row_sum = 0.0;
  for (float l : got.losses) row_sum += l;
  CHECK(std::fabs(got.loss_sum - row_sum) <= 1e-9 * std::fabs(row_sum));
  ExpectClose("dx", got.dx, want_dx, 1e-2, 5e-2);
  ExpectClose("dW (added to the accumulator)", added, want_dw, 1e-2, 5e-2);

  const CeResult again = RunCe(*linear, stream.get(), x, w, targets, dweight0, dims, grad_scale);
  CHECK(BitMismatches(got.losses, again.losses) == 0);
  CHECK(BitMismatches(got.dx, again.dx) == 0);
  CHECK(BitMismatches(got.dweight, again.dweight) == 0);
  CHECK(got.loss_sum == again.loss_sum);
}

TEST_CASE("CrossEntropyRows writes a NaN loss for a target outside the vocabulary",
          "[llama_cuda][fused_ce]") {
  const int rows = 3, V = 40;
  TestStream stream;
  const std::vector<float> logits = NormalBf16(rows * V, 1.0f, 41);
  const std::vector<std::int32_t> targets = {5, V, -1};
  DeviceArray<bf16> d_logits(rows * V);
  DeviceArray<float> d_losses(rows);
  DeviceArray<std::int32_t> d_targets(rows);
  d_logits.Upload(ToBf16(logits));
  d_targets.Upload(targets);
  d_losses.Poison();
  PO_TEST_OK(CrossEntropyRows(d_logits.data(), d_losses.data(), d_targets.data(), rows, V, 1.0f,
                              stream.get()));
  const std::vector<float> losses = d_losses.Download();
  CHECK(std::isfinite(losses[0]));
  CHECK(losses[0] > 0.0f);
  CHECK(std::isnan(losses[1]));
  CHECK(std::isnan(losses[2]));
  // Row 0's gradient sums to zero (softmax sums to one, minus the one-hot), up to bf16 rounding.
  const std::vector<float> g = ToFloat(d_logits.Download());
  double sum = 0.0;
  for (int v = 0; v < V; ++v) sum += g[v];
  CHECK(std::fabs(sum) <= 1e-2);
  CHECK(g[5] < 0.0f);
}

TEST_CASE("SumToDouble adds in a fixed order, in double", "[llama_cuda][fused_ce]") {
  const int n = GENERATE(1, 1000, 5000);
  TestStream stream;
  const std::vector<float> values = NormalBf16(n, 3.0f, 51, 1.0f);
  DeviceArray<float> d_values(n);
  DeviceArray<double> d_sum(1);
  d_values.Upload(values);
  double want = 0.0;
  for (float v : values) want += v;
  PO_TEST_OK(SumToDouble(d_sum.data(), d_values.data(), n, stream.get()));
  const double got = d_sum.Download()[0];
  CHECK(std::fabs(got - want) <= 1e-12 * (std::fabs(want) + n));
  PO_TEST_OK(SumToDouble(d_sum.data(), d_values.data(), n, stream.get()));
  CHECK(d_sum.Download()[0] == got);
}

TEST_CASE("Chunk rules: Liger's, and the fewest equal chunks within a byte budget",
          "[llama_cuda][fused_ce]") {
  const int V = 128256, H = 4096;
  CHECK(LigerChunkRows(2048, H, V) == 64);
  CHECK(LigerChunkRows(16384, H, V) == 512);
  CHECK(LigerChunkRows(10, 64, 200) == 4);    // inc 4: ceil(10 / 4) = 3 -> 4
  CHECK(LigerChunkRows(3, 4096, 4096) == 3);  // capped at N
  const std::int64_t row = std::int64_t{V} * 2;
  CHECK(EvenChunkRows(2048, V, 2048 * row) == 2048);
  CHECK(EvenChunkRows(2048, V, 1024 * row) == 1024);
  CHECK(EvenChunkRows(2048, V, 1000 * row) == 688);  // 3 chunks: 683 -> 688
  CHECK(EvenChunkRows(2048, V, 409 * row) == 344);   // 6 chunks: 342 -> 344, 16.8 % of N
  CHECK(EvenChunkRows(16384, V, 3276 * row) == 2736);
  CHECK(EvenChunkRows(100, V, 0) == 1);
  CHECK(FusedCrossEntropyWorkspaceBytes({2048, H, V, 344}) == (344 * row + 255) / 256 * 256);
  CHECK(FusedCrossEntropyWorkspaceBytes({2048, H, V, 0}) == 0);
}

// Device memory filled with a tiled block of bf16 N(0, stddev) values (generating 1 GB on the
// host would dominate the benchmark's set-up).
void FillTiled(bf16* device, std::int64_t n, float stddev, std::uint64_t seed) {
  const std::int64_t block = std::int64_t{1} << 20;
  const std::vector<bf16> tile = ToBf16(NormalBf16(block, stddev, seed));
  for (std::int64_t at = 0; at < n; at += block) {
    const std::int64_t count = std::min(block, n - at);
    REQUIRE(cudaMemcpy(device + at, tile.data(), static_cast<std::size_t>(count) * 2,
                       cudaMemcpyHostToDevice) == cudaSuccess);
  }
  // A pageable copy may return before its DMA lands; the kernels run on a non-blocking stream.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

// Where a fused call's time goes: FusedLinearCrossEntropy's chunk loop with an event between
// the phases (the logits GEMM, the row kernel, the dx GEMM, the dW GEMM), summed over chunks,
// one warm call first. The events cost a few microseconds per phase; the total is printed beside.
void PrintPhaseTimes(gpt::cuda::Linear& linear, cudaStream_t stream, bf16* dx, float* dw,
                     float* losses, bf16* chunk, const bf16* x, const bf16* w,
                     const std::int32_t* targets, const FusedCrossEntropyDims& d) {
  constexpr int kPhases = 4;
  const char* names[kPhases] = {"logits GEMM", "row kernel", "dx GEMM", "dW GEMM"};
  std::vector<cudaEvent_t> events;
  const int chunks = (d.N + d.chunk_rows - 1) / d.chunk_rows;
  events.resize(static_cast<std::size_t>(chunks) * kPhases + 1);
  for (cudaEvent_t& e : events) PO_TEST_CUDA(cudaEventCreate(&e));
  double sums[kPhases] = {};
  for (int rep = 0; rep < 2; ++rep) {
    int at_event = 0;
    PO_TEST_CUDA(cudaEventRecord(events[at_event++], stream));
    for (int r0 = 0; r0 < d.N; r0 += d.chunk_rows) {
      const int rows = std::min(d.chunk_rows, d.N - r0);
      const std::int64_t at = std::int64_t{r0} * d.H;
      const gpt::cuda::LinearDims dims{.N = rows, .IC = d.H, .OC = d.V};
      PO_TEST_OK(linear.Forward(chunk, x + at, w, nullptr, nullptr, nullptr, dims));
      PO_TEST_CUDA(cudaEventRecord(events[at_event++], stream));
      PO_TEST_OK(CrossEntropyRows(chunk, losses + r0, targets + r0, rows, d.V, 1.0f / d.N, stream));
      PO_TEST_CUDA(cudaEventRecord(events[at_event++], stream));
      PO_TEST_OK(linear.BackwardInput(dx + at, chunk, w, nullptr, dims));
      PO_TEST_CUDA(cudaEventRecord(events[at_event++], stream));
      PO_TEST_OK(linear.BackwardWeight(dw, chunk, x + at, dims));
      PO_TEST_CUDA(cudaEventRecord(events[at_event++], stream));
    }
    PO_TEST_CUDA(cudaEventSynchronize(events.back()));
    if (rep == 0) continue;  // warm-up
    for (int e = 1; e < static_cast<int>(events.size()); ++e) {
      float ms = 0.0f;
      PO_TEST_CUDA(cudaEventElapsedTime(&ms, events[e - 1], events[e]));
      sums[(e - 1) % kPhases] += ms;
    }
  }
  double total = 0.0;
  std::printf("    phases over %d chunk(s) of %d rows:", chunks, d.chunk_rows);
  for (int p = 0; p < kPhases; ++p) {
    std::printf(" %s %.3f ms;", names[p], sums[p]);
    total += sums[p];
  }
  std::printf(" total %.3f ms\n", total);
  for (cudaEvent_t e : events) PO_TEST_CUDA(cudaEventDestroy(e));
}

TEST_CASE("Benchmark: fused vs materialised logits at V 128256, H 4096", "[.llama_cuda_bench]") {
  const int H = 4096, V = 128256;
  const int N = GENERATE(2048, 16384);
  TestStream stream;
  auto linear = ValueOrFail(gpt::cuda::Linear::Create(stream.get()));
  DeviceArray<bf16> d_x(std::int64_t{N} * H), d_w(std::int64_t{V} * H), d_dx(std::int64_t{N} * H);
  DeviceArray<float> d_dw(std::int64_t{V} * H), d_losses(N);
  DeviceArray<double> d_sum(1);
  DeviceArray<std::int32_t> d_targets(N);
  FillTiled(d_x.data(), d_x.count(), 1.0f, 61);
  FillTiled(d_w.data(), d_w.count(), 0.02f, 62);
  std::vector<std::int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = static_cast<std::int32_t>((n * 7919LL) % V);
  d_targets.Upload(targets);
  PO_TEST_CUDA(cudaMemset(d_dw.data(), 0, d_dw.bytes()));
  cudaEvent_t start = nullptr, stop = nullptr;
  PO_TEST_CUDA(cudaEventCreate(&start));
  PO_TEST_CUDA(cudaEventCreate(&stop));
  const std::int64_t logits_bytes = std::int64_t{N} * V * 2;
  struct Variant {
    const char* name;
    int rows;
    double min_saving;  // of the materialised bf16 logits
  };
  // Two and three chunks: the dW GEMM's fp32 read-modify-write of V x H per chunk stays under
  // its arithmetic while a chunk has >= ~600 rows (2 K flops per 8 bytes vs the H200's ~146
  // flops per byte); PyTorch's materialised loss (scripts/torch_ce_peer.py) holds ~4x the bf16
  // logits, so these already cut its memory by > 80%.
  const Variant variants[] = {
      {"materialised", N, 0.0},
      {"fused, 2 chunks", EvenChunkRows(N, V, logits_bytes / 2), 0.49},
      {"fused, 3 chunks", EvenChunkRows(N, V, logits_bytes / 3), 0.66},
      {"fused, Liger's rule", LigerChunkRows(N, H, V), 0.8},
      {"fused, <= 20% of the logits", EvenChunkRows(N, V, logits_bytes / 5), 0.8},
  };
  std::printf("fused cross-entropy, N %d, H %d, V %d (6 N V H = %.1f TFLOP per call)\n", N, H, V,
              6.0 * N * V * H / 1e12);
  double materialised_ms = 0.0;
  double materialised_loss = 0.0;
  for (const Variant& v : variants) {
    const FusedCrossEntropyDims dims{N, H, V, v.rows};
    const std::int64_t ws_bytes = FusedCrossEntropyWorkspaceBytes(dims);
    DeviceArray<unsigned char> d_ws(ws_bytes);
    std::vector<float> times;
    for (int rep = 0; rep < 6; ++rep) {  // the first is the warm-up (plans, clocks)
      PO_TEST_CUDA(cudaEventRecord(start, stream.get()));
      PO_TEST_OK(FusedLinearCrossEntropy(*linear, d_dx.data(), d_dw.data(), d_losses.data(),
                                         d_ws.data(), d_x.data(), d_w.data(), d_targets.data(),
                                         dims, 1.0f / N, stream.get()));
      PO_TEST_CUDA(cudaEventRecord(stop, stream.get()));
      PO_TEST_CUDA(cudaEventSynchronize(stop));
      float ms = 0.0f;
      PO_TEST_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (rep > 0) times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    PO_TEST_OK(SumToDouble(d_sum.data(), d_losses.data(), N, stream.get()));
    const double loss = d_sum.Download()[0] / N;
    if (v.rows == N) {
      materialised_ms = median;
      materialised_loss = loss;
    }
    const double saving = 1.0 - static_cast<double>(ws_bytes) / static_cast<double>(logits_bytes);
    std::printf(
        "  %-28s chunk %5d rows  workspace %8.1f MiB (%5.1f%% less)  %8.3f ms  "
        "%6.1f TFLOP/s  (%.2fx materialised)  loss %.6f\n",
        v.name, v.rows, ws_bytes / 1048576.0, 100.0 * saving, median,
        6.0 * N * V * H / (median * 1e9), median / materialised_ms, loss);
    std::fflush(stdout);
    CHECK(std::fabs(loss - materialised_loss) <= 1e-4 * std::fabs(materialised_loss));
    CHECK(saving >= v.min_saving);
    PrintPhaseTimes(*linear, stream.get(), d_dx.data(), d_dw.data(), d_losses.data(),
                    static_cast<bf16*>(static_cast<void*>(d_ws.data())), d_x.data(), d_w.data(),
                    d_targets.data(), dims);
  }
  PO_TEST_CUDA(cudaEventDestroy(start));
  PO_TEST_CUDA(cudaEventDestroy(stop));
}

}  // namespace
}  // namespace pipeoffload::llama::cuda::testing
