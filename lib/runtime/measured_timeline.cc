// MeasuredTimeline: the stages' measured iterations as one Timeline, in the simulator's layout,
// so TimelineToTraceJson writes predicted and measured traces that can be laid side by side.
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload {

absl::StatusOr<Timeline> MeasuredTimeline(const std::vector<IterationStats>& stats) {
  if (stats.empty()) {
    return absl::InvalidArgumentError("MeasuredTimeline: no stages given");
  }
  double origin = std::numeric_limits<double>::infinity();
  for (std::size_t d = 0; d < stats.size(); ++d) {
    if (stats[d].stage != static_cast<int>(d)) {
      return absl::InvalidArgumentError(absl::StrCat("MeasuredTimeline: entry ", d,
                                                      " holds stage ", stats[d].stage,
                                                      "; pass the stages in order"));
    }
    origin = std::min(origin, stats[d].start_time);
  }
  Timeline timeline;
  Predictions& measured = timeline.predictions;
  double busy_total = 0.0;
  for (const IterationStats& stage : stats) {
    std::vector<TimedOp> ops = stage.ops;
    for (TimedOp& op : ops) {
      op.start -= origin;
      op.end -= origin;
    }
    timeline.stages.push_back(std::move(ops));
    std::vector<MemorySample> memory = stage.memory;
    for (MemorySample& sample : memory) sample.time -= origin;
    timeline.memory.push_back(std::move(memory));

    StagePrediction prediction;
    prediction.peak_bytes = stage.stash_high_water_bytes;
    prediction.peak_units = stage.stash_high_water_entries;
    prediction.host_bytes = stage.host_high_water_bytes;
    prediction.offloaded_bytes = stage.offloaded_bytes;
    prediction.busy_time = stage.compute_seconds;
    prediction.end_time = stage.end_time - origin;
    measured.stages.push_back(prediction);
    measured.step_time = std::max(measured.step_time, prediction.end_time);
    busy_total += stage.compute_seconds;
  }
  if (measured.step_time > 0) {
    measured.bubble_ratio =
        1.0 - busy_total / (static_cast<double>(stats.size()) * measured.step_time);
  }
  return timeline;
}

}  // namespace pipeoffload
