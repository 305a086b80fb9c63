// A test Backend that forwards to another one but can hold the D2H queue shut: while the gate
// is closed, work enqueued on the D2H queue (copies, fills, recordings, queue waits) is kept
// here, in order, and the events it records read as pending (QueryEvent false; WaitEvent
// blocks until the gate opens or the timeout expires). Open() hands the held work to the
// wrapped backend, whose copy engine then runs it as usual. This makes "the D2H copy is still
// in flight" a deterministic state instead of a matter of timing. It also counts the blocks and
// events alive through it and can fail allocations on request (FailAllocationsAfter), for leak
// checks on every error path of a caller that allocates from the backend directly.
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

#include "absl/strings/str_cat.h"
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
    if (absl::Status injected = InjectedFailure(bytes, "device"); !injected.ok()) return injected;
    absl::StatusOr<void*> ptr = inner_.AllocateDevice(bytes);
    if (ptr.ok()) ++live_device_blocks_;
    return ptr;
  }
  void FreeDevice(void* ptr) override {
    --live_device_blocks_;
    inner_.FreeDevice(ptr);
  }
  absl::StatusOr<void*> AllocateHost(std::int64_t bytes) override {
    if (absl::Status injected = InjectedFailure(bytes, "host"); !injected.ok()) return injected;
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
  // Events created through this backend and not destroyed yet.
  int live_events() const { return live_events_; }
  // Once `successes` more allocations (device or host) have succeeded, every further one fails
  // with ResourceExhausted, as a full device would, so a test can fail each allocation of a
  // caller in turn and check its error path; -1 (the default): none fails.
  void FailAllocationsAfter(int successes) { allocations_left_ = successes; }
  absl::Status CopyAsync(Queue queue, void* dst, const void* src, std::int64_t bytes) override;
  absl::Status FillAsync(Queue queue, void* dst, std::uint32_t pattern,
                         std::int64_t bytes) override;
  absl::StatusOr<Event> CreateEvent() override {
    absl::StatusOr<Event> event = inner_.CreateEvent();
    if (event.ok()) ++live_events_;
    return event;
  }
  void DestroyEvent(Event event) override {
    --live_events_;
    inner_.DestroyEvent(event);
  }
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
  // FailAllocationsAfter's budget: OK (and one fewer left) or the injected failure.
  absl::Status InjectedFailure(std::int64_t bytes, const char* what) {
    if (allocations_left_ < 0) return absl::OkStatus();
    if (allocations_left_ > 0) {
      --allocations_left_;
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "gated backend: injected failure allocating ", bytes, " bytes of ", what, " memory"));
  }

  Backend& inner_;
  mutable std::mutex mu_;
  std::condition_variable opened_;
  bool closed_ = false;
  std::vector<std::function<absl::Status()>> held_;  // D2H work, in enqueue order
  std::set<std::int64_t> held_events_;               // ids recorded by held work
  std::atomic<int> live_device_blocks_{0};
  std::atomic<int> live_host_blocks_{0};
  std::atomic<int> live_events_{0};
  std::atomic<int> allocations_left_{-1};
};

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_BACKEND_GATED_BACKEND_H_
