// What only the CUDA backend does, beside the contract every backend keeps (tests/backend/
// backend_contract_test.cc, compiled into gpu_tests with cuda_backend_contract.cc): pageable
// copies, a compute stream that runs ahead of the host, the event clock's anchors, pinned and
// device memory, allocation failures, and its accessors (cuda.h, cuda_stream.h). Run alone
// with `gpu_tests "[cuda]"`.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lib/backend/cuda/cuda_check.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/cuda_stream.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/test_kernels.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {
namespace {

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

cudaStream_t ComputeStream(Backend& backend) {
  absl::StatusOr<cudaStream_t> stream = CudaComputeStream(backend);
  REQUIRE(stream.ok());
  return *stream;
}

TEST_CASE("pageable host buffers copy correctly too", "[gpu][cuda][copy]") {
  auto backend = NewCudaBackend();
  const std::int64_t size = (1 << 20) + 13;
  const std::vector<unsigned char> data = RandomBytes(size, 99);
  std::vector<unsigned char> back(static_cast<std::size_t>(size), 0);
  Block device(*backend, size, /*host=*/false);
  REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kH2D), device.get(), data.data(), size)
              .ok());
  Drain(*backend, QueueKind::kH2D);
  REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kD2H), back.data(), device.get(), size)
              .ok());
  Drain(*backend, QueueKind::kD2H);
  CHECK(FirstMismatch(back, data) == -1);
}

// Compute spins, then fills `buffer` with 0xAAAAAAAA; H2D copies 0x12345678 words over it;
// D2H reads it back. Only a queue wait of H2D on compute makes the copy land last.
std::vector<std::uint32_t> RaceComputeAgainstH2D(bool wait, double* enqueue_seconds,
                                                 bool* pending_after_enqueue) {
  constexpr std::int64_t kWords = 1 << 16;
  constexpr double kSpinSeconds = 0.2;
  auto backend = NewCudaBackend();
  Block buffer(*backend, 4 * kWords, /*host=*/false);
  Block pattern(*backend, 4 * kWords, /*host=*/true);
  Block out(*backend, 4 * kWords, /*host=*/true);
  for (std::int64_t i = 0; i < kWords; ++i) pattern.words()[i] = 0x12345678u;
  const Queue compute = backend->queue(QueueKind::kCompute);
  const Queue h2d = backend->queue(QueueKind::kH2D);
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Event computed = NewEvent(*backend);
  const Event copied = NewEvent(*backend);
  const Event read = NewEvent(*backend);
  // Load both kernels first (lazy module loading would otherwise land in the timed enqueue).
  PO_CUDA_CHECK(LaunchSpin(ComputeStream(*backend), 0.0));
  REQUIRE(backend->FillAsync(compute, buffer.get(), 0u, 4).ok());
  REQUIRE(backend->Synchronize(30.0).ok());
  const double start = backend->NowSeconds();
  PO_CUDA_CHECK(LaunchSpin(ComputeStream(*backend), kSpinSeconds));
  REQUIRE(backend->FillAsync(compute, buffer.get(), 0xAAAAAAAAu, 4 * kWords).ok());
  REQUIRE(backend->RecordEvent(computed, compute).ok());
  if (wait) REQUIRE(backend->QueueWaitEvent(h2d, computed).ok());
  REQUIRE(backend->CopyAsync(h2d, buffer.get(), pattern.get(), 4 * kWords).ok());
  REQUIRE(backend->RecordEvent(copied, h2d).ok());
  *enqueue_seconds = backend->NowSeconds() - start;
  *pending_after_enqueue = !*backend->QueryEvent(copied);
  REQUIRE(backend->WaitEvent(copied, 30.0).ok());
  REQUIRE(backend->WaitEvent(computed, 30.0).ok());
  REQUIRE(backend->QueueWaitEvent(d2h, computed).ok());
  REQUIRE(backend->CopyAsync(d2h, out.get(), buffer.get(), 4 * kWords).ok());
  REQUIRE(backend->RecordEvent(read, d2h).ok());
  REQUIRE(backend->WaitEvent(read, 30.0).ok());
  return std::vector<std::uint32_t>(out.words(), out.words() + kWords);
}

TEST_CASE("a queue wait orders H2D after compute without blocking the caller",
          "[gpu][cuda][events]") {
  double enqueue_seconds = 0.0;
  bool pending = false;
  SECTION("with the wait, the copy lands after the fill") {
    const std::vector<std::uint32_t> words =
        RaceComputeAgainstH2D(true, &enqueue_seconds, &pending);
    CHECK(FirstMismatch(words, std::vector<std::uint32_t>(words.size(), 0x12345678u)) == -1);
    CHECK(pending);                 // the copy waited for the 0.2 s spin
    CHECK(enqueue_seconds < 0.1);   // ... but QueueWaitEvent did not block the host
  }
  SECTION("without it, the fill (behind the spin) lands last: the test can tell") {
    const std::vector<std::uint32_t> words =
        RaceComputeAgainstH2D(false, &enqueue_seconds, &pending);
    CHECK(FirstMismatch(words, std::vector<std::uint32_t>(words.size(), 0xAAAAAAAAu)) == -1);
  }
}

TEST_CASE("EventTime stays on NowSeconds' clock across the event clock's re-anchoring",
          "[gpu][cuda][events][clock]") {
  constexpr int kEvents = 10;
  constexpr double kSpinSeconds = 0.002;
  constexpr double kTolerance = 0.5e-3;  // the clock's error is microseconds
  auto backend = NewCudaBackend();
  const Queue compute = backend->queue(QueueKind::kCompute);
  // Round 0 is timed from the anchor taken at creation. Round 1 comes more than
  // EventClock::kAnchorSpacingSeconds later, so timing it measures a new anchor (after its
  // events, which are still timed from the first one); round 2 comes more than
  // kAnchorMarginSeconds after that anchor and is timed from it.
  const int sleep_ms[] = {0, 1200, 100};
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms[round]));
    std::vector<Event> events;
    for (int i = 0; i < kEvents; ++i) events.push_back(NewEvent(*backend));
    const double before = backend->NowSeconds();
    for (const Event& event : events) {
      PO_CUDA_CHECK(LaunchSpin(ComputeStream(*backend), kSpinSeconds));
      REQUIRE(backend->RecordEvent(event, compute).ok());
    }
    CHECK(backend->EventTime(events.back()).status().code() ==
          absl::StatusCode::kFailedPrecondition);  // still spinning
    REQUIRE(backend->WaitEvent(events.back(), 30.0).ok());
    const double after = backend->NowSeconds();
    const std::vector<double> times = EventTimes(*backend, events);
    CHECK(times.front() >= before - kTolerance);
    CHECK(times.back() <= after + kTolerance);
    for (int i = 1; i < kEvents; ++i) {
      CAPTURE(i, times[i - 1], times[i]);
      CHECK(times[i] - times[i - 1] >= kSpinSeconds - kTolerance);
    }
    for (const Event& event : events) backend->DestroyEvent(event);
  }
}

TEST_CASE("host memory is pinned and device memory is on the backend's device",
          "[gpu][cuda][memory]") {
  auto backend = NewCudaBackend();
  Block host(*backend, 12345, /*host=*/true);
  Block device(*backend, 12345, /*host=*/false);
  cudaPointerAttributes host_attributes{};
  cudaPointerAttributes device_attributes{};
  PO_CUDA_CHECK(cudaPointerGetAttributes(&host_attributes, host.get()));
  PO_CUDA_CHECK(cudaPointerGetAttributes(&device_attributes, device.get()));
  CHECK(host_attributes.type == cudaMemoryTypeHost);
  CHECK(device_attributes.type == cudaMemoryTypeDevice);
  CHECK(device_attributes.device == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(device.get()) % 256 == 0);
  CHECK_FALSE(backend->DeviceMemoryIsHostAccessible());
  CHECK(backend->Name() == "cuda:0");
}

TEST_CASE("an impossible allocation fails with ResourceExhausted and leaves the backend usable",
          "[gpu][cuda][memory]") {
  auto backend = NewCudaBackend();
  const absl::StatusOr<void*> huge = backend->AllocateDevice(std::int64_t{1} << 50);
  INFO(huge.status().ToString());
  CHECK(huge.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(huge.status(), "cudaMalloc"));
  CHECK(Contains(huge.status(), "bytes free"));
  CHECK(backend->AllocateDevice(0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(backend->AllocateHost(-1).status().code() == absl::StatusCode::kInvalidArgument);
  // The failed cudaMalloc must not poison later calls.
  Block device(*backend, 4096, /*host=*/false);
  CHECK(backend->FillAsync(backend->queue(QueueKind::kCompute), device.get(), 1u, 4096).ok());
  CHECK(backend->Synchronize(30.0).ok());
  CHECK(backend->Stats().device_allocations == 1);
}

TEST_CASE("CUDA accessors refuse other backends' queues; bad devices are refused",
          "[gpu][cuda][errors]") {
  auto backend = NewCudaBackend();
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateCpuBackend();
  REQUIRE(cpu.ok());
  CHECK(CudaComputeStream(*backend).ok());
  CHECK(*CudaBackendDevice(*backend) == 0);
  CHECK(CudaComputeStream(**cpu).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CudaQueueStream((*cpu)->queue(QueueKind::kD2H)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  absl::StatusOr<int> count = CudaDeviceCount();
  REQUIRE(count.ok());
  CHECK(*count >= 1);
  CHECK(CreateCudaBackend({-1}).status().code() == absl::StatusCode::kInvalidArgument);
  const absl::Status missing = CreateCudaBackend({*count}).status();
  CHECK(missing.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(missing, "visible"));
}

}  // namespace
}  // namespace pipeoffload::testing
