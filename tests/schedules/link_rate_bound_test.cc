// The link-rate bound (schedules/link_rate_bound.h): exact on a pipeline small enough to time
// by hand, below every plan the offload planner makes over a grid of orders, policies and cost
// models, and binding where auto uses it (bench/schedule_bench's auto case).
#include "schedules/link_rate_bound.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "pipeoffload/compiler.h"
#include "schedules/offload_planner.h"
#include "schedules/offload_policy.h"
#include "tests/testing/catch.h"
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
  CHECK(LinkRateLeastPeak(order->posted, order->posted_times, cost, 9.0) ==
        cost.activation_bytes);
  // Later starts allowed: the link carries the first entry out before anything must start.
  CHECK(LinkRateLeastPeak(order->posted, order->posted_times, cost, 10.0) == 0);
}

TEST_CASE("link-rate bound: no offload plan the planner makes goes below it") {
  CostModel slow_link = UnitCostModel(1.0);
  slow_link.host_link_group_size = 1;
  CostModel shared = UnitCostModel(0.25);
  shared.shared_copy_engine = true;
  shared.host_link_group_size = 4;
  const CostModel costs[] = {UnitCostModel(0.25), UnitCostModel(0.5), slow_link, shared,
                             EstimateGptCostModel(GptShape{})};
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
  int cases = 0, binding = 0;
  for (const CostModel& cost : costs) {
    for (const Shape& shape : shapes) {
      for (const int p : {2, 4, 8}) {
        for (const int m : {8, 16}) {
          for (const bool split : {false, true}) {
            for (const OffloadPolicy policy :
                 {OffloadPolicy::kFull, OffloadPolicy::kHalf, OffloadPolicy::kSelective}) {
              const int g = shape.family != Family::kGroupInterleaved ? 0
                            : shape.largest_group                    ? p
                                                                     : (p + 1) / 2;
              PipelineSpec spec = MakeSpec(shape.family, p, m, shape.v, g, split, policy);
              spec.offload_fraction = policy == OffloadPolicy::kSelective ? 0.5 : 0.0;
              absl::StatusOr<LoweredOrder> order = LowerOrder(spec, cost);
              REQUIRE(order.ok());
              const std::int64_t bound = BoundOf(*order, cost);
              absl::StatusOr<Schedule> plan = CompileLowered(spec, cost, &*order);
              REQUIRE(plan.ok());
              INFO(FamilyName(shape.family) << " v=" << shape.v << " g=" << g << " p=" << p
                                            << " m=" << m << " split=" << split << " policy="
                                            << OffloadPolicyName(policy)
                                            << " k-bandwidth=" << cost.d2h_bandwidth);
              CHECK(bound <= MaxPeak(*plan->predictions));
              ++cases;
              binding += bound > cost.ActivationBytes(0, 0, p);
            }
          }
        }
      }
    }
  }
  CHECK(cases == 5 * 5 * 3 * 2 * 2 * 3);
  // It says more than "one entry" in a fair share of them (not a bound that cannot fail).
  CHECK(binding >= cases / 10);
}

TEST_CASE("link-rate bound: rules out the long warm-ups of schedule_bench's auto case") {
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
  // 1F1B's po-f plan fits eight entries, so the bound must not say otherwise.
  const CostModel one_chunk = RechunkedCost(base, 4, 1);
  absl::StatusOr<LoweredOrder> order =
      LowerOrder(MakeSpec(Family::k1F1B, 64, 512, 1, 0, false, OffloadPolicy::kFull), one_chunk);
  REQUIRE(order.ok());
  CHECK(BoundOf(*order, one_chunk) <= 8 * entry);
}

}  // namespace
}  // namespace pipeoffload::internal
