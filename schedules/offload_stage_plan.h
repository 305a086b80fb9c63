// One stage's offload plan while it is being built: the stage's lowered program with the start
// times the simulator predicted for it, the stash entries it could offload, and the OFFLOAD /
// RELEASE / RELOAD (and BARRIER) ops placed so far. Header-only so the planner's pieces can be
// tested alone; pure computation, no I/O.
//
// Invariants (the planner and its tests rely on them; offload_planner.cc says why they make a
// plan keep to its timeline and collision-free in the simulator):
//  - A baseline op's time is its start, except a SEND/RECV's, which is its transfer's start
//    (the simulator only posts it when issued, simulate.h); the planner hands in programs
//    where these times never decrease along a stage (PostAtTransfers). The "issue time" of gap
//    j is the start of the last op before it that is not a SEND/RECV: what an op placed there
//    is issued at. Only such starts (and copy ends) are slots a transfer can start at.
//  - An inserted op lives in a "gap" j: after baseline op j-1 and before baseline op j. Within a
//    gap, inserted ops run in (planned time, rank, seq) order; ProgramKey encodes that order.
//  - Every inserted op's planned time t satisfies issue(j) <= t <= time(j), so issuing it never
//    delays baseline op j (an op never starts before the op ahead of it is issued, and a post
//    issued at t moves no transfer that starts at time(j) >= t). OFFLOAD and RELOAD go into the
//    last such gap (after every op at t, where a BARRIER guarding them also goes); RELEASE
//    into the first (memory is counted in program order, so the earlier the better).
//  - A transfer starts at a time the simulator reproduces: the issue time of its gap (for an
//    OFFLOAD, or the end of its F if later), the end of the stage's previous transfer in the
//    same direction (its copy engine frees up then), or, for an OFFLOAD, the end of another
//    stage's OFFLOAD on the same host link (the BARRIER of that hand-over sits right after the
//    other stage's RELEASE, which waits for that D2H). Durations are booked with the slower of
//    the solo and duplex bandwidths, so in the simulator a transfer may end earlier than booked
//    and one chained to it start earlier, but never later, and never outside the booked span.
//    A gated copy (GatedPlacement) runs where the gated timeline ran it; its RELEASE then holds
//    the op that waited for it there.
//  - RELEASE goes at the OFFLOAD's booked end; RELOAD no earlier than it and ends at least
//    `reload_margin` before its B starts. For one entry: F < OFFLOAD < RELEASE < RELOAD <= B.
//  - Peak() and ResidentEntries() answer from indexes kept up to date by every commit (a tree
//    of memory over the gaps; entries by F with the latest free/use per block), so planning
//    stays near O(entries log ops) instead of quadratic.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_STAGE_PLAN_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_STAGE_PLAN_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "pipeoffload/cost_model.h"
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
  int offload_search_gap = 0;  // the gap whose window offered offload_start (FindPlacement)
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
  SortedTimes* d2h_ends = nullptr;
  SortedTimes* own_h2d_ends = nullptr;
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
  // `ops` is the stage's lowered program, with simulated times. `entry_bytes(chunk, mode)`
  // gives an entry's size (mode kNone) and what a recomputed entry keeps from its F to its
  // RECOMPUTE* (its mode's retained block); `rebuild_bytes(chunk, mode)` what that RECOMPUTE*
  // allocates (CostModel::RebuildBytes). The block an OffloadEntry describes is what F leaves
  // on the device: the entry, or for a recomputed one its retained block, which lives from F
  // to the RECOMPUTE* (its use and its free) and may be offloaded like an entry. The block the
  // RECOMPUTE* rebuilds then stays until the op that frees it, part of the baseline: both
  // blocks are held while the RECOMPUTE* runs, as the simulator counts. A RECOMPUTE* that
  // allocates nothing (B reads the retained block in place) leaves the retained block in the
  // baseline from there on.
  // REQUIRES: the program is complete (F and B, and W when split, of every (mb, chunk) once, F
  // before B before W, a RECOMPUTE* at most once per entry between its F and B), start times
  // never decrease along it, and it holds no offload ops.
  template <typename BytesFn, typename RebuildFn>
  StagePlan(int stage, std::vector<TimedBaselineOp> ops, bool split_backward,
            const StagePlanParams& params, BytesFn entry_bytes, RebuildFn rebuild_bytes)
      : stage_(stage), ops_(std::move(ops)), params_(params) {
    const int m = params.num_microbatches;
    entries_.resize(static_cast<std::size_t>(m) * params.chunks_per_stage);
    // Per entry: its RECOMPUTE*'s index and mode, or -1 / kNone when it is kept whole.
    std::vector<int> recompute_index(entries_.size(), -1);
    std::vector<Recompute> recompute_mode(entries_.size(), Recompute::kNone);
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      const Op& op = ops_[i].op;
      if (!IsCompute(op.kind)) continue;
      const std::size_t e = static_cast<std::size_t>(op.chunk) * m + op.mb;
      OffloadEntry& entry = entries_[e];
      entry.mb = op.mb;
      entry.chunk = op.chunk;
      if (IsRecompute(op.kind)) {
        recompute_index[e] = i;
        recompute_mode[e] = op.kind == OpKind::kRecompute ? Recompute::kFull : Recompute::kLean;
      } else if (op.kind == OpKind::kForward) {
        entry.forward_index = i;
        entry.forward_end = ops_[i].end;
      } else if (op.kind == OpKind::kBackward) {
        entry.use_index = i;
        entry.use_start = ops_[i].start;
        if (!split_backward) entry.free_index = i;
      } else {
        entry.free_index = i;
      }
    }
    starts_.reserve(ops_.size());
    for (const TimedBaselineOp& op : ops_) starts_.push_back(op.start);
    baseline_delta_.assign(ops_.size(), 0);
    std::vector<std::pair<int, std::int64_t>> transient;  // (RECOMPUTE* index, retained)
    for (int e = 0; e < static_cast<int>(entries_.size()); ++e) {
      OffloadEntry& entry = entries_[e];
      const std::int64_t full = entry_bytes(entry.chunk, Recompute::kNone);
      entry.bytes = full;
      if (recompute_index[e] >= 0) {
        // The retained block is the entry's block from here on; the rebuilt one is baseline.
        const int at = recompute_index[e];
        entry.bytes = entry_bytes(entry.chunk, recompute_mode[e]);
        const std::int64_t rebuild = rebuild_bytes(entry.chunk, recompute_mode[e]);
        // Read in place, the retained block itself stays to the free.
        const std::int64_t for_backward = HeldForBackward(rebuild, entry.bytes);
        baseline_delta_[at] += for_backward;
        baseline_delta_[entry.free_index] -= for_backward;
        // While a rebuild runs, the rebuilt entry and the retained block are both held.
        if (rebuild > 0) transient.push_back({at, entry.bytes});
        entry.use_index = at;
        entry.use_start = ops_[at].start;
        entry.free_index = at;
      }
      baseline_delta_[entry.forward_index] += entry.bytes;
      baseline_delta_[entry.free_index] -= entry.bytes;
    }
    baseline_peak_ = baseline_delta_;
    for (const auto& [index, extra] : transient) baseline_peak_[index] += extra;
    gaps_.resize(ops_.size() + 1);
    gap_issue_.assign(ops_.size() + 1, 0.0);
    for (int j = 1; j <= static_cast<int>(ops_.size()); ++j) {
      const TimedBaselineOp& before = ops_[j - 1];
      gap_issue_[j] = IsP2P(before.op.kind) ? gap_issue_[j - 1] : before.start;
    }
    BuildTree();
    BuildResidentIndex();
    placements_.resize(entries_.size());
  }
  // Every RECOMPUTE* rebuilds the whole entry.
  template <typename BytesFn>
  StagePlan(int stage, std::vector<TimedBaselineOp> ops, bool split_backward,
            const StagePlanParams& params, BytesFn entry_bytes)
      : StagePlan(stage, std::move(ops), split_backward, params, entry_bytes,
                  [entry_bytes](int chunk, Recompute) {
                    return entry_bytes(chunk, Recompute::kNone);
                  }) {}

  int stage() const { return stage_; }
  int num_ops() const { return static_cast<int>(ops_.size()); }
  const std::vector<TimedBaselineOp>& ops() const { return ops_; }
  const std::vector<OffloadEntry>& entries() const { return entries_; }
  const std::optional<Placement>& placement(int entry) const { return placements_[entry]; }
  // Entries in the order they were committed.
  const std::vector<int>& steps() const { return steps_; }

  double Start(int index) const { return starts_[index]; }
  // The latest OFFLOAD start a search that chose gap `search_gap` passed over candidates before.
  double SearchHigh(int search_gap) const {
    return search_gap < num_ops() ? Start(search_gap) : std::numeric_limits<double>::infinity();
  }

  // The placement with the widest offload window for `entry` given what `resources` already
  // hold: the first D2H slot after its F, the release as soon as the D2H is done, and the
  // latest H2D slot that ends `reload_margin` before its B. nullopt when there is none, or when
  // the window would hold no op (the entry lives too briefly to save memory).
  std::optional<Placement> FindPlacement(int entry_index, const TransferResources& res) const {
    const OffloadEntry& entry = entries_[entry_index];
    if (entry.bytes <= 0) return std::nullopt;
    const double d2h = static_cast<double>(entry.bytes) / params_.d2h_bandwidth;
    Placement p;
    if (!FindOffload(entry, d2h, res, &p)) return std::nullopt;
    return CompletePlacement(entry_index, p, res);
  }

  // A placement for an entry whose D2H the stage's program already times: it runs over
  // [start, end) (the caller has booked it, BookOffload) and its RELEASE goes at `end`, before
  // the first op that starts at or after it (an op the RELEASE may be what delays: a gated
  // warm-up forward, warmup_gating.h). The RELOAD as in FindPlacement; nullopt without one.
  std::optional<Placement> GatedPlacement(int entry_index, double start, double end,
                                          const TransferResources& res) const {
    const OffloadEntry& entry = entries_[entry_index];
    if (entry.bytes <= 0) return std::nullopt;
    Placement p;
    p.offload_gap = std::max(CutGapAfter(start), entry.forward_index + 1);
    if (p.offload_gap > entry.use_index) return std::nullopt;
    p.offload_start = start;
    p.offload_end = end;
    return CompletePlacement(entry_index, p, res);
  }

  // Books a D2H of this stage over [start, end), as Commit does for the D2H of a placement.
  static void BookOffload(double start, double end, const TransferResources& res) {
    Book(res.link_d2h, res.engine, start, end);
    if (end > start) res.d2h_ends->insert(end);
  }

  // Books `p`'s transfers in `resources` (its D2H only unless `offload_booked`) and records its
  // three ops.
  void Commit(int entry_index, const Placement& p, const TransferResources& res,
              bool offload_booked = false) {
    const OffloadEntry& entry = entries_[entry_index];
    if (!offload_booked) BookOffload(p.offload_start, p.offload_end, res);
    Insert(InsertedOp{Op{OpKind::kOffload, entry.mb, entry.chunk, -1}, OffloadKey(p),
                      entry_index});
    Insert(InsertedOp{Op{OpKind::kRelease, entry.mb, entry.chunk, -1}, ReleaseKey(p),
                      entry_index});
    Book(res.link_h2d, res.engine, p.reload_start, p.reload_end);
    if (p.reload_end > p.reload_start) res.own_h2d_ends->insert(p.reload_end);
    Insert(InsertedOp{Op{OpKind::kReload, entry.mb, entry.chunk, -1}, ReloadKey(p),
                      entry_index});
    UpdateGaps({p.offload_gap, p.release_gap, p.reload_gap});
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
  // first point that reaches it. O(1): a tree over the gaps keeps it (UpdateGaps).
  PeakPoint Peak() const {
    const Segment& root = tree_[1];
    if (root.best <= 0) return PeakPoint{0, BaselineKey(0)};
    return PeakPoint{root.best, KeyAt(root)};
  }

  // Calls visit(entry) for every entry whose lifetime [forward_end, use_start] meets [a, b],
  // in no particular order.
  template <typename Visit>
  void ForEachAlive(double a, double b, Visit visit) const {
    const auto end = std::upper_bound(by_forward_.begin(), by_forward_.end(), b,
                                      [&](double t, int e) { return t < entries_[e].forward_end; });
    const int count = static_cast<int>(end - by_forward_.begin());
    // Blocks before the first whose running maximum reaches `a` hold no entry alive at `a`.
    const int from = static_cast<int>(
        std::lower_bound(block_use_running_.begin(), block_use_running_.end(), a) -
        block_use_running_.begin());
    for (int block = from; block * kBlock < count; ++block) {
      if (block_use_[block] < a) continue;
      for (int i = block * kBlock; i < std::min(count, (block + 1) * kBlock); ++i) {
        if (entries_[by_forward_[i]].use_start >= a) visit(by_forward_[i]);
      }
    }
  }

  // Entries resident at point `x` without offloading (ResidentAt), in no particular order.
  void ResidentEntries(const ProgramKey& x, std::vector<int>* out) const {
    out->clear();
    ForEachResident(x, [out](int e) { out->push_back(e); });
  }

  // Calls visit(entry) for each of them, in the order ResidentEntries lists them.
  template <typename Visit>
  void ForEachResident(const ProgramKey& x, Visit visit) const {
    ForEachResidentIn(x, [](int) { return true; }, visit);
  }

  // The entries are scanned in blocks (by F); an entry's block, and how many there are.
  int ResidentBlock(int entry) const { return block_of_[entry]; }
  int NumResidentBlocks() const { return static_cast<int>(block_free_.size()); }

  // ForEachResident over the blocks `wanted(block)` keeps: the others are not read.
  template <typename Wanted, typename Visit>
  void ForEachResidentIn(const ProgramKey& x, Wanted wanted, Visit visit) const {
    // Resident at x: F at or before baseline index a, freed after it (see ResidentAt).
    const int a = x.baseline ? x.gap : x.gap - 1;
    const auto end =
        std::upper_bound(by_forward_.begin(), by_forward_.end(), a,
                         [&](int pos, int e) { return pos < entries_[e].forward_index; });
    const int count = static_cast<int>(end - by_forward_.begin());
    const int from = static_cast<int>(
        std::upper_bound(block_free_running_.begin(), block_free_running_.end(), a) -
        block_free_running_.begin());
    for (int block = from; block * kBlock < count; ++block) {
      if (block_free_[block] <= a || !wanted(block)) continue;
      for (int i = block * kBlock; i < std::min(count, (block + 1) * kBlock); ++i) {
        if (free_by_forward_[i] > a) visit(by_forward_[i]);
      }
    }
  }

  // The gap before the first baseline op whose time is after `time`: where an OFFLOAD or
  // RELOAD starting then goes.
  int CutGapAfter(double time) const {
    return static_cast<int>(std::upper_bound(starts_.begin(), starts_.end(), time) -
                            starts_.begin());
  }
  // The gap before the first baseline op whose time is at or after `time`: where a RELEASE
  // at `time` goes, and a BARRIER planned at `time` (offload_barriers.h).
  int FirstGapAtOrAfter(double time) const {
    return static_cast<int>(std::lower_bound(starts_.begin(), starts_.end(), time) -
                            starts_.begin());
  }

  // The final program: baseline ops with the committed entries' ops and `barriers` inserted in
  // key order.
  StageProgram Emit(const std::vector<InsertedOp>& barriers) const {
    // The barriers by gap, in their given order within one (a vector per gap would cost an
    // allocation per op of the program).
    std::vector<const InsertedOp*> by_gap;
    by_gap.reserve(barriers.size());
    for (const InsertedOp& barrier : barriers) by_gap.push_back(&barrier);
    std::stable_sort(by_gap.begin(), by_gap.end(), [](const InsertedOp* a, const InsertedOp* b) {
      return a->key.gap < b->key.gap;
    });
    StageProgram program;
    program.stage = stage_;
    std::size_t inserted = barriers.size();
    for (const std::vector<InsertedOp>& gap : gaps_) inserted += gap.size();
    program.ops.reserve(ops_.size() + inserted);
    std::vector<const InsertedOp*> gap_ops;
    std::size_t next = 0;
    for (int j = 0; j <= num_ops(); ++j) {
      gap_ops.clear();
      for (const InsertedOp& ins : gaps_[j]) gap_ops.push_back(&ins);
      for (; next < by_gap.size() && by_gap[next]->key.gap == j; ++next) {
        gap_ops.push_back(by_gap[next]);
      }
      std::sort(gap_ops.begin(), gap_ops.end(),
                [](const InsertedOp* a, const InsertedOp* b) { return a->key < b->key; });
      for (const InsertedOp* ins : gap_ops) program.ops.push_back(ins->op);
      if (j < num_ops()) program.ops.push_back(ops_[j].op);
    }
    return program;
  }

 private:
  // Fills in the RELEASE and RELOAD of `p`, whose offload fields are set: the release as soon
  // as the D2H is done, and the latest H2D slot that ends `reload_margin` before the B.
  std::optional<Placement> CompletePlacement(int entry_index, Placement p,
                                             const TransferResources& res) const {
    const OffloadEntry& entry = entries_[entry_index];
    const double h2d = static_cast<double>(entry.bytes) / params_.h2d_bandwidth;
    p.release_time = p.offload_end;
    p.release_gap = std::max(FirstGapAtOrAfter(p.release_time), p.offload_gap);
    if (p.release_gap == p.offload_gap && p.release_time == p.offload_start) {
      p.release_rank = kRankOffload;  // zero-time copy: after its OFFLOAD (by seq)
    }
    if (p.release_gap >= entry.use_index) return std::nullopt;

    // RELOAD: the latest start in [offload end, deadline - h2d] that the simulator reproduces
    // (an op's start, or the end of an earlier RELOAD of this stage) with the link free.
    const double latest = entry.use_start - params_.reload_margin - h2d;
    const auto first = starts_.begin();
    auto op_it = std::upper_bound(first, first + entry.use_index, latest);
    auto end_it = res.own_h2d_ends->upper_bound(latest);
    while (op_it != first || end_it != res.own_h2d_ends->begin()) {
      double t;
      if (end_it == res.own_h2d_ends->begin() ||
          (op_it != first && *std::prev(op_it) >= *std::prev(end_it))) {
        // A SEND/RECV is no issue point: its time is its transfer's (file comment).
        --op_it;
        if (IsP2P(ops_[op_it - first].op.kind)) continue;
        t = *op_it;
      } else {
        t = *--end_it;
      }
      if (t < p.offload_end) return std::nullopt;
      const int gap = std::min(CutGapAfter(t), entry.use_index);
      if (gap <= p.release_gap) return std::nullopt;
      if (!IsFree(res.link_h2d, res.engine, t, t + h2d)) {
        // Every start after (earliest booked start it overlaps) - h2d overlaps that booking
        // too: skip those candidates at once.
        double bound = EarliestOverlap(res.link_h2d, res.engine, t, t + h2d) - h2d;
        if (std::isnan(bound) || bound >= t) continue;
        op_it = std::upper_bound(first, op_it, bound);
        end_it = res.own_h2d_ends->upper_bound(bound);  // candidates left are all <= t
        continue;
      }
      p.reload_gap = gap;
      p.reload_start = t;
      p.reload_end = t + h2d;
      return p;
    }
    return std::nullopt;
  }

  // The first OFFLOAD start after the entry's F that the simulator reproduces (see the file
  // comment) with [start, start + d2h) free; fills the offload fields of *p.
  bool FindOffload(const OffloadEntry& entry, double d2h, const TransferResources& res,
                   Placement* p) const {
    const int n = num_ops();
    // Every start before this collides with a booking (known from a failed try): skipped.
    double not_before = -std::numeric_limits<double>::infinity();
    int search_gap = 0;
    const auto try_at = [&](double t) {
      const int gap = CutGapAfter(t);
      if (gap > entry.use_index) return false;
      if (!IsFree(res.link_d2h, res.engine, t, t + d2h)) {
        const double end = LatestOverlapEnd(res.link_d2h, res.engine, t, t + d2h);
        if (!std::isnan(end)) not_before = std::max(not_before, end);
        return false;
      }
      p->offload_gap = gap;
      p->offload_search_gap = search_gap;
      p->offload_start = t;
      p->offload_end = t + d2h;
      return true;
    };
    for (int j = entry.forward_index + 1; j <= entry.use_index;) {
      const double low = std::max(gap_issue_[j], entry.forward_end);
      const double high = j < n ? Start(j) : low;
      if (high < not_before && j < n) {
        // Gaps whose latest start lies before not_before hold no candidate.
        const auto next = std::lower_bound(starts_.begin() + j + 1, starts_.end(), not_before);
        j = static_cast<int>(next - starts_.begin());
        continue;
      }
      if (low <= high) {
        search_gap = j;
        if (low >= not_before && try_at(low)) return true;
        // Ends in (low, high], from not_before on (try_at may raise it as it goes).
        for (auto it = not_before > low ? res.d2h_ends->lower_bound(not_before)
                                        : res.d2h_ends->upper_bound(low);
             it != res.d2h_ends->end() && *it <= high; ++it) {
          if (*it >= not_before && try_at(*it)) return true;
        }
      }
      ++j;
    }
    return false;
  }

  // The earliest start of a booking [start, end) overlaps on the link or the engine, and the
  // latest end; NaN when it overlaps none.
  static double EarliestOverlap(const SlotOccupancy* link, const SlotOccupancy* engine,
                                double start, double end) {
    double out = link->EarliestOverlapStart(start, end);
    if (engine != nullptr) {
      const double other = engine->EarliestOverlapStart(start, end);
      if (std::isnan(out) || other < out) out = other;
    }
    return out;
  }
  static double LatestOverlapEnd(const SlotOccupancy* link, const SlotOccupancy* engine,
                                 double start, double end) {
    double out = link->LatestOverlapEnd(start, end);
    if (engine != nullptr) {
      const double other = engine->LatestOverlapEnd(start, end);
      if (std::isnan(out) || other > out) out = other;
    }
    return out;
  }
  static bool IsFree(const SlotOccupancy* link, const SlotOccupancy* engine, double start,
                     double end) {
    return link->IsFree(start, end) && (engine == nullptr || engine->IsFree(start, end));
  }
  static void Book(SlotOccupancy* link, SlotOccupancy* engine, double start, double end) {
    link->Add(start, end);
    if (engine != nullptr) engine->Add(start, end);
  }
  // Adds `op` to its gap; the caller updates the tree (UpdateGaps).
  void Insert(InsertedOp op) {
    std::vector<InsertedOp>& gap = gaps_[op.key.gap];
    auto it = std::upper_bound(gap.begin(), gap.end(), op,
                               [](const InsertedOp& a, const InsertedOp& b) {
                                 return a.key < b.key;
                               });
    gap.insert(it, std::move(op));
  }

  // Memory over the program as a tree of segments, one per gap (its inserted ops, then its
  // baseline op): each node holds its segment's net change and its highest running total
  // (over non-empty prefixes) with the first point that reaches it, so the peak of the whole
  // program is the root's and a commit updates two leaves.
  // The point is held as (gap, place in the gap, -1 for its baseline op), not as its
  // ProgramKey: a node is then 24 bytes instead of 48, and the tree (two nodes per gap, 3 MB a
  // stage at p=64 m=512 v=4 as keys) is what every commit walks and every copy of a link
  // group's plan copies. A place stays right: an insert into gap j moves places in j only, and
  // updates leaf j and every node above it, the only ones that can hold a point of gap j.
  struct Segment {
    std::int64_t sum = 0;
    std::int64_t best = std::numeric_limits<std::int64_t>::min() / 4;
    int gap = 0;
    int place = -1;
  };
  ProgramKey KeyAt(const Segment& segment) const {
    return segment.place < 0 ? BaselineKey(segment.gap) : gaps_[segment.gap][segment.place].key;
  }
  static Segment Combine(const Segment& a, const Segment& b) {
    Segment out;
    out.sum = a.sum + b.sum;
    if (a.best >= a.sum + b.best) {
      out.best = a.best;
      out.gap = a.gap;
      out.place = a.place;
    } else {
      out.best = a.sum + b.best;
      out.gap = b.gap;
      out.place = b.place;
    }
    return out;
  }
  // Recomputes the leaves of `gaps` and every node above them, level by level: the three paths
  // of a commit share their upper levels, which a walk per leaf would recompute three times
  // (a node met twice in a row is skipped; any order of `gaps` gives the same tree).
  void UpdateGaps(std::array<int, 3> gaps) {
    std::array<int, 3> nodes{};
    for (std::size_t k = 0; k < gaps.size(); ++k) {
      if (k == 0 || gaps[k] != gaps[k - 1]) tree_[leaves_ + gaps[k]] = Leaf(gaps[k]);
      nodes[k] = leaves_ + gaps[k];
    }
    while (nodes[0] > 1) {
      for (std::size_t k = 0; k < nodes.size(); ++k) {
        nodes[k] /= 2;
        if (k > 0 && nodes[k] == nodes[k - 1]) continue;
        tree_[nodes[k]] = Combine(tree_[2 * nodes[k]], tree_[2 * nodes[k] + 1]);
      }
    }
  }
  // Gap j's segment: its inserted ops, then its baseline op.
  Segment Leaf(int j) const {
    Segment leaf;
    std::int64_t running = 0;
    const std::vector<InsertedOp>& gap = gaps_[j];
    for (int k = 0; k < static_cast<int>(gap.size()); ++k) {
      const InsertedOp& ins = gap[k];
      if (ins.entry < 0) continue;
      if (ins.op.kind == OpKind::kRelease) running -= entries_[ins.entry].bytes;
      if (ins.op.kind == OpKind::kReload) running += entries_[ins.entry].bytes;
      if (running > leaf.best) {
        leaf.best = running;
        leaf.gap = j;
        leaf.place = k;
      }
    }
    if (j < num_ops()) {
      if (running + baseline_peak_[j] > leaf.best) {
        leaf.best = running + baseline_peak_[j];
        leaf.gap = j;
        leaf.place = -1;
      }
      running += baseline_delta_[j];
    }
    leaf.sum = running;
    return leaf;
  }
  void BuildTree() {
    leaves_ = 1;
    while (leaves_ < num_ops() + 1) leaves_ *= 2;
    tree_.assign(static_cast<std::size_t>(2 * leaves_), Segment{});
    for (int j = 0; j <= num_ops(); ++j) {
      Segment& leaf = tree_[leaves_ + j];
      leaf.sum = j < num_ops() ? baseline_delta_[j] : 0;
      if (j < num_ops()) {
        leaf.best = baseline_peak_[j];
        leaf.gap = j;
        leaf.place = -1;
      }
    }
    for (int node = leaves_ - 1; node >= 1; --node) {
      tree_[node] = Combine(tree_[2 * node], tree_[2 * node + 1]);
    }
  }
  void BuildResidentIndex() {
    for (int e = 0; e < static_cast<int>(entries_.size()); ++e) by_forward_.push_back(e);
    std::sort(by_forward_.begin(), by_forward_.end(), [&](int a, int b) {
      return entries_[a].forward_index < entries_[b].forward_index;
    });
    for (const int e : by_forward_) free_by_forward_.push_back(entries_[e].free_index);
    const int count = static_cast<int>(by_forward_.size());
    block_of_.resize(entries_.size());
    for (int i = 0; i < count; ++i) block_of_[by_forward_[i]] = i / kBlock;
    for (int i = 0; i < count; i += kBlock) {
      int most = -1;
      double latest = -std::numeric_limits<double>::infinity();
      for (int k = i; k < std::min(count, i + kBlock); ++k) {
        most = std::max(most, entries_[by_forward_[k]].free_index);
        latest = std::max(latest, entries_[by_forward_[k]].use_start);
      }
      block_free_.push_back(most);
      block_use_.push_back(latest);
      block_free_running_.push_back(
          std::max(most, block_free_running_.empty() ? most : block_free_running_.back()));
      block_use_running_.push_back(
          std::max(latest, block_use_running_.empty() ? latest : block_use_running_.back()));
    }
  }
  static constexpr int kBlock = 32;

  int stage_;
  std::vector<TimedBaselineOp> ops_;
  // ops_'s start times alone: the binary searches over them (every placement search makes
  // several) touch a quarter of the cache lines.
  std::vector<double> starts_;
  StagePlanParams params_;
  std::vector<OffloadEntry> entries_;              // index chunk * m + mb
  std::vector<std::int64_t> baseline_delta_;       // memory change of each baseline op
  std::vector<std::int64_t> baseline_peak_;        // the most it adds while it runs (>= delta)
  std::vector<std::vector<InsertedOp>> gaps_;      // [gap], sorted by key
  std::vector<double> gap_issue_;                  // [gap]: when an op placed there is issued
  std::vector<Segment> tree_;                      // Peak(): 1-based heap over the gaps
  int leaves_ = 1;
  std::vector<int> by_forward_;                    // entries by F's index (ResidentEntries)
  // Their free indexes in that order: the resident scan reads these densely instead of one
  // entry record (spread over the stage's entries) per candidate.
  std::vector<int> free_by_forward_;
  std::vector<int> block_of_;                      // [entry]: its place in them / kBlock
  std::vector<int> block_free_;                    // per kBlock of them: the latest free index
  std::vector<double> block_use_;                  // ... and the latest use_start
  std::vector<int> block_free_running_;            // running maxima of the two over blocks
  std::vector<double> block_use_running_;
  std::vector<std::optional<Placement>> placements_;
  std::vector<int> steps_;
  std::int64_t next_seq_ = 0;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_STAGE_PLAN_H_
