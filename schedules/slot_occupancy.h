// Busy time of one transfer resource (one direction of a host link, or one stage's copy engine),
// as the offload planner books it. Header-only: a small value type used by the planner and its
// tests; no I/O.
//
// Intervals are half-open [start, end): two transfers that merely touch (one ends exactly when
// the next starts) do not collide, which is also how the simulator counts collisions. Empty
// intervals (zero-time transfers) occupy nothing, and fit anywhere but strictly inside a booked
// interval (on a copy engine, such a transfer would wait for the one running).
#ifndef PIPEOFFLOAD_SCHEDULES_SLOT_OCCUPANCY_H_
#define PIPEOFFLOAD_SCHEDULES_SLOT_OCCUPANCY_H_

#include <cstddef>
#include <iterator>
#include <limits>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"

namespace pipeoffload::internal {

class SlotOccupancy {
 public:
  // True when [start, end) overlaps nothing booked so far.
  bool IsFree(double start, double end) const {
    if (!(end > start)) {
      auto next = busy_.upper_bound(start);
      return next == busy_.begin() || !(start < std::prev(next)->second) ||
             std::prev(next)->first == start;
    }
    // The first booked interval starting at or after `end` cannot overlap; the one before it
    // is the only candidate, because booked intervals are kept disjoint (merged on Add).
    auto next = busy_.lower_bound(end);
    if (next == busy_.begin()) return true;
    const auto& [busy_start, busy_end] = *std::prev(next);
    return !(busy_start < end && start < busy_end);
  }

  // For a non-empty [start, end) that is not free: the start of the earliest booked interval
  // it overlaps (no start after `start - d` that still ends after start + d... fits before it:
  // a search backwards in time may jump to that start minus its length), and the end of the
  // latest (a search forwards may jump to it). NaN when [start, end) is free or empty.
  double EarliestOverlapStart(double start, double end) const {
    if (!(end > start)) return std::numeric_limits<double>::quiet_NaN();
    auto it = busy_.upper_bound(start);
    if (it != busy_.begin() && std::prev(it)->second > start) return std::prev(it)->first;
    if (it != busy_.end() && it->first < end) return it->first;
    return std::numeric_limits<double>::quiet_NaN();
  }
  double LatestOverlapEnd(double start, double end) const {
    if (!(end > start)) return std::numeric_limits<double>::quiet_NaN();
    auto it = busy_.lower_bound(end);
    if (it == busy_.begin()) return std::numeric_limits<double>::quiet_NaN();
    --it;
    return it->second > start ? it->second : std::numeric_limits<double>::quiet_NaN();
  }

  // Books [start, end), merging it with whatever it overlaps or touches. Booking an interval
  // that overlaps an existing one is allowed (P2P traffic booked from a timeline may already
  // collide with itself); the union is kept.
  void Add(double start, double end) {
    if (!(end > start)) return;
    // [from, to): the booked intervals the new one overlaps or touches, replaced by the union.
    const auto after = busy_.upper_bound(start);
    auto from = after;
    if (after != busy_.begin() && std::prev(after)->second >= start) {
      from = std::prev(after);
      start = from->first;
      if (from->second > end) end = from->second;
    }
    auto to = after;
    for (; to != busy_.end() && to->first <= end; ++to) {
      if (to->second > end) end = to->second;
    }
    if (from != after) {  // the union starts where `from` does: it keeps its key
      from->second = end;
      busy_.erase(std::next(from), to);
      return;
    }
    busy_.insert(busy_.erase(from, to), {start, end});
  }

  // Total booked time (the union of the intervals).
  double BusyTime() const {
    double total = 0.0;
    for (const auto& [start, end] : busy_) total += end - start;
    return total;
  }

  int NumIntervals() const { return static_cast<int>(busy_.size()); }

 private:
  // Start to end; disjoint and non-touching after Add. A B-tree: the planner searches it far
  // more often than it books (every placement search probes it many times), and a link
  // group's plan is copied whole (ChooseEntries), so its nodes hold many intervals each; a
  // sorted vector moved half of itself per booking.
  absl::btree_map<double, double> busy_;
};

// A multiset of instants (the ends of booked copies, where a later copy may start), as a
// B-tree: the placement searches walk it by binary search and iteration far more often than a
// commit adds to it, and a link group's plan is copied whole, so its nodes hold many instants
// each; a sorted vector moved half of itself per insert (thousands of copies a link group at
// p=64 m=512 v=4; issue 15). Equal instants are indistinguishable.
class SortedTimes {
 public:
  using const_iterator = absl::btree_multiset<double>::const_iterator;

  void insert(double t) { times_.insert(t); }
  const_iterator lower_bound(double t) const { return times_.lower_bound(t); }
  const_iterator upper_bound(double t) const { return times_.upper_bound(t); }
  const_iterator begin() const { return times_.begin(); }
  const_iterator end() const { return times_.end(); }
  std::size_t size() const { return times_.size(); }

 private:
  absl::btree_multiset<double> times_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_SLOT_OCCUPANCY_H_
