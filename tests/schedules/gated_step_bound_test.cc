// GatedStepLowerBound: at or below the step of every gated program GateForwards simulates, over
// a grid of orders, cost models and choices of forwards; and binding where it saves auto its
// two failed gated simulations (schedule_bench's v = 2 orders).
#include "schedules/gated_step_bound.h"

#include <algorithm>
#include <vector>

#include "pipeoffload/compiler.h"
#include "schedules/offload_planner.h"
#include "schedules/offload_policy.h"
#include "schedules/warmup_gating.h"
#include "tests/testing/catch.h"
#include "tests/testing/offload_grid_costs.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload::internal {
namespace {

using testing::MakeSpec;

// Per stage, the program indices of its forwards of chunks [0, chunks) before its first B:
// the warm-up forwards GatedWarmup gates (without its share and lifespan filters).
std::vector<std::vector<int>> WarmupForwards(const Schedule& lowered, int chunks) {
  std::vector<std::vector<int>> gated(lowered.stages.size());
  for (std::size_t s = 0; s < lowered.stages.size(); ++s) {
    const std::vector<Op>& ops = lowered.stages[s].ops;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      if (ops[i].kind == OpKind::kBackward) break;
      if (ops[i].kind == OpKind::kForward && ops[i].chunk < chunks) gated[s].push_back(i);
    }
  }
  return gated;
}

// The step of the gated program GateForwards simulated: its ops' latest end (the kept compute
// and P2P ops, and the gated copies; its RELEASEs and BARRIERs sit before compute ops).
double GatedStep(const Timeline& gated_times,
                 const std::vector<std::vector<GatedCopy>>& copies) {
  double step = 0.0;
  for (const std::vector<TimedOp>& stage : gated_times.stages) {
    for (const TimedOp& t : stage) step = std::max(step, t.end);
  }
  for (const std::vector<GatedCopy>& stage : copies) {
    for (const GatedCopy& copy : stage) step = std::max(step, copy.end);
  }
  return step;
}

TEST_CASE("gated step bound: at or below every gated program's simulated step") {
  struct Shape {
    Family family;
    int v;
  };
  const Shape shapes[] = {{Family::k1F1B, 1},          {Family::kInterleaved, 2},
                          {Family::kGroupInterleaved, 2}, {Family::kGroupInterleaved, 4},
                          {Family::kZbv, 2},            {Family::kDualPipeV, 2}};
  int simulated = 0, over_baseline = 0;
  for (const CostModel& cost : testing::OffloadGridCosts()) {
    for (const Shape& shape : shapes) {
      for (const int p : {2, 4, 8}) {
        for (const int m : {8, 16}) {
          for (const bool split : {false, true}) {
            if (shape.family == Family::kDualPipeV && (m < 2 * p || !split)) continue;
            if (shape.family == Family::kZbv && !split) continue;
            const PipelineSpec spec =
                MakeSpec(shape.family, p, m, shape.v, 0, split, OffloadPolicy::kFull);
            absl::StatusOr<LoweredOrder> order = LowerOrder(spec, cost);
            REQUIRE(order.ok());
            Predictions unbounded = order->baseline;
            unbounded.step_time = 1e300;  // GateForwards keeps every timeline that runs
            for (int chunks = 1; chunks <= shape.v; ++chunks) {
              const std::vector<std::vector<int>> gated = WarmupForwards(order->posted, chunks);
              Schedule gated_lowered;
              Timeline gated_times;
              std::vector<std::vector<GatedCopy>> copies;
              std::vector<GatedBarrier> barriers;
              if (!GateForwards(order->posted, cost, unbounded, gated, &gated_lowered,
                                &gated_times, &copies, &barriers)) {
                continue;  // it hangs: nothing to compare
              }
              const double bound = GatedStepLowerBound(order->posted, order->posted_times, cost,
                                                       gated);
              const double step = GatedStep(gated_times, copies);
              INFO(FamilyName(shape.family) << " v=" << shape.v << " p=" << p << " m=" << m
                                            << " split=" << split << " chunks gated=" << chunks
                                            << " d2h bandwidth=" << cost.d2h_bandwidth
                                            << " bound=" << bound << " step=" << step);
              CHECK(bound <= step * (1.0 + 1e-9));
              ++simulated;
              over_baseline += bound > order->baseline.step_time * (1.0 + kOverheadBudget);
            }
          }
        }
      }
    }
  }
  CHECK(simulated >= 300);
  // It rules out most of these choices (all warm-up forwards of a chunk or more at small p)
  // within the budget: not a bound that cannot fail.
  CHECK(over_baseline >= simulated / 2);
}

TEST_CASE("gated step bound: rules out gating schedule_bench's v = 2 interleaved warm-up") {
  // auto's v = 2 candidates at p = 64, m = 512 (unit costs re-chunked from v = 4: F = B = W = 2).
  const CostModel cost = RechunkedCost(UnitCostModel(0.25), 4, 2);
  for (const int chunks : {1, 2}) {
    absl::StatusOr<LoweredOrder> order =
        LowerOrder(MakeSpec(Family::kInterleaved, 64, 512, 2, 0, false, OffloadPolicy::kFull),
                   cost);
    REQUIRE(order.ok());
    const double bound =
        GatedStepLowerBound(order->posted, order->posted_times, cost,
                            WarmupForwards(order->posted, chunks));
    INFO("chunks gated " << chunks << ": bound " << bound << ", step without gating "
                         << order->baseline.step_time);
    CHECK(bound > order->baseline.step_time * (1.0 + kOverheadBudget));
  }
}

}  // namespace
}  // namespace pipeoffload::internal
