// A lower bound on one stage's peak with some of its entries offloaded (the interval-cover
// bound), for the planner's tests and bench/offload_table. Header-only; pure computation on a
// simulated stage, no I/O.
//
// It binds every plan that keeps the order's timeline (no op waits for a copy, as in every plan
// the planner makes outside a gated warm-up) and the planner's reload margin, whatever the link
// sharing: it books no link. Memory counts in program order (+ at F and RELOAD, - at RELEASE and
// at the op that frees the entry), and F < OFFLOAD < RELEASE < RELOAD < B. So after the stage's
// compute op j an offloaded entry can be off the device only if its RELEASE came before op j,
// which waits for the D2H, itself started no earlier than the F ended: F's end + one D2H <=
// start(j); and if its RELOAD, issued no earlier than op j, ends the margin before B: start(j) +
// one H2D + margin <= B's start. Those j form one interval of compute ops per entry: its window.
// Entries count as one unit each (the bound is in entries, exact for unit costs where all chunks
// hold the same bytes).
#ifndef PIPEOFFLOAD_SCHEDULES_PEAK_BOUND_H_
#define PIPEOFFLOAD_SCHEDULES_PEAK_BOUND_H_

#include <algorithm>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::internal {

struct StageWindows {
  std::vector<int> base;                     // entries on the device after compute op j
  std::vector<std::pair<int, int>> windows;  // per entry that has one: its first and last op
  std::vector<double> ready;                 // per window: its entry's F end (a D2H's earliest)
};

// The windows of one simulated stage (`stage`: its timed ops, stage number `stage_index`).
// Only entries of chunks below `candidate_chunks` get one (0: every chunk), as selective
// offload's --offload-chunks allows.
inline StageWindows TimedWindows(const std::vector<TimedOp>& stage, const CostModel& cost,
                                 bool split, int stage_index, int candidate_chunks = 0) {
  std::vector<TimedOp> ops;  // compute ops, in program order (one stage runs one at a time)
  for (const TimedOp& t : stage) {
    if (IsCompute(t.op.kind)) ops.push_back(t);
  }
  const int n = static_cast<int>(ops.size());
  std::map<std::pair<int, int>, int> forward, backward, freed;
  for (int j = 0; j < n; ++j) {
    const std::pair<int, int> entry{ops[j].op.mb, ops[j].op.chunk};
    if (ops[j].op.kind == OpKind::kForward) forward[entry] = j;
    if (ops[j].op.kind == OpKind::kBackward) backward[entry] = j;
    if (ops[j].op.kind == (split ? OpKind::kBackwardWeight : OpKind::kBackward)) freed[entry] = j;
  }
  // The fastest a copy can run: a bound must not assume the slower duplex rate.
  const double d2h = static_cast<double>(cost.activation_bytes) /
                     std::max(cost.d2h_bandwidth, cost.duplex_bandwidth);
  const double h2d = static_cast<double>(cost.activation_bytes) /
                     std::max(cost.h2d_bandwidth, cost.duplex_bandwidth);
  const double margin =
      cost.reload_margin_in_backward_times * cost.BackwardTime(stage_index, split);
  StageWindows out;
  out.base.assign(n, 0);
  for (const auto& [entry, f] : forward) {
    for (int j = f; j < freed.at(entry); ++j) ++out.base[j];
    if (candidate_chunks > 0 && entry.second >= candidate_chunks) continue;
    const int b = backward.at(entry);
    int first = -1, last = -1;
    for (int j = f + 1; j < b; ++j) {
      if (ops[f].end + d2h <= ops[j].start + 1e-9 &&
          ops[j].start + h2d + margin <= ops[b].start + 1e-9) {
        if (first < 0) first = j;
        last = j;
      }
    }
    if (first >= 0) {
      out.windows.push_back({first, last});
      out.ready.push_back(ops[f].end);
    }
  }
  return out;
}

// The fewest windows that bring every point down to `target` entries (-1: no choice can): at
// each point still above it, left to right, the unused window that reaches furthest right.
// Optimal for intervals: an optimal choice that agrees with this one so far covers the point
// with some other window too; trading that window for this one leaves every earlier point
// covered enough (by the windows chosen before) and covers every later point as often or more.
inline int EntriesToReach(const StageWindows& stage, int target) {
  std::vector<int> cover(stage.base.size(), 0);
  std::vector<char> used(stage.windows.size(), 0);
  int count = 0;
  for (int j = 0; j < static_cast<int>(stage.base.size()); ++j) {
    while (stage.base[j] - cover[j] > target) {
      int best = -1;
      for (int e = 0; e < static_cast<int>(stage.windows.size()); ++e) {
        const auto [first, last] = stage.windows[e];
        if (used[e] || first > j || last < j) continue;
        if (best < 0 || last > stage.windows[best].second) best = e;
      }
      if (best < 0) return -1;
      used[best] = 1;
      ++count;
      for (int x = stage.windows[best].first; x <= stage.windows[best].second; ++x) ++cover[x];
    }
  }
  return count;
}

// The least peak (entries) the stage can have with at most `budget` entries offloaded.
inline int LeastPeak(const StageWindows& stage, int budget) {
  if (stage.base.empty()) return 0;
  int peak = *std::max_element(stage.base.begin(), stage.base.end());
  while (peak > 0) {
    const int needed = EntriesToReach(stage, peak - 1);
    if (needed < 0 || needed > budget) break;
    --peak;
  }
  return peak;
}

// A lower bound on the largest peak among stages that share one direction of a host link
// (`stages`: their simulated ops; `first_stage`: the number of the first), for plans that keep
// the order's timeline: the per-stage bound knows no link, and in a long warm-up the stages
// together may make entries faster than one link direction can carry them out. At an instant
// T, take on each stage s the first compute op j_s starting at or after T (its point, as in
// TimedWindows): an entry off the device there has its window over j_s and a D2H done by
// max_s start(j_s). One direction runs one copy at a time, each at least one D2H long and
// starting no earlier than its F's end, so at most C(T') of the candidates are done by T'
// (back to back in order of F's end, the most any order finishes). So the stages' memory at
// their points sums to at least sum_s base_s(j_s) - min(candidates, C), and the largest is at
// least the ceiling of its share. The result is that over every T, and every stage's own
// bound (LeastPeak with every candidate allowed). One unit per entry, as above.
inline int GroupLeastMaxPeak(const std::vector<const std::vector<TimedOp>*>& stages,
                             const CostModel& cost, bool split, int first_stage,
                             int candidate_chunks = 0) {
  struct Stage {
    StageWindows windows;
    std::vector<double> start;  // compute op j's start
  };
  const double d2h = static_cast<double>(cost.activation_bytes) /
                     std::max(cost.d2h_bandwidth, cost.duplex_bandwidth);
  std::vector<Stage> group;
  int best = 0;
  std::vector<double> instants;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const int stage_index = first_stage + static_cast<int>(i);
    Stage s;
    s.windows = TimedWindows(*stages[i], cost, split, stage_index, candidate_chunks);
    best = std::max(best, LeastPeak(s.windows, static_cast<int>(s.windows.windows.size())));
    for (const TimedOp& t : *stages[i]) {
      if (!IsCompute(t.op.kind)) continue;
      s.start.push_back(t.start);
      instants.push_back(t.start);
    }
    group.push_back(std::move(s));
  }
  std::sort(instants.begin(), instants.end());
  instants.erase(std::unique(instants.begin(), instants.end()), instants.end());
  std::vector<double> releases;
  for (const double t : instants) {
    long long base = 0;
    double deadline = t;
    releases.clear();
    bool every_stage = true;
    for (const Stage& s : group) {
      const auto it = std::lower_bound(s.start.begin(), s.start.end(), t);
      if (it == s.start.end()) {
        every_stage = false;
        break;
      }
      const int j = static_cast<int>(it - s.start.begin());
      deadline = std::max(deadline, *it);
      base += s.windows.base[j];
      for (std::size_t w = 0; w < s.windows.windows.size(); ++w) {
        const auto [first, last] = s.windows.windows[w];
        if (first <= j && j <= last) releases.push_back(s.windows.ready[w]);
      }
    }
    if (!every_stage) continue;
    std::sort(releases.begin(), releases.end());
    double free_at = -std::numeric_limits<double>::infinity();
    long long done = 0;
    for (const double r : releases) {
      const double end = std::max(free_at, r) + d2h;
      if (end > deadline + 1e-9) break;
      free_at = end;
      ++done;
    }
    const long long left = base - done;
    const long long members = static_cast<long long>(group.size());
    best = std::max(best, static_cast<int>((left + members - 1) / members));
  }
  return best;
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_PEAK_BOUND_H_
