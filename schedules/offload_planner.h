// Private interface of the offload planner (issue 3): policy search for `auto`.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// `auto`: compiles candidate plans (family, v, g, what to offload) for spec's p and m and
// returns the fastest whose predicted peak activation bytes fit spec.memory_budget_bytes on
// every stage. When `alternatives` is not null, appends one human-readable line per candidate
// weighed (plan, step time, peak, fits or not). Errors: InvalidArgument for a budget <= 0;
// ResourceExhausted when no candidate fits, naming the smallest peak found.
[[nodiscard]] absl::StatusOr<Schedule> PlanAuto(const PipelineSpec& spec, const CostModel& cost,
                                                std::vector<std::string>* alternatives);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_
