// Where recompute lowers a planned schedule's peak (issues 15 and 16): the step of `auto`'s
// mixed plans that picks, per stage over the memory budget, which entries to recompute next.
// Pure function of the schedule and the cost model; no I/O.
//
// Offload is free while the host link keeps up and recompute always costs compute time, so
// `auto` offloads all the link carries (po-f) and recomputes only where the peak stays above
// the budget: at each such stage's peak (program order, the simulator's accounting) it takes
// the entries resident there whose B comes furthest after the peak (recomputing those lowers
// the most of what follows, the greedy for covering points with intervals), until their
// savings cover the excess. For a full recompute, entries the plan offloads count too when
// they are on the device at the peak (their copy waiting for the link, as in a warm-up, or
// back already): recomputed, they leave the link to the others. The offload plan is then made
// again around them, which moves the peak, and the next round looks again.
#ifndef PIPEOFFLOAD_SCHEDULES_RECOMPUTE_MIX_H_
#define PIPEOFFLOAD_SCHEDULES_RECOMPUTE_MIX_H_

#include <cstdint>

#include "pipeoffload/compiler.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// How much of a stage above the budget one round covers. kPeak: the first instant of its peak
// (the offload plan, made again, may handle the rest). kPlateau: every instant above the
// budget, the program order's accounting redone with each round's choices (fewer rounds; it
// recomputes entries a re-planned offload might have moved). On one GPU with 4 stages and
// H200-like costs, neither is always the faster plan (docs/benchmarks.md, "auto's per-entry
// mix"), so auto searches both.
enum class MixCover { kPeak, kPlateau };

// Adds to `choice` the entries of `planned` to recompute in `mode` next: on every stage whose
// predicted peak exceeds `budget_bytes`, entries resident at its peak and not yet recomputed
// (with `mode` kFull, offloaded ones too: the plan then keeps them off the link, and entries
// recomputed lean whose RECOMPUTE_LEAN comes
// after the peak count too: full keeps less), whose B comes after the peak and whose cost model
// offers `mode`, as far as `cover` says. Returns how many entries it added or changed (0:
// recompute in `mode` cannot lower any stage further).
int RecomputeAtPeaks(const Schedule& planned, const CostModel& cost, std::int64_t budget_bytes,
                     Recompute mode, MixCover cover, RecomputeChoice* choice);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_RECOMPUTE_MIX_H_
