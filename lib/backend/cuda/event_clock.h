// Converts the completion times of CUDA events to the host's monotonic clock (NowSeconds), so
// copy timings measured by events line up with compute timings measured on the host.
//
// How: an anchor is an event recorded on an otherwise idle stream of the clock's own and polled
// until it completes; the host times just before the record and just after the completion
// bracket its GPU timestamp, and their midpoint is taken as its host time (best of a few tries,
// so the error is half the tightest bracket, microseconds). An event's host time is then its
// anchor's plus cudaEventElapsedTime(anchor, event).
//
// Invariants:
//  - The first anchor is recorded at Create, before any event the backend times, so elapsed
//    times from it are never negative; it gives a coarse time whose float-millisecond rounding
//    grows with the backend's age (one float ulp: 4 us after a minute, 0.25 ms after an hour).
//  - Later anchors are measured lazily, at most one per kAnchorSpacingSeconds, and the newest
//    kMaxAnchors are kept. An event is timed from the newest anchor older than its coarse time
//    by a margin (kAnchorMarginSeconds, or 4 ulps of the coarse time if that is more), so the
//    elapsed time is positive and short (sub-microsecond rounding). Only an event older than
//    every kept anchor keeps the coarse time. Each anchor re-reads the host clock, so GPU/host
//    clock drift never accumulates; the price is a possible step of a few microseconds between
//    anchors.
//  - Guarded by mu_; every CUDA call needs the clock's device current (the backend's guard).
#ifndef PIPEOFFLOAD_LIB_BACKEND_CUDA_EVENT_CLOCK_H_
#define PIPEOFFLOAD_LIB_BACKEND_CUDA_EVENT_CLOCK_H_

#include <cuda_runtime_api.h>

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"

namespace pipeoffload::internal {

class EventClock {
 public:
  static constexpr double kAnchorSpacingSeconds = 1.0;
  static constexpr double kAnchorMarginSeconds = 0.05;
  static constexpr int kMaxAnchors = 64;
  static constexpr int kCalibrationTries = 3;
  // An anchor on an idle stream completes in microseconds; this only bounds a sick device.
  static constexpr double kAnchorTimeoutSeconds = 5.0;

  // Creates the clock's stream and its first anchor on the current device.
  // Errors: the CUDA calls' Status; DeadlineExceeded when the anchor never completes.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EventClock>> Create();
  ~EventClock();
  EventClock(const EventClock&) = delete;
  EventClock& operator=(const EventClock&) = delete;

  // The host time (MonotonicSeconds) at which `event` completed. REQUIRES: `event` was created
  // with timing enabled on this clock's device, recorded after Create, and has completed.
  [[nodiscard]] absl::StatusOr<double> EventSeconds(cudaEvent_t event);

 private:
  struct Anchor {
    cudaEvent_t event = nullptr;
    double host_seconds = 0.0;
  };
  EventClock() = default;
  absl::StatusOr<Anchor> MeasureAnchorLocked();
  absl::StatusOr<cudaEvent_t> TakeEventLocked();

  std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  Anchor first_;
  std::deque<Anchor> recent_;          // oldest first
  std::vector<cudaEvent_t> spare_;     // created events not in use, reused for anchors
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BACKEND_CUDA_EVENT_CLOCK_H_
