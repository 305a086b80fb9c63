// EventClock: CUDA event timestamps on the host's monotonic clock (event_clock.h).
#include "lib/backend/cuda/event_clock.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::internal {

absl::StatusOr<std::unique_ptr<EventClock>> EventClock::Create() {
  std::unique_ptr<EventClock> clock(new EventClock());
  // The destructor releases whatever was created if a later step fails.
  PO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&clock->stream_, cudaStreamNonBlocking));
  std::lock_guard<std::mutex> lock(clock->mu_);
  PO_ASSIGN_OR_RETURN(clock->first_, clock->MeasureAnchorLocked());
  return clock;
}

EventClock::~EventClock() {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_.event != nullptr) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(first_.event));
  for (const Anchor& anchor : recent_) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(anchor.event));
  for (cudaEvent_t event : spare_) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(event));
  if (stream_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaStreamDestroy(stream_));
}

absl::StatusOr<cudaEvent_t> EventClock::TakeEventLocked() {
  if (!spare_.empty()) {
    cudaEvent_t event = spare_.back();
    spare_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  // Timing stays enabled: anchors are the start points of cudaEventElapsedTime.
  PO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDefault));
  return event;
}

absl::StatusOr<EventClock::Anchor> EventClock::MeasureAnchorLocked() {
  PO_ASSIGN_OR_RETURN(cudaEvent_t best, TakeEventLocked());
  absl::StatusOr<cudaEvent_t> candidate_or = TakeEventLocked();
  if (!candidate_or.ok()) {
    spare_.push_back(best);
    return candidate_or.status();
  }
  cudaEvent_t candidate = *candidate_or;
  double best_window = std::numeric_limits<double>::infinity();
  double best_host = 0.0;
  absl::Status status;
  for (int attempt = 0; attempt < kCalibrationTries && status.ok(); ++attempt) {
    const double before = MonotonicSeconds();
    const cudaError_t recorded = cudaEventRecord(candidate, stream_);
    if (recorded != cudaSuccess) {
      status = CudaStatus(recorded, "cudaEventRecord(anchor, clock stream)", __FILE__, __LINE__);
      break;
    }
    absl::StatusOr<bool> done = PollUntil(
        [&]() -> absl::StatusOr<bool> {
          const cudaError_t query = cudaEventQuery(candidate);
          if (query == cudaSuccess) return true;
          if (query == cudaErrorNotReady) return false;
          return CudaStatus(query, "cudaEventQuery(anchor)", __FILE__, __LINE__);
        },
        kAnchorTimeoutSeconds);
    const double after = MonotonicSeconds();
    if (!done.ok()) {
      status = done.status();
    } else if (!*done) {
      status = absl::DeadlineExceededError(absl::StrFormat(
          "cuda event clock: an event on an idle stream did not complete within %.1f s; the "
          "device is hung or lost",
          kAnchorTimeoutSeconds));
    } else if (after - before < best_window) {
      best_window = after - before;
      best_host = 0.5 * (before + after);
      std::swap(best, candidate);
    }
  }
  spare_.push_back(candidate);
  if (!status.ok()) {
    spare_.push_back(best);
    return status;
  }
  return Anchor{best, best_host};
}

absl::StatusOr<double> EventClock::EventSeconds(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  const double newest = recent_.empty() ? first_.host_seconds : recent_.back().host_seconds;
  if (MonotonicSeconds() - newest > kAnchorSpacingSeconds) {
    PO_ASSIGN_OR_RETURN(const Anchor anchor, MeasureAnchorLocked());
    recent_.push_back(anchor);
    if (static_cast<int>(recent_.size()) > kMaxAnchors) {
      spare_.push_back(recent_.front().event);
      recent_.pop_front();
    }
  }
  float coarse_ms = 0.0f;
  PO_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&coarse_ms, first_.event, event));
  const double coarse = first_.host_seconds + 1e-3 * static_cast<double>(coarse_ms);
  const double ulp_seconds =
      1e-3 * static_cast<double>(std::nextafter(coarse_ms, std::numeric_limits<float>::max()) -
                                 coarse_ms);
  const double margin = std::max(kAnchorMarginSeconds, 4 * ulp_seconds);
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    if (it->host_seconds > coarse - margin) continue;
    float fine_ms = 0.0f;
    PO_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&fine_ms, it->event, event));
    return it->host_seconds + 1e-3 * static_cast<double>(fine_ms);
  }
  return coarse;
}

}  // namespace pipeoffload::internal
