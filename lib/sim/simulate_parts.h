// Simulate in its two parts, for callers that simulate many candidate schedules and need the
// step without offload of one of them only (the offload planner): the run of the programs as
// they are, and the run without their transfer ops. Simulate(s, c) is SimulateOnce, then, when
// HasTransfers(s), step_time_without_offload = StepTimeWithoutTransfers(s, c).
#ifndef PIPEOFFLOAD_LIB_SIM_SIMULATE_PARTS_H_
#define PIPEOFFLOAD_LIB_SIM_SIMULATE_PARTS_H_

#include "absl/status/statusor.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::internal {

// How much of a Timeline SimulateOnce fills in beyond the op times (Timeline::stages), for
// callers that read less than all of it: each level leaves out more.
enum class SimulateDetail {
  kFull,         // everything Simulate returns but the second run
  kPredictions,  // no Timeline::memory (the time-ordered samples; the peaks are predictions)
  kStepTime,     // of the predictions only step_time (and step_time_without_offload = it)
};

// Simulate without the second run: predictions.step_time_without_offload is step_time. The
// op times, and whatever `detail` fills in, are bit-identical to Simulate's.
[[nodiscard]] absl::StatusOr<Timeline> SimulateOnce(
    const Schedule& schedule, const CostModel& cost,
    SimulateDetail detail = SimulateDetail::kFull);

// True when `schedule` holds an OFFLOAD, RELEASE, RELOAD or BARRIER.
bool HasTransfers(const Schedule& schedule);

// The step time of `schedule`'s programs with those ops removed. Errors: as Simulate's, annotated
// "the programs without offload ops" (checked as SimulateOnce checks, so any schedule is safe).
[[nodiscard]] absl::StatusOr<double> StepTimeWithoutTransfers(const Schedule& schedule,
                                                              const CostModel& cost);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SIM_SIMULATE_PARTS_H_
