// The hardware interface of the runtime: device memory, in-order queues of three kinds (compute,
// D2H, H2D: one of each built in, more on request) with asynchronous copies, events between
// them, and a clock (DESIGN.md section 5).
//
// The CPU backend (here; target pipeoffload::backend_cpu) and the CUDA backend (cuda.h;
// pipeoffload::backend_cuda) implement the same contract, so every schedule, offload and byte
// count can be checked without a GPU; one test suite (tests/backend/backend_contract_test.cc)
// checks both against it. No CUDA types appear here.
//
// Host blocking, in short: CopyAsync, FillAsync, RecordEvent and (on device queues)
// QueueWaitEvent enqueue and return; WaitEvent and Synchronize block the caller, each bounded by
// its timeout; QueryEvent, EventTime and Stats never block. On the CPU backend the compute queue
// is the caller's thread: work enqueued there is done when the call returns.
#ifndef PIPEOFFLOAD_BACKEND_H_
#define PIPEOFFLOAD_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload {

class Backend;

// The three kinds of engine of one device. Work enqueued on one queue runs in enqueue order;
// work on different queues (of one kind or not) runs concurrently unless ordered by events.
enum class QueueKind : std::uint8_t {
  kCompute,  // the trainer's kernels: every StageModel call's work (stage_model.h) goes here
             // (CUDA: the compute stream; CPU: the calling thread)
  kD2H,      // device-to-host copies (offload)
  kH2D,      // host-to-device copies (reload)
};
inline constexpr int kNumQueueKinds = 3;
// "compute", "D2H", "H2D".
inline std::string_view QueueKindName(QueueKind kind) {
  switch (kind) {
    case QueueKind::kCompute:
      return "compute";
    case QueueKind::kD2H:
      return "D2H";
    case QueueKind::kH2D:
      return "H2D";
  }
  return "?";
}

// Queues of one kind a backend can have: the built-in one (lane 0) and up to
// kMaxQueuesPerKind - 1 made by Backend::CreateQueue.
inline constexpr int kMaxQueuesPerKind = 32;

// A queue of one backend, as a value: (owner, kind, lane). Lane 0 of each kind is built in
// (Backend::queue()); lanes 1, 2, ... of a kind come from Backend::CreateQueue, in that order.
class Queue {
 public:
  Queue(const Backend* owner, QueueKind kind, int lane = 0)
      : owner_(owner), kind_(kind), lane_(lane) {}
  const Backend* owner() const { return owner_; }
  QueueKind kind() const { return kind_; }
  int lane() const { return lane_; }
  friend bool operator==(const Queue&, const Queue&) = default;

 private:
  const Backend* owner_;
  QueueKind kind_;
  int lane_;
};

// "compute", "D2H", "H2D" for lane 0; "D2H lane 2" for the others (error messages).
inline std::string QueueName(const Queue& queue) {
  std::string name(QueueKindName(queue.kind()));
  if (queue.lane() != 0) name += " lane " + std::to_string(queue.lane());
  return name;
}

// An event of one backend, as a value: (owner, id). Created by Backend::CreateEvent; copies name
// the same event. An event never recorded counts as complete (CUDA semantics).
class Event {
 public:
  Event(const Backend* owner, std::int64_t id) : owner_(owner), id_(id) {}
  const Backend* owner() const { return owner_; }
  std::int64_t id() const { return id_; }
  friend bool operator==(const Event&, const Event&) = default;

 private:
  const Backend* owner_;
  std::int64_t id_;
};

// Counters a test can read to prove, e.g., that the steady state makes no device allocation.
struct BackendStats {
  std::int64_t device_allocations = 0;  // AllocateDevice calls that succeeded
  std::int64_t host_allocations = 0;    // AllocateHost calls that succeeded
  std::int64_t bytes_d2h = 0;           // bytes copied on D2H queues (every lane)
  std::int64_t bytes_h2d = 0;           // bytes copied on H2D queues (every lane)
  std::int64_t copies = 0;              // copies on any queue
};

// One device. Thread-safe: any thread may call any method (the runtime uses one backend per
// pipeline stage from one thread, but copy engines and tests call in from others).
//
// Errors common to every method: InvalidArgument for a Queue or Event of another backend, a
// queue lane the backend did not create, an unknown event id, or a negative size.
class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0", ...
  virtual std::string Name() const = 0;
  // True when the host may read and write device memory directly (the CPU backend). When
  // false, host-buffer transports need staging copies.
  virtual bool DeviceMemoryIsHostAccessible() const = 0;

  // Device memory, `bytes` > 0, aligned to at least 256 bytes. Only DeviceArena (at init and
  // teardown) and the calibration probes (calibrate.h, at set-up) call these: in the steady
  // state nothing allocates (cudaMalloc/cudaFree synchronize the device). Errors: ResourceExhausted when the device has no room.
  [[nodiscard]] virtual absl::StatusOr<void*> AllocateDevice(std::int64_t bytes) = 0;
  // REQUIRES: `ptr` came from AllocateDevice and no queued work still uses it.
  virtual void FreeDevice(void* ptr) = 0;

  // Host memory the copy engines can reach at full speed (pinned on CUDA), `bytes` > 0.
  // Only HostPool calls these, at init and teardown.
  [[nodiscard]] virtual absl::StatusOr<void*> AllocateHost(std::int64_t bytes) = 0;
  virtual void FreeHost(void* ptr) = 0;

  // The built-in queue of `kind` (lane 0).
  Queue queue(QueueKind kind) const { return Queue(this, kind); }

  // Creates another in-order queue of `kind` (the next lane: 1, 2, ...), for a component that
  // needs its own lane, e.g. an engine whose work must overlap the trainer's compute queue or
  // whose copies must not queue behind other copies of the same direction. It behaves as the
  // built-in queue of its kind in every method, lives as long as the backend, and Synchronize
  // covers it. Call at set-up (it may create a stream or a thread). Backends: CUDA, another
  // non-blocking stream; CPU, an extra D2H or H2D lane gets its own worker thread (copy engine)
  // and an extra compute lane is, like the built-in one, the caller's thread.
  // Errors: ResourceExhausted when the backend already has kMaxQueuesPerKind queues of `kind`;
  // Unimplemented for a backend without extra queues (the default, e.g. test wrappers).
  [[nodiscard]] virtual absl::StatusOr<Queue> CreateQueue(QueueKind kind) {
    return absl::UnimplementedError(Name() + ": this backend has no extra " +
                                    std::string(QueueKindName(kind)) + " queues");
  }

  // Enqueues a copy of `bytes` bytes from `src` to `dst` on `queue` and returns at once. On the
  // D2H queue `src` is device memory and `dst` host memory, on H2D the reverse, on the compute
  // queue both are device memory. Both buffers must stay valid (and `src` unchanged) until an
  // event recorded on `queue` after this call completes.
  [[nodiscard]] virtual absl::Status CopyAsync(Queue queue, void* dst, const void* src,
                                               std::int64_t bytes) = 0;

  // Enqueues filling `bytes` bytes of device memory at `dst` (4-byte aligned, `bytes` a multiple
  // of 4) with the 32-bit word `pattern`. Used to poison released memory.
  [[nodiscard]] virtual absl::Status FillAsync(Queue queue, void* dst, std::uint32_t pattern,
                                               std::int64_t bytes) = 0;

  // Events. CreateEvent may allocate; callers keep and reuse events in the steady state.
  [[nodiscard]] virtual absl::StatusOr<Event> CreateEvent() = 0;
  // Destroying an event with pending work is allowed; that work still runs.
  virtual void DestroyEvent(Event event) = 0;
  // Marks `event` pending until all work enqueued on `queue` so far has finished; re-recording
  // replaces the previous capture.
  [[nodiscard]] virtual absl::Status RecordEvent(Event event, Queue queue) = 0;
  // Work enqueued on `queue` after this call starts only once `event`'s current capture has
  // completed. Returns at once on device queues; on the CPU backend's compute queue (the
  // caller's thread) it blocks, up to the backend's queue-wait timeout (DeadlineExceeded).
  [[nodiscard]] virtual absl::Status QueueWaitEvent(Queue queue, Event event) = 0;
  // True once the event's captured work has finished (or it was never recorded).
  [[nodiscard]] virtual absl::StatusOr<bool> QueryEvent(Event event) = 0;
  // Blocks the calling thread until the event completes. Errors: DeadlineExceeded after
  // `timeout_seconds`, naming the event and the queue it was recorded on.
  [[nodiscard]] virtual absl::Status WaitEvent(Event event, double timeout_seconds) = 0;
  // The clock time (NowSeconds' scale) at which the event completed.
  // Errors: FailedPrecondition when it has not completed or was never recorded.
  [[nodiscard]] virtual absl::StatusOr<double> EventTime(Event event) = 0;

  // Blocks until every queue is idle. Errors: DeadlineExceeded after `timeout_seconds`.
  [[nodiscard]] virtual absl::Status Synchronize(double timeout_seconds) = 0;

  // Seconds on a monotonic clock shared by every backend of this machine (so timelines of
  // stages on threads or processes of one host line up).
  virtual double NowSeconds() const = 0;

  virtual BackendStats Stats() const = 0;
};

// Options of the CPU backend. The fault-injection fields make the copy engines sleep a random
// time (seeded, reproducible) before each copy, which exposes a missing event wait as a data
// race the poisoning catches.
struct CpuBackendOptions {
  double min_copy_delay_seconds = 0.0;
  double max_copy_delay_seconds = 0.0;  // 0 = no fault injection
  std::uint64_t fault_seed = 1;
  // How long QueueWaitEvent on the compute queue (the caller's thread) may block.
  double queue_wait_timeout_seconds = 60.0;
};

// The CPU backend: "device" memory is host memory; every compute queue is the calling thread
// (work enqueued on it runs before the call returns); one worker thread per copy queue (the
// built-in D2H and H2D ones and each created by CreateQueue) acts as its engine; events are
// completion flags with condition variables.
// Errors: InvalidArgument for negative or inverted delays.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(
    const CpuBackendOptions& options = {});

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_BACKEND_H_
