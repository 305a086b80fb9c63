// The timelines the offload planner plans on (offload_planner.cc, steps 0 and 1): the lowered
// schedule with every SEND/RECV posted at its transfer, and the warm-up gated so that the
// stages of a link group take turns sending warm-up activations to the host. Pure functions of
// a lowered schedule and the cost model; no I/O.
#ifndef PIPEOFFLOAD_SCHEDULES_WARMUP_GATING_H_
#define PIPEOFFLOAD_SCHEDULES_WARMUP_GATING_H_

#include <vector>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::internal {

// `lowered` with every SEND/RECV moved to where its transfer starts in `timeline` (the
// simulation of `lowered`): after the stage's other ops that start before the transfer (and
// after the F/B that produces a SEND's data, and never earlier than it was), before those that
// start at or after it; the stage's SENDs and RECVs sorted by transfer start, ties in program
// order. *moved gets `timeline`'s ops in the new order. Why: the simulator
// posts a SEND/RECV when the op before it is issued (simulate.h), so lowering may post one long
// before its transfer; here each is posted as late as it can be without moving its transfer
// (its post stays at or before the transfer's start, the same engines move the same messages
// in the same order), so the timeline is unchanged. What it buys: the programs are sorted by
// time, with each P2P pair at one instant on both of its stages (its transfer's start), like a
// rendezvous. So ordering every stage's ops by time is one consistent cut of all programs, and
// a BARRIER pair at the same time on two stages keeps them deadlock-free under the blocking
// rendezvous that Validate checks (offload_barriers.h); and ordering ops by time in a gap, the
// planner never puts an inserted op behind a post whose transfer waits for a later op.
Schedule PostAtTransfers(const Schedule& lowered, const Timeline& timeline, Timeline* moved);

// True when every RECV of `schedule` still comes before the F or B that consumes it (all that
// PostAtTransfers can get wrong: it keeps every other order Validate checks).
bool ReceivesFirst(const Schedule& schedule);

// A D2H of a gated warm-up forward's entry, as the gated program ran it (GatedWarmup).
struct GatedCopy {
  int mb = 0;
  int chunk = 0;
  double start = 0.0;
  double end = 0.0;
};

// A BARRIER of the gated program that orders two gated copies (GatedWarmup): on `stage`,
// after `after_compute` of its ops other than SEND/RECV, at `time` in that program's timeline.
// The plan keeps it where it was: the timeline it planned on waited for it there.
struct GatedBarrier {
  int stage = 0;
  int after_compute = 0;
  double time = 0.0;
  Op op;
};

// Warm-up gating. In a warm-up every stage runs forwards back to back, one activation per F,
// and the stages of a link group together produce them faster than one direction of their link
// can carry them out (two stages at k = 0.25: 2 x 0.75 link time per time unit). Planned on the
// lowered timeline, most of them stay on the device until the warm-up ends, and the peak grows
// with it. Yet early stages have slack there: stage d's F(i) is needed downstream much later
// than it runs (the reference planner postpones warm-up forwards as late as it can,
// pipeoffload.md section 1.4b). So here each gated forward's entry goes out right after its F,
// its RELEASE (which waits for that D2H) sits right before the stage's next F, and the group's
// stages take turns on the link, one copy each (BARRIER pairs: a stage's next copy waits for
// the other stage's RELEASE). The gated program is simulated with reloads free (each put right
// before its B: where they really go is planned afterwards), to learn the timeline it yields.
//
// `lowered` is posted at its transfers (PostAtTransfers) and `times` is its simulation; `base`
// the predictions of the lowered schedule; `share` scales what the policy asks of each stage.
// Gates the warm-up forwards of every chunk, or, when that costs more than kOverheadBudget,
// those of the longer-lived chunks only (down to chunk 0 alone). Returns false when nothing is
// worth gating, or every such timeline hangs or is more than kOverheadBudget slower than
// `base`. Else: the lowered program with its SEND/RECVs posted at their transfers in that
// timeline (*gated_lowered, *gated_times, for the planner), each stage's gated copies as
// simulated (*copies), which the planner commits before anything else, and the BARRIERs that
// ordered them (*barriers), which it keeps.
bool GatedWarmup(const Schedule& lowered, const CostModel& cost, const Timeline& times,
                 const Predictions& base, double share, Schedule* gated_lowered,
                 Timeline* gated_times, std::vector<std::vector<GatedCopy>>* copies,
                 std::vector<GatedBarrier>* barriers);

// GatedWarmup for one choice of forwards to gate (`gated`: per stage, program indices of F ops
// in order, as GatedWarmup chooses them): false when its simulation hangs or is more than
// kOverheadBudget slower than `base`, else true with the outputs as GatedWarmup's. Exposed for
// the tests of the bound GatedWarmup asks first (gated_step_bound.h).
bool GateForwards(const Schedule& lowered, const CostModel& cost, const Predictions& base,
                  const std::vector<std::vector<int>>& gated, Schedule* gated_lowered,
                  Timeline* gated_times, std::vector<std::vector<GatedCopy>>* copies,
                  std::vector<GatedBarrier>* barriers);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_WARMUP_GATING_H_
