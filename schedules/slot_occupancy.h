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

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <limits>
#include <vector>

namespace pipeoffload::internal {

class SlotOccupancy {
  // (First: the member functions below deduce their iterators' types from these.)
  struct Interval {
    double start;
    double end;
  };
  // Iterators into `busy` (const or not, as it is).
  template <typename Intervals>
  static auto FirstStartingAfter(Intervals& busy, double t) {
    return std::upper_bound(busy.begin(), busy.end(), t,
                            [](double x, const Interval& b) { return x < b.start; });
  }
  template <typename Intervals>
  static auto FirstStartingAtOrAfter(Intervals& busy, double t) {
    return std::lower_bound(busy.begin(), busy.end(), t,
                            [](const Interval& b, double x) { return b.start < x; });
  }

 public:
  // True when [start, end) overlaps nothing booked so far.
  bool IsFree(double start, double end) const {
    if (!(end > start)) {
      auto next = FirstStartingAfter(busy_, start);
      return next == busy_.begin() || !(start < std::prev(next)->end) ||
             std::prev(next)->start == start;
    }
    // The first booked interval starting at or after `end` cannot overlap; the one before it
    // is the only candidate, because booked intervals are kept disjoint (merged on Add).
    auto next = FirstStartingAtOrAfter(busy_, end);
    if (next == busy_.begin()) return true;
    const Interval& busy = *std::prev(next);
    return !(busy.start < end && start < busy.end);
  }

  // For a non-empty [start, end) that is not free: the start of the earliest booked interval
  // it overlaps (no start after `start - d` that still ends after start + d... fits before it:
  // a search backwards in time may jump to that start minus its length), and the end of the
  // latest (a search forwards may jump to it). NaN when [start, end) is free or empty.
  double EarliestOverlapStart(double start, double end) const {
    if (!(end > start)) return std::numeric_limits<double>::quiet_NaN();
    auto it = FirstStartingAfter(busy_, start);
    if (it != busy_.begin() && std::prev(it)->end > start) return std::prev(it)->start;
    if (it != busy_.end() && it->start < end) return it->start;
    return std::numeric_limits<double>::quiet_NaN();
  }
  double LatestOverlapEnd(double start, double end) const {
    if (!(end > start)) return std::numeric_limits<double>::quiet_NaN();
    auto it = FirstStartingAtOrAfter(busy_, end);
    if (it == busy_.begin()) return std::numeric_limits<double>::quiet_NaN();
    --it;
    return it->end > start ? it->end : std::numeric_limits<double>::quiet_NaN();
  }

  // Books [start, end), merging it with whatever it overlaps or touches. Booking an interval
  // that overlaps an existing one is allowed (P2P traffic booked from a timeline may already
  // collide with itself); the union is kept.
  void Add(double start, double end) {
    if (!(end > start)) return;
    // [from, to): the booked intervals the new one overlaps or touches, replaced by the union.
    const auto after = FirstStartingAfter(busy_, start);
    auto from = after;
    if (after != busy_.begin() && std::prev(after)->end >= start) {
      from = std::prev(after);
      start = from->start;
      if (from->end > end) end = from->end;
    }
    auto to = after;
    for (; to != busy_.end() && to->start <= end; ++to) {
      if (to->end > end) end = to->end;
    }
    if (from == to) {
      busy_.insert(from, Interval{start, end});
      return;
    }
    *from = Interval{start, end};
    busy_.erase(std::next(from), to);
  }

  // Total booked time (the union of the intervals).
  double BusyTime() const {
    double total = 0.0;
    for (const Interval& busy : busy_) total += busy.end - busy.start;
    return total;
  }

  int NumIntervals() const { return static_cast<int>(busy_.size()); }

 private:
  // By start; disjoint and non-touching after Add. A sorted vector, not a map: the planner
  // searches it far more often than it books (every placement search probes it many times),
  // and a link group's plan is copied whole (ChooseEntries), a memcpy instead of a node per
  // interval.
  std::vector<Interval> busy_;
};

// A multiset of instants (the ends of booked copies, where a later copy may start), as a
// sorted vector: the placement searches walk it by binary search and iteration far more often
// than a commit adds to it, and a link group's plan is copied whole. Equal instants keep their
// insertion order, as std::multiset::insert does.
class SortedTimes {
 public:
  using const_iterator = std::vector<double>::const_iterator;

  void insert(double t) { times_.insert(upper_bound(t), t); }
  const_iterator lower_bound(double t) const {
    return std::lower_bound(times_.begin(), times_.end(), t);
  }
  const_iterator upper_bound(double t) const {
    return std::upper_bound(times_.begin(), times_.end(), t);
  }
  const_iterator begin() const { return times_.begin(); }
  const_iterator end() const { return times_.end(); }
  std::size_t size() const { return times_.size(); }

 private:
  std::vector<double> times_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_SLOT_OCCUPANCY_H_
