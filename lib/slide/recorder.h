// What the layer-sliding engine did, per engine: device work timed by events recorded around it
// on its queue, host work (CPU Adam, NVMe) by the backend's clock. Off unless asked
// (SlidingOptions::record_trace), so the steady state then records nothing and creates no
// events; on, it takes events from a pool it grows as needed.
//
// Invariants: a device record's events stay out of the pool until the record is resolved (its
// end event completed and both times read); Take() returns resolved records in no particular
// order; the pool reuses events only after resolution, so a re-recording never replaces a
// capture someone still reads. Thread-safe.
#ifndef PIPEOFFLOAD_LIB_SLIDE_RECORDER_H_
#define PIPEOFFLOAD_LIB_SLIDE_RECORDER_H_

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::internal {

class SlideRecorder {
 public:
  SlideRecorder(Backend& backend, bool enabled);
  ~SlideRecorder();
  SlideRecorder(const SlideRecorder&) = delete;
  SlideRecorder& operator=(const SlideRecorder&) = delete;

  bool enabled() const { return enabled_; }

  // A start mark on `queue` (nothing when disabled).
  [[nodiscard]] absl::StatusOr<std::optional<Event>> Begin(Queue queue);
  // Closes a mark with an end event on the same queue; the record resolves later.
  [[nodiscard]] absl::Status End(const std::optional<Event>& start, Queue queue,
                                 SlideEngineKind engine, std::string name, int unit, int mb,
                                 std::int64_t bytes);
  // A finished host-side record.
  void AddHost(SlideRecord record);
  // Resolves every device record whose end event has completed.
  [[nodiscard]] absl::Status Resolve();
  // The resolved records so far (removed from the recorder).
  std::vector<SlideRecord> Take();

 private:
  struct Pending {
    SlideRecord record;
    Event start;
    Event end;
  };
  absl::StatusOr<Event> TakeEvent();

  Backend& backend_;
  const bool enabled_;
  std::mutex mu_;
  std::vector<Event> pool_;
  std::vector<Event> all_;
  std::vector<Pending> pending_;
  std::vector<SlideRecord> done_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_RECORDER_H_
