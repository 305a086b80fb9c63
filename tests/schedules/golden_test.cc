// Golden schedules: the builders' compute orders and their lowering for small cases, diffed
// against tests/golden/*.txt. Only scripts/update_golden.sh writes those files (it runs this
// binary with PO_UPDATE_GOLDEN=1); review the diff it shows. They were checked by hand against
// reference/pipeoffload.md sections 1.2 and 1.3 and Megatron's interleaved order.
//
// File format: '#' comment lines, then a "[compute order]" and a "[lowered]" section, each with
// one row per stage: "stage d | op op op ..." (ops as OpToString prints them).
#include <string>

#include "pipeoffload/compiler.h"
#include "tests/testing/catch.h"
#include "tests/testing/golden_file.h"

namespace pipeoffload {
namespace {

struct GoldenCase {
  const char* file;
  Family family;
  int p, m, v, g;
  bool split;
};

constexpr GoldenCase kCases[] = {
    {"1f1b_p4_m8_split.txt", Family::k1F1B, 4, 8, 1, 0, true},
    {"1f1b_p4_m8.txt", Family::k1F1B, 4, 8, 1, 0, false},
    {"interleaved_p2_m4_v2_split.txt", Family::kInterleaved, 2, 4, 2, 0, true},
    {"interleaved_p2_m4_v2.txt", Family::kInterleaved, 2, 4, 2, 0, false},
    {"group_interleaved_p4_m8_v2_g2_split.txt", Family::kGroupInterleaved, 4, 8, 2, 2, true},
    {"group_interleaved_p4_m8_v2_g2.txt", Family::kGroupInterleaved, 4, 8, 2, 2, false},
};

void AppendRows(const Schedule& schedule, std::string& out) {
  for (const StageProgram& program : schedule.stages) {
    out += "stage " + std::to_string(program.stage) + " |";
    for (const Op& op : program.ops) out += " " + OpToString(op);
    out += "\n";
  }
}

// The golden text of one case, straight from the builders.
std::string Render(const GoldenCase& c) {
  PipelineSpec spec;
  spec.family = c.family;
  spec.num_stages = c.p;
  spec.num_microbatches = c.m;
  spec.chunks_per_stage = c.v;
  spec.group_size = c.g;
  spec.split_backward = c.split;
  absl::StatusOr<Schedule> order = BuildComputeOrder(spec, CostModel{});
  INFO(order.status().ToString());
  REQUIRE(order.ok());
  absl::StatusOr<Schedule> lowered = LowerCommunication(*order);
  INFO(lowered.status().ToString());
  REQUIRE(lowered.ok());
  std::string out =
      "# Golden schedule, written by scripts/update_golden.sh from the builders; review diffs.\n";
  out += "# family=" + std::string(FamilyName(c.family)) + " p=" + std::to_string(c.p) +
         " m=" + std::to_string(c.m) + " v=" + std::to_string(c.v) +
         " g=" + std::to_string(order->spec.group_size) + " split=" + (c.split ? "1" : "0") + "\n";
  out += "[compute order]\n";
  AppendRows(*order, out);
  out += "[lowered]\n";
  AppendRows(*lowered, out);
  return out;
}

TEST_CASE("golden schedules match the builders", "[golden][families]") {
  for (const GoldenCase& c : kCases) testing::MatchGolden(c.file, Render(c));
}

// Hand-derived, and compared with PyTorch's own lowering of the same compute order
// (ecosystem.md section 1.4, 2 ranks, 1F1B, 4 microbatches). Stage 0 is identical. On stage 1
// torch's rounds put RECV_F2 before B1; ours are unit-time slots (comm_lowering.cc), and F2's
// output exists only at slot 7, when B1 (slots 5-7) is done, so RECV_F2 follows B1 and under
// in-order issue B1 need not wait for stage 0. Both keep one consistent message order per pair.
TEST_CASE("lowering of a 2-stage 1F1B, by hand", "[golden][lowering][families]") {
  Schedule order;
  order.spec.num_stages = 2;
  order.spec.num_microbatches = 4;
  auto op = [](OpKind kind, int mb) { return Op{kind, mb, 0, -1}; };
  const OpKind f = OpKind::kForward, b = OpKind::kBackward;
  order.stages = {{0, {op(f, 0), op(f, 1), op(b, 0), op(f, 2), op(b, 1), op(f, 3), op(b, 2),
                       op(b, 3)}},
                  {1, {op(f, 0), op(b, 0), op(f, 1), op(b, 1), op(f, 2), op(b, 2), op(f, 3),
                       op(b, 3)}}};
  absl::StatusOr<Schedule> built = BuildComputeOrder(order.spec, CostModel{});
  REQUIRE(built.ok());
  REQUIRE(built->stages == order.stages);  // the 1f1b builder gives this very order
  absl::StatusOr<Schedule> lowered = LowerCommunication(order);
  REQUIRE(lowered.ok());
  std::string rows;
  AppendRows(*lowered, rows);
  CHECK(rows ==
        "stage 0 | F0.0 SEND_F0.0->1 F1.0 SEND_F1.0->1 RECV_B0.0<-1 B0.0 F2.0 SEND_F2.0->1 "
        "RECV_B1.0<-1 B1.0 F3.0 SEND_F3.0->1 RECV_B2.0<-1 B2.0 RECV_B3.0<-1 B3.0\n"
        "stage 1 | RECV_F0.0<-0 F0.0 RECV_F1.0<-0 B0.0 SEND_B0.0->0 F1.0 B1.0 RECV_F2.0<-0 "
        "SEND_B1.0->0 F2.0 B2.0 RECV_F3.0<-0 SEND_B2.0->0 F3.0 B3.0 SEND_B3.0->0\n");
}

}  // namespace
}  // namespace pipeoffload
