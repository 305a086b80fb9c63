// The remembered placements of one stage's entries (PlacementCache), indexed for CoverPoint's
// question: of the entries whose placement takes them off the device at point `at`, which
// reloads last? Header-only; pure computation, no I/O.
//
// Why an index: a placement covers `at` when its RELEASE is before it and its RELOAD after it,
// and the answer is the latest RELOAD; so it is the latest RELOAD of all placements released
// before `at`, if that one reloads after it (a placement released before `at` that reloads
// after it reloads later than one that reloads before). A tree over the RELEASEs' gaps keeps
// the latest RELOAD of each range of gaps: the question is a prefix of them and a few placements,
// instead of a scan of every entry resident at the peak (about 130 a commit on average at p=64
// m=512 v=4), once per commit (issue 15).
//
// Keys: a placement's RELEASE and RELOAD keys (StagePlan::ReleaseKey, ReloadKey) carry the
// sequence number of the next commit, after every op placed so far; so against a placed point
// `at` they compare by (gap, baseline, time, rank) alone, and against each other RELOADs by
// (gap, time) alone (both inserted ops of rank kRankReload, equal sequence numbers). Equal
// RELOADs go to the lowest rank (the entry first in the member's order).
#ifndef PIPEOFFLOAD_SCHEDULES_COVER_INDEX_H_
#define PIPEOFFLOAD_SCHEDULES_COVER_INDEX_H_

#include <cstddef>
#include <vector>

#include "schedules/offload_stage_plan.h"

namespace pipeoffload::internal {

class CoverIndex {
 public:
  // For a stage of `gaps` gaps and `entries` entries.
  CoverIndex(int gaps, int entries)
      : leaves_((gaps + kGapsPerLeaf - 1) / kGapsPerLeaf),
        tree_(2 * static_cast<std::size_t>(leaves_), -1),
        first_(static_cast<std::size_t>(leaves_), -1),
        next_(static_cast<std::size_t>(entries), -1),
        previous_(static_cast<std::size_t>(entries), -1),
        placed_(static_cast<std::size_t>(entries)) {}

  // Indexes `entry`'s placement `p` (its rank in the member's order: `rank`), replacing any.
  void Put(int entry, int rank, const Placement& p) {
    Drop(entry);
    placed_[entry] = Placed{p.release_time, p.reload_start, rank, p.release_gap, p.release_rank,
                            p.reload_gap};
    const int leaf = p.release_gap / kGapsPerLeaf;
    next_[entry] = first_[leaf];
    previous_[entry] = -1;
    if (first_[leaf] >= 0) previous_[first_[leaf]] = entry;
    first_[leaf] = entry;
    Update(leaf);
  }

  // Forgets `entry`'s placement, if indexed.
  void Drop(int entry) {
    Placed& placed = placed_[entry];
    if (placed.release_gap < 0) return;
    const int leaf = placed.release_gap / kGapsPerLeaf;
    placed.release_gap = -1;
    if (previous_[entry] >= 0) {
      next_[previous_[entry]] = next_[entry];
    } else {
      first_[leaf] = next_[entry];
    }
    if (next_[entry] >= 0) previous_[next_[entry]] = previous_[entry];
    Update(leaf);
  }

  // Of the indexed placements released before `at`, the entry that reloads last (equal
  // reloads: the lowest rank), when it reloads after `at`; else -1.
  int LatestCovering(const ProgramKey& at) const {
    int best = -1;
    // Leaves before at.gap's: released before it (a bottom-up range query; Later commutes).
    const int leaf = at.gap / kGapsPerLeaf;
    for (int lo = leaves_, hi = leaves_ + leaf; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1) best = Later(best, tree_[lo++]);
      if (hi & 1) best = Later(best, tree_[--hi]);
    }
    // Its leaf: the gaps before at.gap, and of at.gap, before a baseline point all of it,
    // before an inserted one what sorts first.
    for (int e = first_[leaf]; e >= 0; e = next_[e]) {
      const Placed& placed = placed_[e];
      if (placed.release_gap < at.gap ||
          (placed.release_gap == at.gap &&
           (at.baseline || placed.release_time < at.time ||
            (placed.release_time == at.time && placed.release_rank < at.rank)))) {
        best = Later(best, e);
      }
    }
    if (best < 0) return -1;
    const Placed& placed = placed_[best];
    const bool after = at.gap < placed.reload_gap ||
                       (at.gap == placed.reload_gap && !at.baseline &&
                        (at.time < placed.reload_start ||
                         (at.time == placed.reload_start && at.rank <= kRankReload)));
    return after ? best : -1;
  }

 private:
  // What the index keeps of an indexed placement; release_gap -1 when there is none.
  struct Placed {
    double release_time = 0.0;
    double reload_start = 0.0;
    int rank = 0;
    int release_gap = -1;
    int release_rank = 0;
    int reload_gap = 0;
  };
  // Of two entries (-1: none), the one that reloads later; equal reloads, the lower rank.
  int Later(int a, int b) const {
    if (a < 0) return b;
    if (b < 0) return a;
    const Placed& x = placed_[a];
    const Placed& y = placed_[b];
    if (x.reload_gap != y.reload_gap) return x.reload_gap > y.reload_gap ? a : b;
    if (x.reload_start != y.reload_start) return x.reload_start > y.reload_start ? a : b;
    return y.rank < x.rank ? b : a;
  }
  // Recomputes leaf `leaf` and the nodes above it, up to the first that keeps its entry: the
  // ones above it then keep theirs. (An entry's data changes only while it is in no node: Put
  // drops it first, and a node above one holding it holds it too or a later one.)
  void Update(int leaf) {
    int latest_here = -1;
    for (int e = first_[leaf]; e >= 0; e = next_[e]) latest_here = Later(latest_here, e);
    std::size_t node = static_cast<std::size_t>(leaves_ + leaf);
    tree_[node] = latest_here;
    for (node /= 2; node >= 1; node /= 2) {
      const int latest = Later(tree_[2 * node], tree_[2 * node + 1]);
      if (tree_[node] == latest) return;
      tree_[node] = latest;
    }
  }

  // A leaf per kGapsPerLeaf gaps: a tree over single gaps would hold more than the stage's
  // entries (about 20,000 gaps to 2,048 entries at p=64 m=512 v=4), in every copy of a plan.
  static constexpr int kGapsPerLeaf = 16;
  int leaves_ = 0;
  // Bottom-up tree over the leaves (at leaves_ + leaf): each node's entry reloading last.
  std::vector<int> tree_;
  // The indexed entries released in each leaf's gaps, as lists: [leaf] the first, [entry] the
  // others.
  std::vector<int> first_, next_, previous_;
  std::vector<Placed> placed_;  // [entry]
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_COVER_INDEX_H_
