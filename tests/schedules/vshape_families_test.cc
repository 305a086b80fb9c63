// The V-placed families, zbv and dualpipev (schedules/zbv.cc, dualpipev.cc): exact orders at
// p = 2 and 4 with m = 2p against torch's generators, the V mapping itself, and what ResolveSpec
// says about V specs it cannot build.
//
// The expected rows were worked out from torch.distributed.pipelining's
// ScheduleZBVZeroBubble._calculate_single_rank_operations and
// ScheduleDualPipeV._calculate_single_rank_operations (torch 2.9-2.11), phase by phase, and
// written in our notation: torch's stage index s is our chunk 0 when s < p and chunk 1 when
// s >= p (V placement), torch's I is our B, torch's full B is our B then W, and
// OVERLAP_F_B(F x, B y) is F x, B y, W y.
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/validate.h"
#include "schedules/families.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using ::pipeoffload::testing::MakeSpec;

std::vector<std::string> Rows(Family family, int p, int m) {
  absl::StatusOr<Schedule> order = BuildComputeOrder(MakeSpec(family, p, m, 2), CostModel{});
  INFO(order.status().ToString());
  REQUIRE(order.ok());
  CHECK(order->spec.placement == Placement::kV);
  CHECK(order->spec.split_backward);
  std::vector<std::string> rows;
  for (const StageProgram& program : order->stages) {
    std::string row;
    for (const Op& op : program.ops) row += (row.empty() ? "" : " ") + OpToString(op);
    rows.push_back(row);
  }
  return rows;
}

TEST_CASE("V placement: chunk 0 of stage d is virtual stage d, chunk 1 is 2p - 1 - d",
          "[vshape]") {
  const VirtualStageMap v{Placement::kV, 4, 2};
  const int expected_stage[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int l = 0; l < 8; ++l) {
    INFO("virtual stage " << l);
    CHECK(v.stage_of(l) == expected_stage[l]);
    CHECK(v.chunk_of(l) == (l < 4 ? 0 : 1));
    CHECK(v.virtual_stage(v.stage_of(l), v.chunk_of(l)) == l);
  }
  const VirtualStageMap loop{Placement::kLoop, 4, 2};
  CHECK(loop.virtual_stage(1, 1) == 5);
  CHECK(loop.stage_of(5) == 1);
  CHECK(loop.chunk_of(5) == 1);
}

// ZBV, p = 2 (torch's 4 stages), m = 4 (padded count max(m, 2p - 1) = 4, nothing dropped).
// Stage 0 (virtual 0 and 3): warm-up 1 is 2(p - 0) - 1 = 3 F0; warm-up 2 none; warm-up 3 is
// p - 0 = 2 rounds of F1 B1 W1; steady rounds F0 B0 W0 F1 B1 W1 while F0 has microbatches left
// (one with F3.0) or chunk 1 trails (two more without F0); cool-down p - 0 = 2 rounds of B0 W0.
// Stage 1 (virtual 1 and 2): warm-up 1 is 1 F0; warm-up 2 is one F1 F0; warm-up 3 one F1 B1 W1;
// steady rounds until F0 reaches 4; cool-down: one B0 B1, one B0 W0, then W1 and W0 left over.
TEST_CASE("zbv p=2 m=4 is torch's ScheduleZBVZeroBubble op for op", "[vshape][families]") {
  const std::vector<std::string> rows = Rows(Family::kZbv, 2, 4);
  CHECK(rows[0] ==
        "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F3.0 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 W1.0 "
        "F3.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0");
  CHECK(rows[1] ==
        "F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 F3.0 B1.0 W1.0 F3.1 B2.1 "
        "W2.1 B2.0 B3.1 B3.0 W2.0 W3.1 W3.0");
}

// ZBV, p = 4, m = 8: the same phases with 2(p - d) - 1 = 7, 5, 3, 1 first forwards.
TEST_CASE("zbv p=4 m=8 is torch's ScheduleZBVZeroBubble op for op", "[vshape][families]") {
  const std::vector<std::string> rows = Rows(Family::kZbv, 4, 8);
  CHECK(rows[0] ==
        "F0.0 F1.0 F2.0 F3.0 F4.0 F5.0 F6.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F2.1 B2.1 W2.1 F3.1 "
        "B3.1 W3.1 F7.0 B0.0 W0.0 F4.1 B4.1 W4.1 B1.0 W1.0 F5.1 B5.1 W5.1 B2.0 W2.0 F6.1 B6.1 "
        "W6.1 B3.0 W3.0 F7.1 B7.1 W7.1 B4.0 W4.0 B5.0 W5.0 B6.0 W6.0 B7.0 W7.0");
  CHECK(rows[1] ==
        "F0.0 F1.0 F2.0 F3.0 F4.0 F0.1 F5.0 F1.1 B0.1 W0.1 F2.1 B1.1 W1.1 F3.1 B2.1 W2.1 F6.0 "
        "B0.0 W0.0 F4.1 B3.1 W3.1 F7.0 B1.0 W1.0 F5.1 B4.1 W4.1 B2.0 W2.0 F6.1 B5.1 W5.1 B3.0 "
        "W3.0 F7.1 B6.1 W6.1 B4.0 B7.1 B5.0 W4.0 B6.0 W5.0 B7.0 W6.0 W7.1 W7.0");
  CHECK(rows[2] ==
        "F0.0 F1.0 F2.0 F0.1 F3.0 F1.1 F4.0 F2.1 B0.1 W0.1 F3.1 B1.1 W1.1 F5.0 B0.0 W0.0 F4.1 "
        "B2.1 W2.1 F6.0 B1.0 W1.0 F5.1 B3.1 W3.1 F7.0 B2.0 W2.0 F6.1 B4.1 W4.1 B3.0 W3.0 F7.1 "
        "B5.1 W5.1 B4.0 B6.1 B5.0 B7.1 B6.0 W4.0 B7.0 W5.0 W6.1 W7.1 W6.0 W7.0");
  CHECK(rows[3] ==
        "F0.0 F0.1 F1.0 F1.1 F2.0 F2.1 F3.0 F3.1 B0.1 W0.1 F4.0 B0.0 W0.0 F4.1 B1.1 W1.1 F5.0 "
        "B1.0 W1.0 F5.1 B2.1 W2.1 F6.0 B2.0 W2.0 F6.1 B3.1 W3.1 F7.0 B3.0 W3.0 F7.1 B4.1 W4.1 "
        "B4.0 B5.1 B5.0 B6.1 B6.0 B7.1 B7.0 W4.0 W5.1 W6.1 W7.1 W5.0 W6.0 W7.0");
}

// DualPipeV, p = 2, m = 4. Stage 0: step 1 is 2(p - 0 - 1) = 2 F0; step 2 one F0 F1; step 3 one
// I1 (B0.1), the queued W0.1, F1; step 4 is m - 2p + 0 + 1 = 1 round OVERLAP(F0, B1),
// OVERLAP(F1, B0); step 5 one full B1 then OVERLAP(F1, B0); step 6 one round at i = 0 = (0+1)/2:
// stage 0 is even, so B1 stays full and B0 is an I; step 7 one queued W (W2.0) then I0 (B3.0);
// step 8 one queued W (W3.0). Stage 1 (the last): steps 1 and 3 empty, step 2 two F0 F1, step 4
// two rounds whose first is F0 then a full B1 (not overlapped), step 6 two rounds switching to I
// before the chunk-1 backward of round 1 (odd stage).
TEST_CASE("dualpipev p=2 m=4 is torch's ScheduleDualPipeV with overlaps split",
          "[vshape][families]") {
  const std::vector<std::string> rows = Rows(Family::kDualPipeV, 2, 4);
  CHECK(rows[0] ==
        "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 B2.1 W2.1 F3.1 B1.0 "
        "W1.0 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0");
  CHECK(rows[1] ==
        "F0.0 F0.1 F1.0 F1.1 F2.0 B0.1 W0.1 F2.1 B0.0 W0.0 F3.0 B1.1 W1.1 F3.1 B1.0 W1.0 B2.1 "
        "W2.1 B2.0 W2.0 B3.1 B3.0 W3.1 W3.0");
}

TEST_CASE("dualpipev p=4 m=8 is torch's ScheduleDualPipeV with overlaps split",
          "[vshape][families]") {
  const std::vector<std::string> rows = Rows(Family::kDualPipeV, 4, 8);
  CHECK(rows[0] ==
        "F0.0 F1.0 F2.0 F3.0 F4.0 F5.0 F6.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F2.1 B2.1 W2.1 F3.1 "
        "F7.0 B3.1 W3.1 F4.1 B0.0 W0.0 B4.1 W4.1 F5.1 B1.0 W1.0 B5.1 W5.1 F6.1 B2.0 W2.0 B6.1 "
        "W6.1 F7.1 B3.0 W3.0 B7.1 W7.1 B4.0 W4.0 B5.0 W5.0 B6.0 W6.0 B7.0 W7.0");
  CHECK(rows[1] ==
        "F0.0 F1.0 F2.0 F3.0 F4.0 F0.1 F5.0 F1.1 B0.1 W0.1 F2.1 B1.1 W1.1 F3.1 F6.0 B2.1 W2.1 "
        "F4.1 B0.0 W0.0 F7.0 B3.1 W3.1 F5.1 B1.0 W1.0 B4.1 W4.1 F6.1 B2.0 W2.0 B5.1 W5.1 F7.1 "
        "B3.0 W3.0 B6.1 W6.1 B4.0 W4.0 B7.1 B5.0 W7.1 B6.0 W5.0 B7.0 W6.0 W7.0");
  CHECK(rows[2] ==
        "F0.0 F1.0 F2.0 F0.1 F3.0 F1.1 F4.0 F2.1 B0.1 W0.1 F3.1 F5.0 B1.1 W1.1 F4.1 B0.0 W0.0 "
        "F6.0 B2.1 W2.1 F5.1 B1.0 W1.0 F7.0 B3.1 W3.1 F6.1 B2.0 W2.0 B4.1 W4.1 F7.1 B3.0 W3.0 "
        "B5.1 W5.1 B4.0 W4.0 B6.1 W6.1 B5.0 B7.1 B6.0 W5.0 B7.0 W7.1 W6.0 W7.0");
  CHECK(rows[3] ==
        "F0.0 F0.1 F1.0 F1.1 F2.0 F2.1 F3.0 F3.1 F4.0 B0.1 W0.1 F4.1 B0.0 W0.0 F5.0 B1.1 W1.1 "
        "F5.1 B1.0 W1.0 F6.0 B2.1 W2.1 F6.1 B2.0 W2.0 F7.0 B3.1 W3.1 F7.1 B3.0 W3.0 B4.1 W4.1 "
        "B4.0 W4.0 B5.1 W5.1 B5.0 W5.0 B6.1 B6.0 B7.1 B7.0 W6.1 W6.0 W7.1 W7.0");
}

// The last stage hands virtual stage p - 1's output to virtual stage p itself: lowering puts no
// SEND/RECV between them, and every other neighbour pair talks through exactly one pair.
TEST_CASE("V lowering: no self SEND/RECV at the turn, one pair per crossing",
          "[vshape][families]") {
  for (Family family : {Family::kZbv, Family::kDualPipeV}) {
    for (int p : {1, 2, 3, 4}) {
      const PipelineSpec spec = MakeSpec(family, p, 2 * p, 2);
      INFO(FamilyName(family) << " p=" << p);
      absl::StatusOr<Schedule> lowered = Compile(spec, UnitCostModel(0.25));
      REQUIRE(lowered.ok());
      REQUIRE(Validate(*lowered).ok());
      int sends = 0;
      for (const StageProgram& program : lowered->stages) {
        for (const Op& op : program.ops) {
          if (!IsP2P(op.kind)) continue;
          CHECK(op.peer != program.stage);
          if (IsSend(op.kind)) ++sends;
        }
      }
      // 2p virtual stages, 2p - 1 boundaries, the one at the turn local: 2p - 2 crossings,
      // each once forward and once backward per microbatch.
      CHECK(sends == (2 * p - 2) * 2 * spec.num_microbatches);
    }
  }
}

TEST_CASE("V specs ResolveSpec refuses, with the reason", "[vshape][families]") {
  auto error = [](const PipelineSpec& spec) {
    absl::StatusOr<PipelineSpec> resolved = ResolveSpec(spec);
    REQUIRE(!resolved.ok());
    return std::string(resolved.status().message());
  };
  CHECK(error(MakeSpec(Family::kZbv, 4, 8, 3)) ==
        "zbv needs chunks_per_stage == 2 (got v=3): V placement puts virtual stages d and "
        "2p - 1 - d on stage d");
  CHECK(error(MakeSpec(Family::kDualPipeV, 4, 7, 2)) ==
        "dualpipev needs num_microbatches >= 2 * num_stages (m=7, p=4, so m >= 8), as torch's "
        "ScheduleDualPipeV does");
  CHECK(error(MakeSpec(Family::kZbv, 4, 8, 2, 2)) ==
        "zbv takes no group size: group_size must be 0 (got 2)");
  PipelineSpec looped = MakeSpec(Family::kInterleaved, 4, 8, 2);
  looped.placement = Placement::kV;
  CHECK(error(looped) ==
        "interleaved builds loop placement only (got placement v); placement v comes with the "
        "zbv and dualpipev families");
  // Validate says the same of a V schedule with v != 2 (invariant 1).
  Schedule odd;
  odd.spec = MakeSpec(Family::kZbv, 2, 2, 3);
  odd.spec.placement = Placement::kV;
  odd.stages.resize(2);
  const absl::Status invalid = Validate(odd);
  CHECK(std::string(invalid.message()).find("placement v needs chunks_per_stage == 2 (got v=3)") !=
        std::string::npos);
}

}  // namespace
}  // namespace pipeoffload
