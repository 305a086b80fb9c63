// Timings of the GPT kernels at the benchmark's sizes (bench/cuda/gpt_kernels_bench; filters
// "[bench_memory]", "[bench_attention]"). Device events around each launch, 3 warm-up runs, the median of 20;
// memory-bound kernels report the bytes they must move per microsecond (GB/s, against the H200's
// ~4.8 TB/s), the attention its useful GEMM FLOP/s (the causal half of the T x T products).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "examples/gpt/cuda/kernels_cuda.h"
#include "tests/gpt_cuda/kernel_test_util.h"

namespace pipeoffload::gpt::cuda::testing {
namespace {

// Median milliseconds of `launch` on `stream`; `prepare` (if any) runs before each launch,
// outside the timed interval.
double MedianMs(cudaStream_t stream, const std::function<absl::Status()>& launch,
                const std::function<void()>& prepare = nullptr) {
  constexpr int kWarmup = 3;
  constexpr int kRuns = 20;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  PO_TEST_CUDA(cudaEventCreate(&start));
  PO_TEST_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < kWarmup; ++i) {
    if (prepare) prepare();
    PO_TEST_OK(launch());
  }
  std::vector<double> times;
  for (int i = 0; i < kRuns; ++i) {
    if (prepare) {
      prepare();
      PO_TEST_CUDA(cudaStreamSynchronize(stream));
    }
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

void ReportBandwidth(const char* what, double ms, double bytes) {
  std::printf("bench %-44s %9.1f us %8.0f GB/s\n", what, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
}

TEST_CASE("GPT kernel timings at h = 8192, T = 4096", "[gpt_kernels_bench][bench_memory]") {
  constexpr int kN = 4096;
  constexpr int kC = 8192;
  constexpr int kV = 50304;
  constexpr std::int64_t kNC = std::int64_t{kN} * kC;
  TestStream stream;
  cudaStream_t s = stream.get();
  DeviceArray<bf16> a(4 * kNC), b(4 * kNC), out(4 * kNC), w(kC), bias(kC);
  DeviceArray<float> mean(kN), rstd(kN), dw(kC), db(kC);
  DeviceArray<float> scratch(LayerNormWeightScratchFloats(kN, kC));
  a.Upload(ToBf16(RandomBf16Values(4 * kNC, -2.0f, 2.0f, 71)));
  b.Upload(ToBf16(RandomBf16Values(4 * kNC, -2.0f, 2.0f, 72)));
  w.Upload(ToBf16(RandomBf16Values(kC, 0.5f, 1.5f, 73)));
  bias.Upload(ToBf16(RandomBf16Values(kC, -0.5f, 0.5f, 74)));
  const double nc2 = 2.0 * static_cast<double>(kNC);  // bytes of one (N, C) bf16 tensor

  ReportBandwidth("Add (N,C)",
                  MedianMs(s, [&] { return cuda::Add(out.data(), a.data(), b.data(), kNC, s); }),
                  3 * nc2);
  ReportBandwidth("GeluForward (N,4C)",
                  MedianMs(s, [&] { return cuda::GeluForward(out.data(), a.data(), 4 * kNC, s); }),
                  2 * 4 * nc2);
  ReportBandwidth(
      "GeluBackward (N,4C)",
      MedianMs(s, [&] { return cuda::GeluBackward(out.data(), a.data(), b.data(), 4 * kNC, s); }),
      3 * 4 * nc2);
  ReportBandwidth("LayerNormForward (N,C)",
                  MedianMs(s,
                           [&] {
                             return cuda::LayerNormForward(out.data(), mean.data(), rstd.data(),
                                                           a.data(), w.data(), bias.data(), kN, kC,
                                                           s);
                           }),
                  2 * nc2);
  ReportBandwidth("LayerNormBackwardInput (N,C)",
                  MedianMs(s,
                           [&] {
                             return cuda::LayerNormBackwardInput(out.data(), b.data(), a.data(),
                                                                 w.data(), mean.data(), rstd.data(),
                                                                 kN, kC, s);
                           }),
                  4 * nc2);
  ReportBandwidth("LayerNormBackwardWeight (N,C)",
                  MedianMs(s,
                           [&] {
                             return cuda::LayerNormBackwardWeight(
                                 dw.data(), db.data(), scratch.data(), b.data(), a.data(),
                                 mean.data(), rstd.data(), kN, kC, s);
                           }),
                  2 * nc2);
  ReportBandwidth(
      "BiasBackward (N,C)",
      MedianMs(s,
               [&] { return cuda::BiasBackward(dw.data(), scratch.data(), b.data(), kN, kC, s); }),
      nc2);

  // Embeddings, tokens random (mostly distinct rows of wte): the forward over a table of 4N
  // rows of C (what `a` holds), the backward over GPT-2's vocabulary at C = 1024.
  {
    DeviceArray<std::int32_t> rows(kN);
    rows.Upload(RandomTokens(kN, 4 * kN, 75));
    ReportBandwidth("EncoderForward (N,C)",
                    MedianMs(s,
                             [&] {
                               return cuda::EncoderForward(out.data(), rows.data(), a.data(),
                                                           b.data(), 1, kN, kC, s);
                             }),
                    3 * nc2);
    DeviceArray<std::int32_t> tokens(kN);
    DeviceArray<float> dwte(std::int64_t{kV} * 1024), dwpe(std::int64_t{kN} * 1024);
    tokens.Upload(RandomTokens(kN, kV, 79));
    ReportBandwidth("EncoderBackward (N,1024)",
                    MedianMs(s,
                             [&] {
                               return cuda::EncoderBackward(dwte.data(), dwpe.data(), b.data(),
                                                            tokens.data(), 1, kN, 1024, s);
                             }),
                    2.0 * kN * 1024 + 16.0 * kN * 1024);
  }
  // Cross-entropy over 1024 rows of GPT-2's vocabulary.
  {
    constexpr int kRows = 1024;
    DeviceArray<std::int32_t> targets(kRows);
    DeviceArray<float> losses(kRows), lse(kRows);
    targets.Upload(RandomTokens(kRows, kV, 76));
    const double logits_bytes = 2.0 * kRows * kV;
    ReportBandwidth("SoftmaxCrossEntropyForward (1024,V)",
                    MedianMs(s,
                             [&] {
                               return cuda::SoftmaxCrossEntropyForward(losses.data(), lse.data(),
                                                                       a.data(), targets.data(),
                                                                       kRows, kV, s);
                             }),
                    logits_bytes);
    ReportBandwidth("SoftmaxCrossEntropyBackward (1024,V)",
                    MedianMs(s,
                             [&] {
                               return cuda::SoftmaxCrossEntropyBackward(out.data(), a.data(),
                                                                        lse.data(), targets.data(),
                                                                        1.0f, kRows, kV, s);
                             }),
                    2 * logits_bytes);
  }
}

// The GPT's attention (the flash kernel on the fused QKV layout) at the h = 8192 layer's heads.
TEST_CASE("GPT attention timings at h = 8192 (NH = 64, hs = 128)",
          "[gpt_kernels_bench][bench_attention]") {
  for (const int T : {2048, 4096}) {
    const int C = 64 * 128;
    TestStream stream;
    cudaStream_t s = stream.get();
    const AttentionShape shape{1, T, 64, 128};
    DeviceArray<bf16> qkv(std::int64_t{T} * 3 * C), out(std::int64_t{T} * C);
    DeviceArray<bf16> dout(std::int64_t{T} * C), dqkv(std::int64_t{T} * 3 * C);
    DeviceArray<float> lse(std::int64_t{64} * T);
    DeviceArray<unsigned char> workspace(AttentionBackwardWorkspaceBytes(shape));
    qkv.Upload(ToBf16(RandomBf16Values(std::int64_t{T} * 3 * C, -1.0f, 1.0f, 77)));
    dout.Upload(ToBf16(RandomBf16Values(std::int64_t{T} * C, -1.0f, 1.0f, 78)));
    // Useful (causal: half of T x T) FLOPs: 2 products in the forward, 5 in the backward (the
    // scores are recomputed), T^2 hs multiply-adds each per head.
    const double product = 1.0 * T * T * 128 * 64;
    const double forward = MedianMs(s, [&] {
      return cuda::AttentionForward(out.data(), lse.data(), qkv.data(), shape, s);
    });
    const double backward = MedianMs(s, [&] {
      return cuda::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                     workspace.data(), shape, s);
    });
    std::printf(
        "bench Attention T=%d NH=64 hs=128 (flash): forward %7.3f ms (%5.1f causal TFLOP/s), "
        "backward %7.3f ms (%5.1f)\n",
        T, forward, 2 * product / (forward * 1e-3) / 1e12, backward,
        5 * product / (backward * 1e-3) / 1e12);
  }
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda::testing
