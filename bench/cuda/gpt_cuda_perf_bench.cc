// Speed of the CUDA GPT's pieces on the GPU (bench/cuda/gpt_cuda_perf_bench): each linear
// layer shape of a GPT layer at h = 8192, s = 2048 (forward, input gradient, weight gradient),
// one layer-stack chunk's F and full B at h = 4096 and 8192, and one layer's F, B and W with
// lean vs full saved activations at h = 4096 (alone: "[gpt_cuda_perf_lean]"). CUDA events
// around each launch sequence, on random data, 3 untimed then the median of 10. Prints
// TFLOP/s; the checks only guard the report against a broken timing (a benchmark, not a test:
// the targets are for the report, >= 600 TFLOP/s on the h = 8192 GEMMs, the H200 does ~790).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "examples/gpt/cuda/gpt_cuda_layer.h"
#include "examples/gpt/cuda/gpt_cuda_random.h"
#include "examples/gpt/cuda/gpt_layer_stack.h"
#include "examples/gpt/cuda/linear.h"
#include "pipeoffload/cuda_stream.h"
#include "tests/gpt_cuda/gpt_cuda_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

using model_testing::DeviceBytes;
using model_testing::ValueOrFail;

// Median milliseconds of `run` on `stream`.
double MedianMs(cudaStream_t stream, const std::function<absl::Status()>& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&stop) == cudaSuccess);
  std::vector<double> times;
  for (int rep = 0; rep < 13; ++rep) {
    REQUIRE(cudaEventRecord(start, stream) == cudaSuccess);
    PO_MODEL_TEST_OK(run());
    REQUIRE(cudaEventRecord(stop, stream) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(stop) == cudaSuccess);
    float ms = 0.0f;
    REQUIRE(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
    if (rep >= 3) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void FillRandom(const DeviceBytes& buffer, float stddev, std::uint64_t seed) {
  REQUIRE(LaunchFillNormalBf16(static_cast<bf16*>(buffer.data()), buffer.size() / 2, stddev, seed,
                               nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("GEMM rates of the h=8192 layer shapes", "[gpt_cuda_perf]") {
  auto backend = testing::NewCudaBackend();
  cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
  auto linear = ValueOrFail(Linear::Create(stream));
  const int h = 8192, s = 2048;
  struct Shape {
    const char* name;
    int IC, OC;
  };
  for (const Shape& shape : {Shape{"qkv", h, 3 * h}, Shape{"proj", h, h},
                             Shape{"fc (+gelu)", h, 4 * h}, Shape{"fcproj", 4 * h, h}}) {
    DeviceBytes x(std::int64_t{s} * shape.IC * 2), w(std::int64_t{shape.OC} * shape.IC * 2),
        b(std::int64_t{shape.OC} * 2), y(std::int64_t{s} * shape.OC * 2),
        aux(std::int64_t{s} * shape.OC * 2), dx(std::int64_t{s} * shape.IC * 2),
        dw(std::int64_t{shape.OC} * shape.IC * 4);
    FillRandom(x, 1.0f, 1);
    FillRandom(w, 0.02f, 2);
    FillRandom(b, 0.02f, 3);
    FillRandom(y, 1.0f, 4);
    dw.Zero();
    const bool gelu = shape.OC == 4 * h;
    const LinearDims dims{s, shape.IC, shape.OC};
    const double flops = 2.0 * s * shape.IC * static_cast<double>(shape.OC);
    const double f = MedianMs(stream, [&] {
      return linear->Forward(static_cast<bf16*>(y.data()), static_cast<const bf16*>(x.data()),
                             static_cast<const bf16*>(w.data()), static_cast<const bf16*>(b.data()),
                             nullptr, gelu ? static_cast<bf16*>(aux.data()) : nullptr, dims);
    });
    const double bi = MedianMs(stream, [&] {
      return linear->BackwardInput(static_cast<bf16*>(dx.data()),
                                   static_cast<const bf16*>(y.data()),
                                   static_cast<const bf16*>(w.data()), nullptr, dims);
    });
    const double bw = MedianMs(stream, [&] {
      return linear->BackwardWeight(static_cast<float*>(dw.data()),
                                    static_cast<const bf16*>(y.data()),
                                    static_cast<const bf16*>(x.data()), dims);
    });
    std::printf(
        "[perf] %-11s s=%d IC=%d OC=%d: forward %.3f ms %.0f TFLOP/s | dinp %.3f ms %.0f "
        "TFLOP/s | dW %.3f ms %.0f TFLOP/s\n",
        shape.name, s, shape.IC, shape.OC, f, flops / f / 1e9, bi, flops / bi / 1e9, bw,
        flops / bw / 1e9);
    std::fflush(stdout);
    CHECK(f > 0.0);
  }
}

TEST_CASE("Layer stack chunk times", "[gpt_cuda_perf]") {
  for (const std::int64_t h : {std::int64_t{4096}, std::int64_t{8192}}) {
    auto backend = testing::NewCudaBackend();
    cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
    LayerStackShape shape;
    shape.hidden = h;
    shape.heads = static_cast<int>(h / 128);
    shape.seq = 2048;
    auto model = ValueOrFail(CreateCudaGptLayerStack(*backend, shape));
    DeviceBytes saved(model->SavedBytes(0, false)), in(shape.BoundaryBytes()),
        out(shape.BoundaryBytes()), dout(shape.BoundaryBytes()), din(shape.BoundaryBytes());
    FillRandom(in, 1.0f, 5);
    FillRandom(dout, 1e-3f, 6);
    const double f =
        MedianMs(stream, [&] { return model->Forward(0, 0, in.data(), out.data(), saved.data()); });
    const double b = MedianMs(
        stream, [&] { return model->Backward(0, 0, dout.data(), din.data(), saved.data(), true); });
    const double flops = shape.ForwardFlops();
    std::printf(
        "[perf] layer h=%lld s=2048 NH=%d: F %.3f ms (%.0f TFLOP/s), B %.3f ms (%.0f "
        "TFLOP/s), F+B %.0f TFLOP/s; saved %.1f MB/layer\n",
        static_cast<long long>(h), shape.heads, f, flops / f / 1e9, b, 2 * flops / b / 1e9,
        3 * flops / (f + b) / 1e9, shape.SavedBytes() / 1e6);
    std::fflush(stdout);
    CHECK(f > 0.0);
  }
}

TEST_CASE("Lean vs full saved activations: one layer's F B W times",
          "[gpt_cuda_perf][gpt_cuda_perf_lean]") {
  // Split backward, as po-f schedules with W ops run it: B (input gradient only) then W (which,
  // lean, first recomputes ln1, ln2 and gelu(fch)). h = 4096, s = 2048, one layer.
  double w_ms[2] = {0.0, 0.0};
  for (const bool lean : {false, true}) {
    auto backend = testing::NewCudaBackend();
    cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
    LayerStackShape shape;
    shape.hidden = 4096;
    shape.heads = 32;
    shape.seq = 2048;
    shape.lean_saved = lean;
    auto model = ValueOrFail(CreateCudaGptLayerStack(*backend, shape));
    DeviceBytes saved(model->SavedBytes(0, true)), in(shape.BoundaryBytes()),
        out(shape.BoundaryBytes()), dout(shape.BoundaryBytes()), din(shape.BoundaryBytes());
    FillRandom(in, 1.0f, 5);
    FillRandom(dout, 1e-3f, 6);
    const double f =
        MedianMs(stream, [&] { return model->Forward(0, 0, in.data(), out.data(), saved.data()); });
    const double b = MedianMs(stream, [&] {
      return model->Backward(0, 0, dout.data(), din.data(), saved.data(), false);
    });
    const double w = MedianMs(stream, [&] { return model->BackwardWeight(0, 0, saved.data()); });
    w_ms[lean ? 1 : 0] = w;
    std::printf(
        "[perf] %s layer h=4096 s=2048: F %.3f ms, B %.3f ms, W %.3f ms, F+B+W %.3f ms; saved "
        "%.1f MB/layer (W's inputs excluded)\n",
        lean ? "lean" : "full", f, b, w, f + b + w, shape.SavedBytes() / 1e6);
    std::fflush(stdout);
    CHECK(f > 0.0);
    CHECK(w > 0.0);
  }
  std::printf("[perf] lean recompute costs %.3f ms of W\n", w_ms[1] - w_ms[0]);
  std::fflush(stdout);
}

TEST_CASE("Where a layer's non-GEMM time goes", "[gpt_cuda_perf]") {
  for (const int h : {4096, 8192}) {
    auto backend = testing::NewCudaBackend();
    cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
    const LayerDims dims{1, 2048, h, h / 128};
    auto context = ValueOrFail(GptCudaContext::Create(dims, 0, stream));
    const std::int64_t n = dims.N();
    const std::int64_t nc = n * h;
    DeviceBytes qkv(3 * nc * 2), y(nc * 2), dy(nc * 2), dqkv(3 * nc * 2), x(nc * 2), w(h * 2),
        b(h * 2), stats(2 * n * 4), lse(std::int64_t{dims.NH} * dims.T * 4), grad(2 * h * 4);
    FillRandom(qkv, 1.0f, 7);
    FillRandom(dy, 1.0f, 8);
    FillRandom(x, 1.0f, 9);
    FillRandom(w, 1.0f, 10);
    FillRandom(b, 0.1f, 11);
    auto* mean = static_cast<float*>(stats.data());
    float* rstd = mean + n;
    const auto* xd = static_cast<const bf16*>(x.data());
    const double attention_f = MedianMs(stream, [&] {
      return AttentionForward(static_cast<bf16*>(y.data()), static_cast<float*>(lse.data()),
                              static_cast<const bf16*>(qkv.data()), dims.Attention(), stream);
    });
    const double attention_b = MedianMs(stream, [&] {
      return AttentionBackward(
          static_cast<bf16*>(dqkv.data()), static_cast<const bf16*>(dy.data()),
          static_cast<const bf16*>(qkv.data()), static_cast<const bf16*>(y.data()),
          static_cast<const float*>(lse.data()), context->attention_workspace(), dims.Attention(),
          stream);
    });
    const double norm_f = MedianMs(stream, [&] {
      return LayerNormForward(static_cast<bf16*>(y.data()), mean, rstd, xd,
                              static_cast<const bf16*>(w.data()),
                              static_cast<const bf16*>(b.data()), static_cast<int>(n), h, stream);
    });
    const double norm_bi = MedianMs(stream, [&] {
      return LayerNormBackwardInput(
          static_cast<bf16*>(dqkv.data()), static_cast<const bf16*>(dy.data()), xd,
          static_cast<const bf16*>(w.data()), mean, rstd, static_cast<int>(n), h, stream);
    });
    const double norm_bw = MedianMs(stream, [&] {
      float* g = static_cast<float*>(grad.data());
      return LayerNormBackwardWeight(g, g + h, context->norm_scratch(),
                                     static_cast<const bf16*>(dy.data()), xd, mean, rstd,
                                     static_cast<int>(n), h, stream);
    });
    const double bias = MedianMs(stream, [&] {
      return BiasBackward(static_cast<float*>(grad.data()), context->bias_scratch(),
                          static_cast<const bf16*>(qkv.data()), static_cast<int>(n), 3 * h, stream);
    });
    const double attention_flops = 4.0 * 2048.0 * 2048.0 * h;
    std::printf(
        "[perf] pieces h=%d s=2048: attention F %.3f ms (%.0f TFLOP/s as launched), B "
        "%.3f ms (%.0f); layernorm F %.3f, B input %.3f, B weight %.3f ms; bias grad "
        "(3h) %.3f ms\n",
        h, attention_f, attention_flops / attention_f / 1e9, attention_b,
        2 * attention_flops / attention_b / 1e9, norm_f, norm_bi, norm_bw, bias);
    std::fflush(stdout);
    CHECK(attention_f > 0.0);
  }
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
