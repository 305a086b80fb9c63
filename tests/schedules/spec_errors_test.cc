// Bad input to the compiler's first passes: every bad spec (ResolveSpec, BuildComputeOrder) and
// every malformed compute order (LowerCommunication) must come back as a clear error Status that
// names what is wrong and what would be accepted; never a crash, abort or hang.
#include <limits>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "schedules/families.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using ::pipeoffload::testing::MakeSpec;

// REQUIREs that `status` has `code` and that its message contains every one of `parts`.
void RequireError(const absl::Status& status, absl::StatusCode code,
                  const std::vector<std::string>& parts) {
  INFO(status.ToString());
  REQUIRE(status.code() == code);
  for (const std::string& part : parts) {
    INFO("expected in the message: " << part);
    CHECK(std::string(status.message()).find(part) != std::string::npos);
  }
}

void RequireBadSpec(const PipelineSpec& spec, const std::vector<std::string>& parts) {
  RequireError(ResolveSpec(spec).status(), absl::StatusCode::kInvalidArgument, parts);
  // BuildComputeOrder resolves again, so a caller that skipped ResolveSpec gets the same error.
  RequireError(BuildComputeOrder(spec, CostModel{}).status(), absl::StatusCode::kInvalidArgument,
               parts);
}

TEST_CASE("shape errors name the field and its range", "[spec][families]") {
  RequireBadSpec(MakeSpec(Family::k1F1B, 0, 4, 1), {"num_stages", "[1, 4096]", "got 0"});
  RequireBadSpec(MakeSpec(Family::k1F1B, -3, 4, 1), {"num_stages", "got -3"});
  RequireBadSpec(MakeSpec(Family::k1F1B, 5000, 4, 1), {"num_stages", "got 5000"});
  RequireBadSpec(MakeSpec(Family::k1F1B, 4, 0, 1), {"num_microbatches", "[1, 1048576]", "got 0"});
  RequireBadSpec(MakeSpec(Family::k1F1B, 4, (1 << 20) + 1, 1), {"num_microbatches"});
  RequireBadSpec(MakeSpec(Family::kGroupInterleaved, 4, 8, 0), {"chunks_per_stage", "got 0"});
  RequireBadSpec(MakeSpec(Family::kGroupInterleaved, 4, 8, 2000), {"chunks_per_stage", "[1, 1024]"});
  // Each bound alone is fine, the product is not: an absurd allocation is refused up front.
  RequireBadSpec(MakeSpec(Family::kGroupInterleaved, 4096, 4096, 4),
                 {"num_stages * chunks_per_stage * num_microbatches", "4194304",
                  "4096 * 4 * 4096"});
  RequireBadSpec(MakeSpec(Family::k1F1B, 4096, 1025, 1), {"4194304", "4096 * 1 * 1025 = 4198400"});
  CHECK(ResolveSpec(MakeSpec(Family::k1F1B, 4096, 1024, 1)).ok());  // exactly at the cap
  RequireBadSpec(MakeSpec(static_cast<Family>(7), 4, 8, 1),
                 {"unknown family 7", "1f1b, interleaved, group-interleaved"});
}

TEST_CASE("1f1b errors", "[spec][families]") {
  RequireBadSpec(MakeSpec(Family::k1F1B, 4, 8, 2), {"1f1b needs chunks_per_stage == 1", "v=2",
                                                "interleaved or group-interleaved"});
  RequireBadSpec(MakeSpec(Family::k1F1B, 4, 8, 1, 2), {"group_size must be 0", "got 2"});
}

TEST_CASE("interleaved errors", "[spec][families]") {
  RequireBadSpec(MakeSpec(Family::kInterleaved, 4, 8, 1), {"chunks_per_stage >= 2", "use 1f1b"});
  RequireBadSpec(MakeSpec(Family::kInterleaved, 4, 6, 2),
                 {"num_microbatches % num_stages == 0", "m=6, p=4", "use m=4 or 8",
                  "group-interleaved"});
  RequireBadSpec(MakeSpec(Family::kInterleaved, 4, 3, 2), {"m=3, p=4", "use m=4,"});
  RequireBadSpec(MakeSpec(Family::kInterleaved, 4, 8, 2, 2),
                 {"group_size must be 0 or p=4", "got 2", "group-interleaved"});
}

TEST_CASE("group-interleaved errors state the accepted range", "[spec][families]") {
  RequireBadSpec(MakeSpec(Family::kGroupInterleaved, 8, 32, 2, 3),
                 {"ceil(p/2) <= group_size <= p", "4 <= g <= 8", "got g=3", "default 4"});
  RequireBadSpec(MakeSpec(Family::kGroupInterleaved, 8, 32, 2, 9), {"4 <= g <= 8", "got g=9"});
  RequireBadSpec(MakeSpec(Family::kGroupInterleaved, 5, 32, 2, -1), {"3 <= g <= 5", "got g=-1"});
}

TEST_CASE("offload fields out of range are rejected", "[spec][families]") {
  PipelineSpec spec = MakeSpec(Family::kGroupInterleaved, 4, 8, 2);
  spec.offload_fraction = 1.5;
  RequireBadSpec(spec, {"offload_fraction", "[0, 1]", "1.5"});
  spec.offload_fraction = -0.1;
  RequireBadSpec(spec, {"offload_fraction"});
  spec.offload_fraction = std::numeric_limits<double>::quiet_NaN();
  RequireBadSpec(spec, {"offload_fraction"});
  spec.offload_fraction = 0.5;
  spec.offload_chunks = 3;
  RequireBadSpec(spec, {"offload_chunks", "chunks_per_stage=2", "got 3"});
  spec.offload_chunks = -1;
  RequireBadSpec(spec, {"offload_chunks"});
  spec.offload_chunks = 0;
  spec.memory_budget_bytes = -5;
  RequireBadSpec(spec, {"memory_budget_bytes", "got -5"});
  spec.memory_budget_bytes = 0;
  spec.offload = static_cast<OffloadPolicy>(9);
  RequireBadSpec(spec, {"unknown offload policy 9", "po-f"});
}

TEST_CASE("accepted specs resolve their defaults, idempotently", "[spec][families]") {
  struct Case {
    PipelineSpec spec;
    int resolved_group;
  };
  const Case cases[] = {
      {MakeSpec(Family::k1F1B, 4, 1, 1), 0},               // m < p is fine for 1F1B
      {MakeSpec(Family::k1F1B, 1, 1, 1), 0},
      {MakeSpec(Family::kInterleaved, 4, 4, 2), 4},        // default g = p
      {MakeSpec(Family::kInterleaved, 4, 8, 3, 4), 4},
      {MakeSpec(Family::kInterleaved, 1, 3, 2), 1},
      {MakeSpec(Family::kGroupInterleaved, 8, 32, 2), 4},  // default g = ceil(p/2)
      {MakeSpec(Family::kGroupInterleaved, 7, 5, 3), 4},   // any m, even m < g
      {MakeSpec(Family::kGroupInterleaved, 7, 1, 1, 7), 7},  // v = 1 allowed
      {MakeSpec(Family::kGroupInterleaved, 1, 1, 4), 1},
  };
  for (const Case& c : cases) {
    INFO(FamilyName(c.spec.family) << " p=" << c.spec.num_stages << " m="
                                   << c.spec.num_microbatches << " v=" << c.spec.chunks_per_stage);
    absl::StatusOr<PipelineSpec> resolved = ResolveSpec(c.spec);
    INFO(resolved.status().ToString());
    REQUIRE(resolved.ok());
    CHECK(resolved->group_size == c.resolved_group);
    PipelineSpec expected = c.spec;
    expected.group_size = c.resolved_group;
    CHECK(*resolved == expected);  // nothing else changes
    absl::StatusOr<PipelineSpec> again = ResolveSpec(*resolved);
    REQUIRE(again.ok());
    CHECK(*again == *resolved);
    absl::StatusOr<Schedule> order = BuildComputeOrder(c.spec, CostModel{});
    REQUIRE(order.ok());
    CHECK(order->spec == *resolved);
  }
}

// --- LowerCommunication on malformed compute orders -------------------------------------------

Schedule Order(int p, int m, bool split, std::vector<std::vector<Op>> rows) {
  Schedule schedule;
  schedule.spec = MakeSpec(Family::k1F1B, p, m, 1);
  schedule.spec.split_backward = split;
  for (int d = 0; d < static_cast<int>(rows.size()); ++d) {
    schedule.stages.push_back(StageProgram{d, std::move(rows[d])});
  }
  return schedule;
}

Op F(int mb) { return Op{OpKind::kForward, mb, 0, -1}; }
Op B(int mb) { return Op{OpKind::kBackward, mb, 0, -1}; }
Op W(int mb) { return Op{OpKind::kBackwardWeight, mb, 0, -1}; }

TEST_CASE("lowering accepts the hand-made baseline", "[lowering][families]") {
  REQUIRE(LowerCommunication(Order(2, 2, false, {{F(0), F(1), B(0), B(1)},
                                                 {F(0), B(0), F(1), B(1)}}))
              .ok());
}

TEST_CASE("lowering reports an order that cannot make progress", "[lowering][families]") {
  // The last stage runs B0 before its own F0.
  RequireError(LowerCommunication(Order(2, 2, false, {{F(0), F(1), B(0), B(1)},
                                                      {B(0), F(0), F(1), B(1)}}))
                   .status(),
               absl::StatusCode::kFailedPrecondition,
               {"malformed compute order", "stuck heads",
                "stage 1 op 0 B0.0 waits for its own F0.0",
                "stage 0 op 2 B0.0 waits for B0.0 on stage 1"});
  // A cycle across stages: stage 0 needs stage 1's B0 before F1; stage 1 needs F1 first.
  RequireError(LowerCommunication(Order(2, 2, false, {{F(0), B(0), F(1), B(1)},
                                                      {F(1), F(0), B(0), B(1)}}))
                   .status(),
               absl::StatusCode::kFailedPrecondition,
               {"malformed compute order", "stage 0 op 1 B0.0 waits for B0.0 on stage 1",
                "stage 1 op 0 F1.0 waits for F1.0 on stage 0"});
  // W before its own B.
  RequireError(LowerCommunication(Order(1, 1, true, {{F(0), W(0), B(0)}})).status(),
               absl::StatusCode::kFailedPrecondition, {"W0.0 waits for its own B0.0"});
}

TEST_CASE("lowering rejects duplicate and missing ops", "[lowering][families]") {
  RequireError(LowerCommunication(Order(2, 2, false, {{F(0), F(1), B(0), B(1), F(1)},
                                                      {F(0), B(0), F(1), B(1)}}))
                   .status(),
               absl::StatusCode::kFailedPrecondition, {"stage 0 op 4 (F1.0) appears twice"});
  RequireError(LowerCommunication(Order(2, 2, false, {{F(0), F(1), B(0), B(1)},
                                                      {F(0), B(0), F(1)}}))
                   .status(),
               absl::StatusCode::kFailedPrecondition, {"stage 1 lacks B1.0"});
  RequireError(LowerCommunication(Order(1, 1, true, {{F(0), B(0)}})).status(),
               absl::StatusCode::kFailedPrecondition, {"stage 0 lacks W0.0"});
}

TEST_CASE("lowering rejects ops that do not belong in a compute order", "[lowering][families]") {
  RequireError(
      LowerCommunication(Order(2, 1, false, {{F(0), Op{OpKind::kSendActivation, 0, 0, 1}, B(0)},
                                             {F(0), B(0)}}))
          .status(),
      absl::StatusCode::kInvalidArgument, {"stage 0 op 1 (SEND_F0.0->1)", "compute ops only"});
  RequireError(LowerCommunication(Order(1, 1, false, {{F(0), B(0), W(0)}})).status(),
               absl::StatusCode::kInvalidArgument, {"stage 0 op 2 (W0.0)", "split_backward"});
  RequireError(LowerCommunication(Order(1, 2, false, {{F(0), B(0), F(2), B(1)}})).status(),
               absl::StatusCode::kInvalidArgument, {"stage 0 op 2 (F2.0)", "mb must be in [0, 2)"});
  RequireError(
      LowerCommunication(Order(1, 1, false, {{Op{OpKind::kForward, 0, 1, -1}, B(0)}})).status(),
      absl::StatusCode::kInvalidArgument, {"(F0.1)", "chunk in [0, 1)"});
  RequireError(LowerCommunication(Order(1, 1, false, {{Op{OpKind::kForward, -1, 0, -1}}})).status(),
               absl::StatusCode::kInvalidArgument, {"mb must be in"});
}

TEST_CASE("lowering rejects a schedule of the wrong shape", "[lowering][families]") {
  RequireError(LowerCommunication(Order(3, 1, false, {{F(0), B(0)}, {F(0), B(0)}})).status(),
               absl::StatusCode::kInvalidArgument, {"2 stage programs for num_stages=3"});
  Schedule renumbered = Order(2, 1, false, {{F(0), B(0)}, {F(0), B(0)}});
  renumbered.stages[1].stage = 5;
  RequireError(LowerCommunication(renumbered).status(), absl::StatusCode::kInvalidArgument,
               {"stage program 1 says it is stage 5"});
  Schedule no_stages = Order(0, 1, false, {});
  RequireError(LowerCommunication(no_stages).status(), absl::StatusCode::kInvalidArgument,
               {"num_stages"});
}

}  // namespace
}  // namespace pipeoffload
