// What the memory tests build again and again: a poisoning DeviceArena, a one-class HostPool
// and an ActivationStash over them, on a backend the test owns.
#ifndef PIPEOFFLOAD_TESTS_MEMORY_STASH_RIG_H_
#define PIPEOFFLOAD_TESTS_MEMORY_STASH_RIG_H_

#include <cstdint>
#include <memory>

#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {

struct StashRig {
  // An arena of `budget_bytes` (poison on free), `host_slots` slots of `slot_bytes`.
  StashRig(Backend& backend, std::int64_t budget_bytes, std::int64_t slot_bytes, int host_slots,
           const ActivationStashOptions& stash_options = {}) {
    DeviceArenaOptions arena_options;
    arena_options.budget_bytes = budget_bytes;
    arena_options.poison_on_free = true;
    absl::StatusOr<std::unique_ptr<DeviceArena>> made_arena =
        DeviceArena::Create(backend, arena_options);
    REQUIRE(made_arena.ok());
    arena = std::move(*made_arena);
    absl::StatusOr<std::unique_ptr<HostPool>> made_pool =
        HostPool::Create(backend, {{slot_bytes, host_slots}});
    REQUIRE(made_pool.ok());
    pool = std::move(*made_pool);
    stash = std::make_unique<ActivationStash>(backend, *arena, *pool, stash_options);
  }

  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<ActivationStash> stash;  // declared last: torn down first
};

// A CPU backend made with `options`, required to succeed.
inline std::unique_ptr<Backend> RequireCpuBackend(const CpuBackendOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Backend>> created = CreateCpuBackend(options);
  REQUIRE(created.ok());
  return std::move(*created);
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_MEMORY_STASH_RIG_H_
