// The GPU Adam kernel, the bf16 upcast and the sum of squares against the CPU reference, bit for
// bit (lib/optim/cuda/adam_kernel.h). Tags: [gpuadam][kernel].
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/backend/cuda/cuda_check.h"
#include "lib/optim/cuda/adam_kernel.h"
#include "pipeoffload/adam.h"
#include "tests/optim/adam_test_data.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::AdamBuffers;
using testing::ArrayOffsets;
using testing::CompareBuffers;

template <typename T>
T* DeviceAlloc(std::size_t bytes) {
  void* ptr = nullptr;
  PO_CUDA_CHECK(cudaMalloc(&ptr, bytes));
  return static_cast<T*>(ptr);
}

// Device copies of an AdamBuffers' arrays, each `shift` elements past a 256-byte boundary.
class DeviceAdam {
 public:
  DeviceAdam(std::int64_t count, int shift) : count_(count), shift_(shift) {
    for (void** ptr : {&p_, &m_, &v_, &g_, &b_}) {
      PO_CUDA_CHECK(cudaMalloc(ptr, static_cast<std::size_t>(count + 8) * sizeof(float)));
    }
  }
  ~DeviceAdam() {
    for (void* ptr : {p_, m_, v_, g_, b_}) PO_CUDA_CHECK(cudaFree(ptr));
  }
  float* F(void* base) const { return static_cast<float*>(base) + shift_; }
  std::uint16_t* B() const { return static_cast<std::uint16_t*>(b_) + shift_; }
  AdamSpan Span(bool with_bf16) const {
    return AdamSpan{F(p_), F(m_), F(v_), F(g_), with_bf16 ? B() : nullptr, count_};
  }
  void Upload(AdamBuffers& host) {
    const std::size_t bytes = static_cast<std::size_t>(count_) * sizeof(float);
    PO_CUDA_CHECK(cudaMemcpy(F(p_), host.param(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(F(m_), host.exp_avg(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(F(v_), host.exp_avg_sq(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(F(g_), host.grad(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(B(), host.bf16(), bytes / 2, cudaMemcpyHostToDevice));
  }
  void Download(AdamBuffers& host) {
    const std::size_t bytes = static_cast<std::size_t>(count_) * sizeof(float);
    PO_CUDA_CHECK(cudaMemcpy(host.param(), F(p_), bytes, cudaMemcpyDeviceToHost));
    PO_CUDA_CHECK(cudaMemcpy(host.exp_avg(), F(m_), bytes, cudaMemcpyDeviceToHost));
    PO_CUDA_CHECK(cudaMemcpy(host.exp_avg_sq(), F(v_), bytes, cudaMemcpyDeviceToHost));
    PO_CUDA_CHECK(cudaMemcpy(host.bf16(), B(), bytes / 2, cudaMemcpyDeviceToHost));
  }

 private:
  std::int64_t count_;
  int shift_;
  void *p_ = nullptr, *m_ = nullptr, *v_ = nullptr, *g_ = nullptr, *b_ = nullptr;
};

// Scalars exercising every weight-decay variant: plain, Adam (L2), AdamW, and both lines at
// once (not produced by MakeAdamStepScalars, but the kernels must agree on it too).
std::vector<std::pair<std::string, AdamStepScalars>> ScalarVariants(std::int64_t step) {
  std::vector<std::pair<std::string, AdamStepScalars>> out;
  AdamOptions adam;
  adam.learning_rate = 3e-3f;
  adam.weight_decay = 0.0f;
  out.emplace_back("plain", *MakeAdamStepScalars(adam, step, 0.75f));
  adam.weight_decay = 0.1f;
  adam.decoupled_weight_decay = false;
  out.emplace_back("adam-l2", *MakeAdamStepScalars(adam, step, 1.0f));
  adam.decoupled_weight_decay = true;
  out.emplace_back("adamw", *MakeAdamStepScalars(adam, step, 0.5f));
  AdamStepScalars both = out.back().second;
  both.weight_decay = 0.01f;
  out.emplace_back("l2+decoupled", both);
  return out;
}

TEST_CASE("GPU Adam is bitwise equal to AdamUpdateScalar on awkward sizes", "[gpuadam][kernel]") {
  const std::int64_t count = GENERATE(1, 7, 15, 16, 17, 22, 1023, 4097, (1 << 20) + 3);
  // Shift 0: every array 16-byte aligned (the four-wide path); 1 and 3: the scalar path.
  const int shift = GENERATE(0, 1, 3);
  const bool with_bf16 = GENERATE(true, false);
  CAPTURE(count, shift, with_bf16);
  for (std::int64_t step = 1; step <= 3; ++step) {
    for (const auto& [name, scalars] : ScalarVariants(step)) {
      CAPTURE(step, name);
      AdamBuffers want(count, ArrayOffsets{});
      AdamBuffers got(count, ArrayOffsets{});
      want.FillState(static_cast<std::uint64_t>(count * 31 + step));
      want.FillGrad(static_cast<std::uint64_t>(count * 17 + step));
      got.CopyFrom(want);
      DeviceAdam device(count, shift);
      device.Upload(got);
      AdamUpdateScalar(scalars, want.Span(with_bf16));
      const absl::Status launched = LaunchAdamUpdate(scalars, device.Span(with_bf16), nullptr);
      INFO(launched.ToString());
      REQUIRE(launched.ok());
      PO_CUDA_CHECK(cudaDeviceSynchronize());
      device.Download(got);
      const std::string difference = CompareBuffers(want, got, with_bf16);
      INFO(difference);
      CHECK(difference.empty());
    }
  }
}

TEST_CASE("GPU Adam rejects bad spans and enqueues nothing", "[gpuadam][kernel]") {
  DeviceAdam device(64, 0);
  AdamBuffers host(64, ArrayOffsets{});
  host.FillState(5);
  host.FillGrad(6);
  device.Upload(host);
  const AdamStepScalars scalars = *MakeAdamStepScalars(AdamOptions{}, 1);
  AdamSpan span = device.Span(true);
  span.count = -1;
  CHECK(LaunchAdamUpdate(scalars, span, nullptr).code() == absl::StatusCode::kInvalidArgument);
  span = device.Span(true);
  span.exp_avg_sq = nullptr;
  const absl::Status null_v = LaunchAdamUpdate(scalars, span, nullptr);
  CHECK(null_v.code() == absl::StatusCode::kInvalidArgument);
  CHECK(null_v.message().find("exp_avg_sq") != std::string_view::npos);
  span = device.Span(true);
  span.grad = span.param + 10;  // overlaps param
  const absl::Status overlap = LaunchAdamUpdate(scalars, span, nullptr);
  CHECK(overlap.code() == absl::StatusCode::kInvalidArgument);
  CHECK(overlap.message().find("overlap") != std::string_view::npos);
  span = device.Span(true);
  span.count = 0;
  CHECK(LaunchAdamUpdate(scalars, span, nullptr).ok());
  // Nothing above ran: the state is what was uploaded.
  PO_CUDA_CHECK(cudaDeviceSynchronize());
  AdamBuffers after(64, ArrayOffsets{});
  after.CopyFrom(host);
  device.Download(after);
  CHECK(CompareBuffers(host, after, true).empty());
}

TEST_CASE("bf16 upcast on the GPU is exact for every bit pattern", "[gpuadam][kernel]") {
  constexpr std::int64_t kCount = 1 << 16;  // all patterns, NaNs and infinities included
  std::vector<std::uint16_t> in(kCount);
  for (std::int64_t i = 0; i < kCount; ++i)
    in[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i);
  std::uint16_t* d_in = nullptr;
  float* d_out = nullptr;
  d_in = DeviceAlloc<std::uint16_t>(kCount * 2);
  d_out = DeviceAlloc<float>(kCount * 4 + 4);
  PO_CUDA_CHECK(cudaMemcpy(d_in, in.data(), kCount * 2, cudaMemcpyHostToDevice));
  // Odd offset and length: no alignment assumptions.
  REQUIRE(LaunchBf16ToFp32(d_in + 1, d_out + 1, kCount - 1, nullptr).ok());
  std::vector<float> out(kCount - 1);
  PO_CUDA_CHECK(cudaMemcpy(out.data(), d_out + 1, (kCount - 1) * 4, cudaMemcpyDeviceToHost));
  std::int64_t wrong = -1;
  for (std::int64_t i = 0; i + 1 < kCount && wrong < 0; ++i) {
    const float want = Bf16BitsToFloat(in[static_cast<std::size_t>(i + 1)]);
    if (std::memcmp(&want, &out[static_cast<std::size_t>(i)], 4) != 0) wrong = i + 1;
  }
  CHECK(wrong == -1);
  CHECK(LaunchBf16ToFp32(nullptr, d_out, 4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(LaunchBf16ToFp32(d_in, d_out, -4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  PO_CUDA_CHECK(cudaFree(d_in));
  PO_CUDA_CHECK(cudaFree(d_out));
}

TEST_CASE("GPU sum of squares has CpuAdam::SumOfSquares' bits", "[gpuadam][kernel]") {
  const std::int64_t count = GENERATE(1, 17, 8191, 8192, 8193, 100003, (1 << 22) + 5);
  CAPTURE(count);
  std::mt19937_64 rng(static_cast<std::uint64_t>(count));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-20.0f, 20.0f);
  std::vector<std::uint16_t> bf16(static_cast<std::size_t>(count));
  std::vector<float> fp32(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    // Wide magnitudes, so the order of additions matters to the last bit.
    const float x = normal(rng) * std::exp2(exponent(rng));
    bf16[static_cast<std::size_t>(i)] = FloatToBf16Bits(x);
    fp32[static_cast<std::size_t>(i)] = x;
  }
  std::vector<float> bf16_values(bf16.size());
  for (std::size_t i = 0; i < bf16.size(); ++i) bf16_values[i] = Bf16BitsToFloat(bf16[i]);
  const auto cpu = CpuAdam::Create(CpuAdamOptions{2});
  REQUIRE(cpu.ok());
  const double want_fp32 = (*cpu)->SumOfSquares(fp32.data(), count);
  const double want_bf16 = (*cpu)->SumOfSquares(bf16_values.data(), count);

  float* d_fp32 = nullptr;
  std::uint16_t* d_bf16 = nullptr;
  double* d_partials = nullptr;
  double* d_result = nullptr;
  d_fp32 = DeviceAlloc<float>(static_cast<std::size_t>(count) * 4);
  d_bf16 = DeviceAlloc<std::uint16_t>(static_cast<std::size_t>(count) * 2);
  d_partials = DeviceAlloc<double>(static_cast<std::size_t>(SumOfSquaresPartialCount(count)) * 8);
  d_result = DeviceAlloc<double>(3 * sizeof(double));
  PO_CUDA_CHECK(cudaMemcpy(d_fp32, fp32.data(), fp32.size() * 4, cudaMemcpyHostToDevice));
  PO_CUDA_CHECK(cudaMemcpy(d_bf16, bf16.data(), bf16.size() * 2, cudaMemcpyHostToDevice));
  REQUIRE(
      LaunchSumOfSquares(d_fp32, count, d_partials, d_result, SumMode::kOverwrite, nullptr).ok());
  REQUIRE(
      LaunchSumOfSquaresBf16(d_bf16, count, d_partials, d_result + 1, SumMode::kOverwrite, nullptr)
          .ok());
  // Accumulate: the first half, then the rest, added to what is there (the engine's use).
  const std::int64_t half = count / 2;
  REQUIRE(LaunchSumOfSquares(d_fp32, half, d_partials, d_result + 2, SumMode::kOverwrite, nullptr)
              .ok());
  REQUIRE(LaunchSumOfSquares(d_fp32 + half, count - half, d_partials, d_result + 2,
                             SumMode::kAccumulate, nullptr)
              .ok());
  double got[3] = {};
  PO_CUDA_CHECK(cudaMemcpy(got, d_result, sizeof(got), cudaMemcpyDeviceToHost));
  const double want_split = (*cpu)->SumOfSquares(fp32.data(), half) +
                            (*cpu)->SumOfSquares(fp32.data() + half, count - half);
  CHECK(std::memcmp(&got[0], &want_fp32, 8) == 0);
  CHECK(std::memcmp(&got[1], &want_bf16, 8) == 0);
  CHECK(std::memcmp(&got[2], &want_split, 8) == 0);
  CAPTURE(got[0], want_fp32, got[1], want_bf16, got[2], want_split);
  CHECK(LaunchSumOfSquares(d_fp32, -1, d_partials, d_result, SumMode::kOverwrite, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(LaunchSumOfSquares(d_fp32, 4, d_partials, nullptr, SumMode::kOverwrite, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  for (void* ptr : {static_cast<void*>(d_fp32), static_cast<void*>(d_bf16),
                    static_cast<void*>(d_partials), static_cast<void*>(d_result)}) {
    PO_CUDA_CHECK(cudaFree(ptr));
  }
}

}  // namespace
}  // namespace pipeoffload
