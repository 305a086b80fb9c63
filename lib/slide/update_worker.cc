// UpdateWorker: the CPU Adam thread of layer sliding (invariants in update_worker.h).
#include "lib/slide/update_worker.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/slide/nvme_tier.h"

namespace pipeoffload::internal {

UpdateWorker::UpdateWorker(Backend& backend, CpuAdam& adam, SlideDtype dtype,
                           std::vector<UnitHostState>& units, int landing_buffers,
                           double timeout_seconds, NvmeTier* nvme, SlideRecorder& recorder)
    : backend_(backend),
      adam_(adam),
      dtype_(dtype),
      units_(units),
      timeout_seconds_(timeout_seconds),
      top_sliding_unit_([&units] {
        for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
          if (units[static_cast<std::size_t>(u)].upload != nullptr) return u;
        }
        return -1;
      }()),
      nvme_(nvme),
      recorder_(recorder),
      landing_free_(static_cast<std::size_t>(landing_buffers), true),
      updated_step_(units.size(), 0),
      update_counts_(units.size(), 0),
      thread_([this] { Run(); }) {}

UpdateWorker::~UpdateWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void UpdateWorker::SetScalars(std::int64_t step, std::optional<StepScalars> scalars) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    scalars_[step] = scalars;
    // A step's tasks are done before the step after next begins (its uploads wait for them).
    while (scalars_.size() > 4) scalars_.erase(scalars_.begin());
  }
  cv_.notify_all();
}

void UpdateWorker::Submit(UpdateTask task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

absl::Status UpdateWorker::WaitFor(std::unique_lock<std::mutex>& lock,
                                   const std::function<bool()>& ready, std::string_view what) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_seconds_);
  while (!ready()) {
    if (!error_.ok()) return error_;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
      if (!error_.ok()) return error_;
      return absl::DeadlineExceededError(absl::StrCat(
          "layer sliding: waited ", timeout_seconds_, " s for ", std::string(what), " (",
          tasks_.size(), " CPU updates queued, ", running_, " running)"));
    }
  }
  return error_;
}

absl::StatusOr<int> UpdateWorker::AcquireLanding() {
  std::unique_lock<std::mutex> lock(mu_);
  PO_RETURN_IF_ERROR(WaitFor(
      lock,
      [&] { return std::find(landing_free_.begin(), landing_free_.end(), true) != landing_free_.end(); },
      "a free gradient landing buffer"));
  const int index = static_cast<int>(
      std::find(landing_free_.begin(), landing_free_.end(), true) - landing_free_.begin());
  landing_free_[static_cast<std::size_t>(index)] = false;
  return index;
}

absl::Status UpdateWorker::WaitUpdated(int unit, std::int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  return WaitFor(
      lock, [&] { return updated_step_[static_cast<std::size_t>(unit)] >= step; },
      absl::StrCat("the CPU update of ", units_[static_cast<std::size_t>(unit)].name, " (step ",
                   step, ")"));
}

absl::Status UpdateWorker::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  return WaitFor(lock, [&] { return tasks_.empty() && running_ == 0; }, "every CPU update");
}

absl::Status UpdateWorker::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

double UpdateWorker::TakeAdamSeconds() {
  std::lock_guard<std::mutex> lock(mu_);
  const double seconds = adam_seconds_;
  adam_seconds_ = 0.0;
  return seconds;
}

std::vector<std::int64_t> UpdateWorker::update_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return update_counts_;
}

void UpdateWorker::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // The runnable task (its step's scalars are known) of the lowest unit whose next chunk
    // has landed, else of the lowest unit.
    auto best = tasks_.end();
    bool best_landed = false;
    for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
      if (scalars_.count(it->step) == 0) continue;
      const bool landed = NextChunkLanded(*it);
      if (best == tasks_.end() || (landed && !best_landed) ||
          (landed == best_landed && it->unit < best->unit)) {
        best = it;
        best_landed = landed;
      }
    }
    if (stop_ || !error_.ok()) return;
    if (best == tasks_.end()) {
      cv_.wait(lock);
      continue;
    }
    UpdateTask task = std::move(*best);
    tasks_.erase(best);
    const std::optional<StepScalars> scalars = scalars_[task.step];
    ++running_;
    lock.unlock();
    const absl::Status status = Process(task, scalars);
    lock.lock();
    --running_;
    if (status.ok() && task.next_chunk < task.chunks.size()) {  // preempted: back in the queue
      tasks_.push_back(std::move(task));
      continue;
    }
    if (!status.ok()) {
      error_ = Annotate(status, absl::StrCat("CPU update of ", units_[static_cast<std::size_t>(task.unit)].name));
    } else {
      updated_step_[static_cast<std::size_t>(task.unit)] =
          std::max(updated_step_[static_cast<std::size_t>(task.unit)], task.step);
      if (scalars.has_value()) ++update_counts_[static_cast<std::size_t>(task.unit)];
    }
    if (task.landing >= 0) landing_free_[static_cast<std::size_t>(task.landing)] = true;
    cv_.notify_all();
  }
}

bool UpdateWorker::NextChunkLanded(const UpdateTask& task) {
  if (task.next_chunk >= task.chunks.size()) return true;
  const absl::StatusOr<bool> landed = backend_.QueryEvent(task.chunks[task.next_chunk].landed);
  return !landed.ok() || *landed;  // an error surfaces in the wait that follows
}

bool UpdateWorker::LowerTaskReady(int unit) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const UpdateTask& other : tasks_) {
    if (other.unit < unit && scalars_.count(other.step) != 0 && NextChunkLanded(other)) {
      return true;
    }
  }
  return false;
}

absl::Status UpdateWorker::Process(UpdateTask& task, const std::optional<StepScalars>& scalars) {
  UnitHostState& unit = units_[static_cast<std::size_t>(task.unit)];
  float* exp_avg = unit.exp_avg;
  float* exp_avg_sq = unit.exp_avg_sq;
  std::uint16_t* master_lo = unit.master_lo;
  if (unit.nvme && scalars.has_value()) {
    PO_ASSIGN_OR_RETURN(const NvmeTier::State state, nvme_->Acquire(task.unit));
    exp_avg = state.exp_avg;
    exp_avg_sq = state.exp_avg_sq;
    master_lo = state.master_lo;
  }
  const std::int64_t grad_bytes = SlideDtypeBytes(dtype_);
  double adam_seconds = 0.0;
  const bool preemptible = task.unit == top_sliding_unit_ && !unit.nvme && scalars.has_value() &&
                           (task.landing < 0 || landing_free_.size() >= 3);
  for (; task.next_chunk < task.chunks.size(); ++task.next_chunk) {
    const UpdateChunk& chunk = task.chunks[task.next_chunk];
    if (preemptible && adam_seconds > 0.0 && LowerTaskReady(task.unit)) break;
    PO_RETURN_IF_ERROR(backend_.WaitEvent(chunk.landed, timeout_seconds_));
    if (!scalars.has_value()) continue;
    const double start = backend_.NowSeconds();
    const std::int64_t chunk_end = chunk.begin + chunk.count;
    for (const auto& [run, decay] : unit.runs) {
      const std::int64_t begin = std::max(run.offset, chunk.begin);
      const std::int64_t end = std::min(run.offset + run.count, chunk_end);
      if (begin >= end) continue;
      AdamSpan span;
      span.exp_avg = exp_avg + begin;
      span.exp_avg_sq = exp_avg_sq + begin;
      const auto* grads = static_cast<const std::byte*>(task.grads) + begin * grad_bytes;
      if (dtype_ == SlideDtype::kFp32) {
        span.param = unit.master + begin;
        span.grad = reinterpret_cast<const float*>(grads);
      } else {
        span.param_bf16 = static_cast<std::uint16_t*>(unit.upload) + begin;  // split master
        span.param_lo = master_lo + begin;
        span.grad_bf16 = reinterpret_cast<const std::uint16_t*>(grads);
      }
      span.count = end - begin;
      PO_RETURN_IF_ERROR(adam_.Update(decay ? scalars->decay : scalars->no_decay, span));
    }
    const double end = backend_.NowSeconds();
    adam_seconds += end - start;
    SlideRecord record;
    record.engine = SlideEngineKind::kCpuAdam;
    record.name = absl::StrCat("adam ", unit.name, " [", chunk.begin, ", ", chunk_end, ")");
    record.unit = task.unit;
    record.start = start;
    record.end = end;
    // fp32: p, m, v, g read (16 B), p, m, v written; bf16: halves, m, v, g read (14 B), halves,
    // m, v written.
    record.bytes = chunk.count * (dtype_ == SlideDtype::kFp32 ? 28 : 26);
    recorder_.AddHost(std::move(record));
  }
  if (unit.nvme && scalars.has_value()) PO_RETURN_IF_ERROR(nvme_->Release(task.unit));
  std::lock_guard<std::mutex> lock(mu_);
  adam_seconds_ += adam_seconds;
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal
