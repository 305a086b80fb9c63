// The Backend contract (pipeoffload/backend.h), written once for every backend; each test binary
// links the fixture of its backend (backend_contract.h). Copies in every direction, fills,
// in-order queues, queue waits across queues, the never-recorded-event rule, host waits and
// their timeouts, the event clock, event recycling, and the errors for bad arguments; under
// injected copy delays where the backend has them. Run alone with `<binary> "[contract]"`.
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

ContractSetup Busy(double seconds) {
  ContractSetup setup;
  setup.busy_seconds = seconds;
  return setup;
}

ContractSetup RandomDelays(double max_seconds, std::uint64_t seed) {
  ContractSetup setup;
  setup.max_random_delay_seconds = max_seconds;
  setup.seed = seed;
  return setup;
}

// A new event recorded on `queue` behind Occupy's `seconds` of work there: pending that long.
Event OccupiedEvent(Backend& backend, QueueKind queue, double seconds) {
  const Event event = NewEvent(backend);
  TheBackendUnderTest().Occupy(backend, queue, seconds);
  REQUIRE(backend.RecordEvent(event, backend.queue(queue)).ok());
  return event;
}

// Copies `bytes` into device memory at `device` (H2D, waited for).
void Upload(Backend& backend, void* device, const std::vector<unsigned char>& bytes) {
  Block staging(backend, static_cast<std::int64_t>(bytes.size()), /*host=*/true);
  std::memcpy(staging.get(), bytes.data(), bytes.size());
  REQUIRE(backend.CopyAsync(backend.queue(QueueKind::kH2D), device, staging.get(),
                            static_cast<std::int64_t>(bytes.size()))
              .ok());
  Drain(backend, QueueKind::kH2D);
}

// The `size` bytes of device memory at `device` (D2H, waited for).
std::vector<unsigned char> Download(Backend& backend, const void* device, std::int64_t size) {
  Block staging(backend, size, /*host=*/true);
  REQUIRE(backend.CopyAsync(backend.queue(QueueKind::kD2H), staging.get(), device, size).ok());
  Drain(backend, QueueKind::kD2H);
  return std::vector<unsigned char>(staging.bytes(), staging.bytes() + size);
}

std::vector<unsigned char> Words(std::int64_t count, std::uint32_t word) {
  std::vector<unsigned char> bytes(static_cast<std::size_t>(4 * count));
  for (std::int64_t i = 0; i < count; ++i) std::memcpy(&bytes[4 * i], &word, 4);
  return bytes;
}

TEST_CASE("contract: copies round-trip bytes exactly through H2D, compute and D2H",
          "[contract][copy]") {
  const std::int64_t size = GENERATE(std::int64_t{1}, std::int64_t{3}, std::int64_t{4},
                                     std::int64_t{255}, std::int64_t{4097},
                                     std::int64_t{(1 << 20) + 7});
  const bool delayed = GENERATE(false, true);  // injected copy delays, where the backend has them
  CAPTURE(TheBackendUnderTest().kind(), size, delayed);
  constexpr std::int64_t kGuard = 64;  // bytes past the copy that must stay untouched
  auto backend =
      Make(delayed ? RandomDelays(0.002, static_cast<std::uint64_t>(size)) : ContractSetup{});
  const std::vector<unsigned char> data = RandomBytes(size, static_cast<std::uint64_t>(size));
  Block source(*backend, size, /*host=*/true);
  Block result(*backend, size + kGuard, /*host=*/true);
  Block device_a(*backend, size, /*host=*/false);
  Block device_b(*backend, size, /*host=*/false);
  std::memcpy(source.get(), data.data(), data.size());
  std::memset(result.get(), 0xCD, static_cast<std::size_t>(size + kGuard));

  const RoundTrip trip =
      NewRoundTrip(*backend, backend->queue(QueueKind::kH2D),
                   backend->queue(QueueKind::kCompute), backend->queue(QueueKind::kD2H));
  RunRoundTrip(*backend, trip, source.get(), device_a.get(), device_b.get(), result.get(), size);

  CHECK(std::memcmp(result.get(), data.data(), data.size()) == 0);
  int guard_intact = 0;
  for (std::int64_t i = size; i < size + kGuard; ++i) guard_intact += result.bytes()[i] == 0xCD;
  CHECK(guard_intact == kGuard);
  const BackendStats stats = backend->Stats();
  CHECK(stats.bytes_h2d == size);
  CHECK(stats.bytes_d2h == size);
  CHECK(stats.copies == 3);
  CHECK(stats.device_allocations == 2);
  CHECK(stats.host_allocations == 2);
}

TEST_CASE("contract: a copy behind a busy queue is pending; its event completes with a time",
          "[contract][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 0.3;
  constexpr std::int64_t kSize = 4000;
  auto backend = Make(Busy(kBusy));
  const std::vector<unsigned char> data = RandomBytes(kSize, 5);
  Block device(*backend, kSize, /*host=*/false);
  Block host(*backend, kSize, /*host=*/true);
  Upload(*backend, device.get(), data);
  std::memset(host.get(), 0, kSize);
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Event done = NewEvent(*backend);
  const double before = backend->NowSeconds();
  TheBackendUnderTest().Occupy(*backend, QueueKind::kD2H, kBusy);
  REQUIRE(backend->CopyAsync(d2h, host.get(), device.get(), kSize).ok());
  REQUIRE(backend->RecordEvent(done, d2h).ok());
  CHECK_FALSE(*backend->QueryEvent(done));
  CHECK(host.bytes()[0] == 0);  // a reader that forgot to wait sees stale data
  CHECK(backend->EventTime(done).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(backend->WaitEvent(done, 30.0).ok());
  CHECK(*backend->QueryEvent(done));
  CHECK(std::memcmp(host.get(), data.data(), kSize) == 0);
  const absl::StatusOr<double> time = backend->EventTime(done);
  REQUIRE(time.ok());
  CHECK(*time >= before + kBusy - 1e-3);  // on NowSeconds' clock, after the busy work
  CHECK(*time <= backend->NowSeconds() + 1e-3);
}

TEST_CASE("contract: a queue runs its work in enqueue order", "[contract][ordering]") {
  const std::uint64_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(TheBackendUnderTest().kind(), seed);
  constexpr int kCopies = 20;
  constexpr std::int64_t kWords = 256;
  auto backend = Make(RandomDelays(0.005, seed));
  std::vector<std::unique_ptr<Block>> sources;
  for (int i = 0; i < kCopies; ++i) {
    sources.push_back(std::make_unique<Block>(*backend, 4 * kWords, /*host=*/true));
    const std::vector<unsigned char> words = Words(kWords, static_cast<std::uint32_t>(i));
    std::memcpy(sources.back()->get(), words.data(), words.size());
  }
  Block device(*backend, 4 * kWords, /*host=*/false);
  for (const auto& source : sources) {
    REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kH2D), device.get(), source->get(),
                               4 * kWords)
                .ok());
  }
  Drain(*backend, QueueKind::kH2D);
  CHECK(FirstMismatch(Download(*backend, device.get(), 4 * kWords),
                      Words(kWords, kCopies - 1)) == -1);  // the last copy ran last
}

TEST_CASE("contract: a queue wait orders work across queues", "[contract][ordering]") {
  // Device -> host on D2H, then host -> device2 on H2D after a wait for the D2H event. With
  // random delays on both engines (where injected) only the wait makes it right every time.
  const std::uint64_t seed = GENERATE(11u, 12u, 13u, 14u);
  CAPTURE(TheBackendUnderTest().kind(), seed);
  constexpr std::int64_t kSize = 2048;
  auto backend = Make(RandomDelays(0.01, seed));
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Queue h2d = backend->queue(QueueKind::kH2D);
  const Event offloaded = NewEvent(*backend);
  const Event reloaded = NewEvent(*backend);
  Block device(*backend, kSize, /*host=*/false);
  Block host(*backend, kSize, /*host=*/true);
  Block device2(*backend, kSize, /*host=*/false);
  for (int round = 0; round < 10; ++round) {
    CAPTURE(round);
    const std::vector<unsigned char> data = RandomBytes(kSize, seed * 100 + round);
    Upload(*backend, device.get(), data);
    REQUIRE(backend->CopyAsync(d2h, host.get(), device.get(), kSize).ok());
    REQUIRE(backend->RecordEvent(offloaded, d2h).ok());
    REQUIRE(backend->QueueWaitEvent(h2d, offloaded).ok());
    REQUIRE(backend->CopyAsync(h2d, device2.get(), host.get(), kSize).ok());
    REQUIRE(backend->RecordEvent(reloaded, h2d).ok());
    REQUIRE(backend->WaitEvent(reloaded, 30.0).ok());
    CHECK(FirstMismatch(Download(*backend, device2.get(), kSize), data) == -1);
  }
}

TEST_CASE("contract: a queue wait behind a busy queue holds the waiting queue, not the caller",
          "[contract][ordering]") {
  // D2H: busy, then a fill of 0xAAAAAAAA. H2D: waits for that fill, then copies 0x12345678
  // words over it. The copy must land last and still be pending when the enqueueing returns.
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 0.2;
  constexpr std::int64_t kWords = 1 << 14;
  auto backend = Make(Busy(kBusy));
  Block buffer(*backend, 4 * kWords, /*host=*/false);
  Block pattern(*backend, 4 * kWords, /*host=*/true);
  const std::vector<unsigned char> expected = Words(kWords, 0x12345678u);
  std::memcpy(pattern.get(), expected.data(), expected.size());
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Queue h2d = backend->queue(QueueKind::kH2D);
  const Event filled = NewEvent(*backend);
  const Event copied = NewEvent(*backend);
  TheBackendUnderTest().Occupy(*backend, QueueKind::kD2H, kBusy);
  REQUIRE(backend->FillAsync(d2h, buffer.get(), 0xAAAAAAAAu, 4 * kWords).ok());
  REQUIRE(backend->RecordEvent(filled, d2h).ok());
  REQUIRE(backend->QueueWaitEvent(h2d, filled).ok());
  REQUIRE(backend->CopyAsync(h2d, buffer.get(), pattern.get(), 4 * kWords).ok());
  REQUIRE(backend->RecordEvent(copied, h2d).ok());
  CHECK_FALSE(*backend->QueryEvent(copied));
  REQUIRE(backend->WaitEvent(copied, 30.0).ok());
  CHECK(*backend->QueryEvent(filled));  // the copy's completion implies the fill's
  CHECK(FirstMismatch(Download(*backend, buffer.get(), 4 * kWords), expected) == -1);
}

TEST_CASE("contract: a queue wait captures the recording made before it", "[contract][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 0.2;
  constexpr std::int64_t kSize = 64;
  auto backend = Make(Busy(kBusy));
  const std::vector<unsigned char> data = RandomBytes(kSize, 3);
  Block a(*backend, kSize, /*host=*/false);
  Block b(*backend, kSize, /*host=*/true);
  Block c(*backend, kSize, /*host=*/false);
  Upload(*backend, a.get(), data);
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Queue h2d = backend->queue(QueueKind::kH2D);
  const Event gate = NewEvent(*backend);
  REQUIRE(backend->QueueWaitEvent(h2d, gate).ok());  // never recorded: free
  TheBackendUnderTest().Occupy(*backend, QueueKind::kD2H, kBusy);
  REQUIRE(backend->CopyAsync(d2h, b.get(), a.get(), kSize).ok());
  REQUIRE(backend->RecordEvent(gate, d2h).ok());
  REQUIRE(backend->QueueWaitEvent(h2d, gate).ok());
  REQUIRE(backend->CopyAsync(h2d, c.get(), b.get(), kSize).ok());
  REQUIRE(backend->Synchronize(30.0).ok());
  CHECK(FirstMismatch(Download(*backend, c.get(), kSize), data) == -1);
}

TEST_CASE("contract: an event never recorded counts as complete and has no time",
          "[contract][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 0.2;
  auto backend = Make(Busy(kBusy));
  const Event fresh = NewEvent(*backend);
  CHECK(*backend->QueryEvent(fresh));
  CHECK(backend->WaitEvent(fresh, 0.0).ok());
  CHECK(backend->QueueWaitEvent(backend->queue(QueueKind::kD2H), fresh).ok());
  CHECK(backend->QueueWaitEvent(backend->queue(QueueKind::kCompute), fresh).ok());
  CHECK(backend->EventTime(fresh).status().code() == absl::StatusCode::kFailedPrecondition);
}

// A recycled id must not carry its previous owner's recording (the CPU backend once returned
// the old capture's time from EventTime).
TEST_CASE("contract: an event recycled from a pending one reads as never recorded",
          "[contract][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 0.2;
  auto backend = Make(Busy(kBusy));
  // Whatever the backend recycles for the next event, it must not carry the old capture.
  const Event first = OccupiedEvent(*backend, QueueKind::kD2H, kBusy);
  CHECK_FALSE(*backend->QueryEvent(first));
  backend->DestroyEvent(first);
  const Event next = NewEvent(*backend);
  CHECK(*backend->QueryEvent(next));
  CHECK(backend->WaitEvent(next, 0.0).ok());
  CHECK(backend->EventTime(next).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(backend->Synchronize(30.0).ok());
}

TEST_CASE("contract: fills write the 32-bit pattern on every queue and nothing past it",
          "[contract][fill]") {
  const std::int64_t words = GENERATE(std::int64_t{1}, std::int64_t{7}, std::int64_t{256},
                                      std::int64_t{100003});
  const QueueKind kind = GENERATE(QueueKind::kCompute, QueueKind::kD2H, QueueKind::kH2D);
  CAPTURE(TheBackendUnderTest().kind(), words, std::string(QueueKindName(kind)));
  constexpr std::int64_t kGuardWords = 16;
  constexpr std::uint32_t kPattern = 0x7FF7FFFFu;
  auto backend = Make();
  const std::int64_t bytes = 4 * (words + kGuardWords);
  Block device(*backend, bytes, /*host=*/false);
  const Queue queue = backend->queue(kind);
  REQUIRE(backend->FillAsync(queue, device.get(), 0u, bytes).ok());
  REQUIRE(backend->FillAsync(queue, device.get(), kPattern, 4 * words).ok());
  Drain(*backend, kind);
  std::vector<unsigned char> expected = Words(words, kPattern);
  const std::vector<unsigned char> zeros = Words(kGuardWords, 0u);
  expected.insert(expected.end(), zeros.begin(), zeros.end());
  CHECK(FirstMismatch(Download(*backend, device.get(), bytes), expected) == -1);

  SECTION("sizes and addresses that are not whole words are refused") {
    CHECK(backend->FillAsync(queue, device.get(), kPattern, 6).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(backend->FillAsync(queue, device.bytes() + 2, kPattern, 4).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(backend->FillAsync(queue, device.get(), kPattern, -4).code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("contract: host waits and Synchronize time out on a busy queue, naming it",
          "[contract][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr double kBusy = 1.0;
  auto backend = Make(Busy(kBusy));
  const Event event = OccupiedEvent(*backend, QueueKind::kD2H, kBusy);
  const absl::Status timed_out = backend->WaitEvent(event, 0.05);
  INFO(timed_out.ToString());
  CHECK(timed_out.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Contains(timed_out, "recorded on the D2H queue"));
  CHECK(Contains(timed_out, backend->Name()));
  const absl::Status busy = backend->Synchronize(0.05);
  INFO(busy.ToString());
  CHECK(busy.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Contains(busy, "not idle"));
  CHECK(Contains(busy, "D2H"));
  CHECK(backend->WaitEvent(event, 30.0).ok());
  CHECK(*backend->QueryEvent(event));
  CHECK(backend->Synchronize(30.0).ok());
}

TEST_CASE("contract: event times are on NowSeconds' clock and increase along a queue",
          "[contract][events][clock]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr int kEvents = 5;
  constexpr double kBusy = 0.02;
  constexpr double kTolerance = 1e-3;
  auto backend = Make(Busy(kBusy));
  std::vector<Event> events;
  for (int i = 0; i < kEvents; ++i) events.push_back(NewEvent(*backend));
  const double before = backend->NowSeconds();
  for (const Event& event : events) {
    TheBackendUnderTest().Occupy(*backend, QueueKind::kH2D, kBusy);
    REQUIRE(backend->RecordEvent(event, backend->queue(QueueKind::kH2D)).ok());
  }
  REQUIRE(backend->WaitEvent(events.back(), 30.0).ok());
  const double after = backend->NowSeconds();
  const std::vector<double> times = EventTimes(*backend, events);
  CHECK(times.front() >= before + kBusy - kTolerance);
  CHECK(times.back() <= after + kTolerance);
  for (int i = 1; i < kEvents; ++i) {
    CAPTURE(i, times[i - 1], times[i]);
    CHECK(times[i] - times[i - 1] >= kBusy - kTolerance);
  }
}

TEST_CASE("contract: events are recycled without confusing old and new recordings",
          "[contract][events]") {
  CAPTURE(TheBackendUnderTest().kind());
  constexpr int kRounds = 200;
  auto backend = Make(RandomDelays(0.002, 5));
  Block device(*backend, 256, /*host=*/false);
  Block host(*backend, 256, /*host=*/true);
  const Queue d2h = backend->queue(QueueKind::kD2H);
  for (int i = 0; i < kRounds; ++i) {
    const Event event = NewEvent(*backend);
    REQUIRE(backend->CopyAsync(d2h, host.get(), device.get(), 256).ok());
    REQUIRE(backend->RecordEvent(event, d2h).ok());
    if (i % 2 == 0) REQUIRE(backend->WaitEvent(event, 30.0).ok());
    backend->DestroyEvent(event);  // odd ones are destroyed while pending
  }
  REQUIRE(backend->Synchronize(30.0).ok());
  CHECK(backend->Stats().copies == kRounds);
  CHECK(backend->Stats().bytes_d2h == 256 * kRounds);
}

TEST_CASE("contract: foreign queues and events, destroyed events and bad sizes are refused",
          "[contract][errors]") {
  CAPTURE(TheBackendUnderTest().kind());
  auto backend = Make();
  auto other = Make();
  Block device(*backend, 64, /*host=*/false);
  Block host(*backend, 64, /*host=*/true);
  const Queue d2h = backend->queue(QueueKind::kD2H);
  const Queue foreign = other->queue(QueueKind::kD2H);
  const Event mine = NewEvent(*backend);
  const Event theirs = NewEvent(*other);
  const auto code = [](const absl::Status& status) { return status.code(); };
  constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

  CHECK(code(backend->CopyAsync(foreign, host.get(), device.get(), 64)) == kInvalid);
  CHECK(code(backend->FillAsync(foreign, device.get(), 0u, 64)) == kInvalid);
  CHECK(code(backend->RecordEvent(mine, foreign)) == kInvalid);
  CHECK(code(backend->QueueWaitEvent(foreign, mine)) == kInvalid);
  CHECK(code(backend->RecordEvent(theirs, d2h)) == kInvalid);
  CHECK(code(backend->QueueWaitEvent(d2h, theirs)) == kInvalid);
  CHECK(code(backend->QueryEvent(theirs).status()) == kInvalid);
  CHECK(code(backend->WaitEvent(theirs, 1.0)) == kInvalid);
  CHECK(code(backend->EventTime(theirs).status()) == kInvalid);

  const Event destroyed = NewEvent(*backend);
  backend->DestroyEvent(destroyed);
  CHECK(code(backend->QueryEvent(destroyed).status()) == kInvalid);
  CHECK(code(backend->WaitEvent(destroyed, 1.0)) == kInvalid);
  CHECK(code(backend->RecordEvent(destroyed, d2h)) == kInvalid);

  CHECK(code(backend->CopyAsync(d2h, host.get(), device.get(), -1)) == kInvalid);
  CHECK(code(backend->CopyAsync(d2h, nullptr, device.get(), 64)) == kInvalid);
  CHECK(code(backend->CopyAsync(d2h, host.get(), nullptr, 64)) == kInvalid);
  CHECK(code(backend->AllocateDevice(0).status()) == kInvalid);
  CHECK(code(backend->AllocateDevice(-1).status()) == kInvalid);
  CHECK(code(backend->AllocateHost(0).status()) == kInvalid);
  CHECK(code(backend->AllocateHost(-1).status()) == kInvalid);
  // None of that left work behind or broke the backend.
  CHECK(backend->Synchronize(30.0).ok());
  CHECK(backend->Stats().copies == 0);
  CHECK(*backend->QueryEvent(mine));
}

}  // namespace
}  // namespace pipeoffload::testing
