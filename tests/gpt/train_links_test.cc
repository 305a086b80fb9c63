// MeasureLinks on hand-built measured steps: which copies count as overlapping on a host link
// (per direction, per link as the cost model groups stages) and the P2P spans per stage.
#include "examples/gpt/train_links.h"

#include <vector>

#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload::gpt {
namespace {

using testing::Timed;

// Two stages. Stage 0: two offloads overlapping by 1 s, a reload overlapping the first offload
// (other direction: no collision), sends of 1 and 3 s. Stage 1: an offload overlapping stage
// 0's first one, a receive of 2 s.
std::vector<IterationStats> TwoStages() {
  std::vector<IterationStats> stats(2);
  for (int d = 0; d < 2; ++d) {
    stats[d].stage = d;
    stats[d].start_time = 100.0;
  }
  stats[0].ops = {Timed(0, OpKind::kOffload, 100.0, 103.0),
                  Timed(0, OpKind::kOffload, 102.0, 104.0),
                  Timed(0, OpKind::kReload, 101.0, 102.5),
                  Timed(0, OpKind::kSendActivation, 100.0, 101.0, 1),
                  Timed(0, OpKind::kSendActivation, 104.0, 107.0, 1)};
  stats[1].ops = {Timed(1, OpKind::kOffload, 100.5, 101.5),
                  Timed(1, OpKind::kRecvActivation, 100.0, 102.0, 0)};
  return stats;
}

TEST_CASE("MeasureLinks counts same-direction overlaps per host link", "[train][links]") {
  CostModel own_links;
  own_links.host_link_group_size = 1;
  absl::StatusOr<LinkReport> report = MeasureLinks(own_links, TwoStages());
  REQUIRE(report.ok());
  CHECK(report->stages_per_link == 1);
  CHECK(report->collisions == 1);  // stage 0's two offloads; stage 1 has its own link

  CostModel paired;
  paired.host_link_group_size = 2;
  report = MeasureLinks(paired, TwoStages());
  REQUIRE(report.ok());
  CHECK(report->stages_per_link == 2);
  // One link: stage 1's offload overlaps stage 0's first offload too (its second starts after
  // it ended), so 2 pairs in D2H; the reload is alone in H2D.
  CHECK(report->collisions == 2);
}

TEST_CASE("MeasureLinks reports each stage's P2P spans", "[train][links]") {
  CostModel cost;
  absl::StatusOr<LinkReport> report = MeasureLinks(cost, TwoStages());
  REQUIRE(report.ok());
  REQUIRE(report->stages.size() == 2);
  const P2PTimes& zero = report->stages[0];
  CHECK(zero.sends == 2);
  CHECK(zero.receives == 0);
  CHECK(zero.send_seconds == Catch::Approx(4.0));
  CHECK(zero.median_send_seconds == Catch::Approx(3.0));  // the upper median of {1, 3}
  const P2PTimes& one = report->stages[1];
  CHECK(one.sends == 0);
  CHECK(one.receives == 1);
  CHECK(one.receive_seconds == Catch::Approx(2.0));
  CHECK(one.median_receive_seconds == Catch::Approx(2.0));
}

TEST_CASE("MeasureLinks refuses stages out of order", "[train][links]") {
  std::vector<IterationStats> stats = TwoStages();
  std::swap(stats[0], stats[1]);
  CHECK(MeasureLinks(CostModel{}, stats).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(MeasureLinks(CostModel{}, {}).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload::gpt
