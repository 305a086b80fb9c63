// PlanOffload: decides which stash entries leave the device, and places their OFFLOAD, RELEASE,
// RELOAD ops and the BARRIERs between stages that share a host link (issue 3; DESIGN.md
// section 4, pass 3). Pure function of the lowered schedule and the cost model; no I/O.
//
// How a plan is made, and why it keeps to its timeline and is collision-free by construction:
//  0. Simulate the lowered schedule and post every SEND/RECV at its transfer (PostAtTransfers):
//     the same timeline, with each stage's program sorted by time and each P2P pair at one
//     instant on both of its stages, so cutting all programs at one time is consistent (and
//     BARRIERs placed that way stay deadlock-free under Validate's blocking rendezvous).
//  1. The timeline to plan on: that one as it is, or one where warm-up forwards wait for the
//     D2H of the entry before them (GatedWarmup: the links of a group carry a warm-up's
//     activations only so; the pipeline has slack there), kept only within kOverheadBudget.
//     An inserted transfer can start only when the op ahead of it is issued, when its
//     dependency ends, or when its copy engine (or, through a BARRIER, another stage's copy)
//     frees up: these instants are the "slots" (offload_stage_plan.h). The planner books each
//     transfer at exactly such an instant, for the slower of its solo and duplex durations, on
//     one timeline per direction of each host link, shared by the link group's stages (and by
//     P2P, when it crosses the same link). Stages that share a link thus take turns in each
//     direction while one's D2H runs freely against the other's H2D: the staggered slot grids
//     of the reference planner (pipeoffload.md section 1.4b), derived from the real op times
//     instead of a fixed period. No inserted op starts later than the op after it, so nothing
//     waits that did not wait in the timeline planned on.
//  2. Per link group, choose entries (ChooseEntries): taking turns over the group's stages,
//     find the first point of the stage's program where its memory peaks, and offload, of the
//     entries resident there whose widest placement takes them off the device at that point,
//     the one whose window reaches furthest ahead; until no entry within the policy's share can
//     lower the peak. Then fill the share with the rest, longest-lived first, wherever their
//     window is not empty. Better than the reference's fixed lifespan threshold: an entry stays
//     exactly when no slot takes it off the device anywhere, and the peak decides the order.
//     A policy's share caps each stage's offloaded bytes; more share only adds choices, so in
//     the common case offloading more never raises the peak (the tests check it).
//  3. BARRIERs at every hand-over of a link direction between two stages (offload_barriers.h),
//     and, on a gated timeline, the gated program's own BARRIERs where they were.
//  4. Re-simulate and check: valid, within the budget, no new collision, every RELOAD done in
//     time; keep the better of the two plans that pass (the gated one alone when it keeps every
//     stage at two entries). Should none pass (a bug here, or a simulator whose semantics
//     moved), plan a smaller share and say so in a warning.
// A stage whose links cannot carry the policy's share (a "shortfall") keeps what fits; the
// warning gives requested and planned shares and the link load the full request would need.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
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

// Relative slack when comparing step times: anything beyond rounding is a real difference.
constexpr double kStallTolerance = 1e-9;
// How much slower than the same order without offload a plan may be (a share of its step
// time). Plans that place every op where the lowered schedule had it cost nothing; gating a
// warm-up forward behind the RELEASE of the entry before it (GatedWarmup) may cost time, and
// is kept only within this budget (issue 3: "overhead <= 1%").
constexpr double kOverheadBudget = 0.01;

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
Schedule PostAtTransfers(const Schedule& lowered, const Timeline& timeline, Timeline* moved) {
  Schedule out = lowered;
  out.predictions.reset();
  moved->stages.assign(lowered.stages.size(), {});
  for (std::size_t s = 0; s < lowered.stages.size(); ++s) {
    const std::vector<TimedOp>& timed = timeline.stages[s];
    std::vector<int> compute, p2p;  // program indices; "compute": every op but SEND/RECV
    std::vector<int> rank_before(timed.size(), 0);  // a P2P op's: compute ops before it
    for (int i = 0; i < static_cast<int>(timed.size()); ++i) {
      rank_before[i] = static_cast<int>(compute.size());
      (IsP2P(timed[i].op.kind) ? p2p : compute).push_back(i);
    }
    std::stable_sort(p2p.begin(), p2p.end(),
                     [&](int a, int b) { return timed[a].start < timed[b].start; });
    // Rank among the non-P2P ops of each entry's F and B (the producers of SENDs).
    const int v = lowered.spec.chunks_per_stage;
    const std::size_t entries = static_cast<std::size_t>(lowered.spec.num_microbatches) * v;
    std::vector<int> forward_rank(entries, -1), backward_rank(entries, -1);
    for (int k = 0; k < static_cast<int>(compute.size()); ++k) {
      const Op& op = timed[compute[k]].op;
      const std::size_t entry = static_cast<std::size_t>(op.mb) * v + op.chunk;
      if (op.kind == OpKind::kForward) forward_rank[entry] = k;
      if (op.kind == OpKind::kBackward) backward_rank[entry] = k;
    }
    std::vector<std::vector<int>> before(compute.size() + 1);  // P2P ops put before rank k
    int floor = 0;
    for (const int i : p2p) {
      const TimedOp& t = timed[i];
      int k = static_cast<int>(
          std::lower_bound(compute.begin(), compute.end(), t.start,
                           [&](int c, double x) { return timed[c].start < x; }) -
          compute.begin());
      if (IsSend(t.op.kind)) {
        const std::size_t entry = static_cast<std::size_t>(t.op.mb) * v + t.op.chunk;
        k = std::max(k, 1 + (t.op.kind == OpKind::kSendActivation ? forward_rank[entry]
                                                                  : backward_rank[entry]));
      }
      // Never earlier than it was: a post that was its transfer's binding bound stays put.
      k = std::max({k, floor, rank_before[i]});
      floor = k;
      before[k].push_back(i);
    }
    std::vector<Op>& ops = out.stages[s].ops;
    std::vector<TimedOp>& times = moved->stages[s];
    ops.clear();
    const auto put = [&](int i) {
      ops.push_back(timed[i].op);
      times.push_back(timed[i]);
      times.back().index = static_cast<int>(times.size()) - 1;
    };
    for (std::size_t k = 0; k <= compute.size(); ++k) {
      for (const int i : before[k]) put(i);
      if (k < compute.size()) put(compute[k]);
    }
  }
  return out;
}

// True when every RECV of `schedule` still comes before the F or B that consumes it (all that
// PostAtTransfers can get wrong: it keeps every other order Validate checks).
bool ReceivesFirst(const Schedule& schedule) {
  const int m = schedule.spec.num_microbatches;
  for (const StageProgram& program : schedule.stages) {
    std::vector<char> received(2 * static_cast<std::size_t>(m) * schedule.spec.chunks_per_stage, 0);
    const auto slot = [&](bool grad, const Op& op) {
      return (static_cast<std::size_t>(grad) * schedule.spec.chunks_per_stage + op.chunk) * m +
             op.mb;
    };
    std::vector<char> needs(received.size(), 0);
    for (const Op& op : program.ops) {
      if (op.kind == OpKind::kRecvActivation) needs[slot(false, op)] = 1;
      if (op.kind == OpKind::kRecvGrad) needs[slot(true, op)] = 1;
    }
    for (const Op& op : program.ops) {
      if (op.kind == OpKind::kRecvActivation) received[slot(false, op)] = 1;
      if (op.kind == OpKind::kRecvGrad) received[slot(true, op)] = 1;
      if (op.kind == OpKind::kForward && needs[slot(false, op)] && !received[slot(false, op)]) {
        return false;
      }
      if (op.kind == OpKind::kBackward && needs[slot(true, op)] && !received[slot(true, op)]) {
        return false;
      }
    }
  }
  return true;
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
  void Invalidate(int committer, const Placement& done) {
    const auto overlaps = [](double a0, double a1, double b0, double b1) {
      return a0 <= b1 && b0 <= a1;  // closed: zero-time copies count too
    };
    // Every test below needs the entry alive at some instant of one of the two new copies
    // (its remembered copies, and any candidate start a search could meet, lie in its life).
    for (int m = 0; m < static_cast<int>(plans.size()); ++m) {
      const auto check = [&](int e) {
        if (!cached[m][e].has_value()) return;
        const internal::OffloadEntry& entry = plans[m].entries()[e];
        const std::optional<Placement>& c = *cached[m][e];
        bool stale = plans[m].placement(e).has_value();
        const bool own = m == committer;
        if (!c) {
          stale = stale || overlaps(done.offload_end, done.offload_end, entry.forward_end,
                                    entry.use_start) ||
                  (own && overlaps(done.reload_end, done.reload_end, entry.forward_end,
                                   entry.use_start));
        } else {
          stale = stale ||
                  overlaps(c->offload_start, c->offload_end, done.offload_start,
                           done.offload_end) ||
                  overlaps(c->reload_start, c->reload_end, done.reload_start, done.reload_end) ||
                  (own && shared_engine &&
                   (overlaps(c->offload_start, c->offload_end, done.reload_start,
                             done.reload_end) ||
                    overlaps(c->reload_start, c->reload_end, done.offload_start,
                             done.offload_end))) ||
                  (done.offload_end >= entry.forward_end &&
                   done.offload_end <= plans[m].SearchHigh(c->offload_search_gap)) ||
                  (own && done.reload_end >= c->reload_start &&
                   done.reload_end <= entry.use_start);
        }
        if (stale) cached[m][e].reset();
      };
      plans[m].ForEachAlive(done.offload_start, done.offload_end, check);
      plans[m].ForEachAlive(done.reload_start, done.reload_end, check);
    }
  }
  std::vector<std::vector<std::optional<std::optional<Placement>>>> cached;  // [member][entry]
  std::vector<std::vector<char>> fixed;  // [member][entry]: a gated copy (CommitGated)
};

// Offloads, for member `member`, an entry resident at `at` whose widest window covers it: the
// one whose window reaches furthest past it (the classic greedy for covering points with
// intervals: one entry lowers as much of what follows as any could). False when none can.
bool CoverPoint(Group& group, int member, const ProgramKey& at) {
  StagePlan& plan = group.plans[member];
  std::optional<Placement> best;
  int best_entry = -1;
  // The candidates resident at `at`; equal reaches go to the first in the member's order (the
  // longest-lived).
  std::vector<int>& resident = group.scratch;
  plan.ResidentEntries(at, &resident);
  const std::vector<int>& rank = group.rank[member];
  for (const int e : resident) {
    if (rank[e] < 0 || plan.placement(e) || !group.Affordable(member, e)) continue;
    const std::optional<Placement> p = group.Find(member, e);
    if (!p || !plan.Covers(*p, at)) continue;
    if (!best || plan.ReloadKey(*best) < plan.ReloadKey(*p) ||
        (!(plan.ReloadKey(*p) < plan.ReloadKey(*best)) && rank[e] < rank[best_entry])) {
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
      if (const std::optional<Placement> p = group.Find(s, e)) {
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
  bool ok = true;  // false when a gated entry found no RELOAD (MakePlan)
  std::vector<Group> groups;
  std::vector<std::vector<InsertedOp>> fixed_barriers;  // per stage: the gated program's
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
    for (int e = 0; e < static_cast<int>(entries.size()); ++e) {
      out.total_bytes += entries[e].bytes;
      if (!Candidate(spec, entries[e].chunk) || entries[e].bytes <= 0) continue;
      order.push_back(e);
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (entries[a].lifespan() != entries[b].lifespan()) {
        return entries[a].lifespan() > entries[b].lifespan();
      }
      return entries[a].forward_index < entries[b].forward_index;
    });
    const double ask = share > 0.0 ? RequestedBytes(spec, out.total_bytes) * share : 0.0;
    out.requested_bytes = ask;  // Summarize caps it at what is eligible
    // The relative slack absorbs rounding in fraction * total (e.g. 0.3 * 10 entries).
    group.budget.push_back(std::isinf(ask) ? ask : ask * (1.0 + 1e-12));
    std::vector<int> rank(entries.size(), -1);
    for (int i = 0; i < static_cast<int>(order.size()); ++i) rank[order[i]] = i;
    group.rank.push_back(std::move(rank));
    group.order.push_back(std::move(order));
  }
}

// What `group` planned against what it was asked, into `outcomes`.
void Summarize(Group& group, const StagePlanParams& bandwidths,
               std::vector<StageOutcome>& outcomes) {
  for (int m = 0; m < static_cast<int>(group.plans.size()); ++m) {
    const StagePlan& stage = group.plans[m];
    StageOutcome& out = outcomes[stage.stage()];
    // Eligible: placed, or placeable with the link to itself (but for P2P on it). Asked only
    // of the entries left on the device: a placed one was placeable with the link shared.
    std::vector<bool> eligible(stage.entries().size(), false);
    SlotOccupancy no_engine;
    std::multiset<double> no_ends, no_h2d_ends;
    const TransferResources alone{&group.p2p_d2h, &group.p2p_h2d,
                                  group.shared_engine ? &no_engine : nullptr, &no_ends,
                                  &no_h2d_ends};
    for (const int e : group.order[m]) {
      eligible[e] = stage.placement(e).has_value() || stage.FindPlacement(e, alone).has_value();
      if (eligible[e]) out.eligible_bytes += stage.entries()[e].bytes;
    }
    out.requested_bytes = std::min(out.requested_bytes, static_cast<double>(out.eligible_bytes));
    const double share_of_eligible =
        out.requested_bytes / std::max<double>(1.0, static_cast<double>(out.eligible_bytes));
    for (int e = 0; e < static_cast<int>(stage.entries().size()); ++e) {
      const double bytes = static_cast<double>(stage.entries()[e].bytes);
      if (stage.placement(e)) out.planned_bytes += stage.entries()[e].bytes;
      if (!eligible[e]) continue;
      out.d2h_demand += share_of_eligible * bytes / bandwidths.d2h_bandwidth;
      out.h2d_demand += share_of_eligible * bytes / bandwidths.h2d_bandwidth;
      if (!stage.placement(e) && bytes <= group.budget[m]) out.short_of_request = true;
    }
  }
}

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

// Commits the gated copies of `group`'s stages: every D2H first (they are fixed), then each
// entry's RELOAD, in the order of their forwards. False when one finds no RELOAD.
bool CommitGated(const std::vector<std::vector<GatedCopy>>& gated, int m, Group& group) {
  for (int member = 0; member < static_cast<int>(group.plans.size()); ++member) {
    for (const GatedCopy& copy : gated[group.plans[member].stage()]) {
      StagePlan::BookOffload(copy.start, copy.end, group.Resources(member));
    }
  }
  for (int member = 0; member < static_cast<int>(group.plans.size()); ++member) {
    StagePlan& plan = group.plans[member];
    for (const GatedCopy& copy : gated[plan.stage()]) {
      const int e = copy.chunk * m + copy.mb;
      const std::optional<Placement> p =
          plan.GatedPlacement(e, copy.start, copy.end, group.Resources(member));
      if (!p) return false;
      group.Commit(member, e, *p, /*offload_booked=*/true);
      group.fixed[member][e] = 1;
    }
  }
  return true;
}

// Plans every link group on `baseline`, the simulated timeline of `lowered`. `share` scales
// what the policy asks (1 normally; less when a plan failed its check and PlanOffload retries
// with less).
Plan MakePlan(const Schedule& lowered, const CostModel& cost, const Timeline& baseline,
              double share, const std::vector<std::vector<GatedCopy>>* gated,
              const std::vector<GatedBarrier>* gated_barriers) {
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
    group.cached.emplace_back(group.plans.back().entries().size());
    group.fixed.emplace_back(group.plans.back().entries().size(), 0);
  }
  plan.fixed_barriers.resize(p);
  if (gated_barriers != nullptr) {
    // Each after the same ops but SEND/RECVs as in the gated program, and after the SEND/RECVs
    // there whose transfers start before it (the same rule on both stages of a pair keeps
    // every pair of them on one side: deadlock-free, PostAtTransfers).
    std::int64_t seq = std::int64_t{1} << 40;  // after PlanBarriers' own in equal keys
    for (const GatedBarrier& barrier : *gated_barriers) {
      const StagePlan& stage = plan.groups[plan.group_of[barrier.stage]]
                                   .plans[plan.member_of[barrier.stage]];
      int gap = 0;
      for (int seen = 0; gap < stage.num_ops() && seen < barrier.after_compute; ++gap) {
        seen += IsP2P(stage.ops()[gap].op.kind) ? 0 : 1;
      }
      while (gap < stage.num_ops() && IsP2P(stage.ops()[gap].op.kind) &&
             stage.ops()[gap].start < barrier.time) {
        ++gap;
      }
      plan.fixed_barriers[barrier.stage].push_back(
          InsertedOp{barrier.op, ProgramKey{gap, false, barrier.time, internal::kRankBarrier,
                                            seq++},
                     -1});
    }
  }
  for (Group& group : plan.groups) {
    PrepareChoices(spec, share, group, plan.outcomes);
    if (gated != nullptr && !CommitGated(*gated, spec.num_microbatches, group)) {
      plan.ok = false;
      return plan;
    }
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
        transfers.push_back({m, true, pl.offload_start, pl.offload_end, entry.mb, entry.chunk,
                             group.fixed[m][e] != 0});
        transfers.push_back({m, false, pl.reload_start, pl.reload_end, entry.mb, entry.chunk});
      }
    }
    std::vector<std::vector<InsertedOp>> barriers(members.size());
    if (members.size() > 1) barriers = internal::PlanBarriers(members, transfers);
    for (std::size_t m = 0; m < members.size(); ++m) {
      const std::vector<InsertedOp>& fixed = plan.fixed_barriers[members[m]->stage()];
      barriers[m].insert(barriers[m].end(), fixed.begin(), fixed.end());
      out.stages[members[m]->stage()] = members[m]->Emit(barriers[m]);
    }
  }
  return out;
}

// Re-simulates `planned`: "" when it is valid, within kOverheadBudget of the lowered
// schedule's step time and adds no collision; else what is wrong.
std::string Check(const Schedule& planned, const CostModel& cost, const Predictions& baseline,
                  Timeline* timeline) {
  if (absl::Status valid = Validate(planned); !valid.ok()) {
    return absl::StrCat("it fails validation: ", std::string(valid.message()));
  }
  absl::StatusOr<Timeline> simulated = Simulate(planned, cost);
  if (!simulated.ok()) {
    return absl::StrCat("it does not simulate: ", std::string(simulated.status().message()));
  }
  *timeline = *std::move(simulated);
  const double base = baseline.step_time;
  const double step = timeline->predictions.step_time;
  if (step > base * (1.0 + kOverheadBudget) + 1e-12) {
    return absl::StrFormat("it is too slow (step time %.6g vs %.6g without offload)", step, base);
  }
  if (timeline->predictions.collisions > baseline.collisions) {
    return absl::StrCat("it has ", timeline->predictions.collisions,
                        " colliding transfers (", baseline.collisions, " without offload)");
  }
  // Every RELOAD done reload_margin before its B, as planned (a plan whose ops run other than
  // planned can break that even when it adds no collision).
  const bool split = planned.spec.split_backward;
  for (const std::vector<TimedOp>& stage : timeline->stages) {
    std::map<std::pair<int, int>, double> reload_end;
    for (const TimedOp& t : stage) {
      if (t.op.kind == OpKind::kReload) reload_end[{t.op.mb, t.op.chunk}] = t.end;
      if (t.op.kind != OpKind::kBackward) continue;
      const auto it = reload_end.find({t.op.mb, t.op.chunk});
      const double margin =
          cost.reload_margin_in_backward_times * cost.BackwardTime(t.stage, split);
      if (it != reload_end.end() && it->second > t.start - margin + 1e-9 * std::max(1.0, t.start)) {
        return absl::StrFormat("its RELOAD of %s on stage %d ends at %.6g, within the margin "
                               "before its B at %.6g", OpToString(t.op), t.stage, it->second,
                               t.start);
      }
    }
  }
  return "";
}

// True when `predictions` keep every stage at no more than two of its largest entries.
bool AtMostTwoEntries(const Schedule& lowered, const CostModel& cost,
                      const Predictions& predictions) {
  const int p = lowered.spec.num_stages;
  for (int s = 0; s < p; ++s) {
    std::int64_t largest = 0;
    for (int c = 0; c < lowered.spec.chunks_per_stage; ++c) {
      largest = std::max(largest, cost.ActivationBytes(s, c, p));
    }
    if (predictions.stages[s].peak_bytes > 2 * largest) return false;
  }
  return true;
}

// True when a plan with predictions `a` beats one with `b`: a lower peak on its worst stage,
// then in total over the stages, then a shorter step.
bool Better(const Predictions& a, const Predictions& b) {
  const auto peaks = [](const Predictions& x) {
    std::int64_t worst = 0, total = 0;
    for (const StagePrediction& stage : x.stages) {
      worst = std::max(worst, stage.peak_bytes);
      total += stage.peak_bytes;
    }
    return std::pair{worst, total};
  };
  if (peaks(a) != peaks(b)) return peaks(a) < peaks(b);
  return a.step_time < b.step_time * (1.0 - kStallTolerance);
}

// The warm-up forwards of stage s worth gating (GatedWarmup): program indices of the F ops
// before the stage's first B of chunks [0, chunks) whose entries the policy lets go, within the
// stage's share, and that live long enough to go out and come back with time to spare. Empty
// when fewer than two.
std::vector<int> GateableForwards(const Schedule& lowered, const CostModel& cost,
                                  const std::vector<TimedOp>& timed, int s, double share,
                                  int chunks) {
  const PipelineSpec& spec = lowered.spec;
  const int p = spec.num_stages, m = spec.num_microbatches;
  const std::vector<Op>& ops = lowered.stages[s].ops;
  std::vector<double> use_start(static_cast<std::size_t>(m) * spec.chunks_per_stage, 0.0);
  int first_backward = static_cast<int>(ops.size());
  std::int64_t total = 0;
  for (int i = static_cast<int>(ops.size()) - 1; i >= 0; --i) {
    if (ops[i].kind == OpKind::kForward) total += cost.ActivationBytes(s, ops[i].chunk, p);
    if (ops[i].kind != OpKind::kBackward) continue;
    use_start[static_cast<std::size_t>(ops[i].chunk) * m + ops[i].mb] = timed[i].start;
    first_backward = i;
  }
  double budget = share * RequestedBytes(spec, total) * (1.0 + 1e-12);
  const double margin =
      cost.reload_margin_in_backward_times * cost.BackwardTime(s, spec.split_backward);
  std::vector<int> forwards;
  for (int i = 0; i < first_backward; ++i) {
    const Op& op = ops[i];
    const std::int64_t bytes = cost.ActivationBytes(s, op.chunk, p);
    if (op.kind != OpKind::kForward || bytes <= 0 || !Candidate(spec, op.chunk) ||
        op.chunk >= chunks) {
      continue;
    }
    const double d2h = static_cast<double>(bytes) / std::min(cost.d2h_bandwidth,
                                                             cost.duplex_bandwidth);
    const double h2d = static_cast<double>(bytes) / std::min(cost.h2d_bandwidth,
                                                             cost.duplex_bandwidth);
    const double lifespan =
        use_start[static_cast<std::size_t>(op.chunk) * m + op.mb] - timed[i].end;
    if (lifespan < 2 * d2h + h2d + margin) continue;
    if (static_cast<double>(bytes) > budget) break;
    budget -= static_cast<double>(bytes);
    forwards.push_back(i);
  }
  if (forwards.size() < 2) forwards.clear();
  return forwards;
}

bool GateForwards(const Schedule& lowered, const CostModel& cost, const Predictions& base,
                  const std::vector<std::vector<int>>& gated, Schedule* gated_lowered,
                  Timeline* gated_times, std::vector<std::vector<GatedCopy>>* copies,
                  std::vector<GatedBarrier>* barriers);

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
// Returns false when nothing is worth gating, or that timeline hangs or is more than
// kOverheadBudget slower than `base`. Else: the lowered program with its SEND/RECVs posted at
// their transfers in that timeline (*gated_lowered, *gated_times, for MakePlan) and each
// stage's gated copies as simulated (*copies), which MakePlan commits before anything else.
bool GatedWarmup(const Schedule& lowered, const CostModel& cost, const Timeline& times,
                 const Predictions& base, double share, Schedule* gated_lowered,
                 Timeline* gated_times, std::vector<std::vector<GatedCopy>>* copies,
                 std::vector<GatedBarrier>* barriers) {
  // Gate the warm-up forwards of every chunk; when that costs more than the budget, only those
  // of the longer-lived chunks (the low ones), down to chunk 0 alone.
  std::vector<std::vector<int>> previous;
  for (int chunks = lowered.spec.chunks_per_stage; chunks >= 1; --chunks) {
    std::vector<std::vector<int>> gated(lowered.spec.num_stages);
    bool any = false;
    for (int s = 0; s < lowered.spec.num_stages; ++s) {
      gated[s] = GateableForwards(lowered, cost, times.stages[s], s, share, chunks);
      any = any || !gated[s].empty();
    }
    if (!any) return false;
    if (gated == previous) continue;
    if (GateForwards(lowered, cost, base, gated, gated_lowered, gated_times, copies, barriers)) {
      return true;
    }
    previous = std::move(gated);
  }
  return false;
}

// GatedWarmup for one choice of forwards to gate (per stage, program indices in order).
bool GateForwards(const Schedule& lowered, const CostModel& cost, const Predictions& base,
                  const std::vector<std::vector<int>>& gated, Schedule* gated_lowered,
                  Timeline* gated_times, std::vector<std::vector<GatedCopy>>* copies,
                  std::vector<GatedBarrier>* barriers) {
  const PipelineSpec& spec = lowered.spec;
  const int p = spec.num_stages, m = spec.num_microbatches;
  const int group_size = cost.host_link_group_size;

  // Inserted ops go before original op `pos`; at one position in (copy seq, sub) order.
  struct Insertion {
    int pos, seq, sub;
    Op op;
  };
  std::vector<std::vector<Insertion>> inserted(p);
  std::vector<std::vector<int>> offload_pos(p), release_pos(p);
  std::vector<std::vector<int>> seq(p);
  for (int s = 0; s < p; ++s) {
    const std::vector<Op>& ops = lowered.stages[s].ops;
    std::vector<int> backward(static_cast<std::size_t>(m) * spec.chunks_per_stage, 0);
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (ops[i].kind == OpKind::kBackward) backward[ops[i].chunk * m + ops[i].mb] = i;
    }
    for (const int f : gated[s]) {
      // The copy goes out after the SEND/RECVs that follow its F (posts hold nothing up, and
      // a post left behind a BARRIER could close a cycle through another stage's receives),
      // and its RELEASE holds the stage's next compute op.
      int after = f + 1;
      while (after < static_cast<int>(ops.size()) && IsP2P(ops[after].kind)) ++after;
      int next = f + 1;
      while (next < static_cast<int>(ops.size()) && !IsCompute(ops[next].kind)) ++next;
      const int b = backward[ops[f].chunk * m + ops[f].mb];
      offload_pos[s].push_back(after);
      release_pos[s].push_back(std::max(after, std::min(next, b)));
    }
    seq[s].assign(gated[s].size(), 0);
  }
  // The copies of each link group take turns: round robin over its stages.
  for (int first = 0; first < p; first += group_size) {
    const int last = std::min(p, first + group_size);
    std::vector<std::pair<int, int>> turns;  // (stage, r)
    for (std::size_t r = 0;; ++r) {
      bool more = false;
      for (int s = first; s < last; ++s) {
        if (r >= gated[s].size()) continue;
        seq[s][r] = static_cast<int>(turns.size());
        turns.push_back({s, static_cast<int>(r)});
        more = true;
      }
      if (!more) break;
    }
    for (std::size_t k = 1; k < turns.size(); ++k) {
      const auto [x, rx] = turns[k - 1];
      const auto [y, ry] = turns[k];
      if (x == y) continue;
      const Op& guarded = lowered.stages[y].ops[gated[y][ry]];
      inserted[x].push_back({release_pos[x][rx], seq[x][rx], 3, Op{OpKind::kBarrier, -1, -1, y}});
      inserted[y].push_back(
          {offload_pos[y][ry], seq[y][ry], 0, Op{OpKind::kBarrier, guarded.mb, guarded.chunk, x}});
    }
  }
  Schedule program = lowered;
  for (int s = 0; s < p; ++s) {
    const std::vector<Op>& ops = lowered.stages[s].ops;
    std::vector<int> backward(static_cast<std::size_t>(m) * spec.chunks_per_stage, 0);
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (ops[i].kind == OpKind::kBackward) backward[ops[i].chunk * m + ops[i].mb] = i;
    }
    for (std::size_t r = 0; r < gated[s].size(); ++r) {
      const Op& f = ops[gated[s][r]];
      inserted[s].push_back({offload_pos[s][r], seq[s][r], 1, Op{OpKind::kOffload, f.mb, f.chunk}});
      inserted[s].push_back({release_pos[s][r], seq[s][r], 2, Op{OpKind::kRelease, f.mb, f.chunk}});
      inserted[s].push_back(
          {backward[f.chunk * m + f.mb], seq[s][r], 4, Op{OpKind::kReload, f.mb, f.chunk}});
    }
    std::vector<Insertion>& list = inserted[s];
    std::sort(list.begin(), list.end(), [](const Insertion& a, const Insertion& b) {
      return std::tie(a.pos, a.seq, a.sub) < std::tie(b.pos, b.seq, b.sub);
    });
    std::vector<Op>& out = program.stages[s].ops;
    out.clear();
    std::size_t next = 0;
    for (int i = 0; i <= static_cast<int>(ops.size()); ++i) {
      for (; next < list.size() && list[next].pos == i; ++next) out.push_back(list[next].op);
      if (i < static_cast<int>(ops.size())) out.push_back(ops[i]);
    }
  }
  // Reloads free of charge: where they go is planned later, on this timeline.
  CostModel free_reloads = cost;
  free_reloads.h2d_bandwidth = 1e300;
  free_reloads.duplex_bandwidth = 1e300;
  free_reloads.shared_copy_engine = false;  // nor do they wait for the D2H engine
  const absl::StatusOr<Timeline> simulated = Simulate(program, free_reloads);
  if (!simulated.ok() ||
      simulated->predictions.step_time > base.step_time * (1.0 + kOverheadBudget)) {
    return false;
  }
  Timeline kept;  // the lowered ops only, as the gated program ran them
  kept.stages.resize(p);
  copies->assign(p, {});
  barriers->clear();
  for (int s = 0; s < p; ++s) {
    int compute = 0;  // lowered ops but SEND/RECVs so far
    for (const TimedOp& t : simulated->stages[s]) {
      if (t.op.kind == OpKind::kOffload) {
        (*copies)[s].push_back({t.op.mb, t.op.chunk, t.start, t.end});
      }
      if (t.op.kind == OpKind::kBarrier) barriers->push_back({s, compute, t.start, t.op});
      if (IsOffload(t.op.kind) || t.op.kind == OpKind::kBarrier) continue;
      if (!IsP2P(t.op.kind)) ++compute;
      kept.stages[s].push_back(t);
      kept.stages[s].back().index = static_cast<int>(kept.stages[s].size()) - 1;
    }
  }
  *gated_lowered = PostAtTransfers(lowered, kept, gated_times);
  return true;
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

absl::StatusOr<Schedule> PlanOffload(const Schedule& lowered_in, const CostModel& cost) {
  const PipelineSpec& spec = lowered_in.spec;
  if (spec.offload == OffloadPolicy::kNone) return lowered_in;
  PO_RETURN_IF_ERROR(CheckRequest(lowered_in, cost));
  if (absl::Status valid = Validate(lowered_in); !valid.ok()) {
    return Annotate(valid, "PlanOffload: the lowered schedule is not valid");
  }
  absl::StatusOr<Timeline> baseline = Simulate(lowered_in, cost);
  if (!baseline.ok()) {
    return Annotate(baseline.status(), "PlanOffload: simulating the lowered schedule");
  }
  if (spec.offload == OffloadPolicy::kSelective && spec.offload_chunks == 0 &&
      spec.offload_fraction == 0.0) {
    Schedule out = lowered_in;
    out.predictions = baseline->predictions;
    out.predictions->warnings.push_back(
        "offload selective: offload_fraction and offload_chunks are both 0, so nothing is "
        "offloaded");
    return out;
  }
  // Post each SEND/RECV at its transfer (PostAtTransfers): the same timeline, permuted.
  Timeline posted_times;
  Schedule lowered = PostAtTransfers(lowered_in, *baseline, &posted_times);
  if (!ReceivesFirst(lowered)) {
    // Zero-time ops can tie so that no order by time keeps every consumer after its RECV;
    // plan the lowered order then (its BARRIERs may not come out deadlock-free: Check says).
    lowered = lowered_in;
    posted_times.stages = baseline->stages;
  }
  const Predictions& base = baseline->predictions;

  // Plan two ways and keep the better plan that passes its check by simulation: on the lowered
  // timeline as it is, and on the one where warm-up forwards wait for the D2H of the entry
  // before them (GatedWarmup), which the links of a group can carry when the plain warm-up
  // produces activations faster than that. Should no plan pass (a bug here, or a simulator
  // whose semantics moved), plan again with a smaller share of what the policy asks (the empty
  // plan is the lowered schedule itself, which always passes).
  std::vector<std::string> warnings;
  Plan plan;
  Schedule planned;
  Timeline timeline;
  for (const double share : {1.0, 0.5, 0.25, 0.0}) {
    if (share == 0.0) {
      plan = MakePlan(lowered, cost, posted_times, share, nullptr, nullptr);
      planned = lowered_in;
      timeline = *baseline;
      break;
    }
    // The gated plan first: when it keeps every stage at two entries or fewer, the plain one
    // cannot do better by more than an entry on a stage, and planning it costs as much again.
    bool found = false;
    Schedule gated_lowered;
    Timeline gated_times;
    std::vector<std::vector<GatedCopy>> copies;
    std::vector<GatedBarrier> gated_barriers;
    if (GatedWarmup(lowered, cost, posted_times, base, share, &gated_lowered, &gated_times,
                    &copies, &gated_barriers)) {
      Plan gated_plan =
          MakePlan(gated_lowered, cost, gated_times, share, &copies, &gated_barriers);
      if (gated_plan.ok) {
        Schedule gated_planned = Emit(gated_lowered, gated_plan);
        Timeline gated_timeline;
        if (Check(gated_planned, cost, base, &gated_timeline).empty()) {
          plan = std::move(gated_plan);
          planned = std::move(gated_planned);
          timeline = std::move(gated_timeline);
          found = true;
        }
      }
    }
    if (found && AtMostTwoEntries(lowered, cost, timeline.predictions)) break;
    Plan plain_plan = MakePlan(lowered, cost, posted_times, share, nullptr, nullptr);
    Schedule plain_planned = Emit(lowered, plain_plan);
    Timeline plain_timeline;
    const std::string problem = Check(plain_planned, cost, base, &plain_timeline);
    if (problem.empty() && (!found || Better(plain_timeline.predictions, timeline.predictions))) {
      plan = std::move(plain_plan);
      planned = std::move(plain_planned);
      timeline = std::move(plain_timeline);
      found = true;
    }
    if (found) break;
    warnings.push_back(absl::StrCat(
        "offload ", PolicyName(spec), ": internal check failed: the plan for ",
        absl::StrFormat("%.0f%%", 100 * share), " of the request ", problem,
        "; planning less offload. Please report this."));
  }

  const double step = timeline.predictions.step_time;
  const std::string shortfall =
      ShortfallWarning(spec, cost, plan, step, base.step_time);
  if (!shortfall.empty()) warnings.insert(warnings.begin(), shortfall);
  if (spec.strict && !warnings.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("strict offload: ", warnings.front()));
  }
  planned.predictions = timeline.predictions;
  for (std::string& warning : warnings) planned.predictions->warnings.push_back(std::move(warning));
  return planned;
}

}  // namespace pipeoffload
