// The CPU backend: host memory plays device memory, the calling thread is the compute queue and
// one worker thread per direction is a copy engine. It is the oracle every other backend is
// checked against, and with fault injection (seeded random delays before copies) it exposes
// missing event waits.
//
// Invariants (all guarded by mu_):
//  - An event's `generation` counts its recordings; `completed` is the highest generation whose
//    recorded work has finished. The event is complete iff completed >= generation, so an event
//    never recorded by its owner (`recorded` false; generation 0, or a recycled id's old count)
//    is complete, and has no time.
//  - A kRecord task completes generation g of its event when the worker reaches it, i.e. after
//    every earlier task of that queue finished (in-order queues).
//  - A kWait task blocks its queue until its event's `completed` reaches the generation captured
//    when QueueWaitEvent was called; later re-recordings do not move that target.
//  - Workers drop their remaining tasks at shutdown, so destruction never waits on an event
//    that nobody will complete.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/check.h"
#include "lib/backend/clock.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {
namespace {

constexpr std::int64_t kDeviceAlignment = 256;

struct EventState {
  bool live = false;
  // Recorded by its current owner: a recycled id keeps counting generations, so the count
  // alone cannot tell a fresh event from one whose previous owner's recording completed.
  bool recorded = false;
  std::uint64_t generation = 0;
  std::uint64_t completed = 0;
  QueueKind recorded_on = QueueKind::kCompute;
  double time = 0.0;  // completion time of the latest generation
};

struct Task {
  enum class Type : std::uint8_t { kCopy, kFill, kRecord, kWait };
  Type type = Type::kCopy;
  void* dst = nullptr;
  const void* src = nullptr;
  std::int64_t bytes = 0;
  std::uint32_t pattern = 0;
  std::int64_t event_id = -1;
  std::uint64_t generation = 0;
};

// Index of a copy queue in the per-engine arrays.
int EngineIndex(QueueKind kind) { return kind == QueueKind::kD2H ? 0 : 1; }

void FillWords(void* dst, std::uint32_t pattern, std::int64_t bytes) {
  auto* words = static_cast<std::uint32_t*>(dst);
  std::fill(words, words + bytes / 4, pattern);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {
    for (int engine = 0; engine < 2; ++engine) {
      rng_[engine].seed(options.fault_seed * 0x9E3779B97F4A7C15ull + engine + 1);
      workers_[engine] = std::thread([this, engine] { WorkerLoop(engine); });
    }
  }

  ~CpuBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (std::thread& worker : workers_) worker.join();
    for (void* ptr : device_blocks_) std::free(ptr);
    for (void* ptr : host_blocks_) std::free(ptr);
  }

  std::string Name() const override { return "cpu"; }
  bool DeviceMemoryIsHostAccessible() const override { return true; }

  absl::StatusOr<void*> AllocateDevice(std::int64_t bytes) override {
    return AllocateBlock(bytes, "device", device_blocks_, stats_.device_allocations);
  }
  void FreeDevice(void* ptr) override { FreeBlock(ptr, device_blocks_); }
  absl::StatusOr<void*> AllocateHost(std::int64_t bytes) override {
    return AllocateBlock(bytes, "host", host_blocks_, stats_.host_allocations);
  }
  void FreeHost(void* ptr) override { FreeBlock(ptr, host_blocks_); }

  absl::Status CopyAsync(Queue queue, void* dst, const void* src, std::int64_t bytes) override {
    if (absl::Status ok = CheckQueue(queue); !ok.ok()) return ok;
    if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu backend: CopyAsync on ", std::string(QueueKindName(queue.kind())), " of ", bytes,
                       " bytes needs non-null buffers and a non-negative size"));
    }
    if (queue.kind() == QueueKind::kCompute) {
      if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.copies;
      return absl::OkStatus();
    }
    Task task;
    task.type = Task::Type::kCopy;
    task.dst = dst;
    task.src = src;
    task.bytes = bytes;
    Push(queue.kind(), task);
    return absl::OkStatus();
  }

  absl::Status FillAsync(Queue queue, void* dst, std::uint32_t pattern,
                         std::int64_t bytes) override {
    if (absl::Status ok = CheckQueue(queue); !ok.ok()) return ok;
    if (bytes < 0 || bytes % 4 != 0 || reinterpret_cast<std::uintptr_t>(dst) % 4 != 0 ||
        (bytes > 0 && dst == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cpu backend: FillAsync needs a 4-byte aligned buffer and a size that is a multiple "
          "of 4, got ", bytes, " bytes"));
    }
    if (queue.kind() == QueueKind::kCompute) {
      FillWords(dst, pattern, bytes);
      return absl::OkStatus();
    }
    Task task;
    task.type = Task::Type::kFill;
    task.dst = dst;
    task.pattern = pattern;
    task.bytes = bytes;
    Push(queue.kind(), task);
    return absl::OkStatus();
  }

  absl::StatusOr<Event> CreateEvent() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::int64_t id;
    if (!free_event_ids_.empty()) {
      id = free_event_ids_.back();
      free_event_ids_.pop_back();
    } else {
      id = static_cast<std::int64_t>(events_.size());
      events_.emplace_back();
    }
    EventState& state = events_[static_cast<std::size_t>(id)];
    state.live = true;
    state.recorded = false;
    // Generations keep counting across reuse of the id, so a stale task of a previous owner
    // can never complete the new owner's recording.
    state.completed = state.generation;
    return Event(this, id);
  }

  void DestroyEvent(Event event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!IsLiveEventLocked(event)) return;
    events_[static_cast<std::size_t>(event.id())].live = false;
    free_event_ids_.push_back(event.id());
  }

  absl::Status RecordEvent(Event event, Queue queue) override {
    if (absl::Status ok = CheckQueue(queue); !ok.ok()) return ok;
    std::unique_lock<std::mutex> lock(mu_);
    if (absl::Status ok = CheckEventLocked(event); !ok.ok()) return ok;
    EventState& state = events_[static_cast<std::size_t>(event.id())];
    ++state.generation;
    state.recorded = true;
    state.recorded_on = queue.kind();
    if (queue.kind() == QueueKind::kCompute) {
      // The compute queue is the caller's thread: everything enqueued on it already ran.
      state.completed = state.generation;
      state.time = NowSeconds();
      lock.unlock();
      cv_.notify_all();
      return absl::OkStatus();
    }
    Task task;
    task.type = Task::Type::kRecord;
    task.event_id = event.id();
    task.generation = state.generation;
    tasks_[EngineIndex(queue.kind())].push_back(task);
    lock.unlock();
    cv_.notify_all();
    return absl::OkStatus();
  }

  absl::Status QueueWaitEvent(Queue queue, Event event) override {
    if (absl::Status ok = CheckQueue(queue); !ok.ok()) return ok;
    if (queue.kind() == QueueKind::kCompute) {
      return WaitEvent(event, options_.queue_wait_timeout_seconds);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (absl::Status ok = CheckEventLocked(event); !ok.ok()) return ok;
    Task task;
    task.type = Task::Type::kWait;
    task.event_id = event.id();
    task.generation = events_[static_cast<std::size_t>(event.id())].generation;
    tasks_[EngineIndex(queue.kind())].push_back(task);
    lock.unlock();
    cv_.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryEvent(Event event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status ok = CheckEventLocked(event); !ok.ok()) return ok;
    const EventState& state = events_[static_cast<std::size_t>(event.id())];
    return state.completed >= state.generation;
  }

  absl::Status WaitEvent(Event event, double timeout_seconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (absl::Status ok = CheckEventLocked(event); !ok.ok()) return ok;
    // Index afresh after waiting: CreateEvent on another thread may grow events_.
    const std::uint64_t target = events_[static_cast<std::size_t>(event.id())].generation;
    const bool done = cv_.wait_until(lock, internal::DeadlineAfter(timeout_seconds), [&] {
      return events_[static_cast<std::size_t>(event.id())].completed >= target;
    });
    if (done) return absl::OkStatus();
    const QueueKind queue = events_[static_cast<std::size_t>(event.id())].recorded_on;
    return absl::DeadlineExceededError(absl::StrFormat(
        "cpu backend: event %d (recorded on the %s queue) not complete after %.3f s", event.id(),
        std::string(QueueKindName(queue)), timeout_seconds));
  }

  absl::StatusOr<double> EventTime(Event event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status ok = CheckEventLocked(event); !ok.ok()) return ok;
    const EventState& state = events_[static_cast<std::size_t>(event.id())];
    if (!state.recorded || state.completed < state.generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("cpu backend: EventTime of event ", event.id(),
                       !state.recorded ? ", which was never recorded"
                                             : ", which has not completed"));
    }
    return state.time;
  }

  absl::Status Synchronize(double timeout_seconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    const bool idle = cv_.wait_until(lock, internal::DeadlineAfter(timeout_seconds), [&] {
      return tasks_[0].empty() && tasks_[1].empty() && !busy_[0] && !busy_[1];
    });
    if (idle) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrFormat(
        "cpu backend: copy queues not idle after %.3f s (%d D2H and %d H2D tasks queued)",
        timeout_seconds, tasks_[0].size(), tasks_[1].size()));
  }

  double NowSeconds() const override { return internal::MonotonicSeconds(); }

  BackendStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  absl::StatusOr<void*> AllocateBlock(std::int64_t bytes, const char* what,
                                      std::unordered_set<void*>& blocks,
                                      std::int64_t& counter) {
    if (bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu backend: cannot allocate ", bytes, " bytes of ", what, " memory"));
    }
    const std::int64_t rounded = (bytes + kDeviceAlignment - 1) / kDeviceAlignment *
                                 kDeviceAlignment;
    void* ptr = std::aligned_alloc(kDeviceAlignment, static_cast<std::size_t>(rounded));
    if (ptr == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu backend: out of memory allocating ", bytes, " bytes of ", what,
                       " memory"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    blocks.insert(ptr);
    ++counter;
    return ptr;
  }

  void FreeBlock(void* ptr, std::unordered_set<void*>& blocks) {
    if (ptr == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PO_CHECK_MSG(blocks.erase(ptr) == 1, "cpu backend: freeing memory it did not allocate");
    }
    std::free(ptr);
  }

  absl::Status CheckQueue(Queue queue) const {
    if (queue.owner() != this) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cpu backend: the ", std::string(QueueKindName(queue.kind())), " queue belongs to another backend"));
    }
    return absl::OkStatus();
  }

  bool IsLiveEventLocked(Event event) const {
    return event.owner() == this && event.id() >= 0 &&
           event.id() < static_cast<std::int64_t>(events_.size()) &&
           events_[static_cast<std::size_t>(event.id())].live;
  }

  absl::Status CheckEventLocked(Event event) const {
    if (event.owner() != this) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu backend: event ", event.id(), " belongs to another backend"));
    }
    if (!IsLiveEventLocked(event)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu backend: event ", event.id(), " does not exist (destroyed?)"));
    }
    return absl::OkStatus();
  }

  void Push(QueueKind kind, const Task& task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_[EngineIndex(kind)].push_back(task);
    }
    cv_.notify_all();
  }

  double FaultDelay(int engine) {
    if (options_.max_copy_delay_seconds <= 0.0) return 0.0;
    std::uniform_real_distribution<double> delay(options_.min_copy_delay_seconds,
                                                 options_.max_copy_delay_seconds);
    return delay(rng_[engine]);
  }

  void WorkerLoop(int engine) {
    std::deque<Task>& queue = tasks_[engine];
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return shutdown_ || !queue.empty(); });
      if (shutdown_) return;
      const Task task = queue.front();
      if (task.type == Task::Type::kWait) {
        cv_.wait(lock, [&] {
          return shutdown_ ||
                 events_[static_cast<std::size_t>(task.event_id)].completed >= task.generation;
        });
        if (shutdown_) return;
        queue.pop_front();
        continue;
      }
      if (task.type == Task::Type::kRecord) {
        queue.pop_front();
        EventState& state = events_[static_cast<std::size_t>(task.event_id)];
        state.completed = std::max(state.completed, task.generation);
        if (task.generation == state.generation) state.time = NowSeconds();
        cv_.notify_all();
        continue;
      }
      queue.pop_front();
      busy_[engine] = true;
      const double delay = task.type == Task::Type::kCopy ? FaultDelay(engine) : 0.0;
      lock.unlock();
      if (delay > 0.0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(delay));
        // A backend being destroyed drops the copy it was delaying, like the queued ones.
        lock.lock();
        if (shutdown_) return;
        lock.unlock();
      }
      if (task.type == Task::Type::kCopy) {
        if (task.bytes > 0) std::memcpy(task.dst, task.src, static_cast<std::size_t>(task.bytes));
      } else {
        FillWords(task.dst, task.pattern, task.bytes);
      }
      lock.lock();
      busy_[engine] = false;
      if (task.type == Task::Type::kCopy) {
        ++stats_.copies;
        (engine == 0 ? stats_.bytes_d2h : stats_.bytes_h2d) += task.bytes;
      }
      cv_.notify_all();
    }
  }

  const CpuBackendOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // any task pushed, event completed, engine idle, or shutdown
  std::vector<EventState> events_;
  std::vector<std::int64_t> free_event_ids_;
  std::deque<Task> tasks_[2];  // [D2H, H2D]
  bool busy_[2] = {false, false};
  bool shutdown_ = false;
  std::mt19937_64 rng_[2];  // used by its worker only
  std::unordered_set<void*> device_blocks_;
  std::unordered_set<void*> host_blocks_;
  BackendStats stats_;
  std::thread workers_[2];  // last: they start after every other member exists
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  if (options.min_copy_delay_seconds < 0 || options.max_copy_delay_seconds < 0 ||
      (options.max_copy_delay_seconds > 0 &&
       options.min_copy_delay_seconds > options.max_copy_delay_seconds)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cpu backend: copy delays must satisfy 0 <= min <= max, got min %g s, max %g s",
        options.min_copy_delay_seconds, options.max_copy_delay_seconds));
  }
  if (!(options.queue_wait_timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: queue_wait_timeout_seconds must be positive, got ",
                     options.queue_wait_timeout_seconds));
  }
  return std::unique_ptr<Backend>(new CpuBackend(options));
}

}  // namespace pipeoffload
