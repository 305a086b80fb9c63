// The CUDA backend: one device's memory, non-blocking streams as the compute, D2H and H2D
// queues (one of each built in, more from CreateQueue), and CUDA events between them (cuda.h has
// the contract; cpu_backend.cc is the oracle).
//
// Invariants:
//  - Event ids index slots_. A slot's cudaEvent_t is created once, with timing enabled (EventTime
//    needs it), and destroyed only with the backend: DestroyEvent just frees the slot, so a
//    thread still polling an event it copied out of the slot never touches a destroyed event,
//    and CreateEvent reuses the event without a CUDA call.
//  - `records` counts RecordEvent calls since the slot was handed out. At 0 the event is
//    "never recorded": it counts as complete (Query, Wait), a queue wait on it is a no-op, and
//    EventTime fails. This is what makes a reused cudaEvent_t, whose last capture belongs to
//    its previous owner, behave like a fresh one.
//  - RecordEvent and QueueWaitEvent call CUDA while holding mu_, so they are atomic with respect
//    to DestroyEvent / CreateEvent; host waits copy the cudaEvent_t out and poll without mu_.
//  - Waits poll (cuda_status.h PollUntil) with a deadline; nothing calls cudaEventSynchronize,
//    cudaStreamSynchronize or cudaDeviceSynchronize, which cannot time out.
//  - Every public method holds a ScopedDevice for device_ while it calls CUDA.
//  - device_blocks_ / host_blocks_ hold live allocations; the destructor frees leftovers after a
//    bounded drain of the streams.
//  - streams_[kind][lane] and sync_events_[kind][lane] exist for lane < lanes_[kind]. A lane is
//    written (under lanes_mu_) before lanes_[kind] is raised past it (release) and never
//    changes again until destruction, so readers check the lane against lanes_ (acquire) and
//    then read its stream without a lock.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/backend/cuda/event_clock.h"
#include "lib/backend/cuda/fill_kernel.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload {
namespace {

using internal::ScopedDevice;

// How long the destructor waits for queued work before it frees memory anyway.
constexpr double kTeardownSeconds = 10.0;

int QueueIndex(QueueKind kind) { return static_cast<int>(kind); }

struct EventSlot {
  cudaEvent_t event = nullptr;
  bool live = false;
  std::uint64_t records = 0;
  QueueKind recorded_on = QueueKind::kCompute;
  int recorded_lane = 0;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device), name_(absl::StrCat("cuda:", device)) {}
  ~CudaBackend() override;

  // Creates the streams, the synchronization events and the clock. The destructor releases
  // whatever exists if a step fails.
  absl::Status Init();

  std::string Name() const override { return name_; }
  bool DeviceMemoryIsHostAccessible() const override { return false; }

  absl::StatusOr<void*> AllocateDevice(std::int64_t bytes) override;
  void FreeDevice(void* ptr) override;
  absl::StatusOr<void*> AllocateHost(std::int64_t bytes) override;
  void FreeHost(void* ptr) override;

  absl::StatusOr<Queue> CreateQueue(QueueKind kind) override;

  absl::Status CopyAsync(Queue queue, void* dst, const void* src, std::int64_t bytes) override;
  absl::Status FillAsync(Queue queue, void* dst, std::uint32_t pattern,
                         std::int64_t bytes) override;

  absl::StatusOr<Event> CreateEvent() override;
  void DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Queue queue) override;
  absl::Status QueueWaitEvent(Queue queue, Event event) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status WaitEvent(Event event, double timeout_seconds) override;
  absl::StatusOr<double> EventTime(Event event) override;
  absl::Status Synchronize(double timeout_seconds) override;

  double NowSeconds() const override { return internal::MonotonicSeconds(); }
  BackendStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  int device() const { return device_; }
  // REQUIRES: `queue` passed CheckQueue (a lane that exists).
  cudaStream_t stream(const Queue& queue) const {
    return streams_[QueueIndex(queue.kind())][queue.lane()];
  }
  bool HasLane(const Queue& queue) const {
    return queue.lane() >= 0 &&
           queue.lane() < lanes_[QueueIndex(queue.kind())].load(std::memory_order_acquire);
  }

 private:
  // Creates lane `lane` of `kind`'s stream and its Synchronize event. REQUIRES: lanes_mu_ held
  // (or the constructor's thread), the device current.
  absl::Status CreateLane(int kind, int lane);
  absl::Status CheckQueue(Queue queue, const char* call) const;
  // The slot of a live event of this backend. REQUIRES: mu_ held.
  absl::StatusOr<EventSlot*> SlotLocked(Event event, const char* call);
  absl::StatusOr<void*> Allocate(std::int64_t bytes, bool host);
  std::string Where(const char* call) const { return absl::StrCat(name_, ": ", call); }

  const int device_;
  const std::string name_;
  std::mutex lanes_mu_;  // serializes CreateQueue
  cudaStream_t streams_[kNumQueueKinds][kMaxQueuesPerKind] = {};
  // Synchronize's events, one per stream (owned by Synchronize under sync_mu_ once created).
  cudaEvent_t sync_events_[kNumQueueKinds][kMaxQueuesPerKind] = {};
  std::atomic<int> lanes_[kNumQueueKinds] = {0, 0, 0};
  std::unique_ptr<internal::EventClock> clock_;

  mutable std::mutex mu_;
  std::vector<EventSlot> slots_;
  std::vector<std::int64_t> free_slots_;
  std::unordered_set<void*> device_blocks_;
  std::unordered_set<void*> host_blocks_;
  BackendStats stats_;

  std::mutex sync_mu_;  // serializes Synchronize, which owns sync_events_
};

absl::Status CudaBackend::CreateLane(int kind, int lane) {
  // Non-blocking: the legacy default stream (used by careless library code) must not
  // serialize our queues against each other.
  PO_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&streams_[kind][lane], cudaStreamNonBlocking));
  PO_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&sync_events_[kind][lane], cudaEventDisableTiming));
  lanes_[kind].store(lane + 1, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status CudaBackend::Init() {
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  for (int k = 0; k < kNumQueueKinds; ++k) PO_RETURN_IF_ERROR(CreateLane(k, 0));
  PO_ASSIGN_OR_RETURN(clock_, internal::EventClock::Create());
  return absl::OkStatus();
}

absl::StatusOr<Queue> CudaBackend::CreateQueue(QueueKind kind) {
  std::lock_guard<std::mutex> lock(lanes_mu_);
  const int k = QueueIndex(kind);
  const int lane = lanes_[k].load(std::memory_order_relaxed);
  if (lane >= kMaxQueuesPerKind) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Where("CreateQueue"), ": already ", lane, " ", std::string(QueueKindName(kind)),
        " queues, the most a backend has (kMaxQueuesPerKind)"));
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_RETURN_IF_ERROR(Annotate(CreateLane(k, lane), Where("CreateQueue")));
  return Queue(this, kind, lane);
}

CudaBackend::~CudaBackend() {
  ScopedDevice guard;
  if (absl::Status entered = guard.Enter(device_); !entered.ok()) {
    std::fprintf(stderr, "pipeoffload: %s teardown: %s\n", name_.c_str(),
                 std::string(entered.message()).c_str());
  }
  if (lanes_[0] > 0 && lanes_[1] > 0 && lanes_[2] > 0) {
    if (absl::Status idle = Synchronize(kTeardownSeconds); !idle.ok()) {
      std::fprintf(stderr, "pipeoffload: %s teardown frees memory that queued work may use: %s\n",
                   name_.c_str(), std::string(idle.message()).c_str());
    }
  }
  clock_.reset();
  for (const EventSlot& slot : slots_) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(slot.event));
  for (int k = 0; k < kNumQueueKinds; ++k) {
    for (int lane = 0; lane < kMaxQueuesPerKind; ++lane) {
      if (sync_events_[k][lane] != nullptr) {
        PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(sync_events_[k][lane]));
      }
      if (streams_[k][lane] != nullptr) {
        PO_CUDA_LOG_IF_ERROR(cudaStreamDestroy(streams_[k][lane]));
      }
    }
  }
  for (void* ptr : device_blocks_) PO_CUDA_LOG_IF_ERROR(cudaFree(ptr));
  for (void* ptr : host_blocks_) PO_CUDA_LOG_IF_ERROR(cudaFreeHost(ptr));
}

absl::Status CudaBackend::CheckQueue(Queue queue, const char* call) const {
  if (queue.owner() != this) {
    return absl::InvalidArgumentError(absl::StrCat(Where(call), ": the ", QueueName(queue),
                                                   " queue belongs to another backend"));
  }
  if (!HasLane(queue)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(call), ": no ", QueueName(queue), " queue (",
        lanes_[QueueIndex(queue.kind())].load(), " ", std::string(QueueKindName(queue.kind())),
        " queues exist)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<EventSlot*> CudaBackend::SlotLocked(Event event, const char* call) {
  if (event.owner() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(call), ": event ", event.id(), " belongs to another backend"));
  }
  if (event.id() < 0 || event.id() >= static_cast<std::int64_t>(slots_.size()) ||
      !slots_[static_cast<std::size_t>(event.id())].live) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(call), ": event ", event.id(), " does not exist (destroyed?)"));
  }
  return &slots_[static_cast<std::size_t>(event.id())];
}

absl::StatusOr<void*> CudaBackend::Allocate(std::int64_t bytes, bool host) {
  const char* what = host ? "pinned host" : "device";
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": cannot allocate ", bytes, " bytes of ", what, " memory"));
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  void* ptr = nullptr;
  const auto size = static_cast<std::size_t>(bytes);
  // Portable: pinned for every context, so stages on other devices of this process can use it.
  const cudaError_t error =
      host ? cudaHostAlloc(&ptr, size, cudaHostAllocPortable) : cudaMalloc(&ptr, size);
  if (error != cudaSuccess) {
    absl::Status status = internal::CudaStatus(
        error, host ? "cudaHostAlloc" : "cudaMalloc", __FILE__, __LINE__);
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    std::string memory;
    if (!host && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      memory = absl::StrCat(" (the device has ", free_bytes, " of ", total_bytes,
                            " bytes free)");
    }
    static_cast<void>(cudaGetLastError());
    return Annotate(status, absl::StrCat(name_, ": cannot allocate ", bytes, " bytes of ", what,
                                         " memory", memory));
  }
  std::lock_guard<std::mutex> lock(mu_);
  (host ? host_blocks_ : device_blocks_).insert(ptr);
  ++(host ? stats_.host_allocations : stats_.device_allocations);
  return ptr;
}

absl::StatusOr<void*> CudaBackend::AllocateDevice(std::int64_t bytes) {
  return Allocate(bytes, /*host=*/false);
}

absl::StatusOr<void*> CudaBackend::AllocateHost(std::int64_t bytes) {
  return Allocate(bytes, /*host=*/true);
}

void CudaBackend::FreeDevice(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PO_CHECK_MSG(device_blocks_.erase(ptr) == 1,
                 "cuda backend: FreeDevice of memory it did not allocate");
  }
  ScopedDevice guard;
  guard.Enter(device_).IgnoreError();  // cudaFree acts on the pointer's own context anyway
  PO_CUDA_LOG_IF_ERROR(cudaFree(ptr));
}

void CudaBackend::FreeHost(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PO_CHECK_MSG(host_blocks_.erase(ptr) == 1,
                 "cuda backend: FreeHost of memory it did not allocate");
  }
  ScopedDevice guard;
  guard.Enter(device_).IgnoreError();
  PO_CUDA_LOG_IF_ERROR(cudaFreeHost(ptr));
}

absl::Status CudaBackend::CopyAsync(Queue queue, void* dst, const void* src,
                                    std::int64_t bytes) {
  PO_RETURN_IF_ERROR(CheckQueue(queue, "CopyAsync"));
  if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where("CopyAsync"), " on the ", QueueName(queue), " queue of ", bytes,
        " bytes needs non-null buffers and a non-negative size"));
  }
  if (bytes == 0) return absl::OkStatus();
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  // cudaMemcpyDefault: unified addressing tells device from host memory, so a wrong-direction
  // queue still copies correctly (it only loses the overlap the right queue would give).
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes),
                                          cudaMemcpyDefault, stream(queue)));
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.copies;
  if (queue.kind() == QueueKind::kD2H) stats_.bytes_d2h += bytes;
  if (queue.kind() == QueueKind::kH2D) stats_.bytes_h2d += bytes;
  return absl::OkStatus();
}

absl::Status CudaBackend::FillAsync(Queue queue, void* dst, std::uint32_t pattern,
                                    std::int64_t bytes) {
  PO_RETURN_IF_ERROR(CheckQueue(queue, "FillAsync"));
  if (bytes < 0 || bytes % 4 != 0 || reinterpret_cast<std::uintptr_t>(dst) % 4 != 0 ||
      (bytes > 0 && dst == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where("FillAsync"), " needs a 4-byte aligned device buffer and a size that is a "
        "multiple of 4, got ", bytes, " bytes"));
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_CUDA_RETURN_IF_ERROR(internal::LaunchFillWords(static_cast<std::uint32_t*>(dst), pattern,
                                                    bytes / 4, stream(queue)));
  return absl::OkStatus();
}

absl::StatusOr<Event> CudaBackend::CreateEvent() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!free_slots_.empty()) {
    const std::int64_t id = free_slots_.back();
    free_slots_.pop_back();
    EventSlot& slot = slots_[static_cast<std::size_t>(id)];
    slot.live = true;
    slot.records = 0;
    return Event(this, id);
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  cudaEvent_t event = nullptr;
  // Timing enabled (no cudaEventDisableTiming): EventTime measures from these events.
  PO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDefault));
  slots_.push_back(EventSlot{event, true, 0, QueueKind::kCompute, 0});
  return Event(this, static_cast<std::int64_t>(slots_.size()) - 1);
}

void CudaBackend::DestroyEvent(Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<EventSlot*> slot = SlotLocked(event, "DestroyEvent");
  if (!slot.ok()) return;
  (*slot)->live = false;
  free_slots_.push_back(event.id());
}

absl::Status CudaBackend::RecordEvent(Event event, Queue queue) {
  PO_RETURN_IF_ERROR(CheckQueue(queue, "RecordEvent"));
  std::lock_guard<std::mutex> lock(mu_);
  PO_ASSIGN_OR_RETURN(EventSlot * slot, SlotLocked(event, "RecordEvent"));
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot->event, stream(queue)));
  ++slot->records;
  slot->recorded_on = queue.kind();
  slot->recorded_lane = queue.lane();
  return absl::OkStatus();
}

absl::Status CudaBackend::QueueWaitEvent(Queue queue, Event event) {
  PO_RETURN_IF_ERROR(CheckQueue(queue, "QueueWaitEvent"));
  std::lock_guard<std::mutex> lock(mu_);
  PO_ASSIGN_OR_RETURN(EventSlot * slot, SlotLocked(event, "QueueWaitEvent"));
  if (slot->records == 0) return absl::OkStatus();  // never recorded: complete
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream(queue), slot->event, 0));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaBackend::QueryEvent(Event event) {
  cudaEvent_t cuda_event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PO_ASSIGN_OR_RETURN(EventSlot * slot, SlotLocked(event, "QueryEvent"));
    if (slot->records == 0) return true;
    cuda_event = slot->event;
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const cudaError_t query = cudaEventQuery(cuda_event);
  if (query == cudaSuccess) return true;
  if (query == cudaErrorNotReady) return false;
  return internal::CudaStatus(query, "cudaEventQuery", __FILE__, __LINE__);
}

absl::Status CudaBackend::WaitEvent(Event event, double timeout_seconds) {
  cudaEvent_t cuda_event = nullptr;
  Queue recorded_on = queue(QueueKind::kCompute);
  {
    std::lock_guard<std::mutex> lock(mu_);
    PO_ASSIGN_OR_RETURN(EventSlot * slot, SlotLocked(event, "WaitEvent"));
    if (slot->records == 0) return absl::OkStatus();
    cuda_event = slot->event;
    recorded_on = Queue(this, slot->recorded_on, slot->recorded_lane);
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_ASSIGN_OR_RETURN(const bool done, internal::PollUntil(
                                           [&]() -> absl::StatusOr<bool> {
                                             const cudaError_t query = cudaEventQuery(cuda_event);
                                             if (query == cudaSuccess) return true;
                                             if (query == cudaErrorNotReady) return false;
                                             return internal::CudaStatus(
                                                 query, "cudaEventQuery", __FILE__, __LINE__);
                                           },
                                           timeout_seconds));
  if (done) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s: event %d (recorded on the %s queue) not complete after %.3f s", name_, event.id(),
      QueueName(recorded_on), timeout_seconds));
}

absl::StatusOr<double> CudaBackend::EventTime(Event event) {
  cudaEvent_t cuda_event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PO_ASSIGN_OR_RETURN(EventSlot * slot, SlotLocked(event, "EventTime"));
    if (slot->records == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where("EventTime"), " of event ", event.id(), ", which was never recorded"));
    }
    cuda_event = slot->event;
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const cudaError_t query = cudaEventQuery(cuda_event);
  if (query == cudaErrorNotReady) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where("EventTime"), " of event ", event.id(), ", which has not completed"));
  }
  if (query != cudaSuccess) {
    return internal::CudaStatus(query, "cudaEventQuery", __FILE__, __LINE__);
  }
  return clock_->EventSeconds(cuda_event);
}

absl::Status CudaBackend::Synchronize(double timeout_seconds) {
  std::lock_guard<std::mutex> sync_lock(sync_mu_);
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  // Every queue that exists now, extra lanes included (a lane created meanwhile is idle).
  std::vector<Queue> queues;
  for (int k = 0; k < kNumQueueKinds; ++k) {
    const int lanes = lanes_[k].load(std::memory_order_acquire);
    for (int lane = 0; lane < lanes; ++lane) {
      queues.emplace_back(this, static_cast<QueueKind>(k), lane);
      PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(sync_events_[k][lane], streams_[k][lane]));
    }
  }
  std::vector<bool> idle(queues.size(), false);
  PO_ASSIGN_OR_RETURN(const bool done, internal::PollUntil(
      [&]() -> absl::StatusOr<bool> {
        bool all = true;
        for (std::size_t q = 0; q < queues.size(); ++q) {
          if (idle[q]) continue;
          const cudaError_t query = cudaEventQuery(
              sync_events_[QueueIndex(queues[q].kind())][queues[q].lane()]);
          if (query == cudaErrorNotReady) {
            all = false;
            continue;
          }
          if (query != cudaSuccess) {
            return internal::CudaStatus(query, "cudaEventQuery(sync)", __FILE__, __LINE__);
          }
          idle[q] = true;
        }
        return all;
      },
      timeout_seconds));
  if (done) return absl::OkStatus();
  std::string busy;
  for (std::size_t q = 0; q < queues.size(); ++q) {
    if (!idle[q]) absl::StrAppend(&busy, busy.empty() ? "" : ", ", QueueName(queues[q]));
  }
  return absl::DeadlineExceededError(absl::StrFormat(
      "%s: queues not idle after %.3f s: %s", name_, timeout_seconds, busy));
}

const CudaBackend* AsCuda(const Backend* backend) {
  return dynamic_cast<const CudaBackend*>(backend);
}

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    static_cast<void>(cudaGetLastError());
    return 0;
  }
  if (error != cudaSuccess) {
    return internal::CudaStatus(error, "cudaGetDeviceCount", __FILE__, __LINE__);
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: device must be >= 0, got ", options.device));
  }
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(error),
        ": ", cudaGetErrorString(error), ")"));
  }
  if (options.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("cuda backend: device ", options.device,
                                                      " requested but ", count,
                                                      " CUDA devices are visible"));
  }
  auto backend = std::make_unique<CudaBackend>(options.device);
  PO_RETURN_IF_ERROR(Annotate(backend->Init(), "cuda backend: init"));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::StatusOr<cudaStream_t> CudaQueueStream(const Queue& queue) {
  const CudaBackend* backend = AsCuda(queue.owner());
  if (backend == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaQueueStream: the ", QueueName(queue), " queue does not belong to a CUDA backend"));
  }
  if (!backend->HasLane(queue)) {
    return absl::InvalidArgumentError(absl::StrCat("CudaQueueStream: ", backend->Name(),
                                                   " has no ", QueueName(queue), " queue"));
  }
  return backend->stream(queue);
}

absl::StatusOr<cudaStream_t> CudaComputeStream(const Backend& backend) {
  return CudaQueueStream(backend.queue(QueueKind::kCompute));
}

absl::StatusOr<int> CudaBackendDevice(const Backend& backend) {
  const CudaBackend* cuda = AsCuda(&backend);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("CudaBackendDevice: the ", backend.Name(),
                                                   " backend is not a CUDA backend"));
  }
  return cuda->device();
}

}  // namespace pipeoffload
