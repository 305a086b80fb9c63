// Which stash entries a link group offloads (offload_planner.cc, step 2), and what the plan
// carries against what the policy asked (the shortfall warning). Pure computation on the
// planner's StagePlans; no I/O.
//
// Invariants: a LinkGroupPlan's link timelines (d2h, h2d, engines, *_ends) hold exactly the
// transfers committed through it (plus P2P booked before any choice, when P2P shares the link);
// budget[m] is member m's share less the bytes committed for it; a cached placement is what
// StagePlan::FindPlacement would answer now (Invalidate keeps that), and every cached answer
// is registered in its PlacementCache wherever a commit could make it stale.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_CHOICE_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_CHOICE_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "schedules/cover_index.h"
#include "schedules/offload_stage_plan.h"
#include "schedules/slot_occupancy.h"

namespace pipeoffload::internal {

// One member's remembered FindPlacement answers (LinkGroupPlan::Find), indexed by the instants
// at which a commit can make each one stale (LinkGroupPlan::Invalidate says which): a remembered
// placement only by a copy that meets its own copies, its offload search (from the entry's F to
// the start that bounded the search) or its reload's reach (from its start to the B); a
// remembered "none" by a copy end in the entry's lifetime. Why: a commit then looks at the few
// entries registered where its two copies run, instead of every entry alive there (about 500
// per commit at p=64 m=512 v=4, of which about one goes stale; issue 15).
// Time is cut into buckets (about one per entry, over [0, the latest B]; later instants share
// the last one); an entry is registered in every bucket its intervals meet, and a registration
// outlives a Reset until a scan drops it (each carries the generation of its entry's answer).
// The remembered placements of the entries not closed (Close) are also in a CoverIndex, and
// each block of StagePlan::ForEachResidentIn counts its entries neither remembered nor closed.
class PlacementCache {
 public:
  explicit PlacementCache(const StagePlan& plan)
      : cover_(plan.num_ops() + 1, static_cast<int>(plan.entries().size())) {
    const auto& entries = plan.entries();
    known_.resize(entries.size());
    remembered_.assign(entries.size(), 0);
    closed_.assign(entries.size(), 0);
    block_of_.resize(entries.size());
    unsettled_.assign(static_cast<std::size_t>(plan.NumResidentBlocks()), 0);
    for (int e = 0; e < static_cast<int>(entries.size()); ++e) {
      block_of_[e] = plan.ResidentBlock(e);
      ++unsettled_[block_of_[e]];
    }
    generation_.assign(entries.size(), 0);
    seen_.assign(entries.size(), 0);
    double horizon = 0.0;
    for (const OffloadEntry& entry : entries) horizon = std::max(horizon, entry.use_start);
    buckets_.resize(std::max<std::size_t>(1, entries.size()));
    scale_ = horizon > 0.0 && std::isfinite(horizon)
                 ? static_cast<double>(buckets_.size()) / horizon
                 : 0.0;
  }

  const std::optional<std::optional<Placement>>& Get(int entry) const { return known_[entry]; }
  // Get(entry).has_value(), from a dense array: CoverPoint asks it of every resident entry.
  bool Remembers(int entry) const { return remembered_[entry] != 0; }

  // `rank`: the entry's place in the member's order (CoverIndex's tie-break).
  void Put(const StagePlan& plan, int entry, int rank, const std::optional<Placement>& p) {
    if (!remembered_[entry] && !closed_[entry]) --unsettled_[block_of_[entry]];
    known_[entry] = p;
    remembered_[entry] = 1;
    const OffloadEntry& e = plan.entries()[entry];
    if (!p) {
      Register(entry, e.forward_end, e.use_start);
      return;
    }
    Register(entry, std::min(e.forward_end, p->offload_start),
             std::max(p->offload_end, plan.SearchHigh(p->offload_search_gap)));
    Register(entry, p->reload_start, std::max(p->reload_end, e.use_start));
    cover_.Put(entry, rank, *p);
  }

  void Reset(int entry) {
    if (remembered_[entry] && !closed_[entry]) ++unsettled_[block_of_[entry]];
    known_[entry].reset();
    remembered_[entry] = 0;
    ++generation_[entry];
    cover_.Drop(entry);
  }

  // The entry is no choice any more, for good (committed, not a candidate, or over its
  // member's budget, which only shrinks): CoverIndex forgets it; its answer stays remembered.
  void Close(int entry) {
    cover_.Drop(entry);
    if (closed_[entry]) return;
    closed_[entry] = 1;
    if (!remembered_[entry]) --unsettled_[block_of_[entry]];
  }
  bool Closed(int entry) const { return closed_[entry] != 0; }
  // True when block `block` of StagePlan::ForEachResidentIn holds an entry neither closed nor
  // remembered: only there can CoverPoint find one to ask FindPlacement of.
  bool Unsettled(int block) const { return unsettled_[block] > 0; }

  // Of the remembered placements not closed, the one that covers `at` (StagePlan::Covers) and
  // reloads last, equal ones the lowest rank; -1 when none does (CoverIndex).
  int LatestCovering(const ProgramKey& at) const { return cover_.LatestCovering(at); }

  // Starts a new round of ForEachRegistered: each entry is visited at most once per round.
  void NewRound() { ++round_; }

  // Calls visit(entry) for each remembered entry registered in a bucket that [a, b] meets and
  // not yet visited this round (a superset of those whose intervals meet [a, b]).
  template <typename Visit>
  void ForEachRegistered(double a, double b, Visit visit) {
    for (std::size_t k = Bucket(a), last = Bucket(b); k <= last; ++k) {
      std::vector<Registration>& bucket = buckets_[k];
      for (std::size_t i = 0; i < bucket.size();) {
        const Registration r = bucket[i];
        if (r.generation != generation_[r.entry] || !known_[r.entry]) {
          bucket[i] = bucket.back();  // a forgotten answer: drop its registration
          bucket.pop_back();
          continue;
        }
        ++i;
        if (seen_[r.entry] == round_) continue;
        seen_[r.entry] = round_;
        visit(r.entry);
      }
    }
  }

 private:
  struct Registration {
    int entry;
    std::uint32_t generation;
  };
  // Monotone in t (NaN and negatives go to the first bucket), so two closed intervals that
  // share an instant share a bucket.
  std::size_t Bucket(double t) const {
    const double x = t * scale_;
    if (!(x > 0.0)) return 0;
    const std::size_t last = buckets_.size() - 1;
    return x >= static_cast<double>(last) ? last : static_cast<std::size_t>(x);
  }
  void Register(int entry, double a, double b) {
    for (std::size_t k = Bucket(a), last = Bucket(b); k <= last; ++k) {
      buckets_[k].push_back({entry, generation_[entry]});
    }
  }

  std::vector<std::optional<std::optional<Placement>>> known_;  // [entry]
  std::vector<char> remembered_;                                // [entry]: known_ has a value
  std::vector<char> closed_;                                    // [entry]: Close'd
  std::vector<int> block_of_;                                   // [entry]: ResidentBlock
  std::vector<int> unsettled_;  // [block]: its entries neither remembered nor closed
  std::vector<std::uint32_t> generation_;                       // [entry]: Resets so far
  std::vector<std::uint32_t> seen_;                             // [entry]: its last round
  std::uint32_t round_ = 0;
  std::vector<std::vector<Registration>> buckets_;
  double scale_ = 0.0;  // buckets per time unit
  CoverIndex cover_;    // the remembered placements, for CoverPoint
};

// One link group being planned: its stages, their link timelines and copy engines, and what
// each stage may still offload.
struct LinkGroupPlan {
  std::vector<StagePlan> plans;
  SlotOccupancy d2h, h2d;             // whole group, incl. P2P when it shares the link
  SlotOccupancy p2p_d2h, p2p_h2d;     // P2P alone: what an entry would face by itself
  SortedTimes d2h_ends;               // ends of the group's OFFLOADs (offload_stage_plan.h)
  std::vector<SlotOccupancy> engines;               // per member, when the engine is shared
  std::vector<SortedTimes> h2d_ends;                // per member: ends of its RELOADs
  std::vector<std::vector<int>> order;      // per member: candidates, longest-lived first
  std::vector<double> budget;               // per member: bytes it may still offload
  std::vector<std::vector<int>> rank;       // per member/entry: place in `order`, or -1
  // Per member/entry: its bytes while it is a candidate (rank >= 0) not yet committed, else -1.
  // Why: choosing an entry scans the ~500 resident at a stage's peak per commit (p=64 m=512
  // v=4), most of them committed already; their rank, placement and entry are three scattered
  // reads of large records, this one a read of a few kilobytes that stay in cache.
  std::vector<std::vector<std::int64_t>> open;
  std::vector<int> scratch;
  bool shared_engine = false;

  TransferResources Resources(int member) {
    return TransferResources{&d2h, &h2d, shared_engine ? &engines[member] : nullptr, &d2h_ends,
                             &h2d_ends[member]};
  }
  bool Affordable(int member, int entry) const {
    return static_cast<double>(plans[member].entries()[entry].bytes) <= budget[member];
  }
  // True when `entry` is a candidate of `member` (rank >= 0), not committed, and Affordable:
  // what the choice asks of every entry it scans, from one dense array (`open`).
  bool Open(int member, int entry) const {
    const std::int64_t bytes = open[member][entry];
    return bytes >= 0 && static_cast<double>(bytes) <= budget[member];
  }
  void Commit(int member, int entry, const Placement& p, bool offload_booked = false) {
    plans[member].Commit(entry, p, Resources(member), offload_booked);
    budget[member] -= static_cast<double>(plans[member].entries()[entry].bytes);
    open[member][entry] = -1;
    caches[member].Close(entry);
    Invalidate(member, p);
  }

  // FindPlacement, remembered per entry until a commit could change its answer: new bookings
  // only take slots away, so a remembered placement stays the answer while its own slots stay
  // free and no new candidate start (the end of a new D2H, or of a new RELOAD of its stage)
  // falls where the search would have met it first; a remembered "none" stays none unless a
  // new candidate falls inside the entry's lifetime. Planning calls FindPlacement for every
  // entry resident at the peak, once per entry it offloads: without this, O(entries^2).
  // The answer is the cache's own: valid until the next Commit, which may forget it (a caller
  // that commits it holds a copy).
  const std::optional<Placement>& Find(int member, int entry) {
    PlacementCache& cache = caches[member];
    if (const auto& known = cache.Get(entry)) return *known;
    cache.Put(plans[member], entry, rank[member][entry],
              plans[member].FindPlacement(entry, Resources(member)));
    return *cache.Get(entry);
  }
  // Forgets the remembered placements that committing `done` for member `committer` may have
  // changed.
  void Invalidate(int committer, const Placement& done);

  std::vector<PlacementCache> caches;  // [member]
  std::vector<std::vector<char>> fixed;  // [member][entry]: a gated copy (CommitGated)
};

// Per-stage outcome, for the warnings and the strict check.
struct StageOutcome {
  std::int64_t total_bytes = 0;
  std::int64_t eligible_bytes = 0;
  std::int64_t planned_bytes = 0;
  double requested_bytes = 0.0;   // min(policy's ask, eligible)
  bool short_of_request = false;  // the links could not carry an eligible entry the ask covers
  double d2h_demand = 0.0;        // conservative link time the request needs, per direction
  double h2d_demand = 0.0;
};

// Everything PlanOffload decided.
struct PipelinePlan {
  bool ok = true;  // false when a gated entry found no RELOAD (MakePlan)
  std::vector<LinkGroupPlan> groups;
  std::vector<std::vector<InsertedOp>> fixed_barriers;  // per stage: the gated program's
  std::vector<int> group_of;   // per stage
  std::vector<int> member_of;  // per stage
  std::vector<StageOutcome> outcomes;  // per stage
  std::vector<double> p2p_d2h_busy, p2p_h2d_busy;  // per group
};

// For each member of `group` (whose plans are built): its candidates (longest-lived first),
// and its share of the volume (`share` times what the policy asks), into group and outcomes.
void PrepareChoices(const PipelineSpec& spec, double share, LinkGroupPlan& group,
                    std::vector<StageOutcome>& outcomes);

// Chooses what the group offloads (offload_planner.cc, step 2): lower each stage's peak one
// entry at a time, taking turns, until no entry (within the stage's share) can lower it
// further; then fill the shares with the rest, longest-lived first. A group of two or more
// stages also tries the same after packing the D2Hs of the entries resident at each member's
// peak back to back on the shared direction, and keeps that plan where its largest peak (over
// the group's stages) is lower. A group of one stage plans as it did before packing.
void ChooseEntries(LinkGroupPlan& group);

// What `group` planned against what it was asked, into `outcomes`. `bandwidths` gives the
// booked (slowest) transfer rates.
void Summarize(LinkGroupPlan& group, const StagePlanParams& bandwidths,
               std::vector<StageOutcome>& outcomes);

// The warning for a plan that carries less than the policy asks, with requested and planned
// shares, the busiest link and the slowdowns; "" when it carries it all. Reads the plan's
// outcomes, group_of and P2P busy times only (not its groups, which may be freed).
std::string ShortfallWarning(const PipelineSpec& spec, const CostModel& cost,
                             const PipelinePlan& plan, double step_time, double base_step_time);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_CHOICE_H_
