// The Backend contract for extra queues (Backend::CreateQueue), written once for every backend
// like backend_contract_test.cc (same fixtures, backend_contract.h): copies on extra lanes of
// every kind, ordering across lanes by events, the independence of a lane from the busy built-in
// queue of its kind, never-recorded events, Synchronize covering extra lanes, and the errors
// (a queue of another backend, a lane never created, too many lanes). `<binary> "[lanes]"`.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pipeoffload/backend.h"
#include "tests/backend/backend_contract.h"
#include "tests/backend/backend_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {
namespace {

Queue NewQueue(Backend& backend, QueueKind kind) {
  absl::StatusOr<Queue> queue = backend.CreateQueue(kind);
  INFO(queue.status().ToString());
  REQUIRE(queue.ok());
  return *queue;
}

// Records an event on `queue` and waits for it.
void DrainQueue(Backend& backend, Queue queue) {
  const Event event = NewEvent(backend);
  REQUIRE(backend.RecordEvent(event, queue).ok());
  const absl::Status waited = backend.WaitEvent(event, 60.0);
  INFO(waited.ToString());
  REQUIRE(waited.ok());
  backend.DestroyEvent(event);
}

TEST_CASE("contract: CreateQueue numbers the lanes of each kind from 1", "[contract][lanes]") {
  CAPTURE(TheBackendUnderTest().kind());
  auto backend = Make();
  for (QueueKind kind : {QueueKind::kCompute, QueueKind::kD2H, QueueKind::kH2D}) {
    CAPTURE(std::string(QueueKindName(kind)));
    CHECK(backend->queue(kind).lane() == 0);
    const Queue first = NewQueue(*backend, kind);
    const Queue second = NewQueue(*backend, kind);
    CHECK(first == Queue(backend.get(), kind, 1));
    CHECK(second == Queue(backend.get(), kind, 2));
    CHECK_FALSE(first == backend->queue(kind));
  }
  CHECK(QueueName(Queue(backend.get(), QueueKind::kD2H, 2)) == "D2H lane 2");
  CHECK(QueueName(backend->queue(QueueKind::kH2D)) == "H2D");
}

TEST_CASE("contract: bytes round-trip through extra H2D, compute and D2H lanes ordered by events",
          "[contract][lanes][copy]") {
  // As the built-in round trip (backend_contract_test.cc), on extra lanes only, with random
  // delays where the backend injects them: only the queue waits make it right every time.
  const std::uint64_t seed = GENERATE(21u, 22u, 23u);
  CAPTURE(TheBackendUnderTest().kind(), seed);
  constexpr std::int64_t kSize = 4099;
  ContractSetup setup;
  setup.max_random_delay_seconds = 0.005;
  setup.seed = seed;
  auto backend = Make(setup);
  const RoundTrip trip =
      NewRoundTrip(*backend, NewQueue(*backend, QueueKind::kH2D),
                   NewQueue(*backend, QueueKind::kCompute), NewQueue(*backend, QueueKind::kD2H));
  Block source(*backend, kSize, /*host=*/true);
  Block result(*backend, kSize, /*host=*/true);
  Block device_a(*backend, kSize, /*host=*/false);
  Block device_b(*backend, kSize, /*host=*/false);
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    const std::vector<unsigned char> data = RandomBytes(kSize, seed * 10 + round);
    std::memcpy(source.get(), data.data(), data.size());
    RunRoundTrip(*backend, trip, source.get(), device_a.get(), device_b.get(), result.get(),
                 kSize);
    CHECK(std::memcmp(result.get(), data.data(), data.size()) == 0);
  }
  const BackendStats stats = backend->Stats();
  CHECK(stats.bytes_h2d == 5 * kSize);  // extra lanes count with their direction
  CHECK(stats.bytes_d2h == 5 * kSize);
  CHECK(stats.copies == 15);
}

TEST_CASE("contract: an extra lane waits on an event of a built-in lane of its own kind",
          "[contract][lanes][ordering]") {
  // Built-in H2D: busy, then a fill of 0xAAAAAAAA words. Extra H2D lane: waits for the fill, then
  // copies 0x12345678 words over it: they must land last.
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 0.2;
  constexpr std::int64_t kWords = 1 << 12;
  auto backend = Make([&] {
    ContractSetup setup;
    setup.busy_seconds = kBusy;
    return setup;
  }());
  const Queue lane = NewQueue(*backend, QueueKind::kH2D);
  Block buffer(*backend, 4 * kWords, /*host=*/false);
  Block pattern(*backend, 4 * kWords, /*host=*/true);
  Block result(*backend, 4 * kWords, /*host=*/true);
  const std::vector<std::uint32_t> expected(kWords, 0x12345678u);
  std::memcpy(pattern.get(), expected.data(), 4 * kWords);
  const Event filled = NewEvent(*backend);
  const Event copied = NewEvent(*backend);
  TheBackendUnderTest().Occupy(*backend, QueueKind::kH2D, kBusy);
  REQUIRE(backend->FillAsync(backend->queue(QueueKind::kH2D), buffer.get(), 0xAAAAAAAAu,
                             4 * kWords)
              .ok());
  REQUIRE(backend->RecordEvent(filled, backend->queue(QueueKind::kH2D)).ok());
  REQUIRE(backend->QueueWaitEvent(lane, filled).ok());
  REQUIRE(backend->CopyAsync(lane, buffer.get(), pattern.get(), 4 * kWords).ok());
  REQUIRE(backend->RecordEvent(copied, lane).ok());
  REQUIRE(backend->WaitEvent(copied, 30.0).ok());
  CHECK(*backend->QueryEvent(filled));  // the copy's completion implies the fill's
  REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kD2H), result.get(), buffer.get(),
                             4 * kWords)
              .ok());
  Drain(*backend, QueueKind::kD2H);
  std::vector<std::uint32_t> got(kWords);
  std::memcpy(got.data(), result.get(), 4 * kWords);
  CHECK(FirstMismatch(got, expected) == -1);
}

TEST_CASE("contract: an extra lane does not queue behind the busy built-in queue of its kind",
          "[contract][lanes][ordering]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 1.0;
  ContractSetup setup;
  setup.busy_seconds = kBusy;
  auto backend = Make(setup);
  for (QueueKind kind : {QueueKind::kD2H, QueueKind::kH2D}) {
    CAPTURE(std::string(QueueKindName(kind)));
    const Queue lane = NewQueue(*backend, kind);
    const Event behind_busy = NewEvent(*backend);
    const Event on_lane = NewEvent(*backend);
    TheBackendUnderTest().Occupy(*backend, kind, kBusy);
    REQUIRE(backend->RecordEvent(behind_busy, backend->queue(kind)).ok());
    REQUIRE(backend->RecordEvent(on_lane, lane).ok());
    REQUIRE(backend->WaitEvent(on_lane, 30.0).ok());
    CHECK_FALSE(*backend->QueryEvent(behind_busy));  // still a second of work ahead of it
    REQUIRE(backend->WaitEvent(behind_busy, 30.0).ok());
  }
}

TEST_CASE("contract: an event never recorded holds no extra lane", "[contract][lanes][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  auto backend = Make();
  const Event fresh = NewEvent(*backend);
  for (QueueKind kind : {QueueKind::kCompute, QueueKind::kD2H, QueueKind::kH2D}) {
    CAPTURE(std::string(QueueKindName(kind)));
    const Queue lane = NewQueue(*backend, kind);
    CHECK(backend->QueueWaitEvent(lane, fresh).ok());
    // The lane still runs what comes after the wait.
    Block device(*backend, 64, /*host=*/false);
    REQUIRE(backend->FillAsync(lane, device.get(), 0x01020304u, 64).ok());
    DrainQueue(*backend, lane);
    std::vector<std::uint32_t> got(16);
    Block host(*backend, 64, /*host=*/true);
    REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kD2H), host.get(), device.get(), 64).ok());
    Drain(*backend, QueueKind::kD2H);
    std::memcpy(got.data(), host.get(), 64);
    CHECK(FirstMismatch(got, std::vector<std::uint32_t>(16, 0x01020304u)) == -1);
  }
  CHECK(*backend->QueryEvent(fresh));
}

TEST_CASE("contract: Synchronize and host waits cover extra lanes, naming them",
          "[contract][lanes][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 1.0;
  ContractSetup setup;
  setup.busy_seconds = kBusy;
  auto backend = Make(setup);
  const Queue lane = NewQueue(*backend, QueueKind::kD2H);
  const Event event = NewEvent(*backend);
  TheBackendUnderTest().Occupy(*backend, lane, kBusy);
  REQUIRE(backend->RecordEvent(event, lane).ok());
  const absl::Status timed_out = backend->WaitEvent(event, 0.05);
  INFO(timed_out.ToString());
  CHECK(timed_out.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Contains(timed_out, "recorded on the D2H lane 1 queue"));
  const absl::Status busy = backend->Synchronize(0.05);
  INFO(busy.ToString());
  CHECK(busy.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Contains(busy, "D2H lane 1"));
  REQUIRE(backend->Synchronize(30.0).ok());
  CHECK(*backend->QueryEvent(event));  // Synchronize returned only after the lane drained
}

TEST_CASE("contract: queues of another backend, lanes never created and too many lanes are refused",
          "[contract][lanes][errors]") {
  CAPTURE(TheBackendUnderTest().kind());
  auto backend = Make();
  auto other = Make();
  Block device(*backend, 64, /*host=*/false);
  Block host(*backend, 64, /*host=*/true);
  const Queue foreign = NewQueue(*other, QueueKind::kD2H);
  const Event event = NewEvent(*backend);
  constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  CHECK(backend->CopyAsync(foreign, host.get(), device.get(), 64).code() == kInvalid);
  CHECK(backend->RecordEvent(event, foreign).code() == kInvalid);
  CHECK(backend->QueueWaitEvent(foreign, event).code() == kInvalid);
  // Lane 1 of D2H exists on `other`, not on `backend`; negative lanes never exist.
  for (const Queue& missing : {Queue(backend.get(), QueueKind::kD2H, 1),
                               Queue(backend.get(), QueueKind::kCompute, 1),
                               Queue(backend.get(), QueueKind::kH2D, -1)}) {
    CAPTURE(QueueName(missing));
    const absl::Status copied = backend->CopyAsync(missing, host.get(), device.get(), 64);
    INFO(copied.ToString());
    CHECK(copied.code() == kInvalid);
    CHECK(Contains(copied, QueueName(missing)));
    CHECK(backend->FillAsync(missing, device.get(), 0u, 64).code() == kInvalid);
    CHECK(backend->RecordEvent(event, missing).code() == kInvalid);
    CHECK(backend->QueueWaitEvent(missing, event).code() == kInvalid);
  }
  for (int lane = 1; lane < kMaxQueuesPerKind; ++lane) NewQueue(*backend, QueueKind::kH2D);
  const absl::StatusOr<Queue> one_too_many = backend->CreateQueue(QueueKind::kH2D);
  INFO(one_too_many.status().ToString());
  CHECK(one_too_many.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(one_too_many.status(), "kMaxQueuesPerKind"));
  // The lanes made before still work, and nothing above left work behind.
  const Queue last(backend.get(), QueueKind::kH2D, kMaxQueuesPerKind - 1);
  REQUIRE(backend->CopyAsync(last, device.get(), host.get(), 64).ok());
  CHECK(backend->Synchronize(30.0).ok());
  CHECK(backend->Stats().copies == 1);
}

}  // namespace
}  // namespace pipeoffload::testing
