// HostPool: one host allocation, slots reused across iterations, smallest fitting class,
// high-water mark, and clear errors.
#include <set>
#include <string>
#include <vector>

#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "tests/backend/backend_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

std::unique_ptr<HostPool> Pool(Backend& backend, std::vector<HostSlotClass> classes) {
  absl::StatusOr<std::unique_ptr<HostPool>> pool = HostPool::Create(backend, classes);
  INFO(pool.status().ToString());
  REQUIRE(pool.ok());
  return std::move(*pool);
}

HostSlot Acquire(HostPool& pool, std::int64_t bytes) {
  absl::StatusOr<HostSlot> slot = pool.Acquire(bytes);
  INFO(slot.status().ToString());
  REQUIRE(slot.ok());
  return *slot;
}

TEST_CASE("host pool reuses the same slots across iterations", "[runtime][host_pool]") {
  auto backend = testing::NewCpuBackend();
  auto pool = Pool(*backend, {{1000, 3}});
  CHECK(pool->num_slots() == 3);
  CHECK(pool->capacity_bytes() == 3 * 1024);  // each slot rounded to 256 bytes
  std::set<void*> first;
  for (int iteration = 0; iteration < 20; ++iteration) {
    std::vector<HostSlot> slots;
    for (int i = 0; i < 3; ++i) slots.push_back(Acquire(*pool, 1000 - i));
    std::set<void*> addresses;
    for (const HostSlot& slot : slots) addresses.insert(slot.data);
    CHECK(addresses.size() == 3);
    if (iteration == 0) first = addresses;
    CHECK(addresses == first);
    for (const HostSlot& slot : slots) REQUIRE(pool->Release(slot).ok());
    CHECK(pool->slots_in_use() == 0);
  }
  CHECK(backend->Stats().host_allocations == 1);
}

TEST_CASE("host pool lends the smallest class that fits", "[runtime][host_pool]") {
  auto backend = testing::NewCpuBackend();
  auto pool = Pool(*backend, {{4096, 1}, {512, 2}, {0 + 2048, 0}});
  CHECK(pool->num_slots() == 3);  // the empty class is dropped
  HostSlot small = Acquire(*pool, 300);
  CHECK(small.capacity == 512);
  CHECK(small.bytes == 300);
  HostSlot small2 = Acquire(*pool, 512);
  CHECK(small2.capacity == 512);
  // Both 512-byte slots are taken: a small request falls back to the large class.
  HostSlot large = Acquire(*pool, 10);
  CHECK(large.capacity == 4096);
  absl::StatusOr<HostSlot> none = pool->Acquire(10);
  REQUIRE(none.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(none.status().message());
  INFO(message);
  CHECK(message.find("no free slot of at least 10 bytes") != std::string::npos);
  CHECK(message.find("512 B x 2 (2 in use)") != std::string::npos);
  CHECK(message.find("4096 B x 1 (1 in use)") != std::string::npos);
  CHECK(pool->Acquire(5000).status().code() == absl::StatusCode::kResourceExhausted);
  for (const HostSlot& slot : {small, small2, large}) REQUIRE(pool->Release(slot).ok());
}

TEST_CASE("host pool tracks requested bytes and the high-water mark", "[runtime][host_pool]") {
  auto backend = testing::NewCpuBackend();
  auto pool = Pool(*backend, {{100, 4}});
  HostSlot a = Acquire(*pool, 100);
  HostSlot b = Acquire(*pool, 60);
  CHECK(pool->in_use_bytes() == 160);
  REQUIRE(pool->Release(a).ok());
  HostSlot c = Acquire(*pool, 10);
  CHECK(pool->in_use_bytes() == 70);
  CHECK(pool->high_water_bytes() == 160);
  pool->ResetHighWater();
  CHECK(pool->high_water_bytes() == 70);
  REQUIRE(pool->Release(b).ok());
  REQUIRE(pool->Release(c).ok());
  CHECK(pool->in_use_bytes() == 0);
}

TEST_CASE("host pool rejects bad slots and bad classes", "[runtime][host_pool]") {
  auto backend = testing::NewCpuBackend();
  auto pool = Pool(*backend, {{64, 1}});
  HostSlot slot = Acquire(*pool, 64);
  REQUIRE(pool->Release(slot).ok());
  absl::Status twice = pool->Release(slot);
  CHECK(twice.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(twice.message()).find("not a slot of this pool in use") !=
        std::string::npos);
  CHECK(pool->Release(HostSlot{}).code() == absl::StatusCode::kInvalidArgument);
  CHECK(pool->Acquire(0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(HostPool::Create(*backend, {{0, 1}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(HostPool::Create(*backend, {{64, -1}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("an empty host pool allocates nothing", "[runtime][host_pool]") {
  auto backend = testing::NewCpuBackend();
  auto pool = Pool(*backend, {});
  CHECK(pool->capacity_bytes() == 0);
  CHECK(backend->Stats().host_allocations == 0);
  CHECK(pool->Acquire(1).status().code() == absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pipeoffload
