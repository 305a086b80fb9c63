// Helpers of the CUDA GPT's model tests (cudagpt): device buffers, bf16-rounded random data,
// poisoning, and the relative-error measure every comparison uses (NaN never passes).
#ifndef PIPEOFFLOAD_TESTS_GPT_CUDA_GPT_CUDA_TEST_UTIL_H_
#define PIPEOFFLOAD_TESTS_GPT_CUDA_GPT_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda::model_testing {

#define PO_MODEL_TEST_OK(expr)                   \
  do {                                           \
    const absl::Status po_test_status_ = (expr); \
    INFO(#expr << ": " << po_test_status_.ToString()); \
    REQUIRE(po_test_status_.ok());               \
  } while (0)

// `value` of a StatusOr, REQUIRE-ing it is OK.
template <typename T>
T ValueOrFail(absl::StatusOr<T> result) {
  INFO(result.status().ToString());
  REQUIRE(result.ok());
  return std::move(*result);
}

// Sets `bytes` bytes at `device` to `value` once everything queued on the device is done, and
// returns when they are set. Both waits matter: cudaMemset runs on the legacy default stream,
// which does not wait for work on streams created cudaStreamNonBlocking (the CUDA backend's
// compute stream, where the models launch), nor do those streams wait for it. Without the first
// wait the memset overwrites a buffer that queued kernels still read (the flaky NaN of
// "GPU training steps track the CPU reference trainer": the next microbatch's Poison of the
// saved region ran under the previous one's Backward, whose TokenBackwardKernel then read token
// -1); without the second, the model's next kernels may run before the bytes land.
inline void FillDevice(void* device, std::int64_t bytes, int value) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemset(device, value, static_cast<std::size_t>(bytes)) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

// Bytes of device memory, freed with the object; starts poisoned (every bit set: NaN as bf16
// and fp32, -1 as int32), so anything a kernel forgets to write is NaN.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::int64_t bytes) : bytes_(bytes) {
    REQUIRE(cudaMalloc(&data_, static_cast<std::size_t>(bytes)) == cudaSuccess);
    Poison();
  }
  ~DeviceBytes() { cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  void* data() const { return data_; }
  std::byte* bytes_ptr() const { return static_cast<std::byte*>(data_); }
  std::int64_t size() const { return bytes_; }
  // Both after all queued work (FillDevice): safe between calls of a model on any stream.
  void Poison() const { FillDevice(data_, bytes_, 0xFF); }
  void Zero() const { FillDevice(data_, bytes_, 0); }

 private:
  void* data_ = nullptr;
  std::int64_t bytes_;
};

// Waits for the whole device (tests only), then copies.
inline void CopyToDevice(void* dst, const void* src, std::int64_t bytes) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}
inline void CopyToHost(void* dst, const void* src, std::int64_t bytes) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
}

// n normal(0, stddev) values, each rounded to bf16 (so the CPU sees exactly what the GPU does).
inline std::vector<float> RandomBf16Values(std::int64_t n, float stddev, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (float& x : out) x = RoundToBf16(normal(rng));
  return out;
}
inline std::vector<std::uint16_t> ToBf16Bits(const std::vector<float>& values) {
  std::vector<std::uint16_t> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = RoundToBf16Bits(values[i]);
  return out;
}
inline std::vector<float> FromBf16Bits(const std::vector<std::uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = Bf16BitsToFloat(bits[i]);
  return out;
}
// A bf16 device tensor of n elements, downloaded and widened to fp32.
inline std::vector<float> DownloadBf16(const void* device, std::int64_t n) {
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
  CopyToHost(bits.data(), device, n * 2);
  return FromBf16Bits(bits);
}

// ||got - want|| / ||want|| in double; +infinity when any element of `got` is not finite or
// the sizes differ, so NaN (a poisoned, unwritten element) always fails a `<= tol` check.
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0;
  double norm = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    diff += d * d;
    norm += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

inline bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// One line of the comparison tables the tests print (the device run's log keeps the margins).
inline void Report(const char* test, const std::string& what, double error, double tolerance) {
  std::printf("[%s] %-28s rel err %.3e (tolerance %.1e)%s\n", test, what.c_str(), error,
              tolerance, error <= tolerance ? "" : "  FAIL");
  std::fflush(stdout);
}

}  // namespace pipeoffload::gpt::cuda::model_testing

#endif  // PIPEOFFLOAD_TESTS_GPT_CUDA_GPT_CUDA_TEST_UTIL_H_
