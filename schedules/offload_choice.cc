// Choosing what a link group offloads, and the shortfall report (offload_choice.h). Pure
// computation; no I/O.
#include "schedules/offload_choice.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "schedules/offload_policy.h"

namespace pipeoffload::internal {

void LinkGroupPlan::Invalidate(int committer, const Placement& done) {
  const auto overlaps = [](double a0, double a1, double b0, double b1) {
    return a0 <= b1 && b0 <= a1;  // closed: zero-time copies count too
  };
  // Every test below needs the entry alive at some instant of one of the two new copies
  // (its remembered copies, and any candidate start a search could meet, lie in its life),
  // and each meets an interval the entry is registered with (PlacementCache::Put) at an instant
  // of one of the copies: the registrations there are all that can be stale.
  for (int m = 0; m < static_cast<int>(plans.size()); ++m) {
    PlacementCache& cache = caches[m];
    const auto check = [&](int e) {
      const internal::OffloadEntry& entry = plans[m].entries()[e];
      if (!overlaps(entry.forward_end, entry.use_start, done.offload_start, done.offload_end) &&
          !overlaps(entry.forward_end, entry.use_start, done.reload_start, done.reload_end)) {
        return;
      }
      const std::optional<Placement>& c = *cache.Get(e);
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
      if (stale) cache.Reset(e);
    };
    cache.NewRound();
    cache.ForEachRegistered(done.offload_start, done.offload_end, check);
    cache.ForEachRegistered(done.reload_start, done.reload_end, check);
  }
}

namespace {

// Offloads, for member `member`, an entry resident at `at` whose widest window covers it: the
// one whose window reaches furthest past it (the classic greedy for covering points with
// intervals: one entry lowers as much of what follows as any could). False when none can.
bool CoverPoint(LinkGroupPlan& group, int member, const ProgramKey& at) {
  StagePlan& plan = group.plans[member];
  PlacementCache& cache = group.caches[member];
  // Only a candidate resident at `at` can cover it: those whose answer is not remembered yet
  // are found first (in the blocks that hold any: most resident entries are committed or
  // remembered), and the cache's index answers for all of them; equal reaches go to the first
  // in the member's order (the longest-lived).
  plan.ForEachResidentIn(
      at, [&](int block) { return cache.Unsettled(block); },
      [&](int e) {
        if (cache.Remembers(e) || cache.Closed(e)) return;
        if (group.Open(member, e)) {
          group.Find(member, e);
        } else {
          cache.Close(e);  // for good (PlacementCache::Close)
        }
      });
  for (;;) {
    const int best = cache.LatestCovering(at);
    if (best < 0) return false;
    if (group.Open(member, best)) {
      const Placement p = **cache.Get(best);  // Commit may forget the cached one
      group.Commit(member, best, p);
      return true;
    }
    cache.Close(best);  // over the budget, for good
  }
}

// For a group of two or more stages: offloads the entries resident at each member's first
// peak, each at its first free D2H slot where that takes it off the device at its member's
// peak, in the order a list schedule of the shared direction runs them: when the direction
// frees up, of the members' next entries whose F has ended, the one of the member with the
// most left above its peak's remainder (the earliest F when none has ended). Why: the
// peak-driven choice (CoverPoint) commits one member's copies at their own ready times first,
// and the other's, ready in between, find the direction taken but for holes shorter than a
// copy (0.25-unit holes at k = 0.25 in the example, stages 2 and 3); in this order
// each copy starts where the last ended or at its F's end, and neither member takes the
// direction from the other while its own peak is the lower. A member alone on its link has
// no one to share with: its plan does not change.
void PackPeakResidents(LinkGroupPlan& group) {
  const int members = static_cast<int>(group.plans.size());
  if (members < 2) return;
  std::vector<std::vector<int>> queue(members);  // per member: resident candidates, by F
  std::vector<std::size_t> next(members, 0);
  std::vector<ProgramKey> peaks(members);
  std::vector<double> left(members, 0.0);  // bytes at the peak not yet offloaded
  for (int m = 0; m < members; ++m) {
    const StagePlan& plan = group.plans[m];
    const PeakPoint peak = plan.Peak();
    if (peak.bytes <= 0) continue;
    peaks[m] = peak.at;
    left[m] = static_cast<double>(peak.bytes);
    plan.ResidentEntries(peak.at, &group.scratch);
    for (const int e : group.scratch) {
      if (group.rank[m][e] >= 0 && !plan.placement(e)) queue[m].push_back(e);
    }
    std::sort(queue[m].begin(), queue[m].end(), [&](int a, int b) {
      return plan.entries()[a].forward_index < plan.entries()[b].forward_index;
    });
  }
  const auto ready = [&](int m) { return group.plans[m].entries()[queue[m][next[m]]].forward_end; };
  double link_free = -std::numeric_limits<double>::infinity();
  for (;;) {
    int pick = -1;
    for (int m = 0; m < members; ++m) {
      if (next[m] == queue[m].size()) continue;
      if (pick < 0) {
        pick = m;
        continue;
      }
      const bool m_ready = ready(m) <= link_free, pick_ready = ready(pick) <= link_free;
      if (m_ready != pick_ready ? m_ready
                                : (m_ready ? left[m] > left[pick] : ready(m) < ready(pick))) {
        pick = m;
      }
    }
    if (pick < 0) return;
    const int e = queue[pick][next[pick]++];
    if (!group.Affordable(pick, e)) continue;
    const std::optional<Placement> p = group.Find(pick, e);
    if (!p || !group.plans[pick].Covers(*p, peaks[pick])) continue;
    group.Commit(pick, e, *p);
    link_free = std::max(link_free, p->offload_end);
    left[pick] -= static_cast<double>(group.plans[pick].entries()[e].bytes);
  }
}

// Fill: what is left, longest-lived first, taking turns across the group's stages.
void Fill(LinkGroupPlan& group) {
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

}  // namespace

namespace {

// The peak-driven choice: lower each stage's peak one entry at a time, taking turns, until no
// entry (within the stage's share) can lower it further; then fill.
void ChooseByPeaks(LinkGroupPlan& group) {
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

// The largest peak over the group's members: what a link group is planned for (the pair bound,
// peak_bound.h's GroupLeastMaxPeak, bounds it).
std::int64_t LargestPeak(const LinkGroupPlan& group) {
  std::int64_t largest = 0;
  for (const StagePlan& plan : group.plans) largest = std::max(largest, plan.Peak().bytes);
  return largest;
}

// True when every member of `a` peaks at most as high as in `b`, and one lower.
bool LowerOnEveryStage(const LinkGroupPlan& a, const LinkGroupPlan& b) {
  bool lower = false;
  for (std::size_t m = 0; m < a.plans.size(); ++m) {
    const std::int64_t x = a.plans[m].Peak().bytes, y = b.plans[m].Peak().bytes;
    if (x > y) return false;
    lower = lower || x < y;
  }
  return lower;
}

}  // namespace

// Chooses what the group offloads (offload_planner.cc, step 2). A group of two or more stages
// is planned twice, with and without PackPeakResidents first, and keeps the packed plan where
// its largest peak is lower, or as low with no stage higher and one lower (otherwise the
// peak-driven plan, as before packing). Packing
// wins where the peak-driven choice leaves holes on the shared direction (k = 0.25, long
// warm-ups); where the direction is oversubscribed (k >= 0.5) the turns of the peak-driven
// choice often balance the pair better (packed alone: 467 of the 476 configs of offload_table
// --shared-links within one unit of the larger bound, both: 476). Why the largest peak, not
// "no stage higher": the two plans often trade a unit between the members (8/7 against 7/8),
// and a per-stage rule then picks by budget in a way that is not monotone in it; the largest
// peak is what the pair bound bounds, and the planner keeps it monotone in the volume asked
// (offload_planner_test.cc, "offloading more never raises the planned peak"); a member's own
// peak may rise by what the other's falls more.
void ChooseEntries(LinkGroupPlan& group) {
  if (group.plans.size() < 2) {
    ChooseByPeaks(group);
    return;
  }
  LinkGroupPlan packed = group;
  PackPeakResidents(packed);
  ChooseByPeaks(packed);
  ChooseByPeaks(group);
  const std::int64_t packed_largest = LargestPeak(packed), largest = LargestPeak(group);
  if (packed_largest < largest ||
      (packed_largest == largest && LowerOnEveryStage(packed, group))) {
    group = std::move(packed);
  }
}

// For each member of `group`: its candidates (longest-lived first), which of them the link
// could carry alone, and its share of the volume (`share` times what the policy asks).
void PrepareChoices(const PipelineSpec& spec, double share, LinkGroupPlan& group,
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
    std::vector<std::int64_t> open(entries.size(), -1);
    for (int i = 0; i < static_cast<int>(order.size()); ++i) {
      rank[order[i]] = i;
      open[order[i]] = entries[order[i]].bytes;
    }
    group.rank.push_back(std::move(rank));
    group.open.push_back(std::move(open));
    group.order.push_back(std::move(order));
  }
}

// What `group` planned against what it was asked, into `outcomes`.
void Summarize(LinkGroupPlan& group, const StagePlanParams& bandwidths,
               std::vector<StageOutcome>& outcomes) {
  for (int m = 0; m < static_cast<int>(group.plans.size()); ++m) {
    const StagePlan& stage = group.plans[m];
    StageOutcome& out = outcomes[stage.stage()];
    // Eligible: placed, or placeable with the link to itself (but for P2P on it). Asked only
    // of the entries left on the device: a placed one was placeable with the link shared.
    std::vector<bool> eligible(stage.entries().size(), false);
    SlotOccupancy no_engine;
    SortedTimes no_ends, no_h2d_ends;
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

namespace {

std::string Percent(double part, double whole) {
  return absl::StrFormat("%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
}

}  // namespace

// The warning for a plan that carries less than the policy asks, or "" when it carries it all.
std::string ShortfallWarning(const PipelineSpec& spec, const CostModel& cost,
                             const PipelinePlan& plan, double step_time, double base_step_time) {
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
  // By group_of, not the groups' StagePlans: the planner frees those once a plan is emitted.
  // A group's members are its stages in increasing order, as MakePlan adds them.
  for (int g = 0; g < static_cast<int>(plan.p2p_d2h_busy.size()); ++g) {
    double d2h = plan.p2p_d2h_busy[g], h2d = plan.p2p_h2d_busy[g];
    for (int s = 0; s < static_cast<int>(plan.outcomes.size()); ++s) {
      if (plan.group_of[s] != g) continue;
      const StageOutcome& out = plan.outcomes[s];
      d2h += out.d2h_demand;
      h2d += out.h2d_demand;
      if (cost.shared_copy_engine && out.d2h_demand + out.h2d_demand > busiest) {
        busiest = out.d2h_demand + out.h2d_demand;
        where = absl::StrCat("stage ", s, "'s copy engine");
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
      "offload ", std::string(OffloadPolicyName(spec.offload)),
      ": the host links carry less than requested: planned ",
      Percent(planned, total), " of the activation volume, requested ", Percent(requested, total),
      " (entries that live long enough to save memory, within the policy's share); short: ",
      stages, ". All of it would keep ", where, " busy ", absl::StrFormat("%.0f%%", 100 * load),
      " of the step, so forcing it would slow the step by at least ",
      absl::StrFormat("%.1f%%", 100.0 * std::max(0.0, load - 1.0)),
      " (more where copies bunch up, as in a warm-up); this plan's predicted slowdown: ",
      absl::StrFormat("%.2f%%", 100.0 * slowdown), " (strict mode makes this an error)");
}

}  // namespace pipeoffload::internal
