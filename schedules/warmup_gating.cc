// Warm-up gating and SEND/RECV re-placement: the timelines the offload planner plans on
// (warmup_gating.h says what each function does and why). Pure functions of a lowered schedule
// and the cost model; no I/O.
#include "schedules/warmup_gating.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/base/parallel_for.h"
#include "lib/ir/grid_index.h"
#include "lib/sim/simulate_parts.h"
#include "schedules/gated_step_bound.h"
#include "schedules/offload_policy.h"

namespace pipeoffload::internal {

Schedule PostAtTransfers(const Schedule& lowered, const Timeline& timeline, Timeline* moved) {
  Schedule out;  // every program is written below, from the timeline's ops
  out.spec = lowered.spec;
  out.stages.resize(lowered.stages.size());
  moved->stages.assign(lowered.stages.size(), {});
  // Each stage is permuted on its own: on several threads for large schedules.
  ParallelForSized(static_cast<int>(lowered.stages.size()), TotalOps(lowered.stages), [&](int s) {
    out.stages[s].stage = lowered.stages[s].stage;
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
    // before[r]: the rank among compute ops that p2p[r] is put before. Never decreasing in r
    // (each is at least the one before it), so the P2P ops put before one compute op are a run
    // of p2p, and the program is one merge of the two lists.
    std::vector<int> before(p2p.size());
    int floor = 0;
    // The first compute op starting at or after p2p[r]: compute starts never decrease along the
    // program (in-order issue), nor p2p[r]'s in r, so one forward walk finds them all.
    int first_at_or_after = 0;
    for (std::size_t r = 0; r < p2p.size(); ++r) {
      const int i = p2p[r];
      const TimedOp& t = timed[i];
      while (first_at_or_after < static_cast<int>(compute.size()) &&
             timed[compute[first_at_or_after]].start < t.start) {
        ++first_at_or_after;
      }
      int k = first_at_or_after;
      if (IsSend(t.op.kind)) {
        const std::size_t entry = static_cast<std::size_t>(t.op.mb) * v + t.op.chunk;
        k = std::max(k, 1 + (t.op.kind == OpKind::kSendActivation ? forward_rank[entry]
                                                                  : backward_rank[entry]));
      }
      // Never earlier than it was: a post that was its transfer's binding bound stays put.
      k = std::max({k, floor, rank_before[i]});
      floor = k;
      before[r] = k;
    }
    std::vector<Op>& ops = out.stages[s].ops;
    std::vector<TimedOp>& times = moved->stages[s];
    ops.clear();
    times.reserve(timed.size());
    const auto put = [&](int i) {
      ops.push_back(timed[i].op);
      times.push_back(timed[i]);
      times.back().index = static_cast<int>(times.size()) - 1;
    };
    std::size_t r = 0;
    for (std::size_t k = 0; k <= compute.size(); ++k) {
      for (; r < p2p.size() && before[r] == static_cast<int>(k); ++r) put(p2p[r]);
      if (k < compute.size()) put(compute[k]);
    }
  });
  return out;
}

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

namespace {

// The warm-up forwards of stage s worth gating (GatedWarmup): program indices of the F ops
// before the stage's first B of chunks [0, chunks) whose entries the policy lets go, within the
// stage's share, and that live long enough to go out and come back with time to spare. Empty
// when fewer than two.
std::vector<int> GateableForwards(const Schedule& lowered, const CostModel& cost,
                                  const std::vector<TimedOp>& timed, int s, double share,
                                  int chunks) {
  const PipelineSpec& spec = lowered.spec;
  const int m = spec.num_microbatches;
  const VirtualStageMap map = spec.stage_map();
  const std::vector<Op>& ops = lowered.stages[s].ops;
  std::vector<double> use_start(static_cast<std::size_t>(m) * spec.chunks_per_stage, 0.0);
  // Recomputed entries are no candidates here and not in the policy's total: their retained
  // blocks are left to the plain planner (a gated copy is timed as a whole entry).
  std::vector<char> recomputed(use_start.size(), 0);
  for (const Op& op : ops) {
    if (IsRecompute(op.kind)) recomputed[static_cast<std::size_t>(op.chunk) * m + op.mb] = 1;
  }
  int first_backward = static_cast<int>(ops.size());
  std::int64_t total = 0;
  for (int i = static_cast<int>(ops.size()) - 1; i >= 0; --i) {
    if (ops[i].kind == OpKind::kForward &&
        !recomputed[static_cast<std::size_t>(ops[i].chunk) * m + ops[i].mb]) {
      total += cost.ActivationBytes(s, ops[i].chunk, map);
    }
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
    const std::int64_t bytes = cost.ActivationBytes(s, op.chunk, map);
    if (op.kind != OpKind::kForward || bytes <= 0 || !Candidate(spec, op.chunk) ||
        op.chunk >= chunks || recomputed[static_cast<std::size_t>(op.chunk) * m + op.mb]) {
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

}  // namespace

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
  Schedule program;  // every program is written below
  program.spec = spec;
  program.stages.resize(lowered.stages.size());
  ParallelForSized(p, TotalOps(lowered.stages), [&](int s) {
    program.stages[s].stage = lowered.stages[s].stage;
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
    out.reserve(ops.size() + list.size());
    std::size_t next = 0;
    for (int i = 0; i <= static_cast<int>(ops.size()); ++i) {
      for (; next < list.size() && list[next].pos == i; ++next) out.push_back(list[next].op);
      if (i < static_cast<int>(ops.size())) out.push_back(ops[i]);
    }
  });
  // Reloads free of charge: where they go is planned later, on this timeline.
  CostModel free_reloads = cost;
  free_reloads.h2d_bandwidth = 1e300;
  free_reloads.duplex_bandwidth = 1e300;
  free_reloads.shared_copy_engine = false;  // nor do they wait for the D2H engine
  // Only the step time and the op times are used here: no second simulation (Simulate's, for
  // step_time_without_offload), nor memory, traffic or collisions.
  const absl::StatusOr<Timeline> simulated =
      SimulateOnce(program, free_reloads, SimulateDetail::kStepTime);
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
    // A choice whose gated step is sure to exceed the budget is not simulated: the bound is at
    // or below any step its simulation can have (gated_step_bound.h; the margin covers the
    // sums' rounding), so GateForwards would refuse it.
    const bool too_slow = GatedStepLowerBound(lowered, times, cost, gated) >
                          base.step_time * (1.0 + kOverheadBudget) * (1.0 + 1e-9);
    if (!too_slow &&
        GateForwards(lowered, cost, base, gated, gated_lowered, gated_times, copies, barriers)) {
      return true;
    }
    previous = std::move(gated);
  }
  return false;
}

}  // namespace pipeoffload::internal
