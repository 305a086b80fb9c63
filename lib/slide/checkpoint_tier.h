// Activation checkpoints on the NVMe tier (SlidingOptions::nvme_checkpoint_fraction): the
// checkpoints of some units live in one NvmeStore file (a 4 KiB-aligned record per (unit, mb))
// instead of pinned host memory, and pass through a small ring of pinned staging buffers.
//
//   save  engine thread: AcquireForSave (host wait for a free buffer), D2H into it, record its
//         event, SaveEnqueued. Tier thread: waits the event, writes the buffer to the file,
//         waits the write; the buffer is free again.
//   load  tier thread: once every save of the round has been handed over, reads records into
//         free buffers in load order (prefetch), each only after its own write finished.
//         Engine thread: AcquireLoaded (host wait for that read), H2D from it, record its
//         event, LoadEnqueued. Tier thread: waits the event; the buffer is free again.
//
// Invariants:
//  - A buffer is in one state: free -> saving (lent to the engine, its D2H enqueued or about to
//    be) -> writing -> free, or free -> reading -> loaded -> loading (lent, H2D) -> free. It is
//    handed out again only when free, i.e. after the write or the H2D that last used it has
//    finished: a copy or a drive request never lands in a buffer something still reads.
//  - A round is one step: every record saved once (any order), then loaded once in
//    `load_order`. Reads start only after the round's last save was handed over, so reads
//    never take buffers the forward's saves wait for; they run in load order, so the buffer
//    the engine waits for is always among the first reads issued (no deadlock with K >= 1).
//    A record is read only after its write finished (the store refuses overlapping requests).
//  - The tier thread waits only for things that finish on their own (copies already enqueued,
//    drive requests already submitted), oldest first, each bounded by timeout_seconds.
//  - Errors are sticky: the first one (a failed copy wait, a failed drive request, a protocol
//    breach) is kept, the thread stops, and every later call returns it. No call blocks longer
//    than timeout_seconds.
#ifndef PIPEOFFLOAD_LIB_SLIDE_CHECKPOINT_TIER_H_
#define PIPEOFFLOAD_LIB_SLIDE_CHECKPOINT_TIER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/slide/nvme_io.h"
#include "lib/slide/recorder.h"
#include "pipeoffload/backend.h"

namespace pipeoffload::internal {

struct CheckpointTierOptions {
  std::string dir;                   // SlidingOptions::nvme_dir
  std::int64_t checkpoint_bytes = 0;  // one checkpoint (SlidingModelShape::activation_bytes), > 0
  // Every checkpoint on the drive as (unit, mb), in the order the backward loads them.
  std::vector<std::pair<int, int>> load_order;
  int staging_buffers = 0;  // the ring, >= 1
  double timeout_seconds = 600.0;
  std::vector<std::string> unit_names;  // for trace records
};

class CheckpointTier {
 public:
  // A staging buffer lent to the engine: `data` (checkpoint_bytes, pinned) and the event the
  // engine records after its copy on the queue that reads or writes it.
  struct Lent {
    int buffer = -1;
    void* data = nullptr;
    Event event{nullptr, -1};
  };

  // Creates the file (its records rounded up to 4 KiB), the pinned ring (registered with the
  // store as fixed buffers), its events and the tier thread. `start`: tests' injected store
  // backend (nvme_io.h), or null. Errors: InvalidArgument for bad options; the store's (a
  // missing, read-only or full directory), annotated "the NVMe checkpoint tier (--nvme-dir)";
  // the backend's for the ring and the events.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CheckpointTier>> Create(
      Backend& backend, const CheckpointTierOptions& options, SlideRecorder& recorder,
      const IoBackendStarter* start = nullptr);
  // Stops the thread (a request in flight is finished by the store's destructor). REQUIRES:
  // no copy still reads or writes the ring (the engine synchronizes its backend first).
  ~CheckpointTier();
  CheckpointTier(const CheckpointTier&) = delete;
  CheckpointTier& operator=(const CheckpointTier&) = delete;

  // Engine thread. A free buffer for (unit, mb)'s save. Errors: DeadlineExceeded when none is
  // free within timeout_seconds; Internal for a record not on the drive, saved twice in a
  // round, or saved while the round's loads are pending; the sticky error.
  [[nodiscard]] absl::StatusOr<Lent> AcquireForSave(int unit, int mb);
  // The D2H into `buffer` and its event are enqueued: the tier writes it once the event fires.
  [[nodiscard]] absl::Status SaveEnqueued(int buffer);
  // The buffer holding (unit, mb) as read back. REQUIRES: the round's saves are all handed
  // over. Errors: Internal when (unit, mb) is not the next record in load_order;
  // DeadlineExceeded naming the record; the sticky error (e.g. the read's DataLoss).
  [[nodiscard]] absl::StatusOr<Lent> AcquireLoaded(int unit, int mb);
  // The H2D from `buffer` and its event are enqueued: the buffer is free once the event fires.
  [[nodiscard]] absl::Status LoadEnqueued(int buffer);

  // Drive bytes written and read since the last call.
  std::int64_t TakeBytes();
  std::int64_t staging_bytes() const;
  std::string Describe() const;  // the store's

 private:
  CheckpointTier() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_CHECKPOINT_TIER_H_
