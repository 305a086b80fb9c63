// A lower bound on the step time of a gated warm-up (warmup_gating.h), found without simulating
// the gated program, so that GatedWarmup can skip a choice of forwards that cannot be kept.
// Pure function of a lowered schedule, its timeline and the cost model; no I/O.
#ifndef PIPEOFFLOAD_SCHEDULES_GATED_STEP_BOUND_H_
#define PIPEOFFLOAD_SCHEDULES_GATED_STEP_BOUND_H_

#include <vector>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::internal {

// A lower bound on the step time GatedWarmup's simulation of `lowered` with the forwards
// `gated` gated (per stage, program indices of F ops, as GateableForwards gives them) can
// have. `times` is `lowered`'s timeline in program order (its compute ops' durations are the
// gated program's too: gating only adds copies, RELEASEs and BARRIERs).
//
// Why it holds: in the gated program a gated F's RELEASE sits before the stage's next compute
// op and waits for the F's D2H, which starts after the F ends and runs at d2h_bandwidth (its
// reloads are free and take no time, so no D2H ever runs duplex there); ops issue in program
// order; and an op's input from another stage arrives over P2P no sooner than its producer's
// end plus one transfer. The longest path through those edges (each stage's compute ops in
// order, with a gated F's D2H after it; F to the next virtual stage's F, B to the previous
// one's B) is therefore no longer than the simulated step. BARRIERs, copy-engine queues and the
// turns of a host link only add waits. 0 when the compute ops do not form such a DAG.
double GatedStepLowerBound(const Schedule& lowered, const Timeline& times, const CostModel& cost,
                           const std::vector<std::vector<int>>& gated);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_GATED_STEP_BOUND_H_
