// DeviceArena: one device allocation at Create, carved first-fit with coalescing (small blocks
// from the top).
//
// Invariants (guarded by mu_):
//  - free_ and live_ partition [0, budget) except a tail shorter than the alignment: ranges are
//    disjoint, every offset and live size is a multiple of the alignment, and no two free ranges
//    touch (Free merges a range with both neighbours), so an empty arena has one free range.
//  - usage_[c] sums the REQUESTED bytes of live blocks of category c; the high-water mark is the
//    maximum of that sum since Create or ResetHighWater.
//  - After Create no backend allocation happens; Free only poisons (on the compute queue, so it
//    is ordered after the compute work that last used the block) and returns the range.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipeoffload/memory.h"

namespace pipeoffload {

std::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kStash:
      return "stash";
    case MemoryCategory::kP2P:
      return "p2p";
    case MemoryCategory::kOther:
      return "other";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::Create(
    Backend& backend, const DeviceArenaOptions& options) {
  if (options.budget_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device arena: budget_bytes must be positive, got ", options.budget_bytes));
  }
  const std::int64_t alignment = options.alignment;
  if (alignment < 4 || (alignment & (alignment - 1)) != 0 || alignment > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device arena: alignment must be a power of two in [4, 1 MiB], got ", alignment));
  }
  // Over-allocate by one alignment so the base can be rounded up whatever the backend returns.
  absl::StatusOr<void*> raw = backend.AllocateDevice(options.budget_bytes + alignment);
  if (!raw.ok()) {
    return absl::Status(raw.status().code(),
                        absl::StrCat("device arena: cannot reserve the budget of ",
                                     options.budget_bytes, " bytes: ", raw.status().message()));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(*raw);
  const std::uintptr_t aligned =
      (address + static_cast<std::uintptr_t>(alignment) - 1) &
      ~(static_cast<std::uintptr_t>(alignment) - 1);
  return std::unique_ptr<DeviceArena>(
      new DeviceArena(backend, options, *raw, reinterpret_cast<char*>(aligned)));
}

DeviceArena::DeviceArena(Backend& backend, const DeviceArenaOptions& options, void* raw,
                         char* base)
    : backend_(backend), options_(options), raw_(raw), base_(base) {
  free_.emplace(0, options.budget_bytes / options.alignment * options.alignment);
}

DeviceArena::~DeviceArena() { backend_.FreeDevice(raw_); }

std::int64_t DeviceArena::AlignedSize(std::int64_t bytes) const {
  const std::int64_t a = options_.alignment;
  return (bytes + a - 1) / a * a;
}

absl::StatusOr<void*> DeviceArena::Allocate(std::int64_t bytes, MemoryCategory category) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("device arena: cannot allocate ", bytes,
                                                   " bytes for ", std::string(MemoryCategoryName(category)),
                                                   " (sizes must be positive)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes <= options_.budget_bytes) {
    const std::int64_t size = AlignedSize(bytes);
    // P2P buffers are small and short-lived, and they come and go in an order that depends on
    // when peers finish; carved first-fit between stash entries they split the free space
    // (a budget that holds the plan then fails for want of one contiguous block). So they are
    // carved from the top of the highest range that fits, everything else first-fit from the
    // bottom: the two kinds stay apart. Stash blocks below stash_high_below_bytes (recompute's
    // retained blocks) go to the top for the same reason: at the bottom, where entries of one
    // size come and go, a hole stays a whole entry.
    const bool from_top =
        category == MemoryCategory::kP2P ||
        (category == MemoryCategory::kStash && size < options_.stash_high_below_bytes);
    std::optional<std::int64_t> found;
    if (from_top) {
      // Small blocks of several sizes come and go up here (P2P buffers; retained blocks of
      // lean and of full recomputes, and their reloads when they are offloaded). First the
      // smallest hole that holds one among the holes too small for a full entry (the highest
      // of equals): it keeps larger small-block holes whole for the larger sizes, and a hole
      // an entry could use is never split. Else the highest range that fits, as before.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < size || it->second >= options_.stash_high_below_bytes) continue;
        if (best == free_.end() || it->second <= best->second) best = it;
      }
      if (best == free_.end()) {
        for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
          if (it->second < size) continue;
          best = std::next(it).base();
          break;
        }
      }
      if (best != free_.end()) {
        const std::int64_t start = best->first;
        const std::int64_t rest = best->second - size;
        free_.erase(best);
        if (rest > 0) free_.emplace(start, rest);
        found = start + rest;
      }
    } else {
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second < size) continue;
        const std::int64_t start = it->first;
        const std::int64_t rest = it->second - size;
        free_.erase(it);
        if (rest > 0) free_.emplace(start + size, rest);
        found = start;
        break;
      }
    }
    if (found.has_value()) {
      const std::int64_t offset = *found;
      live_.emplace(offset, Block{size, bytes, category});
      MemoryUsage& usage = usage_[static_cast<int>(category)];
      usage.in_use_bytes += bytes;
      usage.high_water_bytes = std::max(usage.high_water_bytes, usage.in_use_bytes);
      ++usage.live_blocks;
      return static_cast<void*>(base_ + offset);
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "device arena: cannot allocate ", bytes, " bytes for ", std::string(MemoryCategoryName(category)), ": ",
      DescribeLocked()));
}

absl::Status DeviceArena::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::int64_t offset = static_cast<char*>(ptr) - base_;
  auto it = live_.find(offset);
  if (ptr == nullptr || it == live_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "device arena: Free(%p) is not a live block of this arena (double free, or memory "
        "from elsewhere)",
        ptr));
  }
  const Block block = it->second;
  if (options_.poison_on_free) {
    absl::Status poisoned =
        backend_.FillAsync(backend_.queue(QueueKind::kCompute), ptr, kPoisonWord, block.size);
    if (!poisoned.ok()) return poisoned;
  }
  live_.erase(it);
  MemoryUsage& usage = usage_[static_cast<int>(block.category)];
  usage.in_use_bytes -= block.requested;
  --usage.live_blocks;

  // Coalesce with the free neighbours on both sides.
  std::int64_t start = offset;
  std::int64_t size = block.size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, size);
  return absl::OkStatus();
}

MemoryUsage DeviceArena::Usage(MemoryCategory category) const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_[static_cast<int>(category)];
}

void DeviceArena::ResetHighWater() {
  std::lock_guard<std::mutex> lock(mu_);
  for (MemoryUsage& usage : usage_) usage.high_water_bytes = usage.in_use_bytes;
}

std::int64_t DeviceArena::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::int64_t total = 0;
  for (const auto& [offset, block] : live_) total += block.size;
  return total;
}

std::int64_t DeviceArena::largest_free_block() const {
  std::lock_guard<std::mutex> lock(mu_);
  return LargestFreeLocked();
}

int DeviceArena::num_free_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(free_.size());
}

std::int64_t DeviceArena::LargestFreeLocked() const {
  std::int64_t largest = 0;
  for (const auto& [offset, size] : free_) largest = std::max(largest, size);
  return largest;
}

std::string DeviceArena::DescribeLocked() const {
  std::int64_t requested = 0;
  std::int64_t reserved = 0;
  for (const auto& [offset, block] : live_) {
    requested += block.requested;
    reserved += block.size;
  }
  return absl::StrCat(requested, " bytes in use (stash ", usage_[0].in_use_bytes, ", p2p ",
                      usage_[1].in_use_bytes, ", other ", usage_[2].in_use_bytes, "; ", reserved,
                      " reserved with ", options_.alignment, "-byte alignment) of a ",
                      options_.budget_bytes, "-byte budget, largest free block ",
                      LargestFreeLocked(), " bytes");
}

}  // namespace pipeoffload
