// CPU backend: asynchronous copies on in-order queues, events (record, queue wait, host wait,
// query, time), fault-injection delays, timeouts and argument errors.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pipeoffload/backend.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

std::unique_ptr<Backend> Cpu(const CpuBackendOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(options);
  REQUIRE(backend.ok());
  return std::move(*backend);
}

Event NewEvent(Backend& backend) {
  absl::StatusOr<Event> event = backend.CreateEvent();
  REQUIRE(event.ok());
  return *event;
}

CpuBackendOptions Delays(double min_seconds, double max_seconds, std::uint64_t seed = 7) {
  CpuBackendOptions options;
  options.min_copy_delay_seconds = min_seconds;
  options.max_copy_delay_seconds = max_seconds;
  options.fault_seed = seed;
  return options;
}

TEST_CASE("copy queues run asynchronously and events mark completion", "[runtime][backend]") {
  // 300 ms before each copy: long enough that checking right after enqueueing sees it pending.
  std::vector<int> src(1000, 5), dst(1000, 0);
  auto backend = Cpu(Delays(0.3, 0.3));
  const Queue d2h = backend->queue(QueueKind::kD2H);
  Event done = NewEvent(*backend);
  const double before = backend->NowSeconds();
  REQUIRE(backend->CopyAsync(d2h, dst.data(), src.data(), 4000).ok());
  REQUIRE(backend->RecordEvent(done, d2h).ok());
  CHECK_FALSE(*backend->QueryEvent(done));
  CHECK(dst[0] == 0);  // a reader that forgot to wait sees stale data
  CHECK(backend->EventTime(done).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(backend->WaitEvent(done, 10.0).ok());
  CHECK(*backend->QueryEvent(done));
  CHECK(dst == src);
  absl::StatusOr<double> time = backend->EventTime(done);
  REQUIRE(time.ok());
  CHECK(*time >= before + 0.3);
  CHECK(backend->Stats().bytes_d2h == 4000);
}

TEST_CASE("a queue runs its work in order", "[runtime][backend]") {
  std::vector<std::vector<int>> sources;
  for (int i = 0; i < 20; ++i) sources.emplace_back(256, i);
  std::vector<int> dst(256, -1);
  auto backend = Cpu(Delays(0.0, 0.005, GENERATE(1u, 2u, 3u)));
  const Queue h2d = backend->queue(QueueKind::kH2D);
  for (const auto& source : sources) {
    REQUIRE(backend->CopyAsync(h2d, dst.data(), source.data(), 1024).ok());
  }
  Event done = NewEvent(*backend);
  REQUIRE(backend->RecordEvent(done, h2d).ok());
  REQUIRE(backend->WaitEvent(done, 10.0).ok());
  CHECK(dst == sources.back());  // the last copy ran last
}

TEST_CASE("a queue wait orders work across queues under random delays", "[runtime][backend]") {
  // D2H copies device -> host, H2D copies host -> device2 after waiting for the D2H event. With
  // random delays on both engines only the wait makes the result right every time.
  auto backend = Cpu(Delays(0.0, 0.01, GENERATE(11u, 12u, 13u, 14u)));
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Queue h2d = backend->queue(QueueKind::kH2D);
  Event offloaded = NewEvent(*backend);
  Event reloaded = NewEvent(*backend);
  for (int round = 0; round < 10; ++round) {
    std::vector<int> device(512, round + 1), host(512, 0), device2(512, 0);
    REQUIRE(backend->CopyAsync(d2h, host.data(), device.data(), 2048).ok());
    REQUIRE(backend->RecordEvent(offloaded, d2h).ok());
    REQUIRE(backend->QueueWaitEvent(h2d, offloaded).ok());
    REQUIRE(backend->CopyAsync(h2d, device2.data(), host.data(), 2048).ok());
    REQUIRE(backend->RecordEvent(reloaded, h2d).ok());
    REQUIRE(backend->WaitEvent(reloaded, 10.0).ok());
    CHECK(device2 == device);
  }
}

TEST_CASE("a queue wait captures the recording made before it", "[runtime][backend]") {
  std::vector<int> a(16, 1), b(16, 0), c(16, 0);
  auto backend = Cpu(Delays(0.2, 0.2));
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Queue h2d = backend->queue(QueueKind::kH2D);
  Event gate = NewEvent(*backend);
  // Never recorded: waiting on it is free (CUDA semantics).
  CHECK(*backend->QueryEvent(gate));
  REQUIRE(backend->QueueWaitEvent(h2d, gate).ok());
  REQUIRE(backend->CopyAsync(d2h, b.data(), a.data(), 64).ok());
  REQUIRE(backend->RecordEvent(gate, d2h).ok());
  REQUIRE(backend->QueueWaitEvent(h2d, gate).ok());
  REQUIRE(backend->CopyAsync(h2d, c.data(), b.data(), 64).ok());
  REQUIRE(backend->Synchronize(10.0).ok());
  CHECK(c == a);
}

TEST_CASE("compute queue work and events complete on the calling thread",
          "[runtime][backend]") {
  auto backend = Cpu(Delays(0.5, 0.5));  // delays apply to copy engines only
  const Queue compute = backend->queue(QueueKind::kCompute);
  std::vector<std::uint32_t> words(8, 0);
  REQUIRE(backend->FillAsync(compute, words.data(), 0xABCD1234u, 32).ok());
  CHECK(words == std::vector<std::uint32_t>(8, 0xABCD1234u));
  std::vector<std::uint32_t> copy(8, 0);
  REQUIRE(backend->CopyAsync(compute, copy.data(), words.data(), 32).ok());
  CHECK(copy == words);
  Event event = NewEvent(*backend);
  REQUIRE(backend->RecordEvent(event, compute).ok());
  CHECK(*backend->QueryEvent(event));
  CHECK(backend->EventTime(event).ok());
}

TEST_CASE("waits time out with the event and queue named", "[runtime][backend]") {
  // Buffers first: they must outlive the backends whose queued copies name them.
  std::vector<int> src(4, 1), dst(4, 0), x(4, 1), y(4, 0);
  auto backend = Cpu(Delays(1.0, 1.0));
  const Queue d2h = backend->queue(QueueKind::kD2H);
  REQUIRE(backend->CopyAsync(d2h, dst.data(), src.data(), 16).ok());
  Event done = NewEvent(*backend);
  REQUIRE(backend->RecordEvent(done, d2h).ok());
  const double start = backend->NowSeconds();
  const absl::Status status = backend->WaitEvent(done, 0.1);
  CHECK(backend->NowSeconds() - start < 1.0);
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(status.message()).find("recorded on the D2H queue") != std::string::npos);
  // The compute queue blocks the caller, within the backend's queue-wait timeout.
  CpuBackendOptions short_wait = Delays(1.0, 1.0);
  short_wait.queue_wait_timeout_seconds = 0.1;
  auto impatient = Cpu(short_wait);
  REQUIRE(impatient->CopyAsync(impatient->queue(QueueKind::kH2D), y.data(), x.data(), 16).ok());
  Event slow = NewEvent(*impatient);
  REQUIRE(impatient->RecordEvent(slow, impatient->queue(QueueKind::kH2D)).ok());
  CHECK(impatient->QueueWaitEvent(impatient->queue(QueueKind::kCompute), slow).code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(backend->Synchronize(0.05).code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("backend rejects foreign and destroyed events and bad arguments",
          "[runtime][backend]") {
  auto backend = Cpu();
  auto other = Cpu();
  Event foreign = NewEvent(*other);
  CHECK(backend->QueryEvent(foreign).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(backend->RecordEvent(foreign, backend->queue(QueueKind::kD2H)).code() ==
        absl::StatusCode::kInvalidArgument);
  Event mine = NewEvent(*backend);
  CHECK(backend->RecordEvent(mine, other->queue(QueueKind::kD2H)).code() ==
        absl::StatusCode::kInvalidArgument);
  backend->DestroyEvent(mine);
  CHECK(backend->WaitEvent(mine, 1.0).code() == absl::StatusCode::kInvalidArgument);
  int x = 0;
  CHECK(backend->CopyAsync(backend->queue(QueueKind::kD2H), &x, &x, -1).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(backend->CopyAsync(backend->queue(QueueKind::kD2H), nullptr, &x, 4).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(backend->FillAsync(backend->queue(QueueKind::kCompute), &x, 0, 3).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(backend->AllocateDevice(0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CreateCpuBackend(Delays(0.2, 0.1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(CreateCpuBackend(Delays(-1.0, 0.1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("events are recycled without confusing old and new recordings",
          "[runtime][backend]") {
  std::vector<int> src(64, 3), dst(64, 0);
  auto backend = Cpu(Delays(0.0, 0.002, 5));
  const Queue d2h = backend->queue(QueueKind::kD2H);
  for (int i = 0; i < 200; ++i) {
    Event event = NewEvent(*backend);
    REQUIRE(backend->CopyAsync(d2h, dst.data(), src.data(), 256).ok());
    REQUIRE(backend->RecordEvent(event, d2h).ok());
    if (i % 2 == 0) REQUIRE(backend->WaitEvent(event, 10.0).ok());
    backend->DestroyEvent(event);  // odd ones are destroyed while pending
  }
  REQUIRE(backend->Synchronize(10.0).ok());
  CHECK(backend->Stats().copies == 200);
}

TEST_CASE("a backend with queued work is destroyed without hanging", "[runtime][backend]") {
  auto backend = Cpu(Delays(0.05, 0.05));
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
}  // namespace pipeoffload
