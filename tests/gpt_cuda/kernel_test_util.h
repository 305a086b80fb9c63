// Helpers of the GPT kernel tests: device buffers, bf16-rounded random inputs, NaN poisoning,
// and the tolerance check every kernel test uses (fails on NaN, reports the worst element).
#ifndef PIPEOFFLOAD_TESTS_GPT_CUDA_KERNEL_TEST_UTIL_H_
#define PIPEOFFLOAD_TESTS_GPT_CUDA_KERNEL_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda::testing {

using bf16 = __nv_bfloat16;

#define PO_TEST_CUDA(call)                                     \
  do {                                                         \
    const cudaError_t po_test_error_ = (call);                 \
    INFO(#call << ": " << cudaGetErrorString(po_test_error_)); \
    REQUIRE(po_test_error_ == cudaSuccess);                    \
  } while (0)

#define PO_TEST_OK(expr)                         \
  do {                                           \
    const absl::Status po_test_status_ = (expr); \
    INFO(po_test_status_.ToString());            \
    REQUIRE(po_test_status_.ok());               \
  } while (0)

inline bf16 Bf16FromBits(std::uint16_t bits) {
  bf16 value;
  std::memcpy(static_cast<void*>(&value), &bits, sizeof(value));
  return value;
}

inline float RoundBf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Device memory for `count` elements of T (plus `offset` leading elements, so that data() can be
// deliberately misaligned), freed with the object.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::int64_t count, std::int64_t offset = 0)
      : count_(count), offset_(offset) {
    void* base = nullptr;
    PO_TEST_CUDA(cudaMalloc(&base, sizeof(T) * static_cast<std::size_t>(count + offset + 1)));
    base_ = static_cast<T*>(base);
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() const { return base_ + offset_; }
  std::int64_t count() const { return count_; }
  std::size_t bytes() const { return sizeof(T) * static_cast<std::size_t>(count_); }

  void Upload(const std::vector<T>& host) const {
    REQUIRE(static_cast<std::int64_t>(host.size()) == count_);
    PO_TEST_CUDA(cudaMemcpy(data(), host.data(), bytes(), cudaMemcpyHostToDevice));
    // Kernels run on a non-blocking stream, which does not wait for the legacy default stream.
    PO_TEST_CUDA(cudaDeviceSynchronize());
  }
  std::vector<T> Download() const {
    std::vector<T> host(static_cast<std::size_t>(count_));
    PO_TEST_CUDA(cudaDeviceSynchronize());
    PO_TEST_CUDA(cudaMemcpy(host.data(), data(), bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Every bit set: NaN as bf16 and as fp32, so an element a kernel skips can never pass. Waits
  // first: the memset (legacy default stream) does not wait for kernels still queued on the
  // non-blocking test stream, which may be reading this array.
  void Poison() const {
    PO_TEST_CUDA(cudaDeviceSynchronize());
    PO_TEST_CUDA(cudaMemset(data(), 0xFF, bytes()));
    PO_TEST_CUDA(cudaDeviceSynchronize());
  }

 private:
  T* base_ = nullptr;
  std::int64_t count_;
  std::int64_t offset_;
};

// A non-blocking stream for the kernels under test (so nothing relies on the default stream).
class TestStream {
 public:
  TestStream() { PO_TEST_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(stream_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Uniform values in [lo, hi), rounded to bf16 so the CPU sees exactly what the GPU reads.
inline std::vector<float> RandomBf16Values(std::int64_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = RoundBf16(dist(rng));
  return values;
}

inline std::vector<float> RandomFloats(std::int64_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = dist(rng);
  return values;
}

inline std::vector<std::int32_t> RandomTokens(std::int64_t n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, vocab - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(n));
  for (std::int32_t& t : tokens) t = dist(rng);
  return tokens;
}

inline std::vector<bf16> ToBf16(const std::vector<float>& values) {
  std::vector<bf16> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __float2bfloat16_rn(values[i]);
  return out;
}

inline std::vector<float> ToFloat(const std::vector<bf16>& values) {
  std::vector<float> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __bfloat162float(values[i]);
  return out;
}

inline float MaxAbs(const std::vector<float>& values) {
  float m = 0.0f;
  for (float v : values) m = std::fabs(v) > m ? std::fabs(v) : m;
  return m;
}

// got[i] passes when |got[i] - want[i]| <= bound[i]; a NaN anywhere fails (the comparison is
// written so that NaN makes it false). Reports the number of failures and the worst one.
inline void RequireWithin(const std::vector<float>& got, const std::vector<float>& want,
                          const std::vector<float>& bound, const std::string& what) {
  REQUIRE(got.size() == want.size());
  REQUIRE(bound.size() == want.size());
  std::int64_t failures = 0;
  std::int64_t first_failure = -1;
  std::int64_t worst = -1;  // the passing element closest to its bound
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= bound[i])) {
      if (failures++ == 0) first_failure = static_cast<std::int64_t>(i);
      continue;
    }
    const double ratio = bound[i] > 0 ? diff / bound[i] : 0.0;
    if (worst < 0 || ratio > worst_ratio) {
      worst = static_cast<std::int64_t>(i);
      worst_ratio = ratio;
    }
  }
  const std::int64_t shown = first_failure >= 0 ? first_failure : worst;
  if (shown >= 0) {
    const auto k = static_cast<std::size_t>(shown);
    INFO(what << ": " << failures << " of " << got.size()
              << " elements out of tolerance; shown (first failure, else the closest to its "
                 "bound): element "
              << shown << ": got " << got[k] << ", want " << want[k] << ", bound " << bound[k]);
    CHECK(failures == 0);
  }
}

// The usual bound: |got - want| <= rtol * |want| + atol.
inline void RequireClose(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                         double atol, const std::string& what) {
  std::vector<float> bound(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    bound[i] = static_cast<float>(rtol * std::fabs(want[i]) + atol);
  }
  RequireWithin(got, want, bound, what);
}

// Bitwise equality of two downloads (the determinism checks).
template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

// bf16 keeps 8 significant bits: one rounding to nearest is off by at most half an ulp, 2^-8
// of the value (the unit roundoff), and two results rounded from slightly different fp32 values
// are at most one ulp apart, 2^-7 of the value.
inline constexpr double kBf16Roundoff = 1.0 / 256;
inline constexpr double kBf16UlpRelative = 1.0 / 128;

}  // namespace pipeoffload::gpt::cuda::testing

#endif  // PIPEOFFLOAD_TESTS_GPT_CUDA_KERNEL_TEST_UTIL_H_
