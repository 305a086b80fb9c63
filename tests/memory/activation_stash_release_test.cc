// Deferred RELEASE of the ActivationStash: FinishOffload does not wait for the D2H copy; the
// entry leaves the logical count at once while its block stays in the arena until the copy has
// finished. The D2H queue is held shut by a GatedBackend, so "the copy is still in flight" is a
// deterministic state, not a matter of timing.
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "tests/backend/gated_backend.h"
#include "tests/memory/stash_rig.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::GatedBackend;

constexpr double kTimeout = 10.0;
constexpr double kShortTimeout = 0.05;
constexpr std::int64_t kBytes = 1000;    // 1024 in the arena (256-byte alignment)
constexpr std::int64_t kAligned = 1024;

struct GatedFixture {
  explicit GatedFixture(std::int64_t budget_bytes, const ActivationStashOptions& stash_options = {},
                        const CpuBackendOptions& backend_options = {}, int host_slots = 8)
      : cpu(testing::RequireCpuBackend(backend_options)),
        gated(std::make_unique<GatedBackend>(*cpu)),
        rig(*gated, budget_bytes, kBytes, host_slots, stash_options) {}
  ~GatedFixture() {
    gated->Open();  // nothing may stay held when the stash tears down
    stash.reset();
  }

  std::int64_t physical() const { return arena->Usage(MemoryCategory::kStash).in_use_bytes; }

  std::unique_ptr<Backend> cpu;
  std::unique_ptr<GatedBackend> gated;
  testing::StashRig rig;
  std::unique_ptr<DeviceArena>& arena = rig.arena;
  std::unique_ptr<HostPool>& pool = rig.pool;
  std::unique_ptr<ActivationStash>& stash = rig.stash;
};

std::vector<unsigned char> Pattern(int seed) {
  std::vector<unsigned char> pattern(kBytes);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    pattern[i] = static_cast<unsigned char>(i * 13 + static_cast<std::size_t>(seed) * 7 + 1);
  }
  return pattern;
}

// Creates (mb, 0) holding Pattern(mb), then OFFLOAD + RELEASE; returns its device block.
void* CreateAndRelease(ActivationStash& stash, int mb) {
  absl::StatusOr<void*> device = stash.Create(mb, 0, kBytes);
  REQUIRE(device.ok());
  const std::vector<unsigned char> pattern = Pattern(mb);
  std::memcpy(*device, pattern.data(), pattern.size());
  REQUIRE(stash.StartOffload(mb, 0).ok());
  REQUIRE(stash.FinishOffload(mb, 0, kTimeout).ok());
  return *device;
}

// RELOAD, before-B ordering and FinishReload of (mb, 0); checks every byte came back.
void ReloadAndCheck(ActivationStash& stash, int mb) {
  REQUIRE(stash.StartReload(mb, 0).ok());
  REQUIRE(stash.OrderReload(mb, 0).ok());
  REQUIRE(stash.FinishReload(mb, 0, kTimeout).ok());
  absl::StatusOr<void*> back = stash.DeviceData(mb, 0);
  REQUIRE(back.ok());
  const std::vector<unsigned char> pattern = Pattern(mb);
  CHECK(std::memcmp(*back, pattern.data(), pattern.size()) == 0);
  CHECK(*stash.FindPoison(mb, 0) == -1);
}

TEST_CASE("a release does not wait: logical bytes drop, the block waits for its copy",
          "[runtime][stash][release]") {
  GatedFixture f(1 << 16);
  f.gated->Close();
  void* block = CreateAndRelease(*f.stash, 0);
  // RELEASE returned while the D2H copy is held: the entry is ON_HOST and logically gone...
  CHECK(f.gated->held_tasks() > 0);
  CHECK(f.stash->State(0, 0) == StashState::kOnHost);
  CHECK(f.stash->device_bytes() == 0);
  CHECK(f.stash->device_entries() == 0);
  CHECK(f.stash->device_high_water_bytes() == kBytes);
  // ...but the arena still holds its block, unpoisoned, for the copy to read.
  CHECK(f.physical() == kBytes);
  CHECK(f.stash->pending_release_blocks() == 1);
  CHECK(f.stash->pending_release_bytes() == kBytes);
  const std::vector<unsigned char> pattern = Pattern(0);
  CHECK(std::memcmp(block, pattern.data(), pattern.size()) == 0);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int> none = f.stash->ReclaimReleased(ReclaimMode::kFinished, kTimeout);
    REQUIRE(none.ok());
    CHECK(*none == 0);
  }
  // Waiting for the oldest is bounded and names the entry; nothing is lost by the timeout.
  const double waited_before = f.stash->release_wait_seconds();
  const absl::StatusOr<int> late = f.stash->ReclaimReleased(ReclaimMode::kOldest, kShortTimeout);
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(late.status().message()).find("stash entry (mb 0, chunk 0)") !=
        std::string::npos);
  CHECK(f.stash->release_wait_seconds() - waited_before >= kShortTimeout * 0.9);
  CHECK(f.stash->pending_release_blocks() == 1);
  CHECK(f.physical() == kBytes);
  CHECK(std::memcmp(block, pattern.data(), pattern.size()) == 0);
  // The copy runs once the gate opens; only then does the block go back, poisoned.
  f.gated->Open();
  REQUIRE(f.cpu->Synchronize(kTimeout).ok());
  absl::StatusOr<int> one = f.stash->ReclaimReleased(ReclaimMode::kFinished, kTimeout);
  REQUIRE(one.ok());
  CHECK(*one == 1);
  CHECK(f.stash->pending_release_blocks() == 0);
  CHECK(f.physical() == 0);
  CHECK(*static_cast<std::uint32_t*>(block) == kPoisonWord);
  // The host copy was taken before the poison: the round trip keeps every byte.
  ReloadAndCheck(*f.stash, 0);
  REQUIRE(f.stash->Free(0, 0).ok());
  CHECK(f.stash->CheckEmpty().ok());
}

TEST_CASE("FinishReload reclaims its entry's pending block before recycling its events",
          "[runtime][stash][release]") {
  GatedFixture f(1 << 16);
  f.gated->Close();
  CreateAndRelease(*f.stash, 0);
  CreateAndRelease(*f.stash, 1);
  CHECK(f.stash->pending_release_blocks() == 2);
  f.gated->Open();  // the copies run now, asynchronously; nobody has waited for them
  REQUIRE(f.stash->StartReload(1, 0).ok());
  CHECK(f.stash->device_bytes() == kBytes);
  CHECK(f.physical() >= 2 * kBytes);  // the reload's block beside at least one pending block
  REQUIRE(f.stash->OrderReload(1, 0).ok());
  REQUIRE(f.stash->FinishReload(1, 0, kTimeout).ok());
  // Entry 1's own block is back; entry 0's may still be pending (its copy finished or not).
  CHECK(f.stash->pending_release_blocks() <= 1);
  CHECK(f.physical() == kBytes * (1 + f.stash->pending_release_blocks()));
  ReloadAndCheck(*f.stash, 0);
  CHECK(f.stash->pending_release_blocks() == 0);
  CHECK(f.physical() == 2 * kBytes);
  absl::StatusOr<void*> one = f.stash->DeviceData(1, 0);
  REQUIRE(one.ok());
  const std::vector<unsigned char> pattern = Pattern(1);
  CHECK(std::memcmp(*one, pattern.data(), pattern.size()) == 0);
  REQUIRE(f.stash->Free(0, 0).ok());
  REQUIRE(f.stash->Free(1, 0).ok());
  CHECK(f.physical() == 0);
}

TEST_CASE("a full arena is relieved by reclaiming released blocks, oldest first",
          "[runtime][stash][release]") {
  constexpr int kEntries = 4;
  // The D2H engine sleeps 20 ms before each copy, so the copies really lag the releases.
  CpuBackendOptions slow;
  slow.min_copy_delay_seconds = 0.02;
  slow.max_copy_delay_seconds = 0.02;
  GatedFixture f(kEntries * kAligned, {}, slow);
  f.gated->Close();
  for (int mb = 0; mb < kEntries; ++mb) CreateAndRelease(*f.stash, mb);
  CHECK(f.stash->device_bytes() == 0);
  CHECK(f.physical() == kEntries * kBytes);
  CHECK(f.arena->largest_free_block() == 0);
  f.gated->Open();
  // The arena is full of released blocks whose copies are running: F waits for the oldest.
  const double waited_before = f.stash->release_wait_seconds();
  absl::StatusOr<void*> fresh = f.stash->Create(kEntries, 0, kBytes);
  REQUIRE(fresh.ok());
  CHECK(f.stash->release_wait_seconds() > waited_before);
  CHECK(f.stash->device_bytes() == kBytes);
  CHECK(f.stash->pending_release_blocks() < kEntries);
  CHECK(f.physical() == kBytes * (1 + f.stash->pending_release_blocks()));
  CHECK(f.arena->Usage(MemoryCategory::kStash).high_water_bytes == kEntries * kBytes);
  // A request that cannot fit even after everything is reclaimed reports what happened.
  const absl::Status huge = f.stash->Create(kEntries + 1, 0, 2 * kEntries * kAligned).status();
  INFO(huge.message());
  CHECK(huge.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(huge.message()).find("stash entry (mb 5, chunk 0)") != std::string::npos);
  CHECK(f.stash->pending_release_blocks() == 0);
  // Every entry still comes back intact.
  for (int mb = 0; mb < kEntries; ++mb) {
    CAPTURE(mb);
    if (mb == 0) REQUIRE(f.stash->Free(kEntries, 0).ok());  // room for the reloads
    ReloadAndCheck(*f.stash, mb);
    REQUIRE(f.stash->Free(mb, 0).ok());
  }
  CHECK(f.physical() == 0);
  CHECK(f.stash->CheckEmpty().ok());
}

TEST_CASE("the physical cap moves the release's wait to the allocation that needs the bytes",
          "[runtime][stash][release]") {
  // Room for 8 entries in the arena, but the stash may hold at most 2 entries' bytes physically
  // (live plus released-but-copying), as the executor sets it from the predicted peak.
  ActivationStashOptions capped;
  capped.physical_limit_bytes = 2 * kBytes;
  capped.reclaim_timeout_seconds = kShortTimeout;
  GatedFixture f(8 * kAligned, capped);
  f.gated->Close();
  CreateAndRelease(*f.stash, 0);
  CreateAndRelease(*f.stash, 1);  // within the cap: RELEASE returned without waiting
  CHECK(f.stash->pending_release_blocks() == 2);
  CHECK(f.physical() == 2 * kBytes);
  // A third entry would make 3 entries' bytes: it must wait for the oldest copy, which the
  // closed gate holds, so the bounded wait fails and names the entry; nothing was allocated.
  const absl::Status blocked = f.stash->Create(2, 0, kBytes).status();
  INFO(blocked.ToString());
  CHECK(blocked.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(blocked.message()).find("(mb 0, chunk 0)") != std::string::npos);
  CHECK(f.physical() == 2 * kBytes);
  CHECK(f.stash->State(2, 0) == std::nullopt);
  f.gated->Open();
  absl::StatusOr<void*> third = f.stash->Create(2, 0, kBytes);
  REQUIRE(third.ok());
  CHECK(f.physical() <= 2 * kBytes);
  CHECK(f.arena->Usage(MemoryCategory::kStash).high_water_bytes == 2 * kBytes);
  REQUIRE(f.stash->Free(2, 0).ok());
  for (int mb = 0; mb < 2; ++mb) {
    CAPTURE(mb);
    ReloadAndCheck(*f.stash, mb);
    REQUIRE(f.stash->Free(mb, 0).ok());
  }
  CHECK(f.stash->CheckEmpty().ok());
}

TEST_CASE("a full arena with nothing released fails with a clear ResourceExhausted",
          "[runtime][stash][release]") {
  constexpr int kEntries = 3;
  GatedFixture f(kEntries * kAligned);
  for (int mb = 0; mb < kEntries; ++mb) REQUIRE(f.stash->Create(mb, 0, kBytes).ok());
  const absl::Status full = f.stash->Create(kEntries, 0, kBytes).status();
  const std::string message(full.message());
  INFO(message);
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK(message.find("stash entry (mb 3, chunk 0)") != std::string::npos);
  CHECK(message.find("no released stash block pending") != std::string::npos);
  CHECK(message.find("cannot allocate 1000 bytes for stash") != std::string::npos);
  // P2P buffers go through the same path (the executor's AllocateP2P).
  const absl::Status p2p = f.stash->AllocateReclaiming(16, MemoryCategory::kP2P).status();
  CHECK(p2p.code() == absl::StatusCode::kResourceExhausted);
  CHECK(f.stash->release_wait_seconds() == 0.0);
}

TEST_CASE("a P2P allocation reclaims released blocks whose copies are done", "[runtime][stash][release]") {
  GatedFixture f(2 * kAligned);
  CreateAndRelease(*f.stash, 0);
  CreateAndRelease(*f.stash, 1);
  REQUIRE(f.cpu->Synchronize(kTimeout).ok());
  absl::StatusOr<void*> buffer = f.stash->AllocateReclaiming(kAligned, MemoryCategory::kP2P);
  REQUIRE(buffer.ok());
  CHECK(f.stash->pending_release_blocks() == 0);  // the oldest, plus the other finished one
  CHECK(f.arena->Usage(MemoryCategory::kP2P).in_use_bytes == kAligned);
  REQUIRE(f.arena->Free(*buffer).ok());
  f.stash->Clear(kTimeout);
}

TEST_CASE("release modes: blocking waits (bounded), unsafe frees before the copy",
          "[runtime][stash][release][poison]") {
  enum class Mode { kDeferred, kBlocking, kUnsafe };
  const Mode mode = GENERATE(Mode::kDeferred, Mode::kBlocking, Mode::kUnsafe);
  ActivationStashOptions options;
  options.wait_for_copy_at_release = mode == Mode::kBlocking;
  options.unsafe_release_without_wait = mode == Mode::kUnsafe;
  GatedFixture f(1 << 16, options);
  CAPTURE(static_cast<int>(mode));
  absl::StatusOr<void*> device = f.stash->Create(0, 0, kBytes);
  REQUIRE(device.ok());
  const std::vector<unsigned char> pattern = Pattern(0);
  std::memcpy(*device, pattern.data(), pattern.size());
  f.gated->Close();
  REQUIRE(f.stash->StartOffload(0, 0).ok());
  const absl::Status released = f.stash->FinishOffload(0, 0, kShortTimeout);
  if (mode == Mode::kBlocking) {
    // The blocking release cannot finish while the copy is held: bounded, the entry unchanged.
    CHECK(released.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(f.stash->State(0, 0) == StashState::kOffloading);
    CHECK(f.stash->device_bytes() == kBytes);
    CHECK(f.stash->release_wait_seconds() >= kShortTimeout * 0.9);
    f.gated->Open();
    REQUIRE(f.stash->FinishOffload(0, 0, kTimeout).ok());
    CHECK(f.stash->pending_release_blocks() == 0);
    CHECK(f.physical() == 0);
  } else {
    REQUIRE(released.ok());
    CHECK(f.stash->device_bytes() == 0);
    // Deferred keeps the block for the copy; unsafe has freed and poisoned it already.
    CHECK(f.stash->pending_release_blocks() == (mode == Mode::kDeferred ? 1 : 0));
    CHECK(f.physical() == (mode == Mode::kDeferred ? kBytes : 0));
    CHECK((*static_cast<std::uint32_t*>(*device) == kPoisonWord) == (mode == Mode::kUnsafe));
    f.gated->Open();
  }
  REQUIRE(f.stash->StartReload(0, 0).ok());
  REQUIRE(f.stash->OrderReload(0, 0).ok());
  REQUIRE(f.stash->FinishReload(0, 0, kTimeout).ok());
  // Only the unsafe release copied poison to the host; the reload brings it back.
  CHECK(*f.stash->FindPoison(0, 0) == (mode == Mode::kUnsafe ? 0 : -1));
  REQUIRE(f.stash->Free(0, 0).ok());
  CHECK(f.physical() == 0);
}

TEST_CASE("Clear waits for and frees pending released blocks", "[runtime][stash][release]") {
  GatedFixture f(1 << 16);
  f.gated->Close();
  CreateAndRelease(*f.stash, 0);
  CreateAndRelease(*f.stash, 1);
  REQUIRE(f.stash->Create(2, 0, kBytes).ok());
  CHECK(f.physical() == 3 * kBytes);
  f.gated->Open();
  f.stash->Clear(kTimeout);
  CHECK(f.stash->size() == 0);
  CHECK(f.stash->pending_release_blocks() == 0);
  CHECK(f.physical() == 0);
  CHECK(f.pool->slots_in_use() == 0);
  CHECK(f.arena->num_free_ranges() == 1);
}

}  // namespace
}  // namespace pipeoffload
