// ActivationStash: the state machine (every illegal transition from every state), byte-exact
// round trips through host memory under copy delays, poisoning of released memory, and the
// end-of-iteration checks.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "tests/memory/stash_rig.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

constexpr double kTimeout = 10.0;
constexpr std::int64_t kBytes = 1000;

struct Fixture {
  explicit Fixture(const CpuBackendOptions& backend_options = {},
                   const ActivationStashOptions& stash_options = {})
      : backend(testing::RequireCpuBackend(backend_options)),
        rig(*backend, 1 << 16, kBytes, 2, stash_options) {}

  std::unique_ptr<Backend> backend;
  testing::StashRig rig;
  std::unique_ptr<DeviceArena>& arena = rig.arena;
  std::unique_ptr<HostPool>& pool = rig.pool;
  std::unique_ptr<ActivationStash>& stash = rig.stash;
};

enum class Action { kCreate, kRead, kStartOffload, kFinishOffload, kStartReload, kOrderReload,
                    kFinishReload, kFree };

const char* ActionName(Action action) {
  switch (action) {
    case Action::kCreate: return "Create";
    case Action::kRead: return "DeviceData";
    case Action::kStartOffload: return "StartOffload";
    case Action::kFinishOffload: return "FinishOffload";
    case Action::kStartReload: return "StartReload";
    case Action::kOrderReload: return "OrderReload";
    case Action::kFinishReload: return "FinishReload";
    case Action::kFree: return "Free";
  }
  return "?";
}

absl::Status Do(ActivationStash& stash, Action action, int mb, int chunk) {
  switch (action) {
    case Action::kCreate: return stash.Create(mb, chunk, kBytes).status();
    case Action::kRead: return stash.DeviceData(mb, chunk).status();
    case Action::kStartOffload: return stash.StartOffload(mb, chunk);
    case Action::kFinishOffload: return stash.FinishOffload(mb, chunk, kTimeout);
    case Action::kStartReload: return stash.StartReload(mb, chunk);
    case Action::kOrderReload: return stash.OrderReload(mb, chunk);
    case Action::kFinishReload: return stash.FinishReload(mb, chunk, kTimeout).status();
    case Action::kFree: return stash.Free(mb, chunk);
  }
  return absl::InternalError("unreachable");
}

// Drives entry (mb 1, chunk 0) into `state` along the legal path.
void BringTo(ActivationStash& stash, StashState state) {
  REQUIRE(Do(stash, Action::kCreate, 1, 0).ok());
  if (state == StashState::kOnDevice) return;
  REQUIRE(Do(stash, Action::kStartOffload, 1, 0).ok());
  if (state == StashState::kOffloading) return;
  REQUIRE(Do(stash, Action::kFinishOffload, 1, 0).ok());
  if (state == StashState::kOnHost) return;
  REQUIRE(Do(stash, Action::kStartReload, 1, 0).ok());
}

bool Legal(StashState state, Action action) {
  switch (state) {
    case StashState::kOnDevice:
      return action == Action::kRead || action == Action::kStartOffload || action == Action::kFree;
    case StashState::kOffloading:
      return action == Action::kFinishOffload;
    case StashState::kOnHost:
      return action == Action::kStartReload;
    case StashState::kReloading:
      return action == Action::kOrderReload || action == Action::kFinishReload;
  }
  return false;
}

TEST_CASE("stash rejects every illegal transition, naming entry and state", "[runtime][stash]") {
  const StashState state = GENERATE(StashState::kOnDevice, StashState::kOffloading,
                                    StashState::kOnHost, StashState::kReloading);
  const Action action = GENERATE(Action::kCreate, Action::kRead, Action::kStartOffload,
                                 Action::kFinishOffload, Action::kStartReload,
                                 Action::kOrderReload, Action::kFinishReload, Action::kFree);
  if (Legal(state, action)) return;
  Fixture f;
  BringTo(*f.stash, state);
  const absl::Status status = Do(*f.stash, action, 1, 0);
  const std::string message(status.message());
  INFO(StashStateName(state) << " + " << ActionName(action) << ": " << message);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(message.find("stash entry (mb 1, chunk 0)") != std::string::npos);
  CHECK(message.find(std::string(StashStateName(state))) != std::string::npos);
  // A rejected call changes nothing.
  CHECK(f.stash->State(1, 0) == state);
}

TEST_CASE("stash rejects every call on an entry that does not exist", "[runtime][stash]") {
  const Action action = GENERATE(Action::kRead, Action::kStartOffload, Action::kFinishOffload,
                                 Action::kStartReload, Action::kOrderReload,
                                 Action::kFinishReload, Action::kFree);
  Fixture f;
  REQUIRE(Do(*f.stash, Action::kCreate, 1, 0).ok());
  const absl::Status status = Do(*f.stash, action, 2, 1);
  INFO(ActionName(action) << ": " << status.message());
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(status.message()).find("stash entry (mb 2, chunk 1) does not exist") !=
        std::string::npos);
}

TEST_CASE("stash round trip keeps every byte under copy delays", "[runtime][stash]") {
  CpuBackendOptions delays;
  delays.min_copy_delay_seconds = 0.0;
  delays.max_copy_delay_seconds = 0.02;
  delays.fault_seed = GENERATE(1u, 2u, 3u);
  Fixture f(delays);
  std::vector<unsigned char> pattern(kBytes);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7);
  for (int iteration = 0; iteration < 3; ++iteration) {
    absl::StatusOr<void*> device = f.stash->Create(0, 0, kBytes);
    REQUIRE(device.ok());
    std::memcpy(*device, pattern.data(), pattern.size());
    CHECK(f.stash->device_bytes() == kBytes);
    REQUIRE(f.stash->StartOffload(0, 0).ok());
    CHECK(f.stash->State(0, 0) == StashState::kOffloading);
    REQUIRE(f.stash->FinishOffload(0, 0, kTimeout).ok());
    CHECK(f.stash->State(0, 0) == StashState::kOnHost);
    CHECK(f.stash->device_bytes() == 0);  // logically gone at RELEASE
    CHECK(f.pool->slots_in_use() == 1);
    // Physically the block waits for its copy; once reclaimed it is free and poisoned.
    absl::StatusOr<int> reclaimed = f.stash->ReclaimReleased(ReclaimMode::kAll, kTimeout);
    REQUIRE(reclaimed.ok());
    CHECK(*reclaimed == 1);
    CHECK(f.stash->pending_release_blocks() == 0);
    CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
    CHECK(*static_cast<std::uint32_t*>(*device) == kPoisonWord);
    REQUIRE(f.stash->StartReload(0, 0).ok());
    CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == kBytes);
    // The executor's order before B: compute waits for the copy, then reads the entry (still
    // RELOADING, holding its host slot), and only then returns the slot.
    CHECK_FALSE(f.stash->DeviceData(0, 0).ok());
    REQUIRE(f.stash->OrderReload(0, 0).ok());
    CHECK(f.stash->State(0, 0) == StashState::kReloading);
    absl::StatusOr<void*> ordered = f.stash->DeviceData(0, 0);
    REQUIRE(ordered.ok());
    CHECK(std::memcmp(*ordered, pattern.data(), pattern.size()) == 0);
    CHECK(f.pool->slots_in_use() == 1);
    absl::StatusOr<StashTransferTimes> times = f.stash->FinishReload(0, 0, kTimeout);
    REQUIRE(times.ok());
    CHECK(times->offload_start <= times->offload_end);
    CHECK(times->offload_end <= times->reload_start);
    CHECK(times->reload_start <= times->reload_end);
    CHECK(f.pool->slots_in_use() == 0);
    absl::StatusOr<void*> back = f.stash->DeviceData(0, 0);
    REQUIRE(back.ok());
    CHECK(std::memcmp(*back, pattern.data(), pattern.size()) == 0);
    CHECK(*f.stash->FindPoison(0, 0) == -1);
    REQUIRE(f.stash->Free(0, 0).ok());
    REQUIRE(f.stash->CheckEmpty().ok());
  }
  CHECK(f.backend->Stats().bytes_d2h == 3 * kBytes);
  CHECK(f.backend->Stats().bytes_h2d == 3 * kBytes);
  CHECK(f.backend->Stats().device_allocations == 1);
}

TEST_CASE("poisoning exposes a release that does not wait for its D2H copy",
          "[runtime][stash][poison]") {
  // Every copy sleeps 50 ms first, so a release that does not honour the copy frees (and
  // poisons) the device copy before the D2H engine has read it. Deferred and blocking releases
  // both keep the bytes.
  CpuBackendOptions delays;
  delays.min_copy_delay_seconds = 0.05;
  delays.max_copy_delay_seconds = 0.05;
  enum class Mode { kDeferred, kBlocking, kUnsafe };
  const Mode mode = GENERATE(Mode::kDeferred, Mode::kBlocking, Mode::kUnsafe);
  const bool wait = mode != Mode::kUnsafe;
  ActivationStashOptions stash_options;
  stash_options.unsafe_release_without_wait = mode == Mode::kUnsafe;
  stash_options.wait_for_copy_at_release = mode == Mode::kBlocking;
  Fixture f(delays, stash_options);
  absl::StatusOr<void*> device = f.stash->Create(3, 1, kBytes);
  REQUIRE(device.ok());
  std::memset(*device, 0x11, kBytes);
  REQUIRE(f.stash->StartOffload(3, 1).ok());
  REQUIRE(f.stash->FinishOffload(3, 1, kTimeout).ok());
  REQUIRE(f.stash->StartReload(3, 1).ok());
  REQUIRE(f.stash->FinishReload(3, 1, kTimeout).ok());
  absl::StatusOr<std::int64_t> poison = f.stash->FindPoison(3, 1);
  REQUIRE(poison.ok());
  INFO("release mode " << static_cast<int>(mode));
  CHECK(*poison == (wait ? -1 : 0));
  CHECK(f.stash->pending_release_blocks() == 0);  // FinishReload reclaimed it at the latest
  REQUIRE(f.stash->Free(3, 1).ok());
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
}

TEST_CASE("stash zero-fills new entries so untouched bytes never look poisoned",
          "[runtime][stash][poison]") {
  Fixture f;
  absl::StatusOr<void*> first = f.stash->Create(0, 0, kBytes);
  REQUIRE(first.ok());
  REQUIRE(f.stash->Free(0, 0).ok());  // the block is now poisoned
  absl::StatusOr<void*> second = f.stash->Create(1, 0, kBytes);
  REQUIRE(second.ok());
  CHECK(*second == *first);  // first fit hands the same block back
  CHECK(*f.stash->FindPoison(1, 0) == -1);
  REQUIRE(f.stash->Free(1, 0).ok());
}

TEST_CASE("stash lists what is left at iteration end and clears after errors",
          "[runtime][stash]") {
  Fixture f;
  REQUIRE(f.stash->Create(0, 0, kBytes).ok());
  REQUIRE(f.stash->Create(1, 0, kBytes).ok());
  REQUIRE(f.stash->StartOffload(1, 0).ok());
  REQUIRE(f.stash->FinishOffload(1, 0, kTimeout).ok());
  const absl::Status left = f.stash->CheckEmpty();
  CHECK(left.code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(left.message());
  INFO(message);
  CHECK(message.find("2 entries left: (mb 0, chunk 0) ON_DEVICE, (mb 1, chunk 0) ON_HOST") !=
        std::string::npos);
  f.stash->Clear(kTimeout);
  CHECK(f.stash->size() == 0);
  CHECK(f.stash->CheckEmpty().ok());
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
  CHECK(f.pool->slots_in_use() == 0);
}

TEST_CASE("stash reports a full host pool and a full arena with the entry", "[runtime][stash]") {
  Fixture f;
  for (int mb = 0; mb < 3; ++mb) REQUIRE(f.stash->Create(mb, 0, kBytes).ok());
  REQUIRE(f.stash->StartOffload(0, 0).ok());
  REQUIRE(f.stash->StartOffload(1, 0).ok());
  const absl::Status full = f.stash->StartOffload(2, 0);  // the pool has two slots
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(full.message()).find("stash entry (mb 2, chunk 0)") != std::string::npos);
  const absl::Status huge = f.stash->Create(9, 0, 1 << 20).status();
  CHECK(huge.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(huge.message()).find("stash entry (mb 9, chunk 0)") != std::string::npos);
}

}  // namespace
}  // namespace pipeoffload

namespace pipeoffload {
namespace {

// Entry (mb 0, chunk 0) of `bytes`, every byte 0x5A: F's retained block.
void* CreateRetained(ActivationStash& stash, std::int64_t bytes) {
  absl::StatusOr<void*> retained = stash.Create(0, 0, bytes);
  REQUIRE(retained.ok());
  std::memset(*retained, 0x5A, static_cast<std::size_t>(bytes));
  return *retained;
}

TEST_CASE("Regrow holds both blocks until DropRetained, then the full entry alone",
          "[memory][stash][recompute]") {
  Fixture f;
  ActivationStash& stash = *f.stash;
  constexpr std::int64_t kRetained = 100;
  void* const retained = CreateRetained(stash, kRetained);
  CHECK(stash.device_bytes() == kRetained);
  absl::StatusOr<ActivationStash::Regrown> blocks = stash.Regrow(0, 0, kBytes);
  REQUIRE(blocks.ok());
  CHECK(blocks->retained == retained);
  CHECK(blocks->full != retained);
  // The new block is zero-filled (poisoning is on), the retained one untouched.
  const auto* full = static_cast<const unsigned char*>(blocks->full);
  const auto* kept = static_cast<const unsigned char*>(blocks->retained);
  CHECK((full[0] == 0 && full[kBytes - 1] == 0));
  CHECK((kept[0] == 0x5A && kept[kRetained - 1] == 0x5A));
  CHECK(stash.device_bytes() == kRetained + kBytes);
  CHECK(stash.device_high_water_bytes() == kRetained + kBytes);
  CHECK(stash.device_entries() == 1);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == kRetained + kBytes);
  // Once is all.
  CHECK(stash.Regrow(0, 0, kBytes).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(stash.DropRetained(0, 0).ok());
  CHECK(stash.device_bytes() == kBytes);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == kBytes);
  CHECK(stash.DeviceData(0, 0).value() == blocks->full);
  const absl::Status again = stash.DropRetained(0, 0);
  CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(again.message()).find("holds no retained block") != std::string::npos);
  REQUIRE(stash.Free(0, 0).ok());
  CHECK(stash.device_bytes() == 0);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
}

TEST_CASE("Regrow in place counts and allocates nothing and keeps the retained block",
          "[memory][stash][recompute]") {
  Fixture f;
  ActivationStash& stash = *f.stash;
  constexpr std::int64_t kRetained = 100;
  void* const retained = CreateRetained(stash, kRetained);
  const std::int64_t arena_before = f.arena->Usage(MemoryCategory::kStash).in_use_bytes;
  absl::StatusOr<ActivationStash::Regrown> blocks = stash.Regrow(0, 0, kBytes, /*in_place=*/true);
  REQUIRE(blocks.ok());
  CHECK(blocks->retained == retained);
  CHECK(blocks->full == retained);
  // The compiler's lean_rebuild_bytes = 0: the retained block alone, logically and physically.
  CHECK(stash.device_bytes() == kRetained);
  CHECK(stash.device_high_water_bytes() == kRetained);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == arena_before);
  REQUIRE(stash.DropRetained(0, 0).ok());
  CHECK(stash.device_bytes() == kRetained);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == arena_before);
  CHECK(stash.DeviceData(0, 0).value() == retained);
  // The poison scan reads the block the entry has: a neighbour's poison past its end is not
  // this entry's.
  absl::StatusOr<void*> next = stash.Create(1, 0, 64);
  REQUIRE(next.ok());
  REQUIRE(stash.Free(1, 0).ok());  // poisons the freed block
  CHECK(stash.FindPoison(0, 0).value() == -1);
  REQUIRE(stash.Free(0, 0).ok());
  CHECK(stash.device_bytes() == 0);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
}

TEST_CASE("Clear frees an in-place regrown entry once", "[memory][stash][recompute]") {
  Fixture f;
  REQUIRE(f.stash->Create(1, 0, 64).ok());
  REQUIRE(f.stash->Regrow(1, 0, kBytes, /*in_place=*/true).ok());
  f.stash->Clear(kTimeout);
  CHECK(f.stash->device_bytes() == 0);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
  CHECK(f.arena->num_free_ranges() == 1);
}

TEST_CASE("Clear frees a retained block left by a failed recompute", "[memory][stash][recompute]") {
  Fixture f;
  REQUIRE(f.stash->Create(1, 0, 64).ok());
  REQUIRE(f.stash->Regrow(1, 0, kBytes).ok());
  CHECK(f.stash->Regrow(2, 0, kBytes).status().code() == absl::StatusCode::kFailedPrecondition);
  f.stash->Clear(kTimeout);
  CHECK(f.stash->device_bytes() == 0);
  CHECK(f.arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
  CHECK(f.arena->num_free_ranges() == 1);
}

}  // namespace
}  // namespace pipeoffload
