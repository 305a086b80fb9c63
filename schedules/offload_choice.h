// Which stash entries a link group offloads (offload_planner.cc, step 2), and what the plan
// carries against what the policy asked (the shortfall warning). Pure computation on the
// planner's StagePlans; no I/O.
//
// Invariants: a LinkGroupPlan's link timelines (d2h, h2d, engines, *_ends) hold exactly the
// transfers committed through it (plus P2P booked before any choice, when P2P shares the link);
// budget[m] is member m's share less the bytes committed for it; a cached placement is what
// StagePlan::FindPlacement would answer now (Invalidate keeps that).
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_CHOICE_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_CHOICE_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "schedules/offload_stage_plan.h"
#include "schedules/slot_occupancy.h"

namespace pipeoffload::internal {

// One link group being planned: its stages, their link timelines and copy engines, and what
// each stage may still offload.
struct LinkGroupPlan {
  std::vector<StagePlan> plans;
  SlotOccupancy d2h, h2d;             // whole group, incl. P2P when it shares the link
  SlotOccupancy p2p_d2h, p2p_h2d;     // P2P alone: what an entry would face by itself
  std::multiset<double> d2h_ends;     // ends of the group's OFFLOADs (offload_stage_plan.h)
  std::vector<SlotOccupancy> engines;               // per member, when the engine is shared
  std::vector<std::multiset<double>> h2d_ends;      // per member: ends of its RELOADs
  std::vector<std::vector<int>> order;      // per member: candidates, longest-lived first
  std::vector<double> budget;               // per member: bytes it may still offload
  std::vector<std::vector<int>> rank;       // per member/entry: place in `order`, or -1
  std::vector<int> scratch;
  bool shared_engine = false;

  TransferResources Resources(int member) {
    return TransferResources{&d2h, &h2d, shared_engine ? &engines[member] : nullptr, &d2h_ends,
                             &h2d_ends[member]};
  }
  bool Affordable(int member, int entry) const {
    return static_cast<double>(plans[member].entries()[entry].bytes) <= budget[member];
  }
  void Commit(int member, int entry, const Placement& p, bool offload_booked = false) {
    plans[member].Commit(entry, p, Resources(member), offload_booked);
    budget[member] -= static_cast<double>(plans[member].entries()[entry].bytes);
    Invalidate(member, p);
  }

  // FindPlacement, remembered per entry until a commit could change its answer: new bookings
  // only take slots away, so a remembered placement stays the answer while its own slots stay
  // free and no new candidate start (the end of a new D2H, or of a new RELOAD of its stage)
  // falls where the search would have met it first; a remembered "none" stays none unless a
  // new candidate falls inside the entry's lifetime. Planning calls FindPlacement for every
  // entry resident at the peak, once per entry it offloads: without this, O(entries^2).
  std::optional<Placement> Find(int member, int entry) {
    if (cached[member][entry]) return *cached[member][entry];
    std::optional<Placement> p = plans[member].FindPlacement(entry, Resources(member));
    cached[member][entry] = p;
    return p;
  }
  // Forgets the remembered placements that committing `done` for member `committer` may have
  // changed.
  void Invalidate(int committer, const Placement& done);

  std::vector<std::vector<std::optional<std::optional<Placement>>>> cached;  // [member][entry]
  std::vector<std::vector<char>> fixed;  // [member][entry]: a gated copy (CommitGated)
};

// Per-stage outcome, for the warnings and the strict check.
struct StageOutcome {
  std::int64_t total_bytes = 0;
  std::int64_t eligible_bytes = 0;
  std::int64_t planned_bytes = 0;
  double requested_bytes = 0.0;   // min(policy's ask, eligible)
  bool short_of_request = false;  // the links could not carry an eligible entry the ask covers
  double d2h_demand = 0.0;        // conservative link time the request needs, per direction
  double h2d_demand = 0.0;
};

// Everything PlanOffload decided.
struct PipelinePlan {
  bool ok = true;  // false when a gated entry found no RELOAD (MakePlan)
  std::vector<LinkGroupPlan> groups;
  std::vector<std::vector<InsertedOp>> fixed_barriers;  // per stage: the gated program's
  std::vector<int> group_of;   // per stage
  std::vector<int> member_of;  // per stage
  std::vector<StageOutcome> outcomes;  // per stage
  std::vector<double> p2p_d2h_busy, p2p_h2d_busy;  // per group
};

// For each member of `group` (whose plans are built): its candidates (longest-lived first),
// and its share of the volume (`share` times what the policy asks), into group and outcomes.
void PrepareChoices(const PipelineSpec& spec, double share, LinkGroupPlan& group,
                    std::vector<StageOutcome>& outcomes);

// Chooses what the group offloads (offload_planner.cc, step 2): lower each stage's peak one
// entry at a time, taking turns, until no entry (within the stage's share) can lower it
// further; then fill the shares with the rest, longest-lived first.
void ChooseEntries(LinkGroupPlan& group);

// What `group` planned against what it was asked, into `outcomes`. `bandwidths` gives the
// booked (slowest) transfer rates.
void Summarize(LinkGroupPlan& group, const StagePlanParams& bandwidths,
               std::vector<StageOutcome>& outcomes);

// The warning for a plan that carries less than the policy asks, with requested and planned
// shares, the busiest link and the slowdowns; "" when it carries it all. Reads the plan's
// outcomes, group_of and P2P busy times only (not its groups, which may be freed).
std::string ShortfallWarning(const PipelineSpec& spec, const CostModel& cost,
                             const PipelinePlan& plan, double step_time, double base_step_time);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_CHOICE_H_
