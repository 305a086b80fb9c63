// The CPU backend: host memory plays device memory, the calling thread is every compute queue
// and one worker thread per copy queue (the built-in D2H and H2D ones and each extra one) is a
// copy engine. It is the oracle every other backend is checked against, and with fault
// injection (seeded random delays before copies) it exposes missing event waits.
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
//  - Copy engines are created (CreateQueue) but never removed until destruction: a Queue value
//    of lane l < lanes_[kind] always names a live engine.
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
  int recorded_lane = 0;
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

// Index of a copy direction in the per-direction arrays.
int Direction(QueueKind kind) { return kind == QueueKind::kD2H ? 0 : 1; }

// One copy queue: its tasks in order and the worker thread that runs them.
struct CopyEngine {
  CopyEngine(int direction, int lane) : direction(direction), lane(lane) {}
  const int direction;  // Direction(): 0 D2H, 1 H2D
  const int lane;
  std::deque<Task> tasks;  // guarded by the backend's mu_
  bool busy = false;       // a copy or fill is running outside the lock (mu_)
  std::mt19937_64 rng;     // used by its worker only
  std::thread worker;
};

void FillWords(void* dst, std::uint32_t pattern, std::int64_t bytes) {
  auto* words = static_cast<std::uint32_t*>(dst);
  std::fill(words, words + bytes / 4, pattern);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {
    std::lock_guard<std::mutex> lock(mu_);
    StartEngineLocked(0, 0);
    StartEngineLocked(1, 0);
  }

  ~CpuBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& direction : engines_) {
      for (const std::unique_ptr<CopyEngine>& engine : direction) {
        if (engine != nullptr) engine->worker.join();
      }
    }
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

  absl::StatusOr<Queue> CreateQueue(QueueKind kind) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int k = static_cast<int>(kind);
    if (lanes_[k] >= kMaxQueuesPerKind) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cpu backend: CreateQueue: already ", lanes_[k], " ", std::string(QueueKindName(kind)),
          " queues, the most a backend has (kMaxQueuesPerKind)"));
    }
    // An extra compute lane is the caller's thread, as the built-in one: nothing to start.
    if (kind != QueueKind::kCompute) StartEngineLocked(Direction(kind), lanes_[k]);
    return Queue(this, kind, lanes_[k]++);
  }

  absl::Status CopyAsync(Queue queue, void* dst, const void* src, std::int64_t bytes) override {
    if (absl::Status ok = CheckQueue(queue); !ok.ok()) return ok;
    if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu backend: CopyAsync on ", QueueName(queue), " of ", bytes,
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
    Push(queue, task);
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
    Push(queue, task);
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
    state.recorded_lane = queue.lane();
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
    EngineLocked(queue).tasks.push_back(task);
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
    EngineLocked(queue).tasks.push_back(task);
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
    const EventState& state = events_[static_cast<std::size_t>(event.id())];
    return absl::DeadlineExceededError(absl::StrFormat(
        "cpu backend: event %d (recorded on the %s queue) not complete after %.3f s", event.id(),
        QueueName(Queue(this, state.recorded_on, state.recorded_lane)), timeout_seconds));
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
      for (auto& direction : engines_) {
        for (const std::unique_ptr<CopyEngine>& engine : direction) {
          if (engine != nullptr && (!engine->tasks.empty() || engine->busy)) return false;
        }
      }
      return true;
    });
    if (idle) return absl::OkStatus();
    std::string busy;
    for (int d = 0; d < 2; ++d) {
      for (const std::unique_ptr<CopyEngine>& engine : engines_[d]) {
        if (engine == nullptr || (engine->tasks.empty() && !engine->busy)) continue;
        absl::StrAppend(&busy, busy.empty() ? "" : ", ",
                        QueueName(Queue(this, d == 0 ? QueueKind::kD2H : QueueKind::kH2D,
                                        engine->lane)),
                        " (", engine->tasks.size(), " tasks queued)");
      }
    }
    return absl::DeadlineExceededError(absl::StrFormat(
        "cpu backend: copy queues not idle after %.3f s: %s", timeout_seconds, busy));
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
          "cpu backend: the ", QueueName(queue), " queue belongs to another backend"));
    }
    std::lock_guard<std::mutex> lock(mu_);
    const int lanes = lanes_[static_cast<int>(queue.kind())];
    if (queue.lane() < 0 || queue.lane() >= lanes) {
      return absl::InvalidArgumentError(absl::StrCat("cpu backend: no ", QueueName(queue),
                                                     " queue (", lanes, " ",
                                                     std::string(QueueKindName(queue.kind())),
                                                     " queues exist)"));
    }
    return absl::OkStatus();
  }

  // REQUIRES: mu_ held; `queue` a copy queue that passed CheckQueue.
  CopyEngine& EngineLocked(Queue queue) {
    return *engines_[Direction(queue.kind())][queue.lane()];
  }

  // Starts the copy engine of `lane` of `direction`. REQUIRES: mu_ held, the lane free.
  void StartEngineLocked(int direction, int lane) {
    auto engine = std::make_unique<CopyEngine>(direction, lane);
    // Lane 0's seeds are the ones the backend always had, so fault runs stay reproducible.
    engine->rng.seed(options_.fault_seed * 0x9E3779B97F4A7C15ull + direction + 1 +
                     2 * static_cast<std::uint64_t>(lane));
    CopyEngine* raw = engine.get();
    engines_[direction][lane] = std::move(engine);
    raw->worker = std::thread([this, raw] { WorkerLoop(*raw); });
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

  void Push(Queue queue, const Task& task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      EngineLocked(queue).tasks.push_back(task);
    }
    cv_.notify_all();
  }

  double FaultDelay(CopyEngine& engine) {
    if (options_.max_copy_delay_seconds <= 0.0) return 0.0;
    std::uniform_real_distribution<double> delay(options_.min_copy_delay_seconds,
                                                 options_.max_copy_delay_seconds);
    return delay(engine.rng);
  }

  void WorkerLoop(CopyEngine& engine) {
    std::deque<Task>& queue = engine.tasks;
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
      engine.busy = true;
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
      engine.busy = false;
      if (task.type == Task::Type::kCopy) {
        ++stats_.copies;
        (engine.direction == 0 ? stats_.bytes_d2h : stats_.bytes_h2d) += task.bytes;
      }
      cv_.notify_all();
    }
  }

  const CpuBackendOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // any task pushed, event completed, engine idle, or shutdown
  std::vector<EventState> events_;
  std::vector<std::int64_t> free_event_ids_;
  bool shutdown_ = false;
  std::unordered_set<void*> device_blocks_;
  std::unordered_set<void*> host_blocks_;
  BackendStats stats_;
  // Queues of each kind (lanes 0 .. lanes_[kind] - 1); [D2H, H2D] engines by lane. Last: the
  // workers start (in the constructor body) after every other member exists.
  int lanes_[kNumQueueKinds] = {1, 1, 1};
  std::unique_ptr<CopyEngine> engines_[2][kMaxQueuesPerKind];
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
