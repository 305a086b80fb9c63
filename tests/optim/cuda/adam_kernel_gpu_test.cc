// The GPU Adam kernel (fp32 and bf16 gradients), the bf16 <-> fp32 conversions and the sum of
// squares against the CPU reference, bit for bit (lib/optim/cuda/adam_kernel.h).
// Tags: [gpuadam][kernel].
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

// Device copies of an AdamBuffers' arrays, each `shift` elements past a 256-byte boundary (the
// bf16 gradients `grad_bf16_shift` elements, or `shift` when that is negative).
class DeviceAdam {
 public:
  DeviceAdam(std::int64_t count, int shift, int grad_bf16_shift = -1)
      : count_(count),
        shift_(shift),
        grad_bf16_shift_(grad_bf16_shift < 0 ? shift : grad_bf16_shift) {
    for (void** ptr : {&p_, &m_, &v_, &g_, &b_, &gb_}) {
      PO_CUDA_CHECK(cudaMalloc(ptr, static_cast<std::size_t>(count + 8) * sizeof(float)));
    }
  }
  ~DeviceAdam() {
    for (void* ptr : {p_, m_, v_, g_, b_, gb_}) PO_CUDA_CHECK(cudaFree(ptr));
  }
  float* F(void* base) const { return static_cast<float*>(base) + shift_; }
  std::uint16_t* B() const { return static_cast<std::uint16_t*>(b_) + shift_; }
  std::uint16_t* GradBf16() const { return static_cast<std::uint16_t*>(gb_) + grad_bf16_shift_; }
  // The gradient from the bf16 array when `bf16_grad`, else from the fp32 one.
  AdamSpan Span(bool with_bf16, bool bf16_grad = false) const {
    AdamSpan span{F(p_), F(m_), F(v_), F(g_), with_bf16 ? B() : nullptr, count_};
    if (bf16_grad) {
      span.grad = nullptr;
      span.grad_bf16 = GradBf16();
    }
    return span;
  }
  void Upload(AdamBuffers& host) {
    const std::size_t bytes = static_cast<std::size_t>(count_) * sizeof(float);
    PO_CUDA_CHECK(cudaMemcpy(F(p_), host.param(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(F(m_), host.exp_avg(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(F(v_), host.exp_avg_sq(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(F(g_), host.grad(), bytes, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(B(), host.bf16(), bytes / 2, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(GradBf16(), host.grad_bf16(), bytes / 2, cudaMemcpyHostToDevice));
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
  int grad_bf16_shift_;
  void *p_ = nullptr, *m_ = nullptr, *v_ = nullptr, *g_ = nullptr, *b_ = nullptr, *gb_ = nullptr;
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

TEST_CASE("GPU Adam with bf16 gradients is bitwise equal to AdamUpdateScalar",
          "[gpuadam][kernel]") {
  const std::int64_t count = GENERATE(1, 7, 15, 16, 17, 22, 1023, 4097, (1 << 20) + 3);
  // (shift, bf16 gradient shift): 0, 0: the four-wide path; 0, 1: every fp32 array aligned but
  // the bf16 gradients, so the scalar path; 1, 1 and 3, 3: the scalar path.
  const auto [shift, grad_shift] =
      GENERATE(std::pair{0, 0}, std::pair{0, 1}, std::pair{1, 1}, std::pair{3, 3});
  const bool with_bf16 = GENERATE(true, false);
  CAPTURE(count, shift, grad_shift, with_bf16);
  for (std::int64_t step = 1; step <= 3; ++step) {
    for (const auto& [name, scalars] : ScalarVariants(step)) {
      CAPTURE(step, name);
      AdamBuffers want(count, ArrayOffsets{});
      AdamBuffers got(count, ArrayOffsets{});
      want.FillState(static_cast<std::uint64_t>(count * 31 + step));
      // Finite bf16 gradients: subnormals, zeros of both signs, huge values (the non-finite ones
      // are the next test's: their NaN bits differ by design).
      want.FillGradBf16(static_cast<std::uint64_t>(count * 17 + step), /*non_finite=*/false);
      got.CopyFrom(want);
      // Poison the fp32 gradients on the device: the kernel must read the bf16 ones.
      for (std::int64_t i = 0; i < count; ++i) got.grad()[i] = std::nanf("");
      DeviceAdam device(count, shift, grad_shift);
      device.Upload(got);
      AdamUpdateScalar(scalars, want.Span(with_bf16, /*bf16_grad=*/true));
      const absl::Status launched =
          LaunchAdamUpdate(scalars, device.Span(with_bf16, /*bf16_grad=*/true), nullptr);
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

// "" when a and b hold the same bits wherever `want` is not NaN and NaN where it is, else the
// first difference.
std::string CompareNaNAware(const float* want, const float* got, std::int64_t count,
                            const char* name) {
  for (std::int64_t i = 0; i < count; ++i) {
    const bool same = std::isnan(want[i]) ? std::isnan(got[i])
                                          : std::memcmp(&want[i], &got[i], sizeof(float)) == 0;
    if (!same) {
      return std::string(name) + "[" + std::to_string(i) + "]: want " + std::to_string(want[i]) +
             " got " + std::to_string(got[i]);
    }
  }
  return "";
}

TEST_CASE("GPU Adam with every bf16 bit pattern as a gradient matches the CPU, NaN for NaN",
          "[gpuadam][kernel]") {
  // All 65536 patterns (subnormals, zeros, infinities, every NaN payload), one step from a finite
  // state. Finite results must have the CPU's bits; NaN results must be NaN (the GPU writes a
  // canonical NaN where x86 propagates a payload: adam_kernel.h).
  constexpr std::int64_t kCount = std::int64_t{1} << 16;
  const int shift = GENERATE(0, 1);
  CAPTURE(shift);
  for (const auto& [name, scalars] : ScalarVariants(2)) {
    CAPTURE(name);
    AdamBuffers want(kCount, ArrayOffsets{});
    want.FillState(4242);
    for (std::int64_t i = 0; i < kCount; ++i) {
      want.grad_bf16()[i] = static_cast<std::uint16_t>(i);
      want.grad()[i] = Bf16BitsToFloat(static_cast<std::uint16_t>(i));
    }
    AdamBuffers got(kCount, ArrayOffsets{});
    got.CopyFrom(want);
    DeviceAdam device(kCount, shift);
    device.Upload(got);
    AdamUpdateScalar(scalars, want.Span(/*with_bf16=*/true, /*bf16_grad=*/true));
    REQUIRE(LaunchAdamUpdate(scalars, device.Span(true, /*bf16_grad=*/true), nullptr).ok());
    PO_CUDA_CHECK(cudaDeviceSynchronize());
    device.Download(got);
    std::int64_t nans = 0;
    for (std::int64_t i = 0; i < kCount; ++i) nans += std::isnan(want.param()[i]) ? 1 : 0;
    CHECK(nans >= 2 * 127);  // the NaN gradients at least
    CHECK(CompareNaNAware(want.param(), got.param(), kCount, "param") == "");
    CHECK(CompareNaNAware(want.exp_avg(), got.exp_avg(), kCount, "exp_avg") == "");
    CHECK(CompareNaNAware(want.exp_avg_sq(), got.exp_avg_sq(), kCount, "exp_avg_sq") == "");
    std::int64_t bf16_wrong = -1;
    for (std::int64_t i = 0; i < kCount && bf16_wrong < 0; ++i) {
      const bool want_nan = std::isnan(Bf16BitsToFloat(want.bf16()[i]));
      const bool ok = want_nan ? std::isnan(Bf16BitsToFloat(got.bf16()[i]))
                               : want.bf16()[i] == got.bf16()[i];
      if (!ok) bf16_wrong = i;
    }
    CHECK(bf16_wrong == -1);
  }
}

// A split master on the GPU (AdamSpan::param_lo): the halves, m and v the CPU's split update
// writes, bit for bit where the result is not NaN; a NaN master stays NaN when joined and its
// high half (the parameter the model computes with) is a NaN too.
TEST_CASE("GPU Adam on a split master is bitwise equal to the CPU's, NaN for NaN",
          "[gpuadam][kernel]") {
  const std::int64_t count = GENERATE(std::int64_t{1}, std::int64_t{7}, std::int64_t{4097},
                                      std::int64_t{1} << 16);
  // Shift 0: the four-wide path (8-byte aligned halves); 1: the scalar path.
  const int shift = GENERATE(0, 1);
  CAPTURE(count, shift);
  for (const auto& [name, scalars] : ScalarVariants(2)) {
    CAPTURE(name);
    AdamBuffers want(count, ArrayOffsets{});
    want.FillState(static_cast<std::uint64_t>(777 + count));
    // Every bf16 pattern as a gradient, NaNs and infinities included, cycling.
    for (std::int64_t i = 0; i < count; ++i) {
      want.grad_bf16()[i] = static_cast<std::uint16_t>(i * 40503);
    }
    const auto n = static_cast<std::size_t>(count);
    std::vector<std::uint16_t> hi(n), lo(n);
    for (std::size_t i = 0; i < n; ++i) {
      const SplitBf16 split = SplitMaster(want.param()[i]);
      hi[i] = split.hi;
      lo[i] = split.lo;
    }
    std::vector<float> m0(want.exp_avg(), want.exp_avg() + count);
    std::vector<float> v0(want.exp_avg_sq(), want.exp_avg_sq() + count);
    // Device copies (before the CPU updates the host arrays in place).
    auto* d_hi = DeviceAlloc<std::uint16_t>((n + 8) * 2);
    auto* d_lo = DeviceAlloc<std::uint16_t>((n + 8) * 2);
    auto* d_m = DeviceAlloc<float>((n + 8) * 4);
    auto* d_v = DeviceAlloc<float>((n + 8) * 4);
    auto* d_g = DeviceAlloc<std::uint16_t>((n + 8) * 2);
    PO_CUDA_CHECK(cudaMemcpy(d_hi + shift, hi.data(), n * 2, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(d_lo + shift, lo.data(), n * 2, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(d_m + shift, m0.data(), n * 4, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(d_v + shift, v0.data(), n * 4, cudaMemcpyHostToDevice));
    PO_CUDA_CHECK(cudaMemcpy(d_g + shift, want.grad_bf16(), n * 2, cudaMemcpyHostToDevice));

    AdamSpan cpu;
    cpu.exp_avg = want.exp_avg();
    cpu.exp_avg_sq = want.exp_avg_sq();
    cpu.grad_bf16 = want.grad_bf16();
    cpu.param_bf16 = hi.data();
    cpu.param_lo = lo.data();
    cpu.count = count;
    REQUIRE(CheckAdamSpan(cpu).ok());
    AdamUpdateScalar(scalars, cpu);
    AdamSpan gpu;
    gpu.exp_avg = d_m + shift;
    gpu.exp_avg_sq = d_v + shift;
    gpu.grad_bf16 = d_g + shift;
    gpu.param_bf16 = d_hi + shift;
    gpu.param_lo = d_lo + shift;
    gpu.count = count;
    REQUIRE(LaunchAdamUpdate(scalars, gpu, nullptr).ok());
    PO_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::uint16_t> got_hi(n), got_lo(n);
    std::vector<float> got_m(n), got_v(n);
    PO_CUDA_CHECK(cudaMemcpy(got_hi.data(), d_hi + shift, n * 2, cudaMemcpyDeviceToHost));
    PO_CUDA_CHECK(cudaMemcpy(got_lo.data(), d_lo + shift, n * 2, cudaMemcpyDeviceToHost));
    PO_CUDA_CHECK(cudaMemcpy(got_m.data(), d_m + shift, n * 4, cudaMemcpyDeviceToHost));
    PO_CUDA_CHECK(cudaMemcpy(got_v.data(), d_v + shift, n * 4, cudaMemcpyDeviceToHost));
    for (void* ptr : {static_cast<void*>(d_hi), static_cast<void*>(d_lo), static_cast<void*>(d_m),
                      static_cast<void*>(d_v), static_cast<void*>(d_g)}) {
      PO_CUDA_CHECK(cudaFree(ptr));
    }

    std::vector<float> want_master(n), got_master(n);
    std::int64_t nans = 0, wrong_halves = -1, hi_not_nan = -1;
    for (std::size_t i = 0; i < n; ++i) {
      want_master[i] = JoinSplitMaster(hi[i], lo[i]);
      got_master[i] = JoinSplitMaster(got_hi[i], got_lo[i]);
      if (std::isnan(want_master[i])) {
        ++nans;
        if (!std::isnan(Bf16BitsToFloat(got_hi[i])) && hi_not_nan < 0) hi_not_nan = static_cast<std::int64_t>(i);
      } else if ((hi[i] != got_hi[i] || lo[i] != got_lo[i]) && wrong_halves < 0) {
        wrong_halves = static_cast<std::int64_t>(i);
      }
    }
    if (count >= 65536) CHECK(nans >= 2 * 127);  // the NaN gradients at least
    CHECK(wrong_halves == -1);
    CHECK(hi_not_nan == -1);
    CHECK(CompareNaNAware(want_master.data(), got_master.data(), count, "master") == "");
    CHECK(CompareNaNAware(want.exp_avg(), got_m.data(), count, "exp_avg") == "");
    CHECK(CompareNaNAware(want.exp_avg_sq(), got_v.data(), count, "exp_avg_sq") == "");
  }
}

TEST_CASE("GPU Adam rejects a span with both gradients or neither", "[gpuadam][kernel]") {
  DeviceAdam device(64, 0);
  const AdamStepScalars scalars = *MakeAdamStepScalars(AdamOptions{}, 1);
  AdamSpan both = device.Span(true, /*bf16_grad=*/true);
  both.grad = device.Span(true).grad;
  const absl::Status both_status = LaunchAdamUpdate(scalars, both, nullptr);
  CHECK(both_status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(both_status.message().find("both are set") != std::string_view::npos);
  CHECK(both_status.message().find("LaunchAdamUpdate") != std::string_view::npos);
  AdamSpan neither = device.Span(true);
  neither.grad = nullptr;
  const absl::Status neither_status = LaunchAdamUpdate(scalars, neither, nullptr);
  CHECK(neither_status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(neither_status.message().find("both are null") != std::string_view::npos);
  AdamSpan overlap = device.Span(true, /*bf16_grad=*/true);
  overlap.grad_bf16 = overlap.param_bf16 + 10;
  const absl::Status overlap_status = LaunchAdamUpdate(scalars, overlap, nullptr);
  CHECK(overlap_status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(overlap_status.message().find("overlap") != std::string_view::npos);
}

// fp32 inputs whose bf16 rounding is worth checking: for every top half (so every sign,
// exponent, NaN payload and infinity) the low halves that decide rounding (exact, just above,
// just below and exactly at the tie, the largest), then random bit patterns.
std::vector<float> RoundingInputs() {
  std::vector<float> x;
  for (std::uint32_t high = 0; high < 0x10000u; ++high) {
    for (const std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      x.push_back(testing::FromBits((high << 16) | low));
    }
  }
  std::mt19937_64 rng(20261201);
  for (int i = 0; i < (1 << 20) + 5; ++i) {
    x.push_back(testing::FromBits(static_cast<std::uint32_t>(rng())));
  }
  return x;
}

TEST_CASE("LaunchFp32ToBf16 rounds exactly as FloatToBf16Bits", "[gpuadam][kernel]") {
  const std::vector<float> x = RoundingInputs();
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<std::uint16_t> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = FloatToBf16Bits(x[i]);
  float* d_in = DeviceAlloc<float>((x.size() + 8) * sizeof(float));
  std::uint16_t* d_out = DeviceAlloc<std::uint16_t>((x.size() + 16) * sizeof(std::uint16_t));
  constexpr std::int64_t kGuard = 4;  // out elements before and after the written range
  // (input shift, output shift) in elements: 0, 0 and 4, 4: the four-wide path; 1, 1 and 0, 1:
  // the scalar one. Counts odd, so the vector path has a tail.
  for (const auto& [in_shift, out_shift] :
       {std::pair{0, 0}, std::pair{4, 4}, std::pair{1, 1}, std::pair{0, 1}}) {
    const std::int64_t count = n - 3;
    PO_CUDA_CHECK(cudaMemcpy(d_in + in_shift, x.data(), static_cast<std::size_t>(count) * 4,
                             cudaMemcpyHostToDevice));
    // Two poisons: an element the kernel did not write keeps one of them, and no value equals
    // both, so it fails in at least one pass.
    for (const int poison : {0x00, 0xff}) {
      CAPTURE(in_shift, out_shift, poison);
      PO_CUDA_CHECK(cudaMemset(d_out, poison, (x.size() + 16) * sizeof(std::uint16_t)));
      std::uint16_t* out = d_out + kGuard + out_shift;
      REQUIRE(LaunchFp32ToBf16(d_in + in_shift, out, count, nullptr).ok());
      PO_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<std::uint16_t> got(static_cast<std::size_t>(count + 2 * kGuard));
      PO_CUDA_CHECK(cudaMemcpy(got.data(), out - kGuard, got.size() * 2, cudaMemcpyDeviceToHost));
      const std::uint16_t poisoned = static_cast<std::uint16_t>(poison * 0x0101);
      for (std::int64_t g = 0; g < kGuard; ++g) {
        CHECK(got[static_cast<std::size_t>(g)] == poisoned);
        CHECK(got[static_cast<std::size_t>(count + kGuard + g)] == poisoned);
      }
      std::int64_t wrong = -1;
      for (std::int64_t i = 0; i < count && wrong < 0; ++i) {
        if (got[static_cast<std::size_t>(i + kGuard)] != want[static_cast<std::size_t>(i)]) {
          wrong = i;
        }
      }
      if (wrong >= 0) {
        CAPTURE(wrong, testing::Bits(x[static_cast<std::size_t>(wrong)]),
                want[static_cast<std::size_t>(wrong)],
                got[static_cast<std::size_t>(wrong + kGuard)]);
        CHECK(wrong == -1);
      }
    }
  }
  CHECK(LaunchFp32ToBf16(nullptr, d_out, 4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(LaunchFp32ToBf16(d_in, nullptr, 4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(LaunchFp32ToBf16(d_in, d_out, -4, nullptr).code() == absl::StatusCode::kInvalidArgument);
  const absl::Status overlap =
      LaunchFp32ToBf16(d_in, reinterpret_cast<std::uint16_t*>(d_in + 2), 8, nullptr);
  CHECK(overlap.code() == absl::StatusCode::kInvalidArgument);
  CHECK(overlap.message().find("overlap") != std::string_view::npos);
  CHECK(LaunchFp32ToBf16(nullptr, nullptr, 0, nullptr).ok());
  PO_CUDA_CHECK(cudaFree(d_in));
  PO_CUDA_CHECK(cudaFree(d_out));
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
  // And CpuAdam's own bf16 sum (reading the bf16 bits) has the GPU's bits too.
  const double cpu_bf16 = (*cpu)->SumOfSquaresBf16(bf16.data(), count);
  CAPTURE(got[0], want_fp32, got[1], want_bf16, cpu_bf16, got[2], want_split);
  CHECK(std::memcmp(&got[0], &want_fp32, 8) == 0);
  CHECK(std::memcmp(&got[1], &want_bf16, 8) == 0);
  CHECK(std::memcmp(&got[2], &want_split, 8) == 0);
  CHECK(std::memcmp(&got[1], &cpu_bf16, 8) == 0);
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
