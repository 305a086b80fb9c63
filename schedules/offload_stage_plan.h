// One stage's offload plan while it is being built: the stage's lowered program with the start
// times the simulator predicted for it, the stash entries it could offload, and the OFFLOAD /
// RELEASE / RELOAD (and BARRIER) ops placed so far. Header-only so the planner's pieces can be
// tested alone; pure computation, no I/O.
//
// Invariants (the planner and its tests rely on them; offload_planner.cc says why they make a
// plan stall-free and collision-free in the simulator):
//  - An inserted op lives in a "gap" j: after baseline op j-1 and before baseline op j. Within a
//    gap, inserted ops run in (planned time, rank, seq) order; ProgramKey encodes that order.
//  - Every inserted op's planned time t satisfies start(j-1) <= t <= start(j), so issuing it
//    never delays baseline op j (the simulator issues in order: an op never starts before the
//    op ahead of it starts). OFFLOAD and RELOAD go into the last such gap (after every op that
//    starts at t, where a BARRIER guarding them also goes); RELEASE into the first (memory is
//    counted in program order, so the earlier the better).
//  - A transfer starts at a time the simulator reproduces: the issue time of its gap (for an
//    OFFLOAD, or the end of its F if later), the end of the stage's previous transfer in the
//    same direction (its copy engine frees up then), or, for an OFFLOAD, the end of another
//    stage's OFFLOAD on the same host link (the BARRIER of that hand-over sits right after the
//    other stage's RELEASE, which waits for that D2H). Durations are booked with the slower of
//    the solo and duplex bandwidths, so in the simulator a transfer may end earlier than booked
//    and one chained to it start earlier, but never later, and never outside the booked span.
//  - RELEASE goes at the OFFLOAD's booked end; RELOAD no earlier than it and ends at least
//    `reload_margin` before its B starts. For one entry: F < OFFLOAD < RELEASE < RELOAD <= B.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_STAGE_PLAN_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_STAGE_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "pipeoffload/schedule.h"
#include "schedules/slot_occupancy.h"

namespace pipeoffload::internal {

// Order of inserted ops planned for the same time in the same gap: a RELEASE first (a hand-over
// BARRIER of another stage's transfer waits for it, and memory drops before a RELOAD raises it),
// then BARRIERs, then the transfers they guard. (A RELEASE of a zero-time OFFLOAD at the same
// instant takes the OFFLOAD's rank and sorts after it by seq.)
inline constexpr int kRankRelease = 0;
inline constexpr int kRankBarrier = 1;
inline constexpr int kRankOffload = 2;
inline constexpr int kRankReload = 3;

// A point of the final program. Inserted ops of gap j sort before baseline op j.
struct ProgramKey {
  int gap = 0;
  bool baseline = false;
  double time = 0.0;
  int rank = 0;
  std::int64_t seq = 0;

  friend bool operator<(const ProgramKey& a, const ProgramKey& b) {
    if (a.gap != b.gap) return a.gap < b.gap;
    if (a.baseline != b.baseline) return b.baseline;
    if (a.time != b.time) return a.time < b.time;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.seq < b.seq;
  }
};

inline ProgramKey BaselineKey(int index) { return ProgramKey{index, true, 0.0, 0, 0}; }

// A baseline (lowered) op with the simulator's prediction for it.
struct TimedBaselineOp {
  Op op;
  double start = 0.0;
  double end = 0.0;
};

// One (mb, chunk) stash entry of the stage.
struct OffloadEntry {
  int mb = 0;
  int chunk = 0;
  int forward_index = -1;  // baseline index of F
  int use_index = -1;      // of B, the first op that needs the entry back
  int free_index = -1;     // of the op that frees it: B (unsplit) or W (split)
  double forward_end = 0.0;
  double use_start = 0.0;
  std::int64_t bytes = 0;

  double lifespan() const { return use_start - forward_end; }
};

// When and where one entry's OFFLOAD, RELEASE and RELOAD go.
struct Placement {
  int offload_gap = 0;
  double offload_start = 0.0;
  double offload_end = 0.0;  // conservative
  int release_gap = 0;
  double release_time = 0.0;
  int release_rank = kRankRelease;
  int reload_gap = 0;
  double reload_start = 0.0;
  double reload_end = 0.0;  // conservative
};

// The transfer resources a placement must find free, and books.
struct TransferResources {
  SlotOccupancy* link_d2h = nullptr;  // the stage's host link, device-to-host (whole group)
  SlotOccupancy* link_h2d = nullptr;  // host-to-device
  SlotOccupancy* engine = nullptr;    // the stage's single copy engine when shared, else null
                                      // (the only one that may be null)
  // Where an OFFLOAD may start besides its gap's issue time: the ends of the group's OFFLOADs
  // (own ones: the engine frees up; other stages': a hand-over BARRIER). And where a RELOAD
  // may: the ends of this stage's RELOADs. Required.
  std::multiset<double>* d2h_ends = nullptr;
  std::multiset<double>* own_h2d_ends = nullptr;
};

struct StagePlanParams {
  int num_microbatches = 1;
  int chunks_per_stage = 1;
  double d2h_bandwidth = 1.0;  // bytes per time unit, the slower of solo and duplex
  double h2d_bandwidth = 1.0;
  double reload_margin = 0.0;  // time a RELOAD must end before its B starts
};

// An inserted op and where it goes.
struct InsertedOp {
  Op op;
  ProgramKey key;
  int entry = -1;  // the entry it moves (-1 for BARRIER)
};

// The device-memory high-water mark of a stage program and the first point that reaches it.
struct PeakPoint {
  std::int64_t bytes = 0;
  ProgramKey at;
};

class StagePlan {
 public:
  // `ops` is the stage's lowered program, with simulated times. `entry_bytes(chunk)` gives an
  // entry's size. REQUIRES: the program is complete (F and B, and W when split, of every
  // (mb, chunk) once, F before B before W), start times never decrease along it, and it holds
  // no offload ops.
  template <typename BytesFn>
  StagePlan(int stage, std::vector<TimedBaselineOp> ops, bool split_backward,
            const StagePlanParams& params, BytesFn entry_bytes)
      : stage_(stage), ops_(std::move(ops)), params_(params) {
    const int m = params.num_microbatches;
    entries_.resize(static_cast<std::size_t>(m) * params.chunks_per_stage);
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      const Op& op = ops_[i].op;
      if (!IsCompute(op.kind)) continue;
      OffloadEntry& entry = entries_[static_cast<std::size_t>(op.chunk) * m + op.mb];
      entry.mb = op.mb;
      entry.chunk = op.chunk;
      if (op.kind == OpKind::kForward) {
        entry.forward_index = i;
        entry.forward_end = ops_[i].end;
        entry.bytes = entry_bytes(op.chunk);
      } else if (op.kind == OpKind::kBackward) {
        entry.use_index = i;
        entry.use_start = ops_[i].start;
        if (!split_backward) entry.free_index = i;
      } else {
        entry.free_index = i;
      }
    }
    baseline_delta_.assign(ops_.size(), 0);
    for (int e = 0; e < static_cast<int>(entries_.size()); ++e) {
      const OffloadEntry& entry = entries_[e];
      baseline_delta_[entry.forward_index] += entry.bytes;
      baseline_delta_[entry.free_index] -= entry.bytes;
    }
    gaps_.resize(ops_.size() + 1);
    placements_.resize(entries_.size());
  }

  int stage() const { return stage_; }
  int num_ops() const { return static_cast<int>(ops_.size()); }
  const std::vector<TimedBaselineOp>& ops() const { return ops_; }
  const std::vector<OffloadEntry>& entries() const { return entries_; }
  const std::optional<Placement>& placement(int entry) const { return placements_[entry]; }
  // Entries in the order they were committed.
  const std::vector<int>& steps() const { return steps_; }

  double Start(int index) const { return ops_[index].start; }

  // The placement with the widest offload window for `entry` given what `resources` already
  // hold: the first D2H slot after its F, the release as soon as the D2H is done, and the
  // latest H2D slot that ends `reload_margin` before its B. nullopt when there is none, or when
  // the window would hold no op (the entry lives too briefly to save memory).
  std::optional<Placement> FindPlacement(int entry_index, const TransferResources& res) const {
    const OffloadEntry& entry = entries_[entry_index];
    if (entry.bytes <= 0) return std::nullopt;
    const double d2h = static_cast<double>(entry.bytes) / params_.d2h_bandwidth;
    const double h2d = static_cast<double>(entry.bytes) / params_.h2d_bandwidth;
    Placement p;
    if (!FindOffload(entry, d2h, res, &p)) return std::nullopt;
    p.release_time = p.offload_end;
    p.release_gap = std::max(FirstGapAtOrAfter(p.release_time), p.offload_gap);
    if (p.release_gap == p.offload_gap && p.release_time == p.offload_start) {
      p.release_rank = kRankOffload;  // zero-time copy: after its OFFLOAD (by seq)
    }
    if (p.release_gap >= entry.use_index) return std::nullopt;

    // RELOAD: the latest start in [offload end, deadline - h2d] that the simulator reproduces
    // (an op's start, or the end of an earlier RELOAD of this stage) with the link free.
    const double latest = entry.use_start - params_.reload_margin - h2d;
    auto op_it = std::upper_bound(ops_.begin(), ops_.begin() + entry.use_index, latest,
                                  [](double t, const TimedBaselineOp& op) { return t < op.start; });
    auto end_it = res.own_h2d_ends->upper_bound(latest);
    while (op_it != ops_.begin() || end_it != res.own_h2d_ends->begin()) {
      double t;
      if (end_it == res.own_h2d_ends->begin() ||
          (op_it != ops_.begin() && std::prev(op_it)->start >= *std::prev(end_it))) {
        t = (--op_it)->start;
      } else {
        t = *--end_it;
      }
      if (t < p.offload_end) return std::nullopt;
      const int gap = std::min(CutGapAfter(t), entry.use_index);
      if (gap <= p.release_gap) return std::nullopt;
      if (!IsFree(res.link_h2d, res.engine, t, t + h2d)) continue;
      p.reload_gap = gap;
      p.reload_start = t;
      p.reload_end = t + h2d;
      return p;
    }
    return std::nullopt;
  }

  // Books `p`'s transfers in `resources` and records its three ops.
  void Commit(int entry_index, const Placement& p, const TransferResources& res) {
    const OffloadEntry& entry = entries_[entry_index];
    Book(res.link_d2h, res.engine, p.offload_start, p.offload_end);
    if (p.offload_end > p.offload_start) res.d2h_ends->insert(p.offload_end);
    Insert(InsertedOp{Op{OpKind::kOffload, entry.mb, entry.chunk, -1}, OffloadKey(p),
                      entry_index});
    Insert(InsertedOp{Op{OpKind::kRelease, entry.mb, entry.chunk, -1}, ReleaseKey(p),
                      entry_index});
    Book(res.link_h2d, res.engine, p.reload_start, p.reload_end);
    if (p.reload_end > p.reload_start) res.own_h2d_ends->insert(p.reload_end);
    Insert(InsertedOp{Op{OpKind::kReload, entry.mb, entry.chunk, -1}, ReloadKey(p),
                      entry_index});
    next_seq_ += 3;
    placements_[entry_index] = p;
    steps_.push_back(entry_index);
  }

  // Keys the three ops of `p` get if committed next (ties among equal keys go last).
  ProgramKey OffloadKey(const Placement& p) const {
    return ProgramKey{p.offload_gap, false, p.offload_start, kRankOffload, next_seq_};
  }
  ProgramKey ReleaseKey(const Placement& p) const {
    return ProgramKey{p.release_gap, false, p.release_time, p.release_rank, next_seq_ + 1};
  }
  ProgramKey ReloadKey(const Placement& p) const {
    return ProgramKey{p.reload_gap, false, p.reload_start, kRankReload, next_seq_ + 2};
  }

  // True when the entry's device copy counts right after point `x` of the plan without
  // offloading it.
  bool ResidentAt(int entry_index, const ProgramKey& x) const {
    const OffloadEntry& entry = entries_[entry_index];
    return !(x < BaselineKey(entry.forward_index)) && x < BaselineKey(entry.free_index);
  }

  // True when committing `p` would take the entry off the device at point `x`.
  bool Covers(const Placement& p, const ProgramKey& x) const {
    return ReleaseKey(p) < x && x < ReloadKey(p);
  }

  // The device-memory peak of the program with every committed entry offloaded (program order:
  // +bytes at F and RELOAD, -bytes at RELEASE and at the op that frees the entry), and the
  // first point that reaches it.
  PeakPoint Peak() const {
    PeakPoint peak{0, BaselineKey(0)};
    std::int64_t bytes = 0;
    for (int j = 0; j <= num_ops(); ++j) {
      for (const InsertedOp& ins : gaps_[j]) {
        if (ins.entry < 0) continue;
        if (ins.op.kind == OpKind::kRelease) bytes -= entries_[ins.entry].bytes;
        if (ins.op.kind == OpKind::kReload) {
          bytes += entries_[ins.entry].bytes;
          if (bytes > peak.bytes) peak = PeakPoint{bytes, ins.key};
        }
      }
      if (j == num_ops()) break;
      bytes += baseline_delta_[j];
      if (bytes > peak.bytes) peak = PeakPoint{bytes, BaselineKey(j)};
    }
    return peak;
  }

  // The gap before the first baseline op that starts after `time`: where a BARRIER planned at
  // `time` goes (offload_barriers.h), and an OFFLOAD or RELOAD starting then.
  int CutGapAfter(double time) const {
    auto it = std::upper_bound(ops_.begin(), ops_.end(), time,
                               [](double t, const TimedBaselineOp& op) { return t < op.start; });
    return static_cast<int>(it - ops_.begin());
  }
  // The gap before the first baseline op that starts at or after `time`: where a RELEASE at
  // `time` goes.
  int FirstGapAtOrAfter(double time) const {
    auto it = std::lower_bound(ops_.begin(), ops_.end(), time,
                               [](const TimedBaselineOp& op, double t) { return op.start < t; });
    return static_cast<int>(it - ops_.begin());
  }

  // The final program: baseline ops with the committed entries' ops and `barriers` inserted in
  // key order.
  StageProgram Emit(const std::vector<InsertedOp>& barriers) const {
    std::vector<std::vector<const InsertedOp*>> extra(gaps_.size());
    for (const InsertedOp& barrier : barriers) extra[barrier.key.gap].push_back(&barrier);
    StageProgram program;
    program.stage = stage_;
    std::vector<const InsertedOp*> gap_ops;
    for (int j = 0; j <= num_ops(); ++j) {
      gap_ops.clear();
      for (const InsertedOp& ins : gaps_[j]) gap_ops.push_back(&ins);
      gap_ops.insert(gap_ops.end(), extra[j].begin(), extra[j].end());
      std::sort(gap_ops.begin(), gap_ops.end(),
                [](const InsertedOp* a, const InsertedOp* b) { return a->key < b->key; });
      for (const InsertedOp* ins : gap_ops) program.ops.push_back(ins->op);
      if (j < num_ops()) program.ops.push_back(ops_[j].op);
    }
    return program;
  }

 private:
  // The first OFFLOAD start after the entry's F that the simulator reproduces (see the file
  // comment) with [start, start + d2h) free; fills the offload fields of *p.
  bool FindOffload(const OffloadEntry& entry, double d2h, const TransferResources& res,
                   Placement* p) const {
    const int n = num_ops();
    for (int j = entry.forward_index + 1; j <= entry.use_index; ++j) {
      const double low = std::max(Start(j - 1), entry.forward_end);
      const double high = j < n ? Start(j) : low;
      if (low > high) continue;
      const auto try_at = [&](double t) {
        const int gap = CutGapAfter(t);
        if (gap > entry.use_index || !IsFree(res.link_d2h, res.engine, t, t + d2h)) return false;
        p->offload_gap = gap;
        p->offload_start = t;
        p->offload_end = t + d2h;
        return true;
      };
      if (try_at(low)) return true;
      for (auto it = res.d2h_ends->upper_bound(low); it != res.d2h_ends->end() && *it <= high;
           ++it) {
        if (try_at(*it)) return true;
      }
    }
    return false;
  }

  static bool IsFree(const SlotOccupancy* link, const SlotOccupancy* engine, double start,
                     double end) {
    return link->IsFree(start, end) && (engine == nullptr || engine->IsFree(start, end));
  }
  static void Book(SlotOccupancy* link, SlotOccupancy* engine, double start, double end) {
    link->Add(start, end);
    if (engine != nullptr) engine->Add(start, end);
  }
  void Insert(InsertedOp op) {
    std::vector<InsertedOp>& gap = gaps_[op.key.gap];
    auto it = std::upper_bound(gap.begin(), gap.end(), op,
                               [](const InsertedOp& a, const InsertedOp& b) {
                                 return a.key < b.key;
                               });
    gap.insert(it, std::move(op));
  }

  int stage_;
  std::vector<TimedBaselineOp> ops_;
  StagePlanParams params_;
  std::vector<OffloadEntry> entries_;              // index chunk * m + mb
  std::vector<std::int64_t> baseline_delta_;       // memory change of each baseline op
  std::vector<std::vector<InsertedOp>> gaps_;      // [gap], sorted by key
  std::vector<std::optional<Placement>> placements_;
  std::vector<int> steps_;
  std::int64_t next_seq_ = 0;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_STAGE_PLAN_H_
