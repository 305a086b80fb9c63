// ActivationStash: the saved activations of each (mb, chunk) on one stage, and their trips to
// host memory and back. Owns no memory itself: device blocks come from the DeviceArena
// (category kStash), host slots from the HostPool.
//
// Invariants:
//  States and transitions (any other call on an entry is FailedPrecondition naming the entry
//  and its state; an entry that does not exist is named as such):
//    (none)      --Create-------> ON_DEVICE    device block allocated (F)
//    ON_DEVICE   --StartOffload-> OFFLOADING   host slot taken, D2H enqueued (OFFLOAD)
//    OFFLOADING  --FinishOffload> ON_HOST      device block released (RELEASE), see below
//    ON_HOST     --StartReload--> RELOADING    new device block, H2D enqueued (RELOAD)
//    RELOADING   --FinishReload-> ON_DEVICE    H2D waited for, host slot returned (before B)
//    ON_DEVICE   --Free---------> (none)       device block freed (B unsplit, or W)
//    ON_DEVICE   --Regrow-------> ON_DEVICE    + full block, retained block kept (RECOMPUTE);
//                                              also from RELOADING once OrderReload ran (a
//                                              retained block back from the host; the state
//                                              stays until FinishReload)
//    ON_DEVICE   --DropRetained-> ON_DEVICE    retained block freed (after RecomputeSaved);
//                                              in place: nothing freed, the retained block
//                                              is the entry's device block until Free
//  Logical and physical bytes:
//    device_bytes_ / device_entries_ (LOGICAL) follow program order exactly as the compiler
//    models it: + at Create and StartReload, - at FinishOffload and Free. Their high-water mark
//    is the predicted peak. The arena's kStash usage (PHYSICAL) also holds released blocks whose
//    D2H copy may still be running (pending_), so physical >= logical at every moment, and the
//    two are equal whenever pending_ is empty. An entry regrown in place counts, and holds,
//    its retained block until Free.
//  Deferred release (the default): FinishOffload does not wait. The entry goes ON_HOST and
//    leaves the logical count at once; its block moves to pending_ (release order) and stays
//    allocated. A pending block goes back to the arena only after its entry's `offload_done`
//    has completed: ReclaimReleased (kFinished: QueryEvent, never blocks; kOldest / kAll:
//    host-wait), or an allocation that finds the arena full or would take the physical bytes
//    past options_.physical_limit_bytes (AllocateReclaiming: reclaim the oldest, retry, until
//    it fits or nothing is pending; with the limit at the predicted peak, as the executor sets
//    it, physical never exceeds the prediction and the wait moves from RELEASE to the
//    allocation that needs the memory). Why this is safe: the only reader of
//    a released block is its D2H copy, and once that copy has completed nothing reads it, so
//    the block may go to anyone next (F, an H2D reload, a RECV a transport writes from another
//    thread or stream) and arena_.Free may poison it on the compute queue: the poison lands
//    after the copy, never in the host copy.
//    With unsafe_release_without_wait, FinishOffload frees at once without honouring the copy
//    (the bug poisoning exposes); with wait_for_copy_at_release it host-waits the copy and
//    frees at once (the old blocking RELEASE).
//  Event protocol (the same on CUDA streams and CPU copy engines):
//    StartOffload: record `offload_ready` on compute (after the F that wrote the entry); the D2H
//      queue waits on it, records `offload_begin`, copies, records `offload_done`.
//    FinishOffload: no wait (deferred); `offload_done` now also guards the pending block.
//    Reclaim: host-waits (or queries) `offload_done` before arena_.Free, because freeing
//      poisons the block (on the compute queue) and hands it to the next allocation.
//    StartReload: record `reload_ready` on compute (the new block's previous owner may still be
//      read by queued compute work); the H2D queue waits on it and on `offload_done` (the host
//      copy must be complete even if a caller broke the release protocol), records
//      `reload_begin`, copies, records `reload_done`.
//    OrderReload: the compute queue waits on `reload_done` (no host wait on asynchronous
//      backends); from then on compute work enqueued may read the entry.
//    FinishReload: host-waits `reload_done` (after B was enqueued, when it follows
//      OrderReload), reclaims the entry's pending block if still there (its copy is done, since
//      the H2D waited on it, but we still wait on `offload_done` rather than assume), then
//      returns the host slot.
//  Who frees what, when:
//    the device block: reclaim after the D2H (deferred), FinishOffload (blocking / unsafe),
//      Free and Clear; the arena poisons it.
//    the host slot: FinishReload (after the H2D), matching the compiler's host-memory model
//      (released at the entry's B).
//    events: an entry owns its events until FinishReload or Free return them to spare_events_
//      (reused by later entries). Its pending block, if any, is reclaimed first, so a recycled
//      `offload_done` never guards someone else's block; Clear likewise reclaims pending_
//      before returning events.
//  Poisoning (arena option): freed blocks are filled with kPoisonWord; Create zero-fills a new
//    block so that parts F leaves for B to write (split backward) never look poisoned, and
//    FindPoison can tell a read-after-release from stale bytes.
//  At iteration end CheckEmpty must find no entry (the executor reclaims kAll before it); Clear
//  tears down whatever an error left, pending blocks included.
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/memory.h"

namespace pipeoffload {
namespace {

std::string EntryName(int mb, int chunk) {
  return absl::StrCat("stash entry (mb ", mb, ", chunk ", chunk, ")");
}

}  // namespace

std::string_view StashStateName(StashState state) {
  switch (state) {
    case StashState::kOnDevice:
      return "ON_DEVICE";
    case StashState::kOffloading:
      return "OFFLOADING";
    case StashState::kOnHost:
      return "ON_HOST";
    case StashState::kReloading:
      return "RELOADING";
  }
  return "?";
}

ActivationStash::ActivationStash(Backend& backend, DeviceArena& arena, HostPool& host_pool,
                                 const ActivationStashOptions& options)
    : backend_(backend), arena_(arena), host_pool_(host_pool), options_(options) {}

ActivationStash::~ActivationStash() {
  constexpr double kTeardownWaitSeconds = 5.0;
  Clear(kTeardownWaitSeconds);
  for (const Event& event : spare_events_) backend_.DestroyEvent(event);
}

absl::StatusOr<ActivationStash::Entry*> ActivationStash::Find(int mb, int chunk,
                                                              std::string_view action) {
  auto it = entries_.find(Key(mb, chunk));
  if (it == entries_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(EntryName(mb, chunk), " does not exist; ", std::string(action), " needs one"));
  }
  return &it->second;
}

absl::Status ActivationStash::Expect(const Entry& entry, int mb, int chunk, StashState state,
                                     std::string_view action) const {
  if (entry.state == state) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(EntryName(mb, chunk), " is ",
                                                    std::string(StashStateName(entry.state)), "; ", std::string(action),
                                                    " needs it ", std::string(StashStateName(state))));
}

absl::StatusOr<Event> ActivationStash::TakeEvent() {
  if (!spare_events_.empty()) {
    const Event event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  return backend_.CreateEvent();
}

void ActivationStash::ReturnEvents(Entry& entry) {
  for (std::optional<Event>* event : {&entry.offload_ready, &entry.offload_begin,
                                      &entry.offload_done, &entry.reload_ready,
                                      &entry.reload_begin, &entry.reload_done}) {
    if (event->has_value()) spare_events_.push_back(**event);
    event->reset();
  }
}

void ActivationStash::CountDevice(std::int64_t bytes) {
  ++device_entries_;
  device_bytes_ += bytes;
  device_high_water_bytes_ = std::max(device_high_water_bytes_, device_bytes_);
}

void ActivationStash::UncountDevice(std::int64_t bytes) {
  --device_entries_;
  device_bytes_ -= bytes;
}

absl::Status ActivationStash::FreeDevice(Entry& entry) {
  if (entry.device == nullptr) return absl::OkStatus();
  void* device = entry.device;
  entry.device = nullptr;
  UncountDevice(entry.bytes);
  return arena_.Free(device);
}

std::int64_t ActivationStash::pending_release_bytes() const {
  std::int64_t bytes = 0;
  for (const PendingRelease& pending : pending_) bytes += pending.bytes;
  return bytes;
}

absl::Status ActivationStash::ReclaimAt(std::size_t index, double timeout_seconds) {
  const PendingRelease pending = pending_[index];
  Entry& entry = entries_.at(pending.key);  // entries outlive their pending block (see top)
  const double start = backend_.NowSeconds();
  const absl::Status waited = backend_.WaitEvent(*entry.offload_done, timeout_seconds);
  release_wait_seconds_ += backend_.NowSeconds() - start;
  if (!waited.ok()) {
    return Annotate(waited, absl::StrCat(EntryName(pending.key.first, pending.key.second),
                                         ": released block of ", pending.bytes,
                                         " bytes still being copied to host"));
  }
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(index));
  entry.release_pending = false;
  return arena_.Free(pending.block);
}

absl::Status ActivationStash::ReclaimEntry(const Key& key, double timeout_seconds) {
  if (auto it = entries_.find(key); it == entries_.end() || !it->second.release_pending) {
    return absl::OkStatus();
  }
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].key == key) return ReclaimAt(i, timeout_seconds);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ActivationStash::ReclaimReleased(ReclaimMode mode, double timeout_seconds) {
  int reclaimed = 0;
  if (mode == ReclaimMode::kAll) {
    while (!pending_.empty()) {
      PO_RETURN_IF_ERROR(ReclaimAt(0, timeout_seconds));
      ++reclaimed;
    }
    return reclaimed;
  }
  if (mode == ReclaimMode::kOldest && !pending_.empty()) {
    PO_RETURN_IF_ERROR(ReclaimAt(0, timeout_seconds));
    ++reclaimed;
  }
  for (std::size_t i = 0; i < pending_.size();) {
    const Entry& entry = entries_.at(pending_[i].key);
    PO_ASSIGN_OR_RETURN(const bool done, backend_.QueryEvent(*entry.offload_done));
    if (!done) {
      ++i;
      continue;
    }
    PO_RETURN_IF_ERROR(ReclaimAt(i, timeout_seconds));  // complete: the wait returns at once
    ++reclaimed;
  }
  return reclaimed;
}

absl::StatusOr<void*> ActivationStash::AllocateReclaiming(std::int64_t bytes,
                                                          MemoryCategory category) {
  int reclaimed = 0;
  // The physical cap first: a new entry may not push live plus released-but-copying bytes past
  // the limit, so the deferred release waits here, at the allocation that needs the memory.
  // Reclaiming everything always suffices, since logical bytes stay within the predicted peak.
  const std::int64_t limit = options_.physical_limit_bytes;
  while (limit > 0 && category == MemoryCategory::kStash && !pending_.empty() &&
         device_bytes_ + pending_release_bytes() + bytes > limit) {
    PO_ASSIGN_OR_RETURN(const int n,
                        ReclaimReleased(ReclaimMode::kOldest, options_.reclaim_timeout_seconds));
    reclaimed += n;
  }
  absl::StatusOr<void*> block = arena_.Allocate(bytes, category);
  while (!block.ok() && absl::IsResourceExhausted(block.status()) && !pending_.empty()) {
    PO_ASSIGN_OR_RETURN(const int n,
                        ReclaimReleased(ReclaimMode::kOldest, options_.reclaim_timeout_seconds));
    reclaimed += n;
    block = arena_.Allocate(bytes, category);
  }
  if (!block.ok() && absl::IsResourceExhausted(block.status())) {
    return Annotate(block.status(),
                    reclaimed == 0
                        ? std::string("no released stash block pending to reclaim")
                        : absl::StrCat("still full after reclaiming every released stash block (",
                                       reclaimed, ")"));
  }
  return block;
}

absl::StatusOr<void*> ActivationStash::Create(int mb, int chunk, std::int64_t bytes) {
  if (auto it = entries_.find(Key(mb, chunk)); it != entries_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(EntryName(mb, chunk), " already exists (",
                                                      std::string(StashStateName(it->second.state)),
                                                      "); Create needs a new entry"));
  }
  absl::StatusOr<void*> device = AllocateReclaiming(bytes, MemoryCategory::kStash);
  if (!device.ok()) return Annotate(device.status(), EntryName(mb, chunk));
  if (arena_.poison_on_free()) {
    PO_RETURN_IF_ERROR(backend_.FillAsync(backend_.queue(QueueKind::kCompute), *device, 0u,
                                          arena_.AlignedSize(bytes)));
  }
  Entry& entry = entries_[Key(mb, chunk)];
  entry.bytes = bytes;
  entry.device = *device;
  CountDevice(bytes);
  return *device;
}

absl::StatusOr<void*> ActivationStash::DeviceData(int mb, int chunk) const {
  auto it = entries_.find(Key(mb, chunk));
  if (it == entries_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(EntryName(mb, chunk), " does not exist; reading it needs ON_DEVICE"));
  }
  const Entry& entry = it->second;
  if (entry.state == StashState::kReloading && entry.reload_ordered) return entry.device;
  PO_RETURN_IF_ERROR(Expect(entry, mb, chunk, StashState::kOnDevice, "reading it"));
  return entry.device;
}

absl::Status ActivationStash::StartOffload(int mb, int chunk) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "StartOffload (OFFLOAD)"));
  PO_RETURN_IF_ERROR(Expect(*entry, mb, chunk, StashState::kOnDevice, "StartOffload (OFFLOAD)"));
  absl::StatusOr<HostSlot> slot = host_pool_.Acquire(entry->bytes);
  if (!slot.ok()) return Annotate(slot.status(), EntryName(mb, chunk));
  entry->host = *slot;
  entry->state = StashState::kOffloading;
  PO_ASSIGN_OR_RETURN(entry->offload_ready, TakeEvent());
  PO_ASSIGN_OR_RETURN(entry->offload_begin, TakeEvent());
  PO_ASSIGN_OR_RETURN(entry->offload_done, TakeEvent());
  const Queue d2h = backend_.queue(QueueKind::kD2H);
  PO_RETURN_IF_ERROR(
      backend_.RecordEvent(*entry->offload_ready, backend_.queue(QueueKind::kCompute)));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(d2h, *entry->offload_ready));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*entry->offload_begin, d2h));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(d2h, entry->host.data, entry->device, entry->bytes));
  return backend_.RecordEvent(*entry->offload_done, d2h);
}

absl::Status ActivationStash::FinishOffload(int mb, int chunk, double timeout_seconds) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "FinishOffload (RELEASE)"));
  PO_RETURN_IF_ERROR(
      Expect(*entry, mb, chunk, StashState::kOffloading, "FinishOffload (RELEASE)"));
  if (options_.unsafe_release_without_wait) {
    entry->state = StashState::kOnHost;
    return FreeDevice(*entry);
  }
  if (options_.wait_for_copy_at_release) {
    const double start = backend_.NowSeconds();
    const absl::Status waited = backend_.WaitEvent(*entry->offload_done, timeout_seconds);
    release_wait_seconds_ += backend_.NowSeconds() - start;
    if (!waited.ok()) {
      return Annotate(waited, absl::StrCat(EntryName(mb, chunk), ": D2H copy of ", entry->bytes,
                                           " bytes not finished"));
    }
    entry->state = StashState::kOnHost;
    return FreeDevice(*entry);
  }
  // Deferred: out of the logical count now, back to the arena once the copy is done.
  pending_.push_back(PendingRelease{Key(mb, chunk), entry->device, entry->bytes});
  entry->device = nullptr;
  entry->release_pending = true;
  UncountDevice(entry->bytes);
  entry->state = StashState::kOnHost;
  return absl::OkStatus();
}

absl::Status ActivationStash::StartReload(int mb, int chunk) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "StartReload (RELOAD)"));
  PO_RETURN_IF_ERROR(Expect(*entry, mb, chunk, StashState::kOnHost, "StartReload (RELOAD)"));
  absl::StatusOr<void*> device = AllocateReclaiming(entry->bytes, MemoryCategory::kStash);
  if (!device.ok()) return Annotate(device.status(), EntryName(mb, chunk));
  entry->device = *device;
  CountDevice(entry->bytes);
  entry->state = StashState::kReloading;
  PO_ASSIGN_OR_RETURN(entry->reload_ready, TakeEvent());
  PO_ASSIGN_OR_RETURN(entry->reload_begin, TakeEvent());
  PO_ASSIGN_OR_RETURN(entry->reload_done, TakeEvent());
  const Queue h2d = backend_.queue(QueueKind::kH2D);
  PO_RETURN_IF_ERROR(
      backend_.RecordEvent(*entry->reload_ready, backend_.queue(QueueKind::kCompute)));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d, *entry->reload_ready));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d, *entry->offload_done));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*entry->reload_begin, h2d));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(h2d, entry->device, entry->host.data, entry->bytes));
  return backend_.RecordEvent(*entry->reload_done, h2d);
}

absl::Status ActivationStash::OrderReload(int mb, int chunk) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "OrderReload (before B)"));
  PO_RETURN_IF_ERROR(
      Expect(*entry, mb, chunk, StashState::kReloading, "OrderReload (before B)"));
  if (entry->reload_ordered) return absl::OkStatus();
  absl::Status waited =
      backend_.QueueWaitEvent(backend_.queue(QueueKind::kCompute), *entry->reload_done);
  if (!waited.ok()) {
    return Annotate(waited, absl::StrCat(EntryName(mb, chunk), ": ordering compute after its ",
                                         entry->bytes, "-byte H2D copy"));
  }
  entry->reload_ordered = true;
  return absl::OkStatus();
}

absl::StatusOr<StashTransferTimes> ActivationStash::FinishReload(int mb, int chunk,
                                                                 double timeout_seconds) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "FinishReload (before B)"));
  PO_RETURN_IF_ERROR(
      Expect(*entry, mb, chunk, StashState::kReloading, "FinishReload (before B)"));
  absl::Status waited = backend_.WaitEvent(*entry->reload_done, timeout_seconds);
  if (!waited.ok()) {
    return Annotate(waited, absl::StrCat(EntryName(mb, chunk), ": H2D copy of ", entry->bytes,
                                         " bytes not finished"));
  }
  StashTransferTimes times;
  PO_ASSIGN_OR_RETURN(times.offload_start, backend_.EventTime(*entry->offload_begin));
  PO_ASSIGN_OR_RETURN(times.offload_end, backend_.EventTime(*entry->offload_done));
  PO_ASSIGN_OR_RETURN(times.reload_start, backend_.EventTime(*entry->reload_begin));
  PO_ASSIGN_OR_RETURN(times.reload_end, backend_.EventTime(*entry->reload_done));
  // Before ReturnEvents recycles offload_done, which guards the pending block.
  PO_RETURN_IF_ERROR(ReclaimEntry(Key(mb, chunk), timeout_seconds));
  PO_RETURN_IF_ERROR(host_pool_.Release(entry->host));
  entry->host = HostSlot{};
  ReturnEvents(*entry);
  entry->state = StashState::kOnDevice;
  entry->reload_ordered = false;
  return times;
}

absl::Status ActivationStash::Free(int mb, int chunk) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "Free (B or W)"));
  PO_RETURN_IF_ERROR(Expect(*entry, mb, chunk, StashState::kOnDevice, "Free (B or W)"));
  // FinishReload reclaimed any pending block already; this keeps Free safe on its own.
  PO_RETURN_IF_ERROR(ReclaimEntry(Key(mb, chunk), options_.reclaim_timeout_seconds));
  absl::Status freed = FreeDevice(*entry);
  ReturnEvents(*entry);
  entries_.erase(Key(mb, chunk));
  return freed;
}

absl::StatusOr<ActivationStash::Regrown> ActivationStash::Regrow(int mb, int chunk,
                                                                 std::int64_t bytes,
                                                                 bool in_place) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "Regrow (RECOMPUTE)"));
  // A retained block that came back from the host may still be RELOADING, once the compute
  // queue is ordered after its copy (OrderReload): FinishReload then follows the recompute.
  if (!(entry->state == StashState::kReloading && entry->reload_ordered)) {
    PO_RETURN_IF_ERROR(Expect(*entry, mb, chunk, StashState::kOnDevice, "Regrow (RECOMPUTE)"));
  }
  if (entry->retained != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(EntryName(mb, chunk), " is already regrown; Regrow (RECOMPUTE) runs once"));
  }
  if (in_place) {
    // The retained block is the entry's device block and stays it: nothing is allocated or
    // counted, and DropRetained has nothing to free.
    entry->retained = entry->device;
    entry->retained_bytes = 0;
    return Regrown{entry->retained, entry->device};
  }
  absl::StatusOr<void*> device = AllocateReclaiming(bytes, MemoryCategory::kStash);
  if (!device.ok()) return Annotate(device.status(), EntryName(mb, chunk));
  if (arena_.poison_on_free()) {
    PO_RETURN_IF_ERROR(backend_.FillAsync(backend_.queue(QueueKind::kCompute), *device, 0u,
                                          arena_.AlignedSize(bytes)));
  }
  entry->retained = entry->device;
  entry->retained_bytes = entry->bytes;
  entry->device = *device;
  entry->bytes = bytes;
  // One entry, two blocks: the bytes grow, the entry count does not.
  device_bytes_ += bytes;
  device_high_water_bytes_ = std::max(device_high_water_bytes_, device_bytes_);
  return Regrown{entry->retained, entry->device};
}

absl::Status ActivationStash::DropRetained(int mb, int chunk) {
  PO_ASSIGN_OR_RETURN(Entry* entry, Find(mb, chunk, "DropRetained (RECOMPUTE)"));
  if (entry->retained == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        EntryName(mb, chunk), " holds no retained block; DropRetained (RECOMPUTE) needs Regrow"));
  }
  void* retained = entry->retained;
  entry->retained = nullptr;
  device_bytes_ -= entry->retained_bytes;
  entry->retained_bytes = 0;
  // In place, the retained block is the entry's device block: Free returns it.
  return retained == entry->device ? absl::OkStatus() : arena_.Free(retained);
}

absl::Status ActivationStash::CheckEmpty() const {
  if (entries_.empty()) return absl::OkStatus();
  std::string left;
  for (const auto& [key, entry] : entries_) {
    absl::StrAppend(&left, left.empty() ? "" : ", ", "(mb ", key.first, ", chunk ", key.second,
                    ") ", std::string(StashStateName(entry.state)));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "activation stash not empty at iteration end: ", entries_.size(), " entries left: ", left));
}

void ActivationStash::Clear(double timeout_seconds) {
  // Pending blocks first, while their entries still own the events that guard them. Best
  // effort, as below: a failed wait is ignored, because Clear runs after an error was reported.
  for (const PendingRelease& pending : pending_) {
    Entry& entry = entries_.at(pending.key);
    backend_.WaitEvent(*entry.offload_done, timeout_seconds).IgnoreError();
    entry.release_pending = false;
    arena_.Free(pending.block).IgnoreError();
  }
  pending_.clear();
  for (auto& [key, entry] : entries_) {
    // Best effort: a copy still in flight would otherwise write into memory handed to the next
    // owner. A failed wait is ignored, because Clear runs after an error has been reported.
    if (entry.state == StashState::kOffloading) {
      backend_.WaitEvent(*entry.offload_done, timeout_seconds).IgnoreError();
    }
    if (entry.state == StashState::kReloading) {
      backend_.WaitEvent(*entry.reload_done, timeout_seconds).IgnoreError();
    }
    // A RECOMPUTE that failed between Regrow and DropRetained still holds its retained block
    // (the device block itself when regrown in place: FreeDevice returns that one).
    if (entry.retained != nullptr) {
      device_bytes_ -= entry.retained_bytes;
      if (entry.retained != entry.device) arena_.Free(entry.retained).IgnoreError();
      entry.retained = nullptr;
    }
    FreeDevice(entry).IgnoreError();
    if (entry.host.index >= 0) host_pool_.Release(entry.host).IgnoreError();
    ReturnEvents(entry);
  }
  entries_.clear();
}

absl::StatusOr<std::int64_t> ActivationStash::FindPoison(int mb, int chunk) const {
  PO_ASSIGN_OR_RETURN(void* device, DeviceData(mb, chunk));
  if (!arena_.poison_on_free() || !backend_.DeviceMemoryIsHostAccessible()) return -1;
  const std::int64_t bytes = entries_.at(Key(mb, chunk)).bytes;
  const auto* words = static_cast<const std::uint32_t*>(device);
  for (std::int64_t i = 0; i < bytes / 4; ++i) {
    if (words[i] == kPoisonWord) return i * 4;
  }
  return -1;
}

std::optional<StashState> ActivationStash::State(int mb, int chunk) const {
  auto it = entries_.find(Key(mb, chunk));
  if (it == entries_.end()) return std::nullopt;
  return it->second.state;
}

}  // namespace pipeoffload
