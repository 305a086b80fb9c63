// Memory of the runtime (DESIGN.md section 5): the DeviceArena (one up-front device allocation,
// our own allocator, a byte budget and per-category accounting), the HostPool (host memory
// allocated once, slots reused across iterations) and the ActivationStash (the saved activations
// of each (microbatch, chunk), moved to host and back by OFFLOAD / RELEASE / RELOAD).
//
// The same parts serve activation offload, optimizer-state offload and layer sliding.
#ifndef PIPEOFFLOAD_MEMORY_H_
#define PIPEOFFLOAD_MEMORY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {

// Released device memory is filled with this word when poisoning is on. 0x7FF7FFFF is a NaN as
// fp32, as two halves in fp16 and bf16, and paired as fp64, so any float read of poisoned memory
// yields NaN whatever the dtype.
inline constexpr std::uint32_t kPoisonWord = 0x7FF7FFFFu;

#ifdef NDEBUG
inline constexpr bool kPoisonByDefault = false;
#else
inline constexpr bool kPoisonByDefault = true;
#endif

// Who holds arena memory; each category is accounted on its own.
enum class MemoryCategory : std::uint8_t {
  kStash,  // saved activations (the quantity the compiler predicts)
  kP2P,    // boundary activations and gradients in flight between stages
  kOther,  // weights, gradients, workspace
};
inline constexpr int kNumMemoryCategories = 3;
std::string_view MemoryCategoryName(MemoryCategory category);  // "stash", "p2p", "other"

// Byte counts are the sizes callers REQUESTED (not rounded to the alignment), so the stash's
// high-water mark equals the compiler's predicted peak exactly.
struct MemoryUsage {
  std::int64_t in_use_bytes = 0;
  std::int64_t high_water_bytes = 0;  // since creation or the last ResetHighWater
  std::int64_t live_blocks = 0;
};

struct DeviceArenaOptions {
  std::int64_t budget_bytes = 0;  // the one device allocation; > 0
  std::int64_t alignment = 256;   // every block starts at a multiple; a power of two >= 4
  bool poison_on_free = kPoisonByDefault;  // fill freed blocks with kPoisonWord
  // Stash requests smaller than this are carved from the top, as P2P buffers always are; the
  // rest first-fit from the bottom. A stage sets it to its smallest full entry, so the retained
  // blocks of recomputed entries (long-lived, smaller than any entry) never land in a hole a
  // released entry left, which would split it below the size the next reload or regrow needs.
  // Blocks carved from the top go to the smallest free range below this size that holds them
  // (best fit: P2P buffers and retained blocks of several sizes share the top), else to the
  // highest range that fits. 0: every stash block from the bottom, top blocks highest first.
  std::int64_t stash_high_below_bytes = 0;
};

// One device allocation made at Create, carved by a first-fit allocator with coalescing: entries
// from the bottom, small blocks (P2P buffers, retained blocks) from the top. No backend
// allocation happens after Create. Thread-safe.
class DeviceArena {
 public:
  // Errors: InvalidArgument for a non-positive budget or a bad alignment; the backend's
  // ResourceExhausted when the device cannot hold the budget.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceArena>> Create(
      Backend& backend, const DeviceArenaOptions& options);
  // Returns the allocation to the backend. REQUIRES: no queued work still uses arena memory.
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // A block of at least `bytes` (> 0) bytes, aligned to options.alignment, for `category`.
  // Errors: InvalidArgument for bytes <= 0; ResourceExhausted when no free block fits, naming
  // the request, the bytes in use, the budget and the largest free block.
  [[nodiscard]] absl::StatusOr<void*> Allocate(std::int64_t bytes, MemoryCategory category);
  // Frees a block from Allocate; with poison_on_free, first fills it with kPoisonWord on the
  // compute queue (stream-ordered, so compute work enqueued earlier still sees its data).
  // Errors: InvalidArgument for a pointer that is not a live block of this arena.
  [[nodiscard]] absl::Status Free(void* ptr);

  MemoryUsage Usage(MemoryCategory category) const;
  // Sets every category's high-water mark to its current use (start of an iteration).
  void ResetHighWater();

  std::int64_t budget_bytes() const { return options_.budget_bytes; }
  std::int64_t alignment() const { return options_.alignment; }
  bool poison_on_free() const { return options_.poison_on_free; }
  // Bytes a request of `bytes` occupies (rounded up to the alignment).
  std::int64_t AlignedSize(std::int64_t bytes) const;
  std::int64_t reserved_bytes() const;  // aligned bytes of live blocks
  std::int64_t largest_free_block() const;
  int num_free_ranges() const;  // 1 when nothing is allocated: proves coalescing

 private:
  struct Block {
    std::int64_t size = 0;       // aligned
    std::int64_t requested = 0;  // what the caller asked for
    MemoryCategory category = MemoryCategory::kOther;
  };
  DeviceArena(Backend& backend, const DeviceArenaOptions& options, void* raw, char* base);
  std::int64_t LargestFreeLocked() const;
  std::string DescribeLocked() const;

  Backend& backend_;
  const DeviceArenaOptions options_;
  void* const raw_;    // what the backend returned
  char* const base_;   // raw_ rounded up to the alignment
  mutable std::mutex mu_;
  std::map<std::int64_t, std::int64_t> free_;  // offset -> size, disjoint, never adjacent
  std::map<std::int64_t, Block> live_;         // offset -> block
  MemoryUsage usage_[kNumMemoryCategories];
};

// One size class of host slots.
struct HostSlotClass {
  std::int64_t bytes = 0;  // > 0
  int count = 0;           // >= 0
};

// A slot lent by a HostPool. `index` identifies it to Release.
struct HostSlot {
  void* data = nullptr;
  std::int64_t bytes = 0;      // the size requested at Acquire
  std::int64_t capacity = 0;   // the slot's class size
  int index = -1;
};

// Host memory (pinned on CUDA) allocated once at Create, cut into fixed slots by size class;
// slots are reused across iterations, so the steady state allocates nothing. Thread-safe.
class HostPool {
 public:
  // Classes with count 0 are dropped; an empty pool is valid and allocates nothing.
  // Errors: InvalidArgument for a non-positive size or a negative count; the backend's error
  // when the host allocation fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HostPool>> Create(
      Backend& backend, std::vector<HostSlotClass> classes);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A free slot of the smallest class that holds `bytes` (> 0).
  // Errors: ResourceExhausted naming the request and every class's use when none is free.
  [[nodiscard]] absl::StatusOr<HostSlot> Acquire(std::int64_t bytes);
  // Errors: InvalidArgument when `slot` is not a slot of this pool in use.
  [[nodiscard]] absl::Status Release(const HostSlot& slot);

  std::int64_t capacity_bytes() const { return capacity_bytes_; }
  std::int64_t in_use_bytes() const;      // requested bytes of slots in use
  std::int64_t high_water_bytes() const;  // since creation or ResetHighWater
  int slots_in_use() const;
  int num_slots() const { return static_cast<int>(slots_.size()); }
  void ResetHighWater();

 private:
  struct Slot {
    std::int64_t offset = 0;
    std::int64_t capacity = 0;
    std::int64_t in_use = -1;  // requested bytes, -1 when free
  };
  HostPool(Backend& backend, char* base, std::int64_t capacity, std::vector<Slot> slots);

  Backend& backend_;
  char* const base_;
  const std::int64_t capacity_bytes_;
  mutable std::mutex mu_;
  std::vector<Slot> slots_;  // sorted by capacity, then offset
  std::int64_t in_use_bytes_ = 0;
  std::int64_t high_water_bytes_ = 0;
};

// Where a stash entry's bytes live. See activation_stash.cc for the state machine.
enum class StashState : std::uint8_t {
  kOnDevice,    // "ON_DEVICE": device copy valid (after F, or after a finished reload)
  kOffloading,  // "OFFLOADING": D2H copy in flight; the device copy must not change
  kOnHost,      // "ON_HOST": device copy released, host copy valid
  kReloading,   // "RELOADING": H2D copy in flight into a new device block
};
std::string_view StashStateName(StashState state);

// Times (backend clock) of one entry's round trip, known once its reload finished.
struct StashTransferTimes {
  double offload_start = 0.0;
  double offload_end = 0.0;
  double reload_start = 0.0;
  double reload_end = 0.0;
};

struct ActivationStashOptions {
  // Testing only: FinishOffload frees the device copy at once WITHOUT honouring the D2H copy
  // (the block is poisoned and reused while the copy may still read it). This reproduces the
  // missing-wait bug that poisoning exists to expose; never set it otherwise. Wins over
  // wait_for_copy_at_release.
  bool unsafe_release_without_wait = false;
  // FinishOffload host-waits the D2H copy and frees the device copy at once (the blocking
  // RELEASE of earlier versions), instead of deferring the free until the copy has finished.
  // For A/B benchmarks and as a fallback; results are bitwise the same either way.
  bool wait_for_copy_at_release = false;
  // Bound on each host wait for a pending D2H copy when an allocation needs its block
  // (Create, StartReload, AllocateReclaiming). The executor sets its wait_timeout_seconds.
  double reclaim_timeout_seconds = 60.0;
  // When > 0, a deferred release never lets the stash's PHYSICAL bytes (live entries plus
  // released blocks whose D2H copy is still running, requested bytes) exceed this: a stash
  // allocation that would go over it first reclaims the oldest pending blocks, waiting for their
  // copies. The executor sets it to the program's predicted stash peak (plus
  // ExecutorOptions::stash_physical_slack_bytes), so deferring a release only moves its wait to
  // the allocation that needs the memory and the physical peak stays the predicted one. 0: no
  // cap (released blocks may hold any free arena memory until their copies end).
  std::int64_t physical_limit_bytes = 0;
};

// Which released device blocks ReclaimReleased returns to the arena.
enum class ReclaimMode : std::uint8_t {
  kFinished,  // only those whose D2H copy has completed; never blocks
  kOldest,    // host-waits the oldest pending copy, then also takes every finished one
  kAll,       // host-waits every pending copy
};

// The saved activations of each (mb, chunk) of one stage. Not thread-safe: one runtime thread
// drives it (the copies it enqueues run on the backend's engines).
//
// Every call that finds an entry in the wrong state fails with FailedPrecondition naming the
// entry and its state, e.g. "stash entry (mb 3, chunk 1) is ON_HOST; StartReload ... ".
class ActivationStash {
 public:
  ActivationStash(Backend& backend, DeviceArena& arena, HostPool& host_pool,
                  const ActivationStashOptions& options = {});
  // Waits (briefly) for copies still in flight, then frees every entry: teardown after an error.
  ~ActivationStash();
  ActivationStash(const ActivationStash&) = delete;
  ActivationStash& operator=(const ActivationStash&) = delete;

  // F: a new entry of `bytes` bytes, ON_DEVICE; returns its device memory. When the arena is
  // full, reclaims released blocks first (as AllocateReclaiming).
  // Errors: FailedPrecondition when the entry exists; the arena's ResourceExhausted (nothing
  // left to reclaim); DeadlineExceeded from a wait for a pending copy.
  [[nodiscard]] absl::StatusOr<void*> Create(int mb, int chunk, std::int64_t bytes);
  // B / W: the entry's device memory. REQUIRES state ON_DEVICE, or RELOADING after
  // OrderReload. The pointer is valid until the next call that moves or frees the entry.
  [[nodiscard]] absl::StatusOr<void*> DeviceData(int mb, int chunk) const;
  // OFFLOAD: ON_DEVICE -> OFFLOADING. Takes a host slot and enqueues the D2H copy after the
  // compute work enqueued so far (the F that wrote the entry).
  [[nodiscard]] absl::Status StartOffload(int mb, int chunk);
  // RELEASE: OFFLOADING -> ON_HOST, without blocking. The entry's bytes leave the LOGICAL
  // accounting (device_bytes, device_entries) at once, in program order as the compiler models
  // them; the device block stays allocated in the arena (PHYSICALLY), on the pending list,
  // until its D2H copy has finished and ReclaimReleased (or an allocation under pressure)
  // returns it. With wait_for_copy_at_release it instead waits up to `timeout_seconds` for the
  // copy and frees the block at once; errors then: DeadlineExceeded (the entry stays
  // OFFLOADING). `timeout_seconds` is unused otherwise.
  [[nodiscard]] absl::Status FinishOffload(int mb, int chunk, double timeout_seconds);
  // Returns released blocks whose D2H copy has completed to the arena (which poisons them on
  // the compute queue, after the copy); `mode` says whether to wait (each wait bounded by
  // `timeout_seconds`). Returns how many blocks went back. Errors: DeadlineExceeded naming the
  // entry whose copy did not finish (blocks reclaimed before the wait stay reclaimed).
  [[nodiscard]] absl::StatusOr<int> ReclaimReleased(ReclaimMode mode, double timeout_seconds);
  // An arena block for anyone (the executor's P2P buffers): on ResourceExhausted, reclaims the
  // oldest released block (waiting for its copy, up to reclaim_timeout_seconds) and retries
  // until the request fits or nothing is pending. Errors: the arena's ResourceExhausted,
  // annotated with what was reclaimed; DeadlineExceeded from a wait.
  [[nodiscard]] absl::StatusOr<void*> AllocateReclaiming(std::int64_t bytes,
                                                         MemoryCategory category);
  // RELOAD: ON_HOST -> RELOADING. Allocates a device block (reclaiming released blocks when
  // the arena is full, as Create) and enqueues the H2D copy after the compute work enqueued so
  // far (which may still use the block's previous owner's bytes).
  [[nodiscard]] absl::Status StartReload(int mb, int chunk);
  // Before B, without blocking the caller on an asynchronous backend: compute work enqueued
  // from now on runs after the H2D copy (the compute queue waits on its event), and
  // DeviceData may be read by such work. The entry stays RELOADING, holding its host slot,
  // until FinishReload. (On the CPU backend the compute queue is the calling thread, so this
  // blocks until the copy is done, up to the backend's queue-wait timeout.)
  [[nodiscard]] absl::Status OrderReload(int mb, int chunk);
  // RELOADING -> ON_DEVICE. Waits up to `timeout_seconds` for the H2D copy, then returns the
  // host slot to the pool. The executor calls it right after enqueuing B (after OrderReload),
  // so the host waits while the GPU has B queued, not before. Errors: DeadlineExceeded (the
  // entry stays RELOADING).
  [[nodiscard]] absl::StatusOr<StashTransferTimes> FinishReload(int mb, int chunk,
                                                                double timeout_seconds);
  // B (unsplit) / W: ON_DEVICE -> gone; the device block returns to the arena.
  [[nodiscard]] absl::Status Free(int mb, int chunk);

  // RECOMPUTE / RECOMPUTE_LEAN, in two steps around the model's RecomputeSaved. Regrow: the
  // entry (ON_DEVICE, holding the retained block F wrote; or RELOADING once OrderReload ran,
  // when that block went to the host and back: FinishReload then follows, the retained block
  // still in place) gets a new device block of `bytes`
  // (the full entry; zero-filled while poisoning is on, as Create), counted at once, so for the
  // call's duration the logical bytes hold both blocks, as the compiler models it. Returns the
  // retained block and the new one. DropRetained: frees the retained block (the logical bytes
  // shrink by its size); the entry goes on with the new block as its device copy.
  // `in_place` (the model's B reads the retained block itself, StageModel::
  // BackwardReadsRetained; `bytes` is then unused): no block is allocated, `full` is the
  // retained block, nothing is counted, and DropRetained frees nothing, so the entry's device
  // block stays the retained one until Free (the compiler models it with
  // CostModel::lean_rebuild_bytes = 0).
  // Errors: FailedPrecondition for an entry that is neither of those or already regrown (or not
  // regrown, for DropRetained); the arena's errors as Create.
  struct Regrown {
    const void* retained = nullptr;
    void* full = nullptr;
  };
  [[nodiscard]] absl::StatusOr<Regrown> Regrow(int mb, int chunk, std::int64_t bytes,
                                               bool in_place = false);
  [[nodiscard]] absl::Status DropRetained(int mb, int chunk);

  // OK when no entry remains; else FailedPrecondition listing each entry and its state.
  // Pending released blocks are not entries (reclaim them with ReclaimReleased(kAll)).
  [[nodiscard]] absl::Status CheckEmpty() const;
  // Frees every entry and every pending released block whatever its state (after an error),
  // waiting up to `timeout_seconds` for each copy in flight first.
  void Clear(double timeout_seconds);

  // With the arena's poisoning on and host-accessible device memory: the byte offset of the
  // first kPoisonWord in the entry's device copy (REQUIRES ON_DEVICE), or -1 when there is none
  // (and always -1 when poisoning is off). Create zero-fills new blocks while poisoning is on,
  // so poison in an entry can only come from a release of its memory after it was created.
  [[nodiscard]] absl::StatusOr<std::int64_t> FindPoison(int mb, int chunk) const;

  std::optional<StashState> State(int mb, int chunk) const;
  int size() const { return static_cast<int>(entries_.size()); }
  // LOGICAL: entries whose device copy counts as held in program order (ON_DEVICE, OFFLOADING,
  // RELOADING) and their bytes; what the compiler predicts. A released block whose copy is
  // still running is not counted here but in pending_release_*.
  int device_entries() const { return device_entries_; }
  std::int64_t device_bytes() const { return device_bytes_; }
  // The most device_bytes since construction or ResetHighWater.
  std::int64_t device_high_water_bytes() const { return device_high_water_bytes_; }
  void ResetHighWater() { device_high_water_bytes_ = device_bytes_; }
  // Released blocks still allocated in the arena, waiting for their D2H copy (or a reclaim).
  int pending_release_blocks() const { return static_cast<int>(pending_.size()); }
  std::int64_t pending_release_bytes() const;
  // Host seconds spent waiting for D2H copies (release, reclaim, allocation under pressure)
  // since construction: callers take differences.
  double release_wait_seconds() const { return release_wait_seconds_; }

 private:
  struct Entry {
    StashState state = StashState::kOnDevice;
    std::int64_t bytes = 0;
    void* device = nullptr;  // null while ON_HOST
    HostSlot host;           // valid from StartOffload until FinishReload
    bool reload_ordered = false;  // OrderReload ran: compute work waits for the H2D copy
    bool release_pending = false;  // its released block is on pending_ (owns offload_done)
    std::optional<Event> offload_ready, offload_begin, offload_done;
    std::optional<Event> reload_ready, reload_begin, reload_done;
    // Between Regrow and DropRetained: the block F wrote, still counted in device_bytes_.
    void* retained = nullptr;
    std::int64_t retained_bytes = 0;
  };
  using Key = std::pair<int, int>;  // (mb, chunk)
  // A released device block waiting for its entry's D2H copy (the entry's offload_done).
  struct PendingRelease {
    Key key;
    void* block = nullptr;
    std::int64_t bytes = 0;
  };

  absl::StatusOr<Entry*> Find(int mb, int chunk, std::string_view action);
  absl::Status Expect(const Entry& entry, int mb, int chunk, StashState state,
                      std::string_view action) const;
  absl::StatusOr<Event> TakeEvent();
  void ReturnEvents(Entry& entry);
  absl::Status FreeDevice(Entry& entry);
  // Logical accounting of one entry's device copy.
  void CountDevice(std::int64_t bytes);
  void UncountDevice(std::int64_t bytes);
  // Host-waits the D2H copy of pending_[index], then frees its block (timing the wait).
  absl::Status ReclaimAt(std::size_t index, double timeout_seconds);
  // Reclaims the pending block of `key`, if any (before its events are recycled).
  absl::Status ReclaimEntry(const Key& key, double timeout_seconds);

  Backend& backend_;
  DeviceArena& arena_;
  HostPool& host_pool_;
  const ActivationStashOptions options_;
  std::map<Key, Entry> entries_;
  std::vector<Event> spare_events_;  // reused, so the steady state creates no events
  std::vector<PendingRelease> pending_;  // in release order (oldest first)
  int device_entries_ = 0;
  std::int64_t device_bytes_ = 0;
  std::int64_t device_high_water_bytes_ = 0;
  double release_wait_seconds_ = 0.0;
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_MEMORY_H_
