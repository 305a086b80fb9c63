// GatedBackend: see gated_backend.h.
#include "tests/backend/gated_backend.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipeoffload::testing {

void GatedBackend::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

void GatedBackend::Open() {
  // Replays in enqueue order; work enqueued meanwhile is still held (the gate shuts until the
  // end), so the D2H queue keeps its order.
  while (true) {
    std::vector<std::function<absl::Status()>> tasks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (held_.empty()) {
        closed_ = false;
        held_events_.clear();  // recorded on the wrapped backend by now
        break;
      }
      tasks.swap(held_);
    }
    // A held task failing is a bug in the test; its status is what the original call would
    // have returned, and the test's later checks see the consequence.
    for (auto& task : tasks) task().IgnoreError();
  }
  opened_.notify_all();
}

bool GatedBackend::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

int GatedBackend::held_tasks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(held_.size());
}

absl::StatusOr<Queue> GatedBackend::Inner(Queue queue) const {
  if (queue.owner() != this) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gated backend: the ", std::string(QueueKindName(queue.kind())),
        " queue belongs to another backend"));
  }
  return inner_.queue(queue.kind());
}

bool GatedBackend::MaybeHold(QueueKind kind, std::function<absl::Status()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind != QueueKind::kD2H || !closed_) return false;
  held_.push_back(std::move(task));
  return true;
}

bool GatedBackend::IsHeld(Event event) const { return held_events_.count(event.id()) != 0; }

absl::Status GatedBackend::CopyAsync(Queue queue, void* dst, const void* src,
                                     std::int64_t bytes) {
  absl::StatusOr<Queue> inner = Inner(queue);
  if (!inner.ok()) return inner.status();
  auto task = [this, q = *inner, dst, src, bytes] { return inner_.CopyAsync(q, dst, src, bytes); };
  if (MaybeHold(queue.kind(), task)) return absl::OkStatus();
  return task();
}

absl::Status GatedBackend::FillAsync(Queue queue, void* dst, std::uint32_t pattern,
                                     std::int64_t bytes) {
  absl::StatusOr<Queue> inner = Inner(queue);
  if (!inner.ok()) return inner.status();
  auto task = [this, q = *inner, dst, pattern, bytes] {
    return inner_.FillAsync(q, dst, pattern, bytes);
  };
  if (MaybeHold(queue.kind(), task)) return absl::OkStatus();
  return task();
}

absl::Status GatedBackend::RecordEvent(Event event, Queue queue) {
  absl::StatusOr<Queue> inner = Inner(queue);
  if (!inner.ok()) return inner.status();
  auto task = [this, q = *inner, event] { return inner_.RecordEvent(event, q); };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue.kind() == QueueKind::kD2H && closed_) {
      held_.push_back(task);
      held_events_.insert(event.id());
      return absl::OkStatus();
    }
    held_events_.erase(event.id());  // re-recorded elsewhere: the new capture counts
  }
  return task();
}

absl::Status GatedBackend::QueueWaitEvent(Queue queue, Event event) {
  absl::StatusOr<Queue> inner = Inner(queue);
  if (!inner.ok()) return inner.status();
  auto task = [this, q = *inner, event] { return inner_.QueueWaitEvent(q, event); };
  if (MaybeHold(queue.kind(), task)) return absl::OkStatus();
  bool held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held = IsHeld(event);
  }
  if (held && queue.kind() == QueueKind::kH2D) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gated backend: an H2D queue wait on event ", event.id(),
        ", which is held behind the closed D2H gate, is not supported; open the gate first"));
  }
  if (held) {  // the compute queue: the calling thread blocks, as on the CPU backend
    constexpr double kComputeWaitSeconds = 60.0;
    if (absl::Status waited = WaitEvent(event, kComputeWaitSeconds); !waited.ok()) return waited;
  }
  return task();
}

absl::StatusOr<bool> GatedBackend::QueryEvent(Event event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (IsHeld(event)) return false;
  }
  return inner_.QueryEvent(event);
}

absl::Status GatedBackend::WaitEvent(Event event, double timeout_seconds) {
  const double start = inner_.NowSeconds();
  {
    std::unique_lock<std::mutex> lock(mu_);
    const bool released =
        opened_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                         [&] { return !IsHeld(event); });
    if (!released) {
      return absl::DeadlineExceededError(
          absl::StrCat("gated backend: event ", event.id(), " is held behind the closed D2H "
                       "gate after ", timeout_seconds, " s"));
    }
  }
  const double left = timeout_seconds - (inner_.NowSeconds() - start);
  return inner_.WaitEvent(event, left > 0.0 ? left : 0.0);
}

absl::StatusOr<double> GatedBackend::EventTime(Event event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (IsHeld(event)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gated backend: EventTime of event ", event.id(), ", held behind the D2H gate"));
    }
  }
  return inner_.EventTime(event);
}

absl::Status GatedBackend::Synchronize(double timeout_seconds) {
  if (held_tasks() > 0) {
    return absl::FailedPreconditionError(
        "gated backend: Synchronize while D2H work is held behind the closed gate");
  }
  return inner_.Synchronize(timeout_seconds);
}

}  // namespace pipeoffload::testing
