// Private interface of the offload planner (issue 3): PlanOffload for the compiler's own
// lowering, and the policy search for `auto`.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// PlanOffload (compiler.h) for a schedule that Compile lowered itself. REQUIRES: `lowered`
// passes Validate (LowerCommunication's result for a resolved spec); it is not validated again
// unless it is returned as it is. Unless spec.offload is kNone (then `lowered` comes back
// unchanged, without predictions), the result passes Validate and its predictions are those of
// Simulate(result, cost) plus the planner's warnings, so the caller need not validate or
// simulate it again. Errors: those of PlanOffload, and Internal when `lowered`, returned as it
// is, fails validation after all (a compiler bug).
[[nodiscard]] absl::StatusOr<Schedule> PlanOffloadOfLowered(const Schedule& lowered,
                                                            const CostModel& cost);

// Compile (compiler.h) with the recompute choice given per entry instead of the one
// spec.recompute would make, and spec.offload planned around it: the offload planner's
// candidate for a recomputed entry is its retained block. This is how `auto` mixes offload
// and recompute. Errors: InvalidArgument when spec.offload is kAuto or spec.recompute is not
// kNone (the choice is the recompute), and those of Compile.
[[nodiscard]] absl::StatusOr<Schedule> CompileWithRecompute(const PipelineSpec& spec,
                                                            const CostModel& cost,
                                                            const RecomputeChoice& choice);

// `auto`: compiles candidate plans (family, v, g, what to offload) for spec's p and m and
// returns the fastest whose predicted peak activation bytes fit spec.memory_budget_bytes on
// every stage. When `alternatives` is not null, appends one human-readable line per candidate
// weighed (plan, step time, peak, fits or not). Errors: InvalidArgument for a budget <= 0;
// ResourceExhausted when no candidate fits, naming the smallest peak found.
//
// The cost model describes chunks of spec.chunks_per_stage; a candidate with another v cuts the
// same layers into v chunks, so it is priced with RechunkedCost(cost, spec v, candidate v), and
// the returned schedule's predictions come from that model (a caller that simulates or traces
// the result again must use it too). With `judge`, candidates are ranked by its step instead of
// their predicted step_time (CompileOptions::auto_step).
[[nodiscard]] absl::StatusOr<Schedule> PlanAuto(const PipelineSpec& spec, const CostModel& cost,
                                                std::vector<std::string>* alternatives,
                                                const StepJudge& judge = {});

// `cost` (for chunks of a stage cut `from_v` ways) re-cut into `to_v` chunks per stage: compute
// times and activation bytes scale by from_v / to_v, and so do recompute times given
// explicitly and the lean retained bytes; P2P message sizes, the full retained bytes (the
// chunk's input) and bandwidths stay.
// Returns `cost` unchanged when from_v == to_v, and whenever it holds per-virtual-stage bytes
// (which only describe their own v; PlanAuto tries no other v then).
CostModel RechunkedCost(const CostModel& cost, int from_v, int to_v);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_
