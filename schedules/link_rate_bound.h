// The link-rate bound: the least peak any offload plan of one lowered order can have when it is
// no slower than a given step, for `auto` (issue 15) to rule out an order without planning it.
// Pure computation on a simulated lowering; no I/O.
//
// Why it holds. Memory counts in program order (simulate.h): +entry at F, -entry at RELEASE and
// at the op that frees it, +entry at RELOAD. So after a stage's F_j the device holds at least
// X_j (what the order holds there without offload) minus what the stage RELEASEd before F_j. A
// RELEASE waits for its D2H and the ops after it wait for the RELEASE, so those copies ended
// before F_j started. The stages of one host link share its D2H direction: the simulator gives
// each stage a copy engine of its own, but the planner's Check refuses a plan with more
// colliding transfers than the order, which has none on the host links unless P2P crosses them
// (then this bound is 0), so the link carries one copy at a time, at most max(d2h, duplex)
// bandwidth x T bytes by time T, but for the overlaps CountCollisions takes for rounding (up to
// 1e-9 of the horizon per copy, taken off the bound, with one copy per entry as the planner
// places them). Planning adds OFFLOAD, RELEASE, RELOAD
// and BARRIER ops and moves SEND/RECVs, never a compute op, so in a plan whose step ends by
// `max_step`, F_j starts by its latest start LS_j: `max_step` less the longest chain of
// compute ops from F_j to the end (each stage runs its ops one at a time in program order, and
// a consumer waits for its producer's F or B; P2P counted as free, which only loosens it). With
// M_s(T) the largest X_j of stage s over its F_j with LS_j <= T, the stages S of one link have
// sum over S of peak_s >= sum over S of M_s(T) - bandwidth x T, for every T and subset S, so
// the largest peak is at least (that sum) / |S|.
//
// It binds where a warm-up makes activations faster than the link takes them out and the step
// leaves no time to wait (the offload planner's gated warm-ups may stretch the step by at most
// kOverheadBudget: Check refuses more). It does not bind plans with recompute (a RECOMPUTE
// frees memory on its own) and is 0 for them.
#ifndef PIPEOFFLOAD_SCHEDULES_LINK_RATE_BOUND_H_
#define PIPEOFFLOAD_SCHEDULES_LINK_RATE_BOUND_H_

#include <cstdint>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::internal {

// A lower bound, in bytes, on the largest per-stage peak_bytes of any plan that adds offload
// ops to `lowered` (a schedule without offload or recompute ops) and whose step time is at most
// `max_step`. `times` is the simulation of `lowered` or of it posted at its transfers: per stage
// its ops in program order, each compute op with its duration. 0 when nothing binds (or the
// schedule has recompute ops, or its compute ops form no chain the bound can follow).
std::int64_t LinkRateLeastPeak(const Schedule& lowered, const Timeline& times,
                               const CostModel& cost, double max_step);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_LINK_RATE_BOUND_H_
