// HostPool: host memory (pinned on CUDA) allocated once, cut into fixed slots by size class.
//
// Invariants (guarded by mu_):
//  - slots_ never changes after Create: sorted by capacity then offset, disjoint, each offset a
//    multiple of kSlotAlignment, so Acquire's first fit is also the best fit by class.
//  - A slot is free iff in_use < 0; in_use_bytes_ sums the requested bytes of used slots and
//    high_water_bytes_ is its maximum since Create or ResetHighWater.
//  - Fixed slots mean no fragmentation: a pool sized from a program's per-class peak never
//    fails for that program.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipeoffload/memory.h"

namespace pipeoffload {
namespace {

constexpr std::int64_t kSlotAlignment = 256;  // a cache line multiple; what pinned copies like

}  // namespace

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(Backend& backend,
                                                           std::vector<HostSlotClass> classes) {
  std::map<std::int64_t, int> counts;  // capacity -> slots
  for (const HostSlotClass& slot_class : classes) {
    if (slot_class.bytes <= 0 || slot_class.count < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host pool: a slot class needs bytes > 0 and count >= 0, got ", slot_class.bytes,
          " bytes x ", slot_class.count));
    }
    if (slot_class.count > 0) counts[slot_class.bytes] += slot_class.count;
  }
  std::vector<Slot> slots;
  std::int64_t capacity = 0;
  for (const auto& [bytes, count] : counts) {
    const std::int64_t stride = (bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    for (int i = 0; i < count; ++i) {
      slots.push_back(Slot{capacity, bytes, -1});
      capacity += stride;
    }
  }
  char* base = nullptr;
  if (capacity > 0) {
    absl::StatusOr<void*> memory = backend.AllocateHost(capacity);
    if (!memory.ok()) {
      return absl::Status(memory.status().code(),
                          absl::StrCat("host pool: cannot allocate ", capacity,
                                       " bytes: ", memory.status().message()));
    }
    base = static_cast<char*>(*memory);
  }
  return std::unique_ptr<HostPool>(new HostPool(backend, base, capacity, std::move(slots)));
}

HostPool::HostPool(Backend& backend, char* base, std::int64_t capacity, std::vector<Slot> slots)
    : backend_(backend), base_(base), capacity_bytes_(capacity), slots_(std::move(slots)) {}

HostPool::~HostPool() {
  if (base_ != nullptr) backend_.FreeHost(base_);
}

absl::StatusOr<HostSlot> HostPool::Acquire(std::int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host pool: cannot acquire a slot of ", bytes, " bytes"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.in_use >= 0 || slot.capacity < bytes) continue;
    slot.in_use = bytes;
    in_use_bytes_ += bytes;
    high_water_bytes_ = std::max(high_water_bytes_, in_use_bytes_);
    return HostSlot{base_ + slot.offset, bytes, slot.capacity, static_cast<int>(i)};
  }
  std::string classes;
  std::map<std::int64_t, std::pair<int, int>> per_class;  // capacity -> (slots, used)
  for (const Slot& slot : slots_) {
    auto& [total, used] = per_class[slot.capacity];
    ++total;
    if (slot.in_use >= 0) ++used;
  }
  for (const auto& [capacity, counts] : per_class) {
    absl::StrAppend(&classes, classes.empty() ? "" : ", ", capacity, " B x ", counts.first, " (",
                    counts.second, " in use)");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "host pool: no free slot of at least ", bytes, " bytes; slots: ",
      classes.empty() ? "none" : classes, "; ", in_use_bytes_, " of ", capacity_bytes_,
      " bytes in use"));
}

absl::Status HostPool::Release(const HostSlot& slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot.index < 0 || slot.index >= static_cast<int>(slots_.size()) ||
      slots_[static_cast<std::size_t>(slot.index)].in_use < 0 ||
      base_ + slots_[static_cast<std::size_t>(slot.index)].offset != slot.data) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host pool: Release of slot %d at %p, which is not a slot of this pool in use",
        slot.index, slot.data));
  }
  Slot& owned = slots_[static_cast<std::size_t>(slot.index)];
  in_use_bytes_ -= owned.in_use;
  owned.in_use = -1;
  return absl::OkStatus();
}

std::int64_t HostPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_bytes_;
}

std::int64_t HostPool::high_water_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_bytes_;
}

int HostPool::slots_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.in_use >= 0; }));
}

void HostPool::ResetHighWater() {
  std::lock_guard<std::mutex> lock(mu_);
  high_water_bytes_ = in_use_bytes_;
}

}  // namespace pipeoffload
