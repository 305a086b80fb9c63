// Helpers for tests that drive a Backend directly, whichever it is: events, draining a queue,
// RAII blocks of backend memory, and exact comparisons that report where data differ.
#ifndef PIPEOFFLOAD_TESTS_BACKEND_BACKEND_TEST_UTIL_H_
#define PIPEOFFLOAD_TESTS_BACKEND_BACKEND_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "pipeoffload/backend.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {

inline std::unique_ptr<Backend> NewCpuBackend(const CpuBackendOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(options);
  INFO(backend.status().ToString());
  REQUIRE(backend.ok());
  return std::move(*backend);
}

inline Event NewEvent(Backend& backend) {
  absl::StatusOr<Event> event = backend.CreateEvent();
  INFO(event.status().ToString());
  REQUIRE(event.ok());
  return *event;
}

// Records an event on `queue` and waits for it: everything enqueued there so far is done.
inline void Drain(Backend& backend, QueueKind kind, double timeout_seconds = 60.0) {
  const Event event = NewEvent(backend);
  REQUIRE(backend.RecordEvent(event, backend.queue(kind)).ok());
  const absl::Status waited = backend.WaitEvent(event, timeout_seconds);
  INFO(waited.ToString());
  REQUIRE(waited.ok());
  backend.DestroyEvent(event);
}

// The three queues of a round trip host -> device -> device -> host, and the events that
// order its steps (created once, reused round after round).
struct RoundTrip {
  Queue h2d, compute, d2h;
  Event uploaded, moved, downloaded;
};
inline RoundTrip NewRoundTrip(Backend& backend, Queue h2d, Queue compute, Queue d2h) {
  return RoundTrip{h2d, compute, d2h, NewEvent(backend), NewEvent(backend), NewEvent(backend)};
}
// Copies `bytes` from host `source` to device `device_a` on h2d, then to `device_b` on compute,
// then to host `result` on d2h, each step ordered after the previous only by an event, and waits
// for the last: `result` holds `source` exactly when every queue wait did its job.
inline void RunRoundTrip(Backend& backend, const RoundTrip& trip, const void* source,
                         void* device_a, void* device_b, void* result, std::int64_t bytes) {
  REQUIRE(backend.CopyAsync(trip.h2d, device_a, source, bytes).ok());
  REQUIRE(backend.RecordEvent(trip.uploaded, trip.h2d).ok());
  REQUIRE(backend.QueueWaitEvent(trip.compute, trip.uploaded).ok());
  REQUIRE(backend.CopyAsync(trip.compute, device_b, device_a, bytes).ok());
  REQUIRE(backend.RecordEvent(trip.moved, trip.compute).ok());
  REQUIRE(backend.QueueWaitEvent(trip.d2h, trip.moved).ok());
  REQUIRE(backend.CopyAsync(trip.d2h, result, device_b, bytes).ok());
  REQUIRE(backend.RecordEvent(trip.downloaded, trip.d2h).ok());
  REQUIRE(backend.WaitEvent(trip.downloaded, 60.0).ok());
}

// The completion time of each event (REQUIREs that each has completed).
inline std::vector<double> EventTimes(Backend& backend, const std::vector<Event>& events) {
  std::vector<double> times;
  for (const Event& event : events) {
    absl::StatusOr<double> time = backend.EventTime(event);
    INFO(time.status().ToString());
    REQUIRE(time.ok());
    times.push_back(*time);
  }
  return times;
}

// A block of backend memory, freed with the object.
class Block {
 public:
  Block(Backend& backend, std::int64_t bytes, bool host) : backend_(backend), host_(host) {
    absl::StatusOr<void*> ptr = host ? backend.AllocateHost(bytes) : backend.AllocateDevice(bytes);
    INFO(ptr.status().ToString());
    REQUIRE(ptr.ok());
    ptr_ = *ptr;
  }
  ~Block() { host_ ? backend_.FreeHost(ptr_) : backend_.FreeDevice(ptr_); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  void* get() const { return ptr_; }
  unsigned char* bytes() const { return static_cast<unsigned char*>(ptr_); }
  std::uint32_t* words() const { return static_cast<std::uint32_t*>(ptr_); }
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  Backend& backend_;
  const bool host_;
  void* ptr_ = nullptr;
};

// Index of the first element where `a` and `b` differ, the shorter size when one is a prefix of
// the other, or -1 when they are equal. CHECK(FirstMismatch(a, b) == -1) reports the index
// instead of printing megabytes of both vectors.
template <typename T>
std::int64_t FirstMismatch(const std::vector<T>& a, const std::vector<T>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (!(a[i] == b[i])) return static_cast<std::int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(n);
}

inline std::vector<unsigned char> RandomBytes(std::int64_t size, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> bytes(static_cast<std::size_t>(size));
  for (unsigned char& byte : bytes) byte = static_cast<unsigned char>(rng());
  return bytes;
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_BACKEND_BACKEND_TEST_UTIL_H_
