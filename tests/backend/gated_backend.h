// A test Backend that forwards to another one but can hold the D2H queue shut: while the gate
// is closed, work enqueued on the D2H queue (copies, fills, recordings, queue waits) is kept
// here, in order, and the events it records read as pending (QueryEvent false; WaitEvent
// blocks until the gate opens or the timeout expires). Open() hands the held work to the
// wrapped backend, whose copy engine then runs it as usual. This makes "the D2H copy is still
// in flight" a deterministic state instead of a matter of timing.
//
// Limitation (kept simple on purpose): a queue wait of the H2D queue on an event held behind
// the gate is refused with FailedPrecondition; open the gate before such a wait.
#ifndef PIPEOFFLOAD_TESTS_BACKEND_GATED_BACKEND_H_
#define PIPEOFFLOAD_TESTS_BACKEND_GATED_BACKEND_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "pipeoffload/backend.h"

namespace pipeoffload::testing {

class GatedBackend final : public Backend {
 public:
  // `inner` must outlive this backend. The gate starts open.
  explicit GatedBackend(Backend& inner) : inner_(inner) {}

  void Close();
  void Open();
  bool closed() const;
  int held_tasks() const;

  std::string Name() const override { return "gated:" + inner_.Name(); }
  bool DeviceMemoryIsHostAccessible() const override {
    return inner_.DeviceMemoryIsHostAccessible();
  }
  absl::StatusOr<void*> AllocateDevice(std::int64_t bytes) override {
    absl::StatusOr<void*> ptr = inner_.AllocateDevice(bytes);
    if (ptr.ok()) ++live_device_blocks_;
    return ptr;
  }
  void FreeDevice(void* ptr) override {
    --live_device_blocks_;
    inner_.FreeDevice(ptr);
  }
  absl::StatusOr<void*> AllocateHost(std::int64_t bytes) override {
    absl::StatusOr<void*> ptr = inner_.AllocateHost(bytes);
    if (ptr.ok()) ++live_host_blocks_;
    return ptr;
  }
  void FreeHost(void* ptr) override {
    --live_host_blocks_;
    inner_.FreeHost(ptr);
  }
  // Blocks allocated through this backend and not freed yet (a leak check for callers that
  // allocate from the backend directly).
  int live_device_blocks() const { return live_device_blocks_; }
  int live_host_blocks() const { return live_host_blocks_; }
  absl::Status CopyAsync(Queue queue, void* dst, const void* src, std::int64_t bytes) override;
  absl::Status FillAsync(Queue queue, void* dst, std::uint32_t pattern,
                         std::int64_t bytes) override;
  absl::StatusOr<Event> CreateEvent() override { return inner_.CreateEvent(); }
  void DestroyEvent(Event event) override { inner_.DestroyEvent(event); }
  absl::Status RecordEvent(Event event, Queue queue) override;
  absl::Status QueueWaitEvent(Queue queue, Event event) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status WaitEvent(Event event, double timeout_seconds) override;
  absl::StatusOr<double> EventTime(Event event) override;
  absl::Status Synchronize(double timeout_seconds) override;
  double NowSeconds() const override { return inner_.NowSeconds(); }
  BackendStats Stats() const override { return inner_.Stats(); }

 private:
  // The wrapped backend's queue of the same kind, or InvalidArgument for a foreign queue.
  absl::StatusOr<Queue> Inner(Queue queue) const;
  // Holds `task` when `queue` is the D2H queue and the gate is closed; returns whether it did.
  bool MaybeHold(QueueKind kind, std::function<absl::Status()> task);
  bool IsHeld(Event event) const;

  Backend& inner_;
  mutable std::mutex mu_;
  std::condition_variable opened_;
  bool closed_ = false;
  std::vector<std::function<absl::Status()>> held_;  // D2H work, in enqueue order
  std::set<std::int64_t> held_events_;               // ids recorded by held work
  std::atomic<int> live_device_blocks_{0};
  std::atomic<int> live_host_blocks_{0};
};

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_BACKEND_GATED_BACKEND_H_
