// The test helpers' own contract (gpt_cuda_test_util.h): poisoning or zeroing a buffer waits for
// the work already queued on a non-blocking stream (where the CUDA backend's models launch), so
// a test may poison a model's saved region between two of its calls. The version without the
// first wait let the memset of the next microbatch's Poison run under the previous microbatch's
// Backward: the flaky NaN of "GPU training steps track the CPU reference trainer".
//
// The host function that holds the stream only makes the old race certain (the copy queued
// behind it runs long after a memset that does not wait); with the wait the result is the same
// however long the stream is held.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "tests/gpt_cuda/gpt_cuda_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

using model_testing::CopyToDevice;
using model_testing::CopyToHost;
using model_testing::DeviceBytes;

constexpr std::int64_t kBytes = std::int64_t{1} << 20;
constexpr unsigned char kPattern = 0x3C;

void HoldStream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

// Bytes of `buffer` that differ from `value`.
std::int64_t CountOther(const DeviceBytes& buffer, unsigned char value) {
  std::vector<unsigned char> host(static_cast<std::size_t>(buffer.size()));
  CopyToHost(host.data(), buffer.data(), buffer.size());
  std::int64_t other = 0;
  for (unsigned char b : host) other += b != value ? 1 : 0;
  return other;
}

// One way of overwriting a buffer, and the byte it leaves.
struct Fill {
  const char* name;
  void (DeviceBytes::*apply)() const;
  unsigned char value;
};

TEST_CASE("Poison and Zero wait for the copies queued on a non-blocking stream",
          "[gpt_cuda][gpt_cuda_test_util]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  DeviceBytes source(kBytes), copy(kBytes);
  const std::vector<unsigned char> pattern(static_cast<std::size_t>(kBytes), kPattern);
  for (const Fill& fill : {Fill{"Poison", &DeviceBytes::Poison, 0xFF},
                           Fill{"Zero", &DeviceBytes::Zero, 0x00}}) {
    INFO(fill.name);
    CopyToDevice(source.data(), pattern.data(), kBytes);
    copy.Poison();
    REQUIRE(cudaLaunchHostFunc(stream, HoldStream, nullptr) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(copy.data(), source.data(), static_cast<std::size_t>(kBytes),
                            cudaMemcpyDeviceToDevice, stream) == cudaSuccess);
    (source.*fill.apply)();  // must not overwrite the source before the queued copy read it
    CHECK(CountOther(copy, kPattern) == 0);
    CHECK(CountOther(source, fill.value) == 0);
  }
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
