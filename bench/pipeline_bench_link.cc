// MeasureLink (see the header). Everything it allocates is released on every path (Buffers).
#include "bench/pipeline_bench_link.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::bench {
namespace {

constexpr double kWaitSeconds = 60.0;
constexpr std::uint32_t kPattern = 0x3c5a3c5a;  // not zero: copies of zeros can be special

struct Buffers {
  Backend& backend;
  std::vector<void*> device;
  std::vector<void*> host;
  std::vector<Event> events;
  ~Buffers() {
    static_cast<void>(backend.Synchronize(kWaitSeconds));  // teardown: nothing may be in flight
    for (void* ptr : device) backend.FreeDevice(ptr);
    for (void* ptr : host) backend.FreeHost(ptr);
    for (const Event& event : events) backend.DestroyEvent(event);
  }
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// One copy per entry of `copies` (queue, dst, src), all enqueued before any is waited for;
// returns each one's seconds between events recorded around it on its queue.
struct Copy {
  QueueKind queue;
  void* dst;
  const void* src;
};

absl::StatusOr<std::vector<double>> TimeCopies(Backend& backend, Buffers& buffers,
                                               const std::vector<Copy>& copies,
                                               std::int64_t bytes) {
  std::vector<std::array<Event, 2>> events;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    std::array<Event, 2> pair = {Event(nullptr, 0), Event(nullptr, 0)};
    for (Event& event : pair) {
      PO_ASSIGN_OR_RETURN(event, backend.CreateEvent());
      buffers.events.push_back(event);
    }
    events.push_back(pair);
  }
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const Queue queue = backend.queue(copies[i].queue);
    PO_RETURN_IF_ERROR(backend.RecordEvent(events[i][0], queue));
    PO_RETURN_IF_ERROR(backend.CopyAsync(queue, copies[i].dst, copies[i].src, bytes));
    PO_RETURN_IF_ERROR(backend.RecordEvent(events[i][1], queue));
  }
  std::vector<double> seconds;
  for (const auto& pair : events) {
    PO_RETURN_IF_ERROR(backend.WaitEvent(pair[1], kWaitSeconds));
    PO_ASSIGN_OR_RETURN(const double start, backend.EventTime(pair[0]));
    PO_ASSIGN_OR_RETURN(const double end, backend.EventTime(pair[1]));
    seconds.push_back(std::max(end - start, 1e-9));
  }
  return seconds;
}

}  // namespace

absl::StatusOr<LinkFigures> MeasureLink(Backend& backend, std::int64_t bytes, int reps) {
  if (bytes < 4096 || reps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MeasureLink: needs bytes >= 4096 and reps >= 1 (got ", bytes, ", ", reps, ")"));
  }
  bytes = bytes / 4 * 4;
  Buffers buffers{backend, {}, {}, {}};
  for (int i = 0; i < 2; ++i) {
    PO_ASSIGN_OR_RETURN(void* device, backend.AllocateDevice(bytes));
    buffers.device.push_back(device);
    PO_ASSIGN_OR_RETURN(void* host, backend.AllocateHost(bytes));
    buffers.host.push_back(host);
    PO_RETURN_IF_ERROR(backend.FillAsync(backend.queue(QueueKind::kCompute), device, kPattern,
                                         bytes));
  }
  PO_RETURN_IF_ERROR(backend.Synchronize(kWaitSeconds));
  const Copy d2h{QueueKind::kD2H, buffers.host[0], buffers.device[0]};
  const Copy h2d{QueueKind::kH2D, buffers.device[1], buffers.host[1]};
  std::vector<double> solo_d2h, solo_h2d, duplex_d2h, duplex_h2d;
  for (int rep = 0; rep < reps + 1; ++rep) {
    PO_ASSIGN_OR_RETURN(const std::vector<double> a, TimeCopies(backend, buffers, {d2h}, bytes));
    PO_ASSIGN_OR_RETURN(const std::vector<double> b, TimeCopies(backend, buffers, {h2d}, bytes));
    PO_ASSIGN_OR_RETURN(const std::vector<double> both,
                        TimeCopies(backend, buffers, {d2h, h2d}, bytes));
    if (rep == 0) continue;  // untimed: first-touch and driver set-up
    solo_d2h.push_back(a[0]);
    solo_h2d.push_back(b[0]);
    duplex_d2h.push_back(both[0]);
    duplex_h2d.push_back(both[1]);
  }
  const double size = static_cast<double>(bytes);
  LinkFigures link;
  link.d2h = size / Median(solo_d2h);
  link.h2d = size / Median(solo_h2d);
  link.duplex = std::min(size / Median(duplex_d2h), size / Median(duplex_h2d));
  return link;
}

}  // namespace pipeoffload::bench
