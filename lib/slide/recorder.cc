// SlideRecorder: device records timed by event pairs, host records by the backend's clock.
#include "lib/slide/recorder.h"

#include "lib/base/status_macros.h"

namespace pipeoffload::internal {

SlideRecorder::SlideRecorder(Backend& backend, bool enabled)
    : backend_(backend), enabled_(enabled) {}

SlideRecorder::~SlideRecorder() {
  for (const Event& event : all_) backend_.DestroyEvent(event);
}

absl::StatusOr<Event> SlideRecorder::TakeEvent() {
  if (!pool_.empty()) {
    const Event event = pool_.back();
    pool_.pop_back();
    return event;
  }
  PO_ASSIGN_OR_RETURN(const Event event, backend_.CreateEvent());
  all_.push_back(event);
  return event;
}

absl::StatusOr<std::optional<Event>> SlideRecorder::Begin(Queue queue) {
  if (!enabled_) return std::optional<Event>();
  std::lock_guard<std::mutex> lock(mu_);
  PO_ASSIGN_OR_RETURN(const Event start, TakeEvent());
  PO_RETURN_IF_ERROR(backend_.RecordEvent(start, queue));
  return std::optional<Event>(start);
}

absl::Status SlideRecorder::End(const std::optional<Event>& start, Queue queue,
                                SlideEngineKind engine, std::string name, int unit, int mb,
                                std::int64_t bytes) {
  if (!enabled_ || !start.has_value()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  PO_ASSIGN_OR_RETURN(const Event end, TakeEvent());
  PO_RETURN_IF_ERROR(backend_.RecordEvent(end, queue));
  SlideRecord record;
  record.engine = engine;
  record.name = std::move(name);
  record.unit = unit;
  record.mb = mb;
  record.bytes = bytes;
  pending_.push_back({std::move(record), *start, end});
  return absl::OkStatus();
}

void SlideRecorder::AddHost(SlideRecord record) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_.push_back(std::move(record));
}

absl::Status SlideRecorder::Resolve() {
  if (!enabled_) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Pending> still;
  for (Pending& p : pending_) {
    PO_ASSIGN_OR_RETURN(const bool done, backend_.QueryEvent(p.end));
    if (!done) {
      still.push_back(std::move(p));
      continue;
    }
    PO_ASSIGN_OR_RETURN(p.record.start, backend_.EventTime(p.start));
    PO_ASSIGN_OR_RETURN(p.record.end, backend_.EventTime(p.end));
    done_.push_back(std::move(p.record));
    pool_.push_back(p.start);
    pool_.push_back(p.end);
  }
  pending_ = std::move(still);
  return absl::OkStatus();
}

std::vector<SlideRecord> SlideRecorder::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SlideRecord> out = std::move(done_);
  done_.clear();
  return out;
}

}  // namespace pipeoffload::internal
