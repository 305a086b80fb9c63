// Exhaustion of the host pool and the device arena in the middle of an "iteration" of stash
// traffic (issue 17's fault injection, CPU): the failing call returns ResourceExhausted with
// the numbers, Clear (what the executor does after an error) gives every block and slot back
// while copies are still in flight (copy engines delayed), and the next iteration runs on the
// same arena and pool with every byte intact and no new backend allocation.
#include <cstdint>
#include <cstring>
#include <memory>
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
constexpr std::int64_t kBudget = 4096;  // four 1000-byte entries at the 256-byte alignment

struct Pools {
  // Copies start 0-5 ms late, in no particular order.
  explicit Pools(int host_slots)
      : backend(testing::RequireCpuBackend(CpuBackendOptions{0.0, 0.005})),
        rig(*backend, kBudget, kBytes, host_slots) {}

  // Nothing held: no stash block, no host slot.
  void CheckNothingHeld() const {
    CHECK(stash->size() == 0);
    CHECK(stash->pending_release_blocks() == 0);
    CHECK(arena->Usage(MemoryCategory::kStash).in_use_bytes == 0);
    CHECK(arena->Usage(MemoryCategory::kStash).live_blocks == 0);
    CHECK(arena->reserved_bytes() == 0);
    CHECK(arena->num_free_ranges() == 1);
    CHECK(pool->slots_in_use() == 0);
    CHECK(pool->in_use_bytes() == 0);
  }

  std::unique_ptr<Backend> backend;
  testing::StashRig rig;
  std::unique_ptr<DeviceArena>& arena = rig.arena;
  std::unique_ptr<HostPool>& pool = rig.pool;
  std::unique_ptr<ActivationStash>& stash = rig.stash;
};

// Byte i of entry (mb, 0): distinct per entry and position.
std::uint8_t Pattern(int mb, std::int64_t i) {
  return static_cast<std::uint8_t>(mb * 131 + i * 7 + 1);
}

void Fill(ActivationStash& stash, int mb) {
  absl::StatusOr<void*> data = stash.DeviceData(mb, 0);
  REQUIRE(data.ok());
  auto* bytes = static_cast<std::uint8_t*>(*data);
  for (std::int64_t i = 0; i < kBytes; ++i) bytes[i] = Pattern(mb, i);
}

// Whether entry (mb, 0)'s device bytes are its pattern, every one.
bool Intact(const ActivationStash& stash, int mb) {
  absl::StatusOr<void*> data = stash.DeviceData(mb, 0);
  REQUIRE(data.ok());
  const auto* bytes = static_cast<const std::uint8_t*>(*data);
  for (std::int64_t i = 0; i < kBytes; ++i) {
    if (bytes[i] != Pattern(mb, i)) return false;
  }
  return true;
}

// An iteration of `entries` entries, each sent to the host and brought back one at a time (so
// one host slot suffices), checked byte for byte, then freed.
void RoundTripOneAtATime(ActivationStash& stash, int entries) {
  for (int mb = 0; mb < entries; ++mb) {
    REQUIRE(stash.Create(mb, 0, kBytes).ok());
    Fill(stash, mb);
  }
  for (int mb = 0; mb < entries; ++mb) {
    REQUIRE(stash.StartOffload(mb, 0).ok());
    REQUIRE(stash.FinishOffload(mb, 0, kTimeout).ok());
    REQUIRE(stash.StartReload(mb, 0).ok());
    REQUIRE(stash.OrderReload(mb, 0).ok());
    REQUIRE(stash.FinishReload(mb, 0, kTimeout).ok());
    CHECK(Intact(stash, mb));
  }
  for (int mb = 0; mb < entries; ++mb) REQUIRE(stash.Free(mb, 0).ok());
  REQUIRE(stash.ReclaimReleased(ReclaimMode::kAll, kTimeout).ok());
  CHECK(stash.CheckEmpty().ok());
}

TEST_CASE("a host pool that runs out mid-iteration fails clearly, frees all, and recovers",
          "[runtime][faults][host_pool]") {
  Pools pools(/*host_slots=*/1);
  const BackendStats before = pools.backend->Stats();
  for (int mb = 0; mb < 2; ++mb) {
    REQUIRE(pools.stash->Create(mb, 0, kBytes).ok());
    Fill(*pools.stash, mb);
  }
  REQUIRE(pools.stash->StartOffload(0, 0).ok());  // its D2H copy is still in flight below
  const absl::Status full = pools.stash->StartOffload(1, 0);
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  const std::string message(full.message());
  CAPTURE(message);
  CHECK(message.find("stash entry (mb 1, chunk 0)") != std::string::npos);
  // Slots start 256-byte aligned: one 1000-byte slot spans 1024 bytes of the pool.
  CHECK(message.find("host pool: no free slot of at least 1000 bytes; slots: 1000 B x 1 (1 in "
                     "use); 1000 of 1024 bytes in use") != std::string::npos);
  // The entry that could not go out stays on the device, untouched.
  CHECK(pools.stash->State(1, 0) == StashState::kOnDevice);
  CHECK(Intact(*pools.stash, 1));

  pools.stash->Clear(kTimeout);
  pools.CheckNothingHeld();

  RoundTripOneAtATime(*pools.stash, 3);
  pools.CheckNothingHeld();
  // The pool and arena were allocated once, at Create: the recovery allocated nothing.
  CHECK(pools.backend->Stats().host_allocations == before.host_allocations);
  CHECK(pools.backend->Stats().device_allocations == before.device_allocations);
}

TEST_CASE("an arena that runs out mid-iteration fails clearly, frees all, and recovers",
          "[runtime][faults][arena]") {
  Pools pools(/*host_slots=*/4);
  const BackendStats before = pools.backend->Stats();
  for (int mb = 0; mb < 4; ++mb) REQUIRE(pools.stash->Create(mb, 0, kBytes).ok());
  // Entry 0 is on its way out (its D2H copy delayed, the block still its own); a fifth entry
  // finds the arena full and nothing released to take back.
  REQUIRE(pools.stash->StartOffload(0, 0).ok());
  const absl::StatusOr<void*> fifth = pools.stash->Create(4, 0, kBytes);
  CHECK(fifth.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(fifth.status().message());
  CAPTURE(message);
  CHECK(message.find("stash entry (mb 4, chunk 0)") != std::string::npos);
  CHECK(message.find("no released stash block pending to reclaim") != std::string::npos);
  CHECK(message.find("device arena: cannot allocate 1000 bytes for stash: 4000 bytes in use "
                     "(stash 4000, p2p 0, other 0; 4096 reserved with 256-byte alignment) of a "
                     "4096-byte budget, largest free block 0 bytes") != std::string::npos);

  pools.stash->Clear(kTimeout);
  pools.CheckNothingHeld();

  RoundTripOneAtATime(*pools.stash, 4);
  pools.CheckNothingHeld();
  CHECK(pools.backend->Stats().host_allocations == before.host_allocations);
  CHECK(pools.backend->Stats().device_allocations == before.device_allocations);
}

TEST_CASE("a host pool lends the same slots again after running dry",
          "[runtime][faults][host_pool]") {
  Pools pools(/*host_slots=*/2);
  std::vector<HostSlot> first;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<HostSlot> slot = pools.pool->Acquire(kBytes - i);
    REQUIRE(slot.ok());
    first.push_back(*slot);
  }
  const absl::StatusOr<HostSlot> dry = pools.pool->Acquire(1);
  CHECK(dry.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(dry.status().message()) ==
        "host pool: no free slot of at least 1 bytes; slots: 1000 B x 2 (2 in use); 1999 of "
        "2048 bytes in use");
  for (const HostSlot& slot : first) REQUIRE(pools.pool->Release(slot).ok());
  CHECK(pools.pool->in_use_bytes() == 0);
  CHECK(pools.pool->high_water_bytes() == 1999);
  for (const HostSlot& slot : first) {
    absl::StatusOr<HostSlot> again = pools.pool->Acquire(slot.bytes);
    REQUIRE(again.ok());
    CHECK(again->data == slot.data);
    CHECK(again->index == slot.index);
  }
}

}  // namespace
}  // namespace pipeoffload
