// The monotonic clock and deadline helper shared by backends, transports and the runtime.
// Header-only so every layer can use it without a link dependency.
#ifndef PIPEOFFLOAD_LIB_BACKEND_CLOCK_H_
#define PIPEOFFLOAD_LIB_BACKEND_CLOCK_H_

#include <algorithm>
#include <chrono>

namespace pipeoffload::internal {

// Seconds on steady_clock (CLOCK_MONOTONIC on Linux: one clock for every thread and process
// of a host, so stage timelines line up).
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// now + `seconds`, clamped to [0, about 116 days] so huge or NaN timeouts cannot overflow
// the clock's integer representation.
inline std::chrono::steady_clock::time_point DeadlineAfter(double seconds) {
  constexpr double kMaxSeconds = 1e7;
  const double clamped = seconds > 0 ? std::min(seconds, kMaxSeconds) : 0.0;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(clamped));
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BACKEND_CLOCK_H_
