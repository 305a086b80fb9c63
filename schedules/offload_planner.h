// Private interface of the offload planner (issue 3): PlanOffload for the compiler's own
// lowering, and the policy search for `auto`.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"
#include "schedules/share_bound.h"

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

// One order lowered once for several offload plans of it (auto's shares of one order): what
// PlanOffloadOfLowered computes before it plans, which depends on the lowering only (not on the
// spec's offload fields): the simulation of the lowered schedule, and that schedule with every
// SEND/RECV posted at its transfer. About three copies of the lowering in size (the posted
// program and its op times), so it is kept only while its order's plans are made.
struct LoweredOrder {
  Schedule lowered;      // Compile's lowering; its spec is that of the last plan made on it
  Predictions baseline;  // SimulateOnce(lowered)'s, which has no transfers: Simulate's
  Schedule posted;       // `lowered` posted at its transfers (or `lowered`, should that not
                         // keep every RECV before its consumer)
  Timeline posted_times;  // the baseline's op times, in `posted`'s order
  // The share bound of `posted` per policy asked: auto asks it of a share before planning it,
  // the planner again as it plans it; computed once (share_bound.h).
  ShareBoundMemo share_bounds;
};

// LoweredOrder of `lowered` (REQUIRES: as for PlanOffloadOfLowered). Errors: those of Simulate.
[[nodiscard]] absl::StatusOr<LoweredOrder> MakeLoweredOrder(Schedule lowered,
                                                            const CostModel& cost);

// PlanOffloadOfLowered(lowered with spec `resolved`, cost) for order->lowered, bit for bit,
// without simulating or posting it again. REQUIRES: `resolved` is order->lowered.spec but for
// its offload fields, and `cost` the model the order was made with; sets both schedules' spec
// to `resolved`. Not thread-safe on one order.
[[nodiscard]] absl::StatusOr<Schedule> PlanOffloadOfLoweredOrder(LoweredOrder* order,
                                                                 const PipelineSpec& resolved,
                                                                 const CostModel& cost);

// Whether no plan of `lowered`'s policy keeps every stage at two of its largest entries or
// fewer (the test that lets PlanOffloadOfLowered keep the gated plan alone), by the share bound
// of each stage (`share_least_peaks`: ShareLeastPeaks of `lowered` under its spec, share_bound.h):
// then the plain plan is needed beside the gated one whatever the gated one does, and the two
// are made side by side. Stage by stage, since a stage of small entries can keep more than two
// of them while a stage of larger ones keeps less.
bool NeverAtMostTwoEntries(const Schedule& lowered, const CostModel& cost,
                           const std::vector<std::int64_t>& share_least_peaks);

// Compile's passes up to the offload planner for `spec` (REQUIRES: its offload is not kAuto,
// recompute kNone), and the order they make: CompileLowered makes spec's plans of other offload
// fields from it. Errors: those of Compile before the offload planner, and of Simulate.
[[nodiscard]] absl::StatusOr<LoweredOrder> LowerOrder(const PipelineSpec& spec,
                                                      const CostModel& cost);

// Compile(spec, cost), bit for bit, on `order` (LowerOrder of a spec that differs from `spec`
// in its offload fields at most; the caller keeps to that). Errors: those of Compile, and
// InvalidArgument when spec.offload is kAuto or spec.recompute is not kNone, or when `spec`
// resolves to another order than `order`'s.
[[nodiscard]] absl::StatusOr<Schedule> CompileLowered(const PipelineSpec& spec,
                                                      const CostModel& cost,
                                                      LoweredOrder* order);

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
