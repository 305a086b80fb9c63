// MeasureLink and MeasureChunkTimes (see the header). Everything they allocate is released on
// every path (Buffers), after the backend's queues drained.
#include "pipeoffload/calibrate.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace pipeoffload {
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

// Seconds of `call` on the compute queue, between two events recorded around it (waits for it).
template <typename Call>
absl::StatusOr<double> TimeOnCompute(Backend& backend, Buffers& buffers, double timeout_seconds,
                                     Call&& call) {
  std::array<Event, 2> events = {Event(nullptr, 0), Event(nullptr, 0)};
  for (Event& event : events) {
    PO_ASSIGN_OR_RETURN(event, backend.CreateEvent());
    buffers.events.push_back(event);
  }
  const Queue compute = backend.queue(QueueKind::kCompute);
  PO_RETURN_IF_ERROR(backend.RecordEvent(events[0], compute));
  PO_RETURN_IF_ERROR(call());
  PO_RETURN_IF_ERROR(backend.RecordEvent(events[1], compute));
  PO_RETURN_IF_ERROR(backend.WaitEvent(events[1], timeout_seconds));
  PO_ASSIGN_OR_RETURN(const double start, backend.EventTime(events[0]));
  PO_ASSIGN_OR_RETURN(const double end, backend.EventTime(events[1]));
  return std::max(end - start, 1e-9);
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

absl::StatusOr<ChunkTimes> MeasureChunkTimes(Backend& backend, StageModel& model,
                                             const ChunkTimingOptions& options) {
  const std::int64_t saved_bytes = model.SavedBytes(options.chunk, /*split_backward=*/false);
  if (options.reps < 1 || options.untimed < 0 || saved_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MeasureChunkTimes: needs reps >= 1, untimed >= 0 and a chunk that saves "
                     "bytes (got reps ",
                     options.reps, ", untimed ", options.untimed, ", chunk ", options.chunk,
                     " saving ", saved_bytes, " bytes)"));
  }
  Buffers buffers{backend, {}, {}, {}};
  auto fill = [&](void* device, std::int64_t bytes) -> absl::Status {
    const int index = static_cast<int>(buffers.device.size()) - 1;
    if (options.fill) return options.fill(device, bytes, index);
    return backend.FillAsync(backend.queue(QueueKind::kCompute), device, kPattern,
                             bytes / 4 * 4);
  };
  // Buffers the chunk reads are filled; the ones it only writes are left as allocated.
  auto allocate = [&](std::int64_t bytes, bool read) -> absl::StatusOr<void*> {
    PO_ASSIGN_OR_RETURN(void* device, backend.AllocateDevice(bytes));
    buffers.device.push_back(device);
    if (read) PO_RETURN_IF_ERROR(fill(device, bytes));
    return device;
  };
  const std::int64_t boundary = std::max<std::int64_t>(model.BoundaryBytes(), 4);
  PO_ASSIGN_OR_RETURN(void* saved, allocate(saved_bytes, /*read=*/true));
  void* input = nullptr;
  void* grad_input = nullptr;
  void* output = nullptr;
  void* grad_output = nullptr;
  if (options.has_input) {
    PO_ASSIGN_OR_RETURN(input, allocate(boundary, /*read=*/true));
    PO_ASSIGN_OR_RETURN(grad_input, allocate(boundary, /*read=*/false));
  }
  if (options.has_output) {
    PO_ASSIGN_OR_RETURN(output, allocate(boundary, /*read=*/false));
    PO_ASSIGN_OR_RETURN(grad_output, allocate(boundary, /*read=*/true));
  }
  PO_RETURN_IF_ERROR(backend.Synchronize(kWaitSeconds));
  std::vector<double> forward;
  std::vector<double> backward;
  for (int rep = 0; rep < options.untimed + options.reps; ++rep) {
    PO_ASSIGN_OR_RETURN(const double f,
                        TimeOnCompute(backend, buffers, options.timeout_seconds, [&] {
                          return model.Forward(options.mb, options.chunk, input, output, saved);
                        }));
    PO_ASSIGN_OR_RETURN(const double b,
                        TimeOnCompute(backend, buffers, options.timeout_seconds, [&] {
                          return model.Backward(options.mb, options.chunk, grad_output,
                                                grad_input, saved, /*with_weight_grad=*/true);
                        }));
    if (rep < options.untimed) continue;
    forward.push_back(f);
    backward.push_back(b);
  }
  return ChunkTimes{Median(std::move(forward)), Median(std::move(backward))};
}

ChunkTimes MeanChunkTimes(const StageCosts& costs) {
  ChunkTimes mean;
  for (const ChunkTimes& chunk : costs.chunks) {
    mean.forward += chunk.forward;
    mean.backward += chunk.backward;
  }
  const double n = static_cast<double>(costs.chunks.size());
  return ChunkTimes{mean.forward / n, mean.backward / n};
}

LinkFigures SlowestLink(const std::vector<StageCosts>& stages) {
  LinkFigures slowest = stages.front().link;
  for (const StageCosts& stage : stages) {
    slowest.d2h = std::min(slowest.d2h, stage.link.d2h);
    slowest.h2d = std::min(slowest.h2d, stage.link.h2d);
    slowest.duplex = std::min(slowest.duplex, stage.link.duplex);
  }
  return slowest;
}

absl::StatusOr<StageCosts> MeasureStageCosts(Backend& backend, StageModel& model,
                                             const VirtualStageMap& map, int stage,
                                             bool split_backward, const StageCostProbe& probe) {
  const int chunks = map.chunks;
  if (stage < 0 || stage >= map.num_stages || chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MeasureStageCosts: stage ", stage, " of ",
                                                   map.num_stages, " with ", chunks, " chunks"));
  }
  constexpr std::int64_t kLinkProbeMinBytes = std::int64_t{1} << 20;
  StageCosts costs;
  std::int64_t largest = 0;
  for (int c = 0; c < chunks; ++c) {
    ChunkTimingOptions options;
    options.chunk = c;
    const int virtual_stage = map.virtual_stage(stage, c);
    options.has_input = virtual_stage != 0;
    options.has_output = virtual_stage != map.num_virtual_stages() - 1;
    options.untimed = probe.untimed;
    options.reps = probe.reps;
    options.timeout_seconds = probe.timeout_seconds;
    options.fill = probe.fill;
    absl::StatusOr<ChunkTimes> times = MeasureChunkTimes(backend, model, options);
    if (!times.ok()) {
      return Annotate(times.status(), absl::StrCat("measuring stage ", stage, " chunk ", c));
    }
    costs.chunks.push_back(*times);
    largest = std::max(largest, model.SavedBytes(c, split_backward));
  }
  const std::int64_t probe_bytes =
      std::clamp(largest, kLinkProbeMinBytes, std::max(kLinkProbeMinBytes,
                                                       probe.link_probe_max_bytes));
  absl::StatusOr<LinkFigures> link = MeasureLink(backend, probe_bytes, probe.link_reps);
  if (!link.ok()) {
    return Annotate(link.status(), absl::StrCat("measuring stage ", stage, "'s host link"));
  }
  costs.link = *link;
  return costs;
}

}  // namespace pipeoffload
