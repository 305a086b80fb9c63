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

#include <iterator>
#include <limits>
#include <map>

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
    auto it = busy_.upper_bound(start);
    if (it != busy_.begin()) {
      auto before = std::prev(it);
      if (before->second >= start) {
        start = before->first;
        if (before->second > end) end = before->second;
        it = busy_.erase(before);
      }
    }
    while (it != busy_.end() && it->first <= end) {
      if (it->second > end) end = it->second;
      it = busy_.erase(it);
    }
    busy_.emplace(start, end);
  }

  // Total booked time (the union of the intervals).
  double BusyTime() const {
    double total = 0.0;
    for (const auto& [start, end] : busy_) total += end - start;
    return total;
  }

  int NumIntervals() const { return static_cast<int>(busy_.size()); }

 private:
  std::map<double, double> busy_;  // start -> end; disjoint and non-touching after Add
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_SLOT_OCCUPANCY_H_
