// What only the CPU backend does, beside the contract every backend keeps
// (backend_contract_test.cc): its compute queue is the caller's thread, a queue wait there
// blocks within the backend's bound, its fault-injection options are checked, and it drops
// queued copies when destroyed.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "pipeoffload/backend.h"
#include "tests/backend/backend_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {
namespace {

CpuBackendOptions Delays(double min_seconds, double max_seconds) {
  CpuBackendOptions options;
  options.min_copy_delay_seconds = min_seconds;
  options.max_copy_delay_seconds = max_seconds;
  return options;
}

TEST_CASE("cpu: compute queue work and events complete on the calling thread",
          "[runtime][backend]") {
  auto backend = NewCpuBackend(Delays(0.5, 0.5));  // delays apply to copy engines only
  const Queue compute = backend->queue(QueueKind::kCompute);
  std::vector<std::uint32_t> words(8, 0);
  REQUIRE(backend->FillAsync(compute, words.data(), 0xABCD1234u, 32).ok());
  CHECK(words == std::vector<std::uint32_t>(8, 0xABCD1234u));
  std::vector<std::uint32_t> copy(8, 0);
  REQUIRE(backend->CopyAsync(compute, copy.data(), words.data(), 32).ok());
  CHECK(copy == words);
  const Event event = NewEvent(*backend);
  REQUIRE(backend->RecordEvent(event, compute).ok());
  CHECK(*backend->QueryEvent(event));
  CHECK(backend->EventTime(event).ok());
  CHECK(backend->DeviceMemoryIsHostAccessible());
  CHECK(backend->Name() == "cpu");
}

TEST_CASE("cpu: a compute-queue wait blocks the caller within the queue-wait timeout",
          "[runtime][backend]") {
  std::vector<int> x(4, 1), y(4, 0);  // outlive the backend's queued copy
  CpuBackendOptions options = Delays(1.0, 1.0);
  options.queue_wait_timeout_seconds = 0.1;
  auto backend = NewCpuBackend(options);
  REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kH2D), y.data(), x.data(), 16).ok());
  const Event slow = NewEvent(*backend);
  REQUIRE(backend->RecordEvent(slow, backend->queue(QueueKind::kH2D)).ok());
  const absl::Status waited = backend->QueueWaitEvent(backend->queue(QueueKind::kCompute), slow);
  CHECK(waited.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(y[0] == 0);  // the copy had not run: the wait did not pretend
}

TEST_CASE("cpu: negative or inverted fault-injection delays are refused", "[runtime][backend]") {
  CHECK(CreateCpuBackend(Delays(0.2, 0.1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(CreateCpuBackend(Delays(-1.0, 0.1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("cpu: a backend with queued work is destroyed without hanging", "[runtime][backend]") {
  auto backend = NewCpuBackend(Delays(0.05, 0.05));
  static std::vector<int> src(64, 1), dst(64, 0);  // outlive the queued copies
  for (int i = 0; i < 100; ++i) {
    REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kD2H), dst.data(), src.data(), 256)
                .ok());
  }
  const auto start = std::chrono::steady_clock::now();
  backend.reset();  // drops the queued copies after the one in flight
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
}

}  // namespace
}  // namespace pipeoffload::testing
