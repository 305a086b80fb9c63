// The bounds auto rules candidates out by: the link-rate bound (schedules/link_rate_bound.h)
// and the share bound (schedules/share_bound.h). Each is exact on a pipeline small enough to
// work out by hand, below every plan the offload planner makes over a grid of orders (loop and
// V placement), policies and cost models, and binding where auto uses it (bench/schedule_bench's
// auto case).
#include "schedules/link_rate_bound.h"
#include "schedules/share_bound.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "schedules/offload_planner.h"
#include "schedules/offload_policy.h"
#include "tests/testing/catch.h"
#include "tests/testing/compile_threads.h"
#include "tests/testing/offload_grid_costs.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload::internal {
namespace {

using testing::MakeSpec;

std::int64_t MaxPeak(const Predictions& predictions) {
  std::int64_t peak = 0;
  for (const StagePrediction& stage : predictions.stages) peak = std::max(peak, stage.peak_bytes);
  return peak;
}

// The bound for plans of `spec`'s order within the planner's overhead budget (what auto uses).
std::int64_t BoundOf(LoweredOrder& order, const CostModel& cost) {
  const double max_step = order.baseline.step_time * (1.0 + kOverheadBudget) + 1e-12;
  return LinkRateLeastPeak(order.posted, order.posted_times, cost, max_step);
}

TEST_CASE("link-rate bound: 1f1b p=2 m=2 by hand") {
  // Unit costs, unsplit: F = 1, B = 2. Stage 0 runs F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9], stage
  // 1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; step 9. With max_step 9 the latest starts are: stage
  // 0 F0 0 (its output feeds stage 1's F0, whose B0 must start by 2), F1 3; stage 1 F0 1, F1 4.
  // At T = 0 stage 0 holds one entry and the link has carried nothing: the bound is one entry.
  // Later points do not beat it: at T = 1 both hold one (2 entries less 1 / 0.75 carried, over
  // two stages: 1/3 of an entry each); at T = 3 stage 0 holds two and 4 were carried.
  const CostModel cost = UnitCostModel(0.25);
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::k1F1B, 2, 2, 1, 0, false, OffloadPolicy::kFull), cost);
  REQUIRE(order.ok());
  REQUIRE(order->baseline.step_time == 9.0);
  // Less what CountCollisions takes for rounding, which leaves it a byte short.
  CHECK(LinkRateLeastPeak(order->posted, order->posted_times, cost, 9.0) ==
        cost.activation_bytes - 1);
  // Where P2P crosses the host links the order's own sends collide there, and the bound claims
  // nothing.
  CostModel p2p_on_link = cost;
  p2p_on_link.p2p_shares_host_link = true;
  CHECK(LinkRateLeastPeak(order->posted, order->posted_times, p2p_on_link, 9.0) == 0);
  // Later starts allowed: the link carries the first entry out before anything must start.
  CHECK(LinkRateLeastPeak(order->posted, order->posted_times, cost, 10.0) == 0);
}

TEST_CASE("link-rate bound: zbv p=2 m=1 by hand, down the V and back") {
  // Unit costs, split: F = B = W = 1. Stage 0 holds virtual stages 0 and 3, stage 1 holds 1 and
  // 2. The one microbatch runs down the V and back up: stage 0 F0.0 [0,1]; stage 1 F0.0 [1,2]
  // and F0.1 [2,3] (the turn, handed over on the stage); stage 0 F0.1 [3,4] B0.1 [4,5]; stage 1
  // B0.1 [5,6] W0.1 [6,7] B0.0 [7,8]; stage 0 B0.0 [8,9] W0.0 [9,10]. Step 10, all one chain,
  // so with max_step 10 stage 0's F0.0 starts by 0, when it holds one entry and the link has
  // carried nothing. Without the edge back up the V (stage 1's F0.1 feeds stage 0's F0.1) it
  // could start at 2, by when the link carries 8/3 entries: a bound that lost it says 0.
  const CostModel cost = UnitCostModel(0.25);
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::kZbv, 2, 1, 2, 0, true, OffloadPolicy::kFull), cost);
  REQUIRE(order.ok());
  REQUIRE(order->baseline.step_time == 10.0);
  // Less what CountCollisions takes for rounding, as in the 1f1b case.
  CHECK(LinkRateLeastPeak(order->posted, order->posted_times, cost, 10.0) ==
        cost.activation_bytes - 1);
  CHECK(LinkRateLeastPeak(order->posted, order->posted_times, cost, 11.0) == 0);
}

TEST_CASE("share bound: 1f1b p=4 m=8 by hand") {
  // Stage 0 runs F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 .. B7: after its forwards it holds 1, 2,
  // 3, 4, 4, 4, 4, 4 entries (sum 26). Entries 0-4 have three forwards between their F and B,
  // entry 5 two, entry 6 one. Over all eight forwards, po-h (4 entries) takes off at most
  // 4 x 3: (26 - 12) / 8 = 1.75 entries; selective 0.25 (2 entries) 2 x 3: 20 / 8 = 2.5; po-f
  // every reach (18): 1. The middle runs and the other stages bind less.
  const CostModel cost = UnitCostModel(0.25);
  const std::int64_t entry = cost.activation_bytes;
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::k1F1B, 4, 8, 1, 0, false, OffloadPolicy::kFull), cost);
  REQUIRE(order.ok());
  PipelineSpec spec = order->lowered.spec;
  spec.offload = OffloadPolicy::kHalf;
  CHECK(ShareLeastPeak(order->posted, spec, cost) == entry * 7 / 4);
  spec.offload = OffloadPolicy::kSelective;
  spec.offload_fraction = 0.25;
  CHECK(ShareLeastPeak(order->posted, spec, cost) == entry * 5 / 2);
  spec.offload = OffloadPolicy::kFull;
  CHECK(ShareLeastPeak(order->posted, spec, cost) == entry);
  spec.offload = OffloadPolicy::kNone;
  CHECK(ShareLeastPeak(order->posted, spec, cost) == 0);
}

// How many plans the grid checked, and in how many each bound said more than one entry.
struct Tally {
  int cases = 0, link_binding = 0, share_binding = 0;
};

struct Policy {
  OffloadPolicy offload;
  double fraction;
  int chunks;
};
constexpr Policy kGridPolicies[] = {{OffloadPolicy::kFull, 0.0, 0},
                                    {OffloadPolicy::kHalf, 0.0, 0},
                                    {OffloadPolicy::kSelective, 0.5, 0},
                                    {OffloadPolicy::kSelective, 0.0, 1}};

// Plans `spec` under each of kGridPolicies and checks both bounds are at or below the plan's
// peak.
void CheckBoundsBelowPlans(PipelineSpec spec, const CostModel& cost, Tally* tally) {
  for (const Policy& policy : kGridPolicies) {
    spec.offload = policy.offload;
    spec.offload_fraction = policy.fraction;
    spec.offload_chunks = policy.chunks;
    absl::StatusOr<LoweredOrder> order = LowerOrder(spec, cost);
    REQUIRE(order.ok());
    const std::int64_t link = BoundOf(*order, cost);
    const std::int64_t share = ShareLeastPeak(order->posted, spec, cost);
    absl::StatusOr<Schedule> plan = CompileLowered(spec, cost, &*order);
    REQUIRE(plan.ok());
    INFO(FamilyName(spec.family) << " v=" << spec.chunks_per_stage << " g=" << spec.group_size
                                 << " p=" << spec.num_stages << " m=" << spec.num_microbatches
                                 << " split=" << spec.split_backward
                                 << " policy=" << OffloadPolicyName(policy.offload)
                                 << " fraction=" << policy.fraction << " chunks=" << policy.chunks
                                 << " d2h bandwidth=" << cost.d2h_bandwidth);
    CHECK(link <= MaxPeak(*plan->predictions));
    CHECK(share <= MaxPeak(*plan->predictions));
    // The share bound holds stage by stage too (what NeverAtMostTwoEntries relies on).
    const std::vector<std::int64_t> least = ShareLeastPeaks(order->posted, spec, cost);
    for (int s = 0; s < spec.num_stages; ++s) {
      INFO("stage " << s);
      CHECK(least[s] <= plan->predictions->stages[s].peak_bytes);
    }
    const std::int64_t entry = cost.ActivationBytes(0, 0, order->lowered.spec.stage_map());
    ++tally->cases;
    tally->link_binding += link > entry;
    tally->share_binding += share > entry;
  }
}

TEST_CASE("share bound: zbv p=2 m=4 by hand") {
  // Orders in vshape_families_test.cc; split, so W frees. Stage 0's forwards F0.0 F1.0 F2.0 F0.1
  // F1.1 F3.0 F2.1 F3.1 leave 1, 2, 3, 4, 4, 4, 4, 3 entries (sum 25); entries 0.0, 1.0, 2.0
  // reach five forwards, 3.0 two, chunk 1's none (its B follows at once). Stage 1's F0.0 F0.1
  // F1.0 F1.1 F2.0 F2.1 F3.0 F3.1 leave 1, 2, 3, 4, 4, 4, 4, 4 (sum 26); reaches 4 (0.0), 2
  // (0.1), 4 (1.0), 2 (1.1), 3 (2.0), 2 (2.1), 1 (3.0). po-f takes every reach: one entry on
  // both. po-h (four entries a stage): stage 1 over all eight forwards keeps (26 - 13) / 8 =
  // 13/8 entries. Selective 0.25 (two): stage 1 keeps (26 - 8) / 8 = 9/4, and stage 0 two over
  // its middle quarter (F0.1 F1.1: 8 less 2 x 2, over 2), so stage 1 binds.
  const CostModel cost = UnitCostModel(0.25);
  const std::int64_t entry = cost.activation_bytes;
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::kZbv, 2, 4, 2, 0, true, OffloadPolicy::kFull), cost);
  REQUIRE(order.ok());
  PipelineSpec spec = order->lowered.spec;
  CHECK(ShareLeastPeak(order->posted, spec, cost) == entry);
  spec.offload = OffloadPolicy::kHalf;
  CHECK(ShareLeastPeak(order->posted, spec, cost) == entry * 13 / 8);
  spec.offload = OffloadPolicy::kSelective;
  spec.offload_fraction = 0.25;
  CHECK(ShareLeastPeak(order->posted, spec, cost) == entry * 9 / 4);
}

TEST_CASE("share bound memo: auto's ask and the planner's are one computation per policy") {
  // On two threads the planner asks the share bound of po-h (NeverAtMostTwoEntries) through the
  // order's memo; auto's ask of the same share then finds it there, and each other policy is
  // computed once, however often asked, with exactly ShareLeastPeaks' values.
  const testing::ScopedCompileThreads two_threads("2");
  const CostModel cost = UnitCostModel(0.25);
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::kZbv, 2, 4, 2, 0, true, OffloadPolicy::kHalf), cost);
  REQUIRE(order.ok());
  const PipelineSpec half = order->lowered.spec;
  REQUIRE(CompileLowered(half, cost, &*order).ok());
  ShareBoundMemo& memo = order->share_bounds;
  CHECK(memo.computed() == 1);
  CHECK(memo.PerStage(order->posted, half, cost) == ShareLeastPeaks(order->posted, half, cost));
  CHECK(memo.Largest(order->posted, half, cost) == ShareLeastPeak(order->posted, half, cost));
  CHECK(memo.computed() == 1);
  // Selective by fraction and by chunks: distinct policies, each computed once.
  PipelineSpec quarter = half;
  quarter.offload = OffloadPolicy::kSelective;
  quarter.offload_fraction = 0.25;
  PipelineSpec first_chunk = quarter;
  first_chunk.offload_fraction = 0.0;
  first_chunk.offload_chunks = 1;
  for (int round = 0; round < 2; ++round) {
    for (const PipelineSpec& spec : {quarter, first_chunk, half}) {
      INFO("round " << round << ", " << OffloadPolicyName(spec.offload) << " fraction "
                    << spec.offload_fraction << " chunks " << spec.offload_chunks);
      CHECK(memo.PerStage(order->posted, spec, cost) ==
            ShareLeastPeaks(order->posted, spec, cost));
    }
    CHECK(memo.computed() == 3);
  }
  REQUIRE(CompileLowered(quarter, cost, &*order).ok());
  CHECK(memo.computed() == 3);
}

TEST_CASE("offload bounds: no offload plan the planner makes goes below them") {
  struct Shape {
    Family family;
    int v;
    bool largest_group;  // group-interleaved: g = p, else ceil(p/2); others: the default
  };
  const Shape shapes[] = {{Family::k1F1B, 1, false},
                          {Family::kInterleaved, 2, false},
                          {Family::kInterleaved, 4, false},
                          {Family::kGroupInterleaved, 2, false},
                          {Family::kGroupInterleaved, 4, true}};
  Tally tally;
  for (const CostModel& cost : testing::OffloadGridCosts()) {
    for (const Shape& shape : shapes) {
      for (const int p : {2, 4, 8}) {
        for (const int m : {8, 16}) {
          for (const bool split : {false, true}) {
            const int g = shape.family != Family::kGroupInterleaved ? 0
                          : shape.largest_group                    ? p
                                                                   : (p + 1) / 2;
            CheckBoundsBelowPlans(MakeSpec(shape.family, p, m, shape.v, g, split), cost,
                                  &tally);
          }
        }
      }
    }
  }
  CHECK(tally.cases == 6 * 5 * 3 * 2 * 2 * 4);
  // Each says more than "one entry" in a fair share of them (not a bound that cannot fail).
  CHECK(tally.link_binding >= tally.cases / 10);
  CHECK(tally.share_binding >= tally.cases / 10);
}

TEST_CASE("offload bounds: V placement (zbv, dualpipev) plans do not go below them either") {
  // Stage d holds virtual stages d and 2p - 1 - d: its two chunks' entries live on one device,
  // and the turn (virtual stages p - 1 and p, both on stage p - 1) hands over without a message.
  Tally tally;
  for (const CostModel& cost : testing::OffloadGridCosts()) {
    for (const Family family : {Family::kZbv, Family::kDualPipeV}) {
      for (const int p : {2, 4, 8}) {
        for (const int m : {8, 16}) {
          if (family == Family::kDualPipeV && m < 2 * p) continue;  // torch's own limit
          CheckBoundsBelowPlans(MakeSpec(family, p, m, 2, 0, true), cost, &tally);
        }
      }
    }
  }
  CHECK(tally.cases == 6 * (6 + 5) * 4);
  CHECK(tally.link_binding >= tally.cases / 10);
  CHECK(tally.share_binding >= tally.cases / 10);
}

TEST_CASE("share bound per stage: a stage of small entries keeps more than two of them") {
  // 1f1b p=4 m=8 as in the hand case above, with stage 3's entries four times the others'. Under
  // selective 0.25 stage 0 keeps at least 5/2 of its entries (the hand case), more than two;
  // stage 3 holds one entry at a time, four units. Against the largest entry of all (four
  // units) no stage's bound exceeds two of it, so only the per-stage test sees that no plan
  // keeps every stage at two of its own entries.
  CostModel cost = UnitCostModel(0.25);
  const std::int64_t entry = cost.activation_bytes;
  cost.activation_bytes_per_virtual_stage = {entry, entry, entry, 4 * entry};
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::k1F1B, 4, 8, 1, 0, false, OffloadPolicy::kFull), cost);
  REQUIRE(order.ok());
  PipelineSpec spec = order->lowered.spec;
  spec.offload = OffloadPolicy::kSelective;
  spec.offload_fraction = 0.25;
  const std::vector<std::int64_t> least = ShareLeastPeaks(order->posted, spec, cost);
  REQUIRE(least.size() == 4);
  CHECK(least[0] == entry * 5 / 2);
  CHECK(least[3] == 4 * entry);
  CHECK(ShareLeastPeak(order->posted, spec, cost) < 2 * 4 * entry);
  CHECK(NeverAtMostTwoEntries(order->posted, cost, least));
  // po-f can take every entry off between its F and B: one entry of each stage remains.
  spec.offload = OffloadPolicy::kFull;
  CHECK(!NeverAtMostTwoEntries(order->posted, cost, ShareLeastPeaks(order->posted, spec, cost)));
}

TEST_CASE("offload bounds: rule out what auto compiled in vain in schedule_bench's auto case") {
  // p=64 m=512, unit costs, k = 0.25, chunks priced as auto prices them (RechunkedCost of v=4):
  // with eight entries of budget, auto compiled these orders' po-f plans only to learn that
  // their peaks (82-114 entries) exceed it; the bound rules them out before planning.
  const CostModel base = UnitCostModel(0.25);
  const std::int64_t entry = base.activation_bytes;
  for (const int v : {3, 4}) {
    const CostModel cost = RechunkedCost(base, 4, v);
    for (const Family family : {Family::kInterleaved, Family::kGroupInterleaved}) {
      absl::StatusOr<LoweredOrder> order =
          LowerOrder(MakeSpec(family, 64, 512, v, family == Family::kInterleaved ? 0 : 64, false,
                              OffloadPolicy::kFull),
                     cost);
      REQUIRE(order.ok());
      INFO(FamilyName(family) << " v=" << v);
      CHECK(BoundOf(*order, cost) > 8 * entry);
    }
  }
  // 1F1B's po-f plan fits eight entries, so the bound must not say otherwise. Its po-h and
  // selective 0.75 plans peak at 132 and 76 entries: the share bound rules them out.
  const CostModel one_chunk = RechunkedCost(base, 4, 1);
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::k1F1B, 64, 512, 1, 0, false, OffloadPolicy::kFull), one_chunk);
  REQUIRE(order.ok());
  CHECK(BoundOf(*order, one_chunk) <= 8 * entry);
  PipelineSpec spec = order->lowered.spec;
  CHECK(ShareLeastPeak(order->posted, spec, one_chunk) <= 8 * entry);
  spec.offload = OffloadPolicy::kHalf;
  CHECK(ShareLeastPeak(order->posted, spec, one_chunk) > 8 * entry);
  spec.offload = OffloadPolicy::kSelective;
  spec.offload_fraction = 0.75;
  CHECK(ShareLeastPeak(order->posted, spec, one_chunk) > 8 * entry);
}

}  // namespace
}  // namespace pipeoffload::internal
