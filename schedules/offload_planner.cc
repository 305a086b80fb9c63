// PlanOffload: decides which stash entries leave the device, and places their OFFLOAD, RELEASE,
// RELOAD ops and the BARRIERs between stages that share a host link (issue 3; DESIGN.md
// section 4, pass 3). Pure function of the lowered schedule and the cost model; no I/O. This
// file owns the passes' order, the plan's assembly and its check; the timelines it plans on are
// warmup_gating.h's, the choice of entries offload_choice.h's, one stage's placements
// offload_stage_plan.h's and the BARRIERs offload_barriers.h's.
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
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/checked_math.h"
#include "lib/base/parallel_for.h"
#include "lib/base/status_macros.h"
#include "lib/ir/grid_index.h"
#include "lib/sim/simulate_parts.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_barriers.h"
#include "schedules/offload_choice.h"
#include "schedules/offload_planner.h"
#include "schedules/offload_policy.h"
#include "schedules/offload_stage_plan.h"
#include "schedules/share_bound.h"
#include "schedules/slot_occupancy.h"
#include "schedules/warmup_gating.h"

namespace pipeoffload {
namespace {

using internal::GatedBarrier;
using internal::GatedCopy;
using internal::InsertedOp;
using internal::kOverheadBudget;
using internal::kStallTolerance;
using internal::LinkGroupPlan;
using internal::PipelinePlan;
using internal::Placement;
using internal::PlannedTransfer;
using internal::ProgramKey;
using internal::StagePlan;
using internal::StagePlanParams;

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
    return bad(
        absl::StrCat("offload_fraction must be in [0, 1] (got ", spec.offload_fraction, ")"));
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

// Books every SEND on the host links it crosses when P2P shares them with offload (a SEND
// crosses the sender's link outbound and the receiver's inbound: simulate.h).
void BookP2P(const Timeline& baseline, const CostModel& cost, PipelinePlan* plan) {
  if (!cost.p2p_shares_host_link) return;
  const int group_size = cost.host_link_group_size;
  for (const auto& stage : baseline.stages) {
    for (const TimedOp& t : stage) {
      if (!IsSend(t.op.kind) || !(t.end > t.start)) continue;
      LinkGroupPlan& from = plan->groups[t.stage / group_size];
      LinkGroupPlan& to = plan->groups[t.op.peer / group_size];
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

// Commits the gated copies of `group`'s stages: every D2H first (they are fixed), then each
// entry's RELOAD, in the order of their forwards. False when one finds no RELOAD.
bool CommitGated(const std::vector<std::vector<GatedCopy>>& gated, int m, LinkGroupPlan& group) {
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
PipelinePlan MakePlan(const Schedule& lowered, const CostModel& cost, const Timeline& baseline,
              double share, const std::vector<std::vector<GatedCopy>>* gated,
              const std::vector<GatedBarrier>* gated_barriers) {
  const PipelineSpec& spec = lowered.spec;
  const int p = spec.num_stages;
  const int group_size = cost.host_link_group_size;
  const int num_groups = static_cast<int>(CeilDiv(p, group_size));
  PipelinePlan plan;
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
    plan.group_of[s] = s / group_size;
    plan.member_of[s] = s % group_size;
  }
  // Link groups share nothing while they are planned (P2P is booked above; each writes only
  // its own members' outcomes), so they are built and planned on several threads; the plan
  // does not depend on how many (fingerprint_test).
  internal::ParallelFor(num_groups, [&](int g) {
    LinkGroupPlan& group = plan.groups[g];
    group.shared_engine = cost.shared_copy_engine;
    for (int s = g * group_size; s < std::min(p, (g + 1) * group_size); ++s) {
      std::vector<internal::TimedBaselineOp> ops;
      ops.reserve(baseline.stages[s].size());
      for (const TimedOp& t : baseline.stages[s]) ops.push_back({t.op, t.start, t.end});
      StagePlanParams stage_params = params;
      stage_params.reload_margin =
          cost.reload_margin_in_backward_times * cost.BackwardTime(s, spec.split_backward);
      group.plans.emplace_back(s, std::move(ops), spec.split_backward, stage_params,
                               [&, s, map = spec.stage_map()](int chunk, Recompute mode) {
                                 return cost.RetainedBytes(s, chunk, map, mode);
                               },
                               [&, s, map = spec.stage_map()](int chunk, Recompute mode) {
                                 return cost.RebuildBytes(s, chunk, map, mode);
                               });
      group.engines.emplace_back();
      group.h2d_ends.emplace_back();
      group.caches.emplace_back(group.plans.back());
      group.fixed.emplace_back(group.plans.back().entries().size(), 0);
    }
  });
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
  std::vector<char> gated_ok(num_groups, 1);
  internal::ParallelFor(num_groups, [&](int g) {
    LinkGroupPlan& group = plan.groups[g];
    internal::PrepareChoices(spec, share, group, plan.outcomes);
    if (gated != nullptr && !CommitGated(*gated, spec.num_microbatches, group)) {
      gated_ok[g] = 0;
      return;
    }
    internal::ChooseEntries(group);
    internal::Summarize(group, params, plan.outcomes);
  });
  plan.ok = std::find(gated_ok.begin(), gated_ok.end(), 0) == gated_ok.end();
  return plan;
}

// The lowered schedule with the plan's entries offloaded and the BARRIERs their hand-overs need.
Schedule Emit(const Schedule& lowered, const PipelinePlan& plan) {
  Schedule out;  // every stage is some group's member: each program is written below
  out.spec = lowered.spec;
  out.stages.resize(lowered.stages.size());
  // Each group writes only its own members' programs.
  internal::ParallelFor(static_cast<int>(plan.groups.size()), [&](int g) {
    const LinkGroupPlan& group = plan.groups[g];
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
  });
  return out;
}

// True when `planned` without its offload ops and BARRIERs is `plain`, op for op: then it
// runs as `plain` does without them (what StepTimeWithoutTransfers would simulate).
bool SameWithoutTransfers(const Schedule& planned, const Schedule& plain) {
  if (planned.stages.size() != plain.stages.size()) return false;
  for (std::size_t s = 0; s < planned.stages.size(); ++s) {
    const std::vector<Op>& ops = planned.stages[s].ops;
    const std::vector<Op>& want = plain.stages[s].ops;
    std::size_t j = 0;
    for (const Op& op : ops) {
      if (IsOffload(op.kind) || op.kind == OpKind::kBarrier) continue;
      if (j == want.size() || !(op == want[j])) return false;
      ++j;
    }
    if (j != want.size()) return false;
  }
  return true;
}

// The step time of `planned` (which has transfers) without them: step_time_without_offload.
// Most plans only add ops to the program they were planned on, `plain`, whose timeline is the
// baseline's (PostAtTransfers permutes it, nothing more): then it is the baseline's step time,
// known without another simulation of a million ops. A plan whose other ops moved (a gated
// one) is simulated without them.
absl::StatusOr<double> StepWithoutTransfers(const Schedule& planned, const Schedule& plain,
                                            const CostModel& cost, const Predictions& baseline) {
  if (SameWithoutTransfers(planned, plain)) return baseline.step_time;
  return internal::StepTimeWithoutTransfers(planned, cost);
}

// What Check finds out about a plan.
struct Checked {
  std::string problem;  // "" when the plan passes
  Predictions predictions;
  // StepWithoutTransfers, when Check had the threads to find it alongside.
  std::optional<absl::StatusOr<double>> without_transfers;
};

// Re-simulates `planned`: no problem when it is valid, within kOverheadBudget of the lowered
// schedule's step time and adds no collision; else what is wrong. Only the predictions come
// back: the kept plan's report needs no more, and a timeline of every op is the largest object
// planning makes. Validation and the simulation share nothing, so for a large schedule, where
// the compiler has threads, they run side by side, and so does the plan's StepWithoutTransfers
// on `plain` unless `step_later`: a number only the kept plan reports, found here while a
// thread is free (else at PlanOnBaseline's end, for that plan alone). `step_later` where
// another plan is made on the other threads meanwhile: none is free then, and a gated plan's
// number is a whole simulation, lost where the other plan is kept (po-h at p=64 m=512 v=4). A
// small schedule is checked one part at a time, simulated only once it validates.
Checked Check(const Schedule& planned, const Schedule& plain, const CostModel& cost,
              const Predictions& baseline, bool step_later) {
  Checked checked;
  absl::Status valid;
  absl::StatusOr<Timeline> simulated;
  const bool alongside = internal::CompileThreads() > 1 &&
                         internal::TotalOps(planned.stages) >= internal::kItemsWorthThreads;
  if (alongside) {
    internal::ParallelFor(internal::HasTransfers(planned) && !step_later ? 3 : 2, [&](int task) {
      if (task == 0) {
        valid = Validate(planned);
      } else if (task == 1) {
        simulated = internal::SimulateOnce(planned, cost, internal::SimulateDetail::kPredictions);
      } else {
        checked.without_transfers = StepWithoutTransfers(planned, plain, cost, baseline);
      }
    });
  } else {
    valid = Validate(planned);
    if (valid.ok()) {
      simulated = internal::SimulateOnce(planned, cost, internal::SimulateDetail::kPredictions);
    }
  }
  const auto fail = [&](std::string problem) {
    checked.problem = std::move(problem);
    return std::move(checked);
  };
  if (!valid.ok()) {
    return fail(absl::StrCat("it fails validation: ", std::string(valid.message())));
  }
  if (!simulated.ok()) {
    return fail(
        absl::StrCat("it does not simulate: ", std::string(simulated.status().message())));
  }
  const Timeline* timeline = &*simulated;
  const double base = baseline.step_time;
  const double step = timeline->predictions.step_time;
  if (step > base * (1.0 + kOverheadBudget) + 1e-12) {
    return fail(
        absl::StrFormat("it is too slow (step time %.6g vs %.6g without offload)", step, base));
  }
  if (timeline->predictions.collisions > baseline.collisions) {
    return fail(absl::StrCat("it has ", timeline->predictions.collisions,
                             " colliding transfers (", baseline.collisions, " without offload)"));
  }
  // Every RELOAD done reload_margin before its B (or the RECOMPUTE* that reads a retained block
  // first), as planned (a plan whose ops run other than planned can break that even when it
  // adds no collision).
  const bool split = planned.spec.split_backward;
  const int v = planned.spec.chunks_per_stage;
  // Per entry (mb * v + chunk) of one stage: its RELOAD's end so far, NaN before one ran.
  std::vector<double> reload_end;
  for (const std::vector<TimedOp>& stage : timeline->stages) {
    reload_end.assign(static_cast<std::size_t>(planned.spec.num_microbatches) * v,
                      std::numeric_limits<double>::quiet_NaN());
    for (const TimedOp& t : stage) {
      if (t.op.kind != OpKind::kReload && t.op.kind != OpKind::kBackward &&
          !IsRecompute(t.op.kind)) {
        continue;
      }
      double& end = reload_end[static_cast<std::size_t>(t.op.mb) * v + t.op.chunk];
      if (t.op.kind == OpKind::kReload) {
        end = t.end;
        continue;
      }
      const double margin =
          cost.reload_margin_in_backward_times * cost.BackwardTime(t.stage, split);
      if (!std::isnan(end) && end > t.start - margin + 1e-9 * std::max(1.0, t.start)) {
        return fail(absl::StrFormat("its RELOAD of %s on stage %d ends at %.6g, within the "
                                    "margin before its %s at %.6g",
                                    OpToString(t.op), t.stage, end,
                                    std::string(OpKindName(t.op.kind)), t.start));
      }
    }
  }
  checked.predictions = std::move(simulated->predictions);
  return checked;
}

// The largest entry of stage s of `lowered`.
std::int64_t LargestEntry(const Schedule& lowered, const CostModel& cost, int s) {
  std::int64_t largest = 0;
  for (int c = 0; c < lowered.spec.chunks_per_stage; ++c) {
    largest = std::max(largest, cost.ActivationBytes(s, c, lowered.spec.stage_map()));
  }
  return largest;
}

// True when `predictions` keep every stage at no more than two of its largest entries.
bool AtMostTwoEntries(const Schedule& lowered, const CostModel& cost,
                      const Predictions& predictions) {
  const int p = lowered.spec.num_stages;
  for (int s = 0; s < p; ++s) {
    if (predictions.stages[s].peak_bytes > 2 * LargestEntry(lowered, cost, s)) return false;
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

// A plan that passed Check: its program, its predictions and its shortfall warning ("" when it
// carries all that was asked).
struct Candidate {
  Schedule planned;
  Predictions predictions;
  std::string shortfall;
  // Checked's, carried so the kept plan is not simulated without transfers a second time.
  std::optional<absl::StatusOr<double>> without_transfers;
};

// Plans `share` on `lowered` (timeline `times`; gated when `copies` is not null), emits and
// checks the plan: "" with *out set when it passes, else what is wrong. `plain` is the program
// the plan's step without transfers is measured against (Check, as `step_later` says). The
// plan itself is freed before the check's simulation.
std::string PlanAndCheck(const Schedule& lowered, const Schedule& plain, const CostModel& cost,
                         const Timeline& times, const Predictions& base, double share,
                         const std::vector<std::vector<GatedCopy>>* copies,
                         const std::vector<GatedBarrier>* gated_barriers,
                         std::optional<Candidate>* out, bool step_later = false) {
  PipelinePlan plan = MakePlan(lowered, cost, times, share, copies, gated_barriers);
  if (!plan.ok) return "it finds no RELOAD for a gated entry";
  Schedule planned = Emit(lowered, plan);
  // The working state goes, freed on several threads (its many small blocks take a twentieth
  // of the compile to free on one); ShortfallWarning needs only what is left.
  internal::ParallelFor(static_cast<int>(plan.groups.size()),
                        [&](int g) { plan.groups[g] = LinkGroupPlan(); });
  plan.groups = {};
  Checked checked = Check(planned, plain, cost, base, step_later);
  if (!checked.problem.empty()) return checked.problem;
  std::string shortfall = internal::ShortfallWarning(
      lowered.spec, cost, plan, checked.predictions.step_time, base.step_time);
  *out = Candidate{std::move(planned), std::move(checked.predictions), std::move(shortfall),
                   std::move(checked.without_transfers)};
  return "";
}

// A gated warm-up's program and timeline (GatedWarmup's outputs), for its plan.
struct GatedTimeline {
  Schedule lowered;
  Timeline times;
  std::vector<std::vector<GatedCopy>> copies;
  std::vector<GatedBarrier> barriers;
};

// GatedWarmup of `lowered`, or nullopt when no warm-up is worth gating.
std::optional<GatedTimeline> GateWarmup(const Schedule& lowered, const CostModel& cost,
                                        const Timeline& times, const Predictions& base,
                                        double share) {
  GatedTimeline gated;
  if (!internal::GatedWarmup(lowered, cost, times, base, share, &gated.lowered, &gated.times,
                             &gated.copies, &gated.barriers)) {
    return std::nullopt;
  }
  return gated;
}

// The gated candidate (PlanAndCheck on the gated timeline, which is freed on return), or
// nullopt when its plan fails the check. `beside_plain`: the plain plan is made meanwhile.
std::optional<Candidate> PlanGated(GatedTimeline timeline, const Schedule& lowered,
                                   const CostModel& cost, const Predictions& base, double share,
                                   bool beside_plain) {
  std::optional<Candidate> gated;
  PlanAndCheck(timeline.lowered, lowered, cost, timeline.times, base, share, &timeline.copies,
               &timeline.barriers, &gated, /*step_later=*/beside_plain);
  return gated;
}

// `lowered`, Compile's own lowering, returned as it is: a schedule we emit that fails
// validation is our bug, not the user's.
absl::Status ValidatedLowering(const Schedule& lowered) {
  if (absl::Status valid = Validate(lowered); !valid.ok()) {
    return absl::InternalError(absl::StrCat("compiler emitted an invalid schedule: ",
                                            std::string(valid.message())));
  }
  return absl::OkStatus();
}

// The selective policy with nothing to offload: `lowered_in` as it is, with the baseline's
// predictions and a warning saying so.
Schedule NothingSelected(const Schedule& lowered_in, const Predictions& base) {
  Schedule out = lowered_in;
  out.predictions = base;
  out.predictions->warnings.push_back(
      "offload selective: offload_fraction and offload_chunks are both 0, so nothing is "
      "offloaded");
  return out;
}

bool SelectsNothing(const PipelineSpec& spec) {
  return spec.offload == OffloadPolicy::kSelective && spec.offload_chunks == 0 &&
         spec.offload_fraction == 0.0;
}

// Step 0 of the file comment: simulates `lowered_in` (Simulate's predictions: the lowered
// schedule has no transfers, CheckRequest, so there is no second run; without the memory
// samples, which nothing here reads) and posts each SEND/RECV at its transfer. Fills *base,
// *posted and *posted_times (the baseline's op times, permuted as *posted is); *posted is
// `lowered_in` itself where posting would not keep every RECV first.
absl::Status PostBaseline(const Schedule& lowered_in, const CostModel& cost, Predictions* base,
                          Schedule* posted, Timeline* posted_times) {
  absl::StatusOr<Timeline> baseline =
      internal::SimulateOnce(lowered_in, cost, internal::SimulateDetail::kPredictions);
  if (!baseline.ok()) {
    return Annotate(baseline.status(), "PlanOffload: simulating the lowered schedule");
  }
  *posted = internal::PostAtTransfers(lowered_in, *baseline, posted_times);
  if (!internal::ReceivesFirst(*posted)) {
    // Zero-time ops can tie so that no order by time keeps every consumer after its RECV;
    // plan the lowered order then (its BARRIERs may not come out deadlock-free: Check says).
    *posted = lowered_in;
    posted_times->stages = std::move(baseline->stages);
  }
  *base = std::move(baseline->predictions);
  return absl::OkStatus();
}

// Steps 1 to 4 of the file comment, on the baseline PostBaseline made of `lowered_in`
// (`lowered` is its posted schedule). REQUIRES: CheckRequest passed, spec.offload is not kNone
// and the spec does not select nothing. `validated_input` validates `lowered_in` where it is
// returned as it is. `share_bounds` is the memo of `lowered`'s share bounds (its order's, so
// that what auto asked of them is not computed again).
absl::StatusOr<Schedule> PlanOnBaseline(
    const Schedule& lowered_in, const CostModel& cost, const Predictions& base,
    const Schedule& lowered, const Timeline& posted_times,
    const std::function<absl::Status()>& validated_input, internal::ShareBoundMemo* share_bounds) {
  const PipelineSpec& spec = lowered_in.spec;
  // Plan two ways and keep the better plan that passes its check by simulation: on the lowered
  // timeline as it is, and on the one where warm-up forwards wait for the D2H of the entry
  // before them (GatedWarmup), which the links of a group can carry when the plain warm-up
  // produces activations faster than that. Should no plan pass (a bug here, or a simulator
  // whose semantics moved), plan again with a smaller share of what the policy asks (the empty
  // plan is the lowered schedule itself, which always passes). Each candidate keeps only its
  // program, its predictions and its shortfall warning: a plan's working state is freed as soon
  // as it is emitted, so at most one is alive at a time, or two where both plans are made side
  // by side (bounded memory, issue 15).
  std::vector<std::string> warnings;
  std::optional<Candidate> kept;
  const bool both_needed =
      internal::CompileThreads() > 1 &&
      internal::NeverAtMostTwoEntries(lowered, cost,
                                      share_bounds->PerStage(lowered, lowered.spec, cost));
  for (const double share : {1.0, 0.5, 0.25, 0.0}) {
    if (share == 0.0) {
      PO_RETURN_IF_ERROR(validated_input());
      const PipelinePlan plan = MakePlan(lowered, cost, posted_times, share, nullptr, nullptr);
      kept = Candidate{lowered_in, base,
                       internal::ShortfallWarning(spec, cost, plan, base.step_time,
                                                  base.step_time)};
      break;
    }
    // The gated plan first: when it keeps every stage at two entries or fewer, the plain one
    // cannot do better by more than an entry on a stage, and planning it costs as much again.
    // Where the policy's share rules that out and a warm-up is worth gating, both are needed:
    // they are made side by side (two working states at once, each with the threads the other
    // leaves idle).
    std::optional<Candidate> gated, plain;
    std::string problem;
    const auto plan_plain = [&] {
      problem = PlanAndCheck(lowered, lowered, cost, posted_times, base, share, nullptr,
                             nullptr, &plain);
    };
    std::optional<GatedTimeline> gated_timeline =
        GateWarmup(lowered, cost, posted_times, base, share);
    if (both_needed && gated_timeline) {
      internal::ParallelFor(2, [&](int task) {
        if (task == 0) {
          gated = PlanGated(*std::move(gated_timeline), lowered, cost, base, share,
                            /*beside_plain=*/true);
        } else {
          plan_plain();
        }
      });
      // The bound says this cannot hold; should it, the plan is the one made in turn.
      if (gated && AtMostTwoEntries(lowered, cost, gated->predictions)) {
        kept = std::move(gated);
        break;
      }
    } else {
      if (gated_timeline) {
        gated = PlanGated(*std::move(gated_timeline), lowered, cost, base, share,
                          /*beside_plain=*/false);
      }
      if (gated && AtMostTwoEntries(lowered, cost, gated->predictions)) {
        kept = std::move(gated);
        break;
      }
      plan_plain();
    }
    if (plain && (!gated || Better(plain->predictions, gated->predictions))) {
      kept = std::move(plain);
    } else if (gated) {
      kept = std::move(gated);
    }
    if (kept) break;
    warnings.push_back(absl::StrCat(
        "offload ", PolicyName(spec), ": internal check failed: the plan for ",
        absl::StrFormat("%.0f%%", 100 * share), " of the request ", problem,
        "; planning less offload. Please report this."));
  }

  if (!kept->shortfall.empty()) warnings.insert(warnings.begin(), kept->shortfall);
  if (spec.strict && !warnings.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("strict offload: ", warnings.front()));
  }
  Schedule planned = std::move(kept->planned);
  planned.predictions = std::move(kept->predictions);
  if (internal::HasTransfers(planned)) {
    if (!kept->without_transfers) {
      kept->without_transfers = StepWithoutTransfers(planned, lowered, cost, base);
    }
    PO_ASSIGN_OR_RETURN(planned.predictions->step_time_without_offload,
                        std::move(*kept->without_transfers));
  }
  for (std::string& warning : warnings) planned.predictions->warnings.push_back(std::move(warning));
  return planned;
}

// PlanOffload and PlanOffloadOfLowered. With `input_validated`, `lowered_in` is known to pass
// Validate (Compile's own lowering), so it is validated only where it is returned as it is.
absl::StatusOr<Schedule> PlanOffloadImpl(const Schedule& lowered_in, const CostModel& cost,
                                         bool input_validated) {
  const PipelineSpec& spec = lowered_in.spec;
  if (spec.offload == OffloadPolicy::kNone) return lowered_in;
  PO_RETURN_IF_ERROR(CheckRequest(lowered_in, cost));
  if (!input_validated) {
    if (absl::Status valid = Validate(lowered_in); !valid.ok()) {
      return Annotate(valid, "PlanOffload: the lowered schedule is not valid");
    }
  }
  // Where the result is the lowered schedule itself, no check below has validated it.
  const auto validated_input = [&]() -> absl::Status {
    return input_validated ? ValidatedLowering(lowered_in) : absl::OkStatus();
  };
  if (SelectsNothing(spec)) {
    absl::StatusOr<Timeline> baseline =
        internal::SimulateOnce(lowered_in, cost, internal::SimulateDetail::kPredictions);
    if (!baseline.ok()) {
      return Annotate(baseline.status(), "PlanOffload: simulating the lowered schedule");
    }
    PO_RETURN_IF_ERROR(validated_input());
    return NothingSelected(lowered_in, baseline->predictions);
  }
  Predictions base;
  Schedule lowered;
  Timeline posted_times;
  PO_RETURN_IF_ERROR(PostBaseline(lowered_in, cost, &base, &lowered, &posted_times));
  internal::ShareBoundMemo share_bounds;  // this one plan's
  return PlanOnBaseline(lowered_in, cost, base, lowered, posted_times, validated_input,
                        &share_bounds);
}

}  // namespace

absl::StatusOr<Schedule> PlanOffload(const Schedule& lowered, const CostModel& cost) {
  return PlanOffloadImpl(lowered, cost, /*input_validated=*/false);
}

namespace internal {

bool NeverAtMostTwoEntries(const Schedule& lowered, const CostModel& cost,
                           const std::vector<std::int64_t>& share_least_peaks) {
  for (int s = 0; s < lowered.spec.num_stages; ++s) {
    if (share_least_peaks[s] > 2 * LargestEntry(lowered, cost, s)) return true;
  }
  return false;
}

absl::StatusOr<Schedule> PlanOffloadOfLowered(const Schedule& lowered, const CostModel& cost) {
  return PlanOffloadImpl(lowered, cost, /*input_validated=*/true);
}

absl::StatusOr<LoweredOrder> MakeLoweredOrder(Schedule lowered, const CostModel& cost) {
  LoweredOrder order;
  PO_RETURN_IF_ERROR(
      PostBaseline(lowered, cost, &order.baseline, &order.posted, &order.posted_times));
  order.lowered = std::move(lowered);
  return order;
}

absl::StatusOr<Schedule> PlanOffloadOfLoweredOrder(LoweredOrder* order,
                                                   const PipelineSpec& resolved,
                                                   const CostModel& cost) {
  order->lowered.spec = resolved;
  order->posted.spec = resolved;
  const Schedule& lowered_in = order->lowered;
  if (resolved.offload == OffloadPolicy::kNone) return lowered_in;
  PO_RETURN_IF_ERROR(CheckRequest(lowered_in, cost));
  const auto validated_input = [&] { return ValidatedLowering(lowered_in); };
  if (SelectsNothing(resolved)) {
    PO_RETURN_IF_ERROR(validated_input());
    return NothingSelected(lowered_in, order->baseline);
  }
  return PlanOnBaseline(lowered_in, cost, order->baseline, order->posted, order->posted_times,
                        validated_input, &order->share_bounds);
}

}  // namespace internal

}  // namespace pipeoffload
