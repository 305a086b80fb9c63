// PlanOffload: decides which stash entries leave the device, and places their OFFLOAD, RELEASE,
// RELOAD ops and the BARRIERs between stages that share a host link (issue 3; DESIGN.md
// section 4, pass 3). Pure function of the lowered schedule and the cost model; no I/O.
//
// How a plan is made, and why it is stall-free and collision-free by construction:
//  1. Simulate the lowered schedule. The simulator issues each stage's ops in order, so an
//     inserted transfer can only start when the op ahead of it starts, when its dependency
//     ends, or when its copy engine (or, through a BARRIER, another stage's copy) frees up:
//     these instants are the "slots" (offload_stage_plan.h). The planner books each transfer at
//     exactly such an instant, for the slower of its solo and duplex durations, on one timeline
//     per direction of each host link, shared by the link group's stages (and by P2P, when it
//     crosses the same link). Stages that share a link thus take turns in each direction while
//     one's D2H runs freely against the other's H2D: the staggered slot grids of the reference
//     planner (pipeoffload.md section 1.4b), derived from the real op times instead of a fixed
//     period. No inserted op starts later than the op after it, so no stage ever waits.
//  2. Per link group, choose entries (ChooseEntries): taking turns over the group's stages,
//     find the first point of the stage's program where its memory peaks, and offload, of the
//     entries resident there whose widest placement takes them off the device at that point,
//     the one whose window reaches furthest ahead; until no entry within the policy's share can
//     lower the peak. Then fill the share with the rest, longest-lived first, wherever their
//     window is not empty. Better than the reference's fixed lifespan threshold: an entry stays
//     exactly when no slot takes it off the device anywhere, and the peak decides the order.
//     A policy's share caps each stage's offloaded bytes; more share only adds choices, so in
//     the common case offloading more never raises the peak (the tests check it).
//  3. BARRIERs at every hand-over of a link direction between two stages (offload_barriers.h).
//  4. Re-simulate and check: valid, no stall, no new collision. Should that ever fail (a bug
//     here, or a simulator whose semantics moved), plan a smaller share and say so in a warning.
// A stage whose links cannot carry the policy's share (a "shortfall") keeps what fits; the
// warning gives requested and planned shares and the link load the full request would need.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_barriers.h"
#include "schedules/offload_stage_plan.h"
#include "schedules/slot_occupancy.h"

namespace pipeoffload {
namespace {

using internal::InsertedOp;
using internal::PeakPoint;
using internal::Placement;
using internal::PlannedTransfer;
using internal::ProgramKey;
using internal::SlotOccupancy;
using internal::StagePlan;
using internal::StagePlanParams;
using internal::TransferResources;

// Relative slack when checking the re-simulated step time against the plan's: the plan starts
// every op exactly when it did before, so anything beyond rounding is a stall.
constexpr double kStallTolerance = 1e-9;

std::string PolicyName(const PipelineSpec& spec) {
  return std::string(OffloadPolicyName(spec.offload));
}

absl::Status CheckRequest(const Schedule& lowered, const CostModel& cost) {
  const PipelineSpec& spec = lowered.spec;
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("PlanOffload: ", what));
  };
  if (spec.offload == OffloadPolicy::kAuto) {
    return bad("policy 'auto' has no plan of its own; Compile (PlanAuto) picks the family, v, g "
               "and a concrete policy for it");
  }
  if (!std::isfinite(spec.offload_fraction) || spec.offload_fraction < 0.0 ||
      spec.offload_fraction > 1.0) {
    return bad(absl::StrCat("offload_fraction must be in [0, 1] (got ", spec.offload_fraction, ")"));
  }
  if (spec.offload_chunks < 0 || spec.offload_chunks > spec.chunks_per_stage) {
    return bad(absl::StrCat("offload_chunks must be in [0, chunks_per_stage=",
                            spec.chunks_per_stage, "] (got ", spec.offload_chunks, ")"));
  }
  if (!(cost.reload_margin_in_backward_times >= 0.0) ||
      !std::isfinite(cost.reload_margin_in_backward_times)) {
    return bad(absl::StrCat("reload_margin_in_backward_times must be finite and >= 0 (got ",
                            cost.reload_margin_in_backward_times, ")"));
  }
  if (cost.host_link_group_size < 1) {
    return bad(absl::StrCat("host_link_group_size must be >= 1 (got ", cost.host_link_group_size,
                            ")"));
  }
  for (const StageProgram& program : lowered.stages) {
    for (const Op& op : program.ops) {
      if (IsOffload(op.kind) || op.kind == OpKind::kBarrier) {
        return bad(absl::StrCat("stage ", program.stage, " already holds offload ops (",
                                OpToString(op), "); plan a lowered schedule without them"));
      }
    }
  }
  return absl::OkStatus();
}

// What the policy asks of one stage, in bytes (infinity: everything that saves memory).
double RequestedBytes(const PipelineSpec& spec, std::int64_t total_bytes) {
  switch (spec.offload) {
    case OffloadPolicy::kHalf: return 0.5 * static_cast<double>(total_bytes);
    case OffloadPolicy::kSelective:
      if (spec.offload_chunks > 0) return std::numeric_limits<double>::infinity();
      return spec.offload_fraction * static_cast<double>(total_bytes);
    default: return std::numeric_limits<double>::infinity();
  }
}

// Whether the policy lets entry `chunk` go at all.
bool Candidate(const PipelineSpec& spec, int chunk) {
  return spec.offload != OffloadPolicy::kSelective || spec.offload_chunks == 0 ||
         chunk < spec.offload_chunks;
}

// One link group being planned: its stages, their link timelines and copy engines, and what
// each stage may still offload.
struct Group {
  std::vector<StagePlan> plans;
  SlotOccupancy d2h, h2d;             // whole group, incl. P2P when it shares the link
  SlotOccupancy p2p_d2h, p2p_h2d;     // P2P alone: what an entry would face by itself
  std::multiset<double> d2h_ends;     // ends of the group's OFFLOADs (offload_stage_plan.h)
  std::vector<SlotOccupancy> engines;               // per member, when the engine is shared
  std::vector<std::multiset<double>> h2d_ends;      // per member: ends of its RELOADs
  std::vector<std::vector<int>> order;      // per member: candidates, longest-lived first
  std::vector<std::vector<bool>> eligible;  // per member/entry: placeable with the link alone
  std::vector<double> budget;               // per member: bytes it may still offload
  bool shared_engine = false;

  TransferResources Resources(int member) {
    return TransferResources{&d2h, &h2d, shared_engine ? &engines[member] : nullptr, &d2h_ends,
                             &h2d_ends[member]};
  }
  bool Affordable(int member, int entry) const {
    return static_cast<double>(plans[member].entries()[entry].bytes) <= budget[member];
  }
  void Commit(int member, int entry, const Placement& p) {
    plans[member].Commit(entry, p, Resources(member));
    budget[member] -= static_cast<double>(plans[member].entries()[entry].bytes);
  }
};

// Offloads, for member `member`, an entry resident at `at` whose widest window covers it: the
// one whose window reaches furthest past it (the classic greedy for covering points with
// intervals: one entry lowers as much of what follows as any could). False when none can.
bool CoverPoint(Group& group, int member, const ProgramKey& at) {
  StagePlan& plan = group.plans[member];
  const TransferResources res = group.Resources(member);
  std::optional<Placement> best;
  int best_entry = -1;
  for (const int e : group.order[member]) {
    if (plan.placement(e) || !group.Affordable(member, e) || !plan.ResidentAt(e, at)) continue;
    const std::optional<Placement> p = plan.FindPlacement(e, res);
    if (!p || !plan.Covers(*p, at)) continue;
    if (!best || plan.ReloadKey(*best) < plan.ReloadKey(*p)) {
      best = p;
      best_entry = e;
    }
  }
  if (!best) return false;
  group.Commit(member, best_entry, *best);
  return true;
}

// Fill: what is left, longest-lived first, taking turns across the group's stages.
void Fill(Group& group) {
  const int members = static_cast<int>(group.plans.size());
  std::size_t longest = 0;
  for (const auto& order : group.order) longest = std::max(longest, order.size());
  for (std::size_t rank = 0; rank < longest; ++rank) {
    for (int s = 0; s < members; ++s) {
      if (rank >= group.order[s].size()) continue;
      const int e = group.order[s][rank];
      if (group.plans[s].placement(e) || !group.Affordable(s, e)) continue;
      if (const std::optional<Placement> p = group.plans[s].FindPlacement(e, group.Resources(s))) {
        group.Commit(s, e, *p);
      }
    }
  }
}

// Chooses what the group offloads (file comment, step 2): lower each stage's peak one entry at
// a time, taking turns, until no entry (within the stage's share) can lower it further; then
// fill.
void ChooseEntries(Group& group) {
  const int members = static_cast<int>(group.plans.size());
  std::vector<bool> done(members, false);
  for (int active = members; active > 0;) {
    active = 0;
    for (int s = 0; s < members; ++s) {
      if (done[s]) continue;
      const PeakPoint peak = group.plans[s].Peak();
      if (peak.bytes > 0 && CoverPoint(group, s, peak.at)) {
        ++active;
      } else {
        done[s] = true;
      }
    }
  }
  Fill(group);
}

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
struct Plan {
  std::vector<Group> groups;
  std::vector<int> group_of;   // per stage
  std::vector<int> member_of;  // per stage
  std::vector<StageOutcome> outcomes;  // per stage
  std::vector<double> p2p_d2h_busy, p2p_h2d_busy;  // per group
};

// Books every SEND on the host links it crosses when P2P shares them with offload (a SEND
// crosses the sender's link outbound and the receiver's inbound: simulate.h).
void BookP2P(const Timeline& baseline, const CostModel& cost, Plan* plan) {
  if (!cost.p2p_shares_host_link) return;
  const int group_size = cost.host_link_group_size;
  for (const auto& stage : baseline.stages) {
    for (const TimedOp& t : stage) {
      if (!IsSend(t.op.kind) || !(t.end > t.start)) continue;
      Group& from = plan->groups[t.stage / group_size];
      Group& to = plan->groups[t.op.peer / group_size];
      from.d2h.Add(t.start, t.end);
      from.p2p_d2h.Add(t.start, t.end);
      to.h2d.Add(t.start, t.end);
      to.p2p_h2d.Add(t.start, t.end);
    }
  }
  for (std::size_t g = 0; g < plan->groups.size(); ++g) {
    plan->p2p_d2h_busy[g] = plan->groups[g].p2p_d2h.BusyTime();
    plan->p2p_h2d_busy[g] = plan->groups[g].p2p_h2d.BusyTime();
  }
}

// For each member of `group`: its candidates (longest-lived first), which of them the link
// could carry alone, and its share of the volume (`share` times what the policy asks).
void PrepareChoices(const PipelineSpec& spec, double share, Group& group,
                    std::vector<StageOutcome>& outcomes) {
  for (const StagePlan& stage : group.plans) {
    const auto& entries = stage.entries();
    StageOutcome& out = outcomes[stage.stage()];
    std::vector<int> order;
    std::vector<bool> eligible(entries.size(), false);
    SlotOccupancy no_engine;
    std::multiset<double> no_ends, no_h2d_ends;
    const TransferResources alone{&group.p2p_d2h, &group.p2p_h2d,
                                  group.shared_engine ? &no_engine : nullptr, &no_ends,
                                  &no_h2d_ends};
    for (int e = 0; e < static_cast<int>(entries.size()); ++e) {
      out.total_bytes += entries[e].bytes;
      if (!Candidate(spec, entries[e].chunk) || entries[e].bytes <= 0) continue;
      order.push_back(e);
      eligible[e] = stage.FindPlacement(e, alone).has_value();
      if (eligible[e]) out.eligible_bytes += entries[e].bytes;
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (entries[a].lifespan() != entries[b].lifespan()) {
        return entries[a].lifespan() > entries[b].lifespan();
      }
      return entries[a].forward_index < entries[b].forward_index;
    });
    const double ask = share > 0.0 ? RequestedBytes(spec, out.total_bytes) * share : 0.0;
    out.requested_bytes = std::min(ask, static_cast<double>(out.eligible_bytes));
    // The relative slack absorbs rounding in fraction * total (e.g. 0.3 * 10 entries).
    group.budget.push_back(std::isinf(ask) ? ask : ask * (1.0 + 1e-12));
    group.order.push_back(std::move(order));
    group.eligible.push_back(std::move(eligible));
  }
}

// What `group` planned against what it was asked, into `outcomes`.
void Summarize(const Group& group, const StagePlanParams& bandwidths,
               std::vector<StageOutcome>& outcomes) {
  for (int m = 0; m < static_cast<int>(group.plans.size()); ++m) {
    const StagePlan& stage = group.plans[m];
    StageOutcome& out = outcomes[stage.stage()];
    const double share_of_eligible =
        out.requested_bytes / std::max<double>(1.0, static_cast<double>(out.eligible_bytes));
    for (int e = 0; e < static_cast<int>(stage.entries().size()); ++e) {
      const double bytes = static_cast<double>(stage.entries()[e].bytes);
      if (stage.placement(e)) out.planned_bytes += stage.entries()[e].bytes;
      if (!group.eligible[m][e]) continue;
      out.d2h_demand += share_of_eligible * bytes / bandwidths.d2h_bandwidth;
      out.h2d_demand += share_of_eligible * bytes / bandwidths.h2d_bandwidth;
      if (!stage.placement(e) && bytes <= group.budget[m]) out.short_of_request = true;
    }
  }
}

// Plans every link group on `baseline`, the simulated timeline of `lowered`. `share` scales
// what the policy asks (1 normally; less when a plan failed its check and PlanOffload retries
// with less).
Plan MakePlan(const Schedule& lowered, const CostModel& cost, const Timeline& baseline,
              double share) {
  const PipelineSpec& spec = lowered.spec;
  const int p = spec.num_stages;
  const int group_size = cost.host_link_group_size;
  const int num_groups = (p + group_size - 1) / group_size;
  Plan plan;
  plan.groups.resize(num_groups);
  plan.group_of.resize(p);
  plan.member_of.resize(p);
  plan.outcomes.resize(p);
  plan.p2p_d2h_busy.assign(num_groups, 0.0);
  plan.p2p_h2d_busy.assign(num_groups, 0.0);
  BookP2P(baseline, cost, &plan);
  // Transfers are booked for their longest possible duration (simulate.h: duplex bandwidth
  // whenever the opposite direction of the link is busy), so the simulator never runs one
  // longer than planned.
  StagePlanParams params;
  params.num_microbatches = spec.num_microbatches;
  params.chunks_per_stage = spec.chunks_per_stage;
  params.d2h_bandwidth = std::min(cost.d2h_bandwidth, cost.duplex_bandwidth);
  params.h2d_bandwidth = std::min(cost.h2d_bandwidth, cost.duplex_bandwidth);
  for (int s = 0; s < p; ++s) {
    Group& group = plan.groups[s / group_size];
    group.shared_engine = cost.shared_copy_engine;
    plan.group_of[s] = s / group_size;
    plan.member_of[s] = static_cast<int>(group.plans.size());
    std::vector<internal::TimedBaselineOp> ops;
    ops.reserve(baseline.stages[s].size());
    for (const TimedOp& t : baseline.stages[s]) ops.push_back({t.op, t.start, t.end});
    params.reload_margin =
        cost.reload_margin_in_backward_times * cost.BackwardTime(s, spec.split_backward);
    group.plans.emplace_back(s, std::move(ops), spec.split_backward, params,
                             [&](int chunk) { return cost.ActivationBytes(s, chunk, p); });
    group.engines.emplace_back();
    group.h2d_ends.emplace_back();
  }
  for (Group& group : plan.groups) {
    PrepareChoices(spec, share, group, plan.outcomes);
    ChooseEntries(group);
    Summarize(group, params, plan.outcomes);
  }
  return plan;
}

// The lowered schedule with the plan's entries offloaded and the BARRIERs their hand-overs need.
Schedule Emit(const Schedule& lowered, const Plan& plan) {
  Schedule out = lowered;
  out.predictions.reset();
  for (const Group& group : plan.groups) {
    std::vector<PlannedTransfer> transfers;
    std::vector<const StagePlan*> members;
    for (int m = 0; m < static_cast<int>(group.plans.size()); ++m) {
      const StagePlan& stage = group.plans[m];
      members.push_back(&stage);
      for (const int e : stage.steps()) {
        const Placement& pl = *stage.placement(e);
        const internal::OffloadEntry& entry = stage.entries()[e];
        transfers.push_back({m, true, pl.offload_start, pl.offload_end, entry.mb, entry.chunk});
        transfers.push_back({m, false, pl.reload_start, pl.reload_end, entry.mb, entry.chunk});
      }
    }
    std::vector<std::vector<InsertedOp>> barriers(members.size());
    if (members.size() > 1) barriers = internal::PlanBarriers(members, transfers);
    for (std::size_t m = 0; m < members.size(); ++m) {
      out.stages[members[m]->stage()] = members[m]->Emit(barriers[m]);
    }
  }
  return out;
}

// Re-simulates `planned`: "" when it is valid, as fast as the lowered schedule and adds no
// collision; else what is wrong.
std::string Check(const Schedule& planned, const CostModel& cost, const Timeline& baseline,
                  Timeline* timeline) {
  if (absl::Status valid = Validate(planned); !valid.ok()) {
    return absl::StrCat("it fails validation: ", std::string(valid.message()));
  }
  absl::StatusOr<Timeline> simulated = Simulate(planned, cost);
  if (!simulated.ok()) {
    return absl::StrCat("it does not simulate: ", std::string(simulated.status().message()));
  }
  *timeline = *std::move(simulated);
  const double base = baseline.predictions.step_time;
  const double step = timeline->predictions.step_time;
  if (step > base * (1.0 + kStallTolerance) + 1e-12) {
    return absl::StrFormat("it stalls (step time %.6g vs %.6g without offload)", step, base);
  }
  if (timeline->predictions.collisions > baseline.predictions.collisions) {
    return absl::StrCat("it has ", timeline->predictions.collisions,
                        " colliding transfers (", baseline.predictions.collisions,
                        " without offload)");
  }
  return "";
}

std::string Percent(double part, double whole) {
  return absl::StrFormat("%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
}

// The warning for a plan that carries less than the policy asks, or "" when it carries it all.
std::string ShortfallWarning(const PipelineSpec& spec, const CostModel& cost, const Plan& plan,
                             double step_time, double base_step_time) {
  double total = 0, requested = 0, planned = 0;
  std::string stages;
  int listed = 0;
  for (int s = 0; s < static_cast<int>(plan.outcomes.size()); ++s) {
    const StageOutcome& out = plan.outcomes[s];
    total += static_cast<double>(out.total_bytes);
    requested += out.requested_bytes;
    planned += static_cast<double>(out.planned_bytes);
    if (!out.short_of_request) continue;
    if (++listed <= 6) {
      absl::StrAppend(&stages, listed > 1 ? ", " : "", "stage ", s, " ",
                      Percent(static_cast<double>(out.planned_bytes), out.total_bytes), " of ",
                      Percent(out.requested_bytes, out.total_bytes));
    }
  }
  if (listed == 0) return "";
  if (listed > 6) absl::StrAppend(&stages, " and ", listed - 6, " more");
  // The busiest link direction (or shared copy engine) if every requested entry moved.
  double busiest = 0.0;
  std::string where;
  for (int g = 0; g < static_cast<int>(plan.groups.size()); ++g) {
    double d2h = plan.p2p_d2h_busy[g], h2d = plan.p2p_h2d_busy[g];
    for (const StagePlan& stage : plan.groups[g].plans) {
      const StageOutcome& out = plan.outcomes[stage.stage()];
      d2h += out.d2h_demand;
      h2d += out.h2d_demand;
      if (cost.shared_copy_engine && out.d2h_demand + out.h2d_demand > busiest) {
        busiest = out.d2h_demand + out.h2d_demand;
        where = absl::StrCat("stage ", stage.stage(), "'s copy engine");
      }
    }
    if (d2h > busiest) {
      busiest = d2h;
      where = absl::StrCat("host:", g, " D2H");
    }
    if (h2d > busiest) {
      busiest = h2d;
      where = absl::StrCat("host:", g, " H2D");
    }
  }
  const double load = base_step_time > 0 ? busiest / base_step_time : 0.0;
  const double slowdown = base_step_time > 0 ? (step_time - base_step_time) / base_step_time : 0;
  return absl::StrCat(
      "offload ", PolicyName(spec), ": the host links carry less than requested: planned ",
      Percent(planned, total), " of the activation volume, requested ", Percent(requested, total),
      " (entries that live long enough to save memory, within the policy's share); short: ",
      stages, ". All of it would keep ", where, " busy ", absl::StrFormat("%.0f%%", 100 * load),
      " of the step, so forcing it would slow the step by at least ",
      absl::StrFormat("%.1f%%", 100.0 * std::max(0.0, load - 1.0)),
      " (more where copies bunch up, as in a warm-up); this plan's predicted slowdown: ",
      absl::StrFormat("%.2f%%", 100.0 * slowdown), " (strict mode makes this an error)");
}

}  // namespace

absl::StatusOr<Schedule> PlanOffload(const Schedule& lowered, const CostModel& cost) {
  const PipelineSpec& spec = lowered.spec;
  if (spec.offload == OffloadPolicy::kNone) return lowered;
  PO_RETURN_IF_ERROR(CheckRequest(lowered, cost));
  if (absl::Status valid = Validate(lowered); !valid.ok()) {
    return Annotate(valid, "PlanOffload: the lowered schedule is not valid");
  }
  absl::StatusOr<Timeline> baseline = Simulate(lowered, cost);
  if (!baseline.ok()) {
    return Annotate(baseline.status(), "PlanOffload: simulating the lowered schedule");
  }
  if (spec.offload == OffloadPolicy::kSelective && spec.offload_chunks == 0 &&
      spec.offload_fraction == 0.0) {
    Schedule out = lowered;
    out.predictions = baseline->predictions;
    out.predictions->warnings.push_back(
        "offload selective: offload_fraction and offload_chunks are both 0, so nothing is "
        "offloaded");
    return out;
  }

  // Check the plan by simulation; should it ever fail, plan again with a smaller share of what
  // the policy asks (the empty plan is the lowered schedule itself, which always passes).
  std::vector<std::string> warnings;
  Plan plan;
  Schedule planned;
  Timeline timeline;
  for (const double share : {1.0, 0.5, 0.25, 0.0}) {
    plan = MakePlan(lowered, cost, *baseline, share);
    if (share == 0.0) {
      planned = lowered;
      timeline = *baseline;
      break;
    }
    planned = Emit(lowered, plan);
    const std::string problem = Check(planned, cost, *baseline, &timeline);
    if (problem.empty()) break;
    warnings.push_back(absl::StrCat(
        "offload ", PolicyName(spec), ": internal check failed: the plan for ",
        absl::StrFormat("%.0f%%", 100 * share), " of the request ", problem,
        "; planning less offload. Please report this."));
  }

  const double step = timeline.predictions.step_time;
  const std::string shortfall =
      ShortfallWarning(spec, cost, plan, step, baseline->predictions.step_time);
  if (!shortfall.empty()) warnings.insert(warnings.begin(), shortfall);
  if (spec.strict && !warnings.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("strict offload: ", warnings.front()));
  }
  planned.predictions = timeline.predictions;
  for (std::string& warning : warnings) planned.predictions->warnings.push_back(std::move(warning));
  return planned;
}

}  // namespace pipeoffload
