// What the fuzz targets share: a check that aborts (so libFuzzer records the input as a crash)
// with a message, and the simulation step every target ends with.
#ifndef PIPEOFFLOAD_TESTS_FUZZ_FUZZ_CHECK_H_
#define PIPEOFFLOAD_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

#define PO_FUZZ_CHECK(condition, what)                                        \
  do {                                                                        \
    if (!(condition)) {                                                       \
      std::fprintf(stderr, "fuzz check failed: %s (%s)\n", what, #condition); \
      std::abort();                                                           \
    }                                                                         \
  } while (0)

namespace pipeoffload::fuzzing {

// Simulates a schedule that passed Validate. A simulation may refuse a cost model (a Status),
// but one it accepts must give finite, non-negative times and a bubble in [0, 1].
inline void SimulateChecked(const Schedule& schedule, const CostModel& cost) {
  absl::StatusOr<Timeline> timeline = Simulate(schedule, cost);
  if (!timeline.ok()) return;
  const Predictions& p = timeline->predictions;
  PO_FUZZ_CHECK(std::isfinite(p.step_time) && p.step_time >= 0, "step time not finite");
  PO_FUZZ_CHECK(std::isfinite(p.step_time_without_offload), "plain step time not finite");
  PO_FUZZ_CHECK(p.bubble_ratio >= -1e-9 && p.bubble_ratio <= 1 + 1e-9, "bubble outside [0, 1]");
  for (const StagePrediction& stage : p.stages) {
    PO_FUZZ_CHECK(stage.peak_bytes >= 0 && stage.host_bytes >= 0, "negative bytes");
    PO_FUZZ_CHECK(stage.end_time <= p.step_time, "a stage ends after the step");
  }
}

}  // namespace pipeoffload::fuzzing

#endif  // PIPEOFFLOAD_TESTS_FUZZ_FUZZ_CHECK_H_
