// AnalyzeP2P (pipeoffload/p2p_lifetimes.h) on hand schedules with answers worked out by hand,
// on schedules it must refuse (unmatched, unconsumed, cyclic), and on compiled schedules of
// every family, where the bound must stay within today's worst case. The bound against measured
// runs is in executor_compiled_test.cc.
#include "pipeoffload/p2p_lifetimes.h"

#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/validate.h"
#include "tests/runtime/hand_schedules.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::FindOp;
using testing::Hand1F1B;

Op MakeOp(OpKind kind, int mb, int chunk = 0, int peer = -1) { return Op{kind, mb, chunk, peer}; }

// Today's reserve (bench/pipeline_bench_plan.cc ArenaBudget): every SEND and RECV block of the
// stage at once, plus two outputs.
int WorstCaseBlocks(const StageProgram& program) {
  int p2p_ops = 0;
  for (const Op& op : program.ops) p2p_ops += IsP2P(op.kind) ? 1 : 0;
  return p2p_ops + 2;
}

TEST_CASE("AnalyzeP2P on 1F1B with p = 2, m = 2: clocks, guarantee points and peaks by hand",
          "[runtime][p2p]") {
  // Stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1
  // Stage 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 F1 B1 SEND_B1
  // (Validate refuses it: under blocking rendezvous SEND_F1 and SEND_B0 deadlock. The
  // executor's sends do not block, and the analysis models exactly that.)
  const Schedule schedule = Hand1F1B(2, 2, false);
  absl::StatusOr<std::vector<P2PLifetimes>> result = AnalyzeP2P(schedule);
  INFO(result.status().ToString());
  REQUIRE(result.ok());
  REQUIRE(result->size() == 2);
  const P2PLifetimes& s0 = (*result)[0];
  const P2PLifetimes& s1 = (*result)[1];
  CHECK(s0.stage == 0);
  CHECK(s1.stage == 1);
  // SEND_F0 (op 1) meets RECV_F0 (stage 1, op 0): stage 0 learns of it only when B0 (op 5)
  // takes the gradient stage 1 sent after it. SEND_F1 (op 3) meets RECV_F1 (stage 1, op 4),
  // seen at B1 (op 7) through SEND_B1.
  CHECK(s0.guarantee_point == std::vector<int>{-1, 5, -1, 7, -1, -1, -1, -1});
  // Stage 1's sends meet RECV_B0 / RECV_B1 (stage 0, ops 4 and 6): nothing stage 0 does after
  // them reaches stage 1, so both are guaranteed only at the end of the step.
  CHECK(s1.guarantee_point == std::vector<int>{-1, -1, -1, 8, -1, -1, -1, 8});
  // Stage 0: F0 out(1), F1 out(2), RECV_B0 (3: both sends still unguaranteed), at B0 SEND_F0
  // is guaranteed (2), B0 frees its input (1), RECV_B1 (2), at B1 SEND_F1 is done (1).
  CHECK(s0.live_blocks == std::vector<int>{1, 1, 2, 2, 3, 2, 2, 1});
  CHECK(s0.peak_blocks == 3);
  CHECK(s0.peak_op == 4);
  // Stage 1: RECV_F0 (1), F0 consumes it (last virtual stage: no output), B0 allocates its
  // input gradient (1), sent and held to the end; RECV_F1 (2), F1 (2, then 1), B1 (2).
  CHECK(s1.live_blocks == std::vector<int>{1, 1, 1, 1, 2, 2, 2, 2});
  CHECK(s1.peak_blocks == 2);
  CHECK(s1.peak_op == 4);
  // Today's reserve: 4 P2P ops + 2 on each stage.
  CHECK(WorstCaseBlocks(schedule.stages[0]) == 6);
  CHECK(P2PBoundBytes(s0, 256, 256) == 3 * 256);
  CHECK(P2PBoundBytes(s0, 100, 64) == 3 * 128);
  CHECK(P2PBoundBytes(s1, 1, 1) == 2);
}

TEST_CASE("AnalyzeP2P: a BARRIER pair orders both sides and moves guarantee points earlier",
          "[runtime][p2p]") {
  Schedule schedule = Hand1F1B(2, 2, false);
  std::vector<Op>& ops0 = schedule.stages[0].ops;
  std::vector<Op>& ops1 = schedule.stages[1].ops;
  // Stage 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 BARRIER B0 RECV_B1 B1
  // Stage 1: RECV_F0 F0 B0 SEND_B0 RECV_F1 BARRIER F1 B1 SEND_B1
  ops0.insert(ops0.begin() + 5, MakeOp(OpKind::kBarrier, -1, -1, 1));
  ops1.insert(ops1.begin() + 5, MakeOp(OpKind::kBarrier, -1, -1, 0));
  absl::StatusOr<std::vector<P2PLifetimes>> result = AnalyzeP2P(schedule);
  INFO(result.status().ToString());
  REQUIRE(result.ok());
  // Past the pair (from op 6 on) stage 0 knows stage 1 posted RECV_F1 (op 4): SEND_F1 is
  // guaranteed at B0 (op 6), not at B1 (op 8) as without the barrier. Not at the BARRIER
  // itself: the executor waits before an op, when the pair has not met yet.
  CHECK((*result)[0].guarantee_point == std::vector<int>{-1, 6, -1, 6, -1, -1, -1, -1, -1});
  CHECK((*result)[0].live_blocks == std::vector<int>{1, 1, 2, 2, 3, 3, 1, 1, 1});
  CHECK((*result)[0].peak_blocks == 3);
  // SEND_B0 (op 3) meets RECV_B0 (stage 0, op 4), but stage 0 blocks in its BARRIER (op 5)
  // before consuming it, serving no receive there: the wait needs stage 0 past that BARRIER,
  // known from op 6. SEND_B1 is guaranteed only at the end (9).
  CHECK((*result)[1].guarantee_point == std::vector<int>{-1, -1, -1, 6, -1, -1, -1, -1, 9});
  CHECK((*result)[1].live_blocks == std::vector<int>{1, 1, 1, 1, 2, 2, 1, 1, 1});
  CHECK((*result)[1].peak_blocks == 2);
}

TEST_CASE("AnalyzeP2P: p = 1 holds the local outputs between chunks, no sends", "[runtime][p2p]") {
  Schedule schedule;
  schedule.spec.num_stages = 1;
  schedule.spec.num_microbatches = 2;
  schedule.spec.chunks_per_stage = 2;
  schedule.spec.family = Family::kInterleaved;
  schedule.stages.push_back(
      StageProgram{0,
                   {MakeOp(OpKind::kForward, 0, 0), MakeOp(OpKind::kForward, 1, 0),
                    MakeOp(OpKind::kForward, 0, 1), MakeOp(OpKind::kBackward, 0, 1),
                    MakeOp(OpKind::kForward, 1, 1), MakeOp(OpKind::kBackward, 0, 0),
                    MakeOp(OpKind::kBackward, 1, 1), MakeOp(OpKind::kBackward, 1, 0)}});
  REQUIRE(Validate(schedule).ok());
  absl::StatusOr<std::vector<P2PLifetimes>> result = AnalyzeP2P(schedule);
  INFO(result.status().ToString());
  REQUIRE(result.ok());
  const P2PLifetimes& s0 = (*result)[0];
  // F0.0 out (1), F1.0 out (2), F0.1 takes F0.0's (2 -> 1), B0.1 makes a gradient (2),
  // F1.1 takes F1.0's (2 -> 1), B0.0 takes B0.1's (1 -> 0), B1.1 (1), B1.0 takes it.
  CHECK(s0.live_blocks == std::vector<int>{1, 2, 2, 2, 2, 1, 1, 1});
  CHECK(s0.peak_blocks == 2);
  CHECK(s0.peak_op == 1);
  CHECK(s0.guarantee_point == std::vector<int>(8, -1));
}

TEST_CASE("AnalyzeP2P refuses schedules whose messages cannot be ordered, naming the ops",
          "[runtime][p2p]") {
  // Stage 0 sends F0's output only after B0, which needs stage 1's gradient, which needs
  // stage 1's F0, which needs stage 0's activation: a cycle of waits.
  Schedule schedule;
  schedule.spec.num_stages = 2;
  schedule.spec.num_microbatches = 1;
  schedule.stages.push_back(
      StageProgram{0,
                   {MakeOp(OpKind::kForward, 0), MakeOp(OpKind::kRecvGrad, 0, 0, 1),
                    MakeOp(OpKind::kBackward, 0), MakeOp(OpKind::kSendActivation, 0, 0, 1)}});
  schedule.stages.push_back(
      StageProgram{1,
                   {MakeOp(OpKind::kRecvActivation, 0, 0, 0), MakeOp(OpKind::kForward, 0),
                    MakeOp(OpKind::kBackward, 0), MakeOp(OpKind::kSendGrad, 0, 0, 0)}});
  absl::StatusOr<std::vector<P2PLifetimes>> result = AnalyzeP2P(schedule);
  REQUIRE(!result.ok());
  CHECK(result.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(result.status().message());
  INFO(message);
  CHECK(message.find("cannot be ordered") != std::string::npos);
  CHECK(message.find("stage 0, op 2 (B0.0) waits for the message of stage 1, op 3 (SEND_B0.0") !=
        std::string::npos);
  CHECK(message.find("stage 1, op 1 (F0.0) waits for the message of stage 0, op 3 (SEND_F0.0") !=
        std::string::npos);
}

TEST_CASE("AnalyzeP2P refuses malformed schedules with a message naming the op", "[runtime][p2p]") {
  Schedule schedule = Hand1F1B(2, 2, false);
  std::string expected;
  SECTION("a SEND without its RECV") {
    std::vector<Op>& ops1 = schedule.stages[1].ops;
    ops1.erase(ops1.begin() + FindOp(schedule.stages[1], MakeOp(OpKind::kRecvActivation, 1, 0, 0)));
    expected = "stage 0, op 3 (SEND_F1.0->1) has no matching RECV_F on stage 1";
  }
  SECTION("a RECV whose message no later op consumes") {
    std::vector<Op>& ops0 = schedule.stages[0].ops;
    const int recv = FindOp(schedule.stages[0], MakeOp(OpKind::kRecvGrad, 1, 0, 1));
    std::swap(ops0[static_cast<std::size_t>(recv)], ops0[static_cast<std::size_t>(recv + 1)]);
    expected = "stage 0, op 7 (RECV_B1.0<-1): no later B1.0 consumes its message";
  }
  SECTION("a SEND before the op producing its data") {
    std::vector<Op>& ops0 = schedule.stages[0].ops;
    std::swap(ops0[2], ops0[3]);  // SEND_F1 before F1
    expected = "stage 0, op 2 (SEND_F1.0->1): it sends the output of F1.0, which has not run";
  }
  SECTION("a program of the wrong stage") {
    schedule.stages[1].stage = 0;
    expected = "wrong stage numbering";
  }
  absl::StatusOr<std::vector<P2PLifetimes>> result = AnalyzeP2P(schedule);
  REQUIRE(!result.ok());
  CHECK(result.status().code() == absl::StatusCode::kFailedPrecondition);
  INFO(result.status().message());
  CHECK(std::string(result.status().message()).find(expected) != std::string::npos);
}

// p = 4, m = 8, v chunks, unit costs, no offload: only the order matters to P2P buffers.
absl::StatusOr<Schedule> CompileOrder(Family family, int chunks, bool split) {
  PipelineSpec spec;
  spec.family = family;
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.chunks_per_stage = chunks;
  spec.split_backward = split;
  CostModel cost = UnitCostModel(/*offload_ratio_k=*/0.5);
  cost.activation_bytes_per_virtual_stage.assign(static_cast<std::size_t>(4 * chunks), 1024);
  cost.boundary_bytes = 256;
  return Compile(spec, cost);
}

TEST_CASE("AnalyzeP2P on compiled schedules: within today's reserve, consistent walk",
          "[runtime][p2p]") {
  for (Family family : {Family::k1F1B, Family::kInterleaved, Family::kGroupInterleaved}) {
    for (int chunks : {1, 2, 4}) {
      if ((family == Family::k1F1B) != (chunks == 1)) continue;
      for (bool split : {false, true}) {
        INFO(FamilyName(family) << " v=" << chunks << (split ? " split" : ""));
        absl::StatusOr<Schedule> schedule = CompileOrder(family, chunks, split);
        INFO(schedule.status().ToString());
        REQUIRE(schedule.ok());
        absl::StatusOr<std::vector<P2PLifetimes>> result = AnalyzeP2P(*schedule);
        INFO(result.status().ToString());
        REQUIRE(result.ok());
        for (int d = 0; d < 4; ++d) {
          CAPTURE(d);
          const StageProgram& program = schedule->stages[static_cast<std::size_t>(d)];
          const P2PLifetimes& stage = (*result)[static_cast<std::size_t>(d)];
          const int n = static_cast<int>(program.ops.size());
          REQUIRE(stage.live_blocks.size() == program.ops.size());
          CHECK(stage.peak_blocks > 0);
          CHECK(stage.peak_blocks <= WorstCaseBlocks(program));
          CHECK(stage.live_blocks[static_cast<std::size_t>(stage.peak_op)] == stage.peak_blocks);
          int sends = 0;
          for (int j = 0; j < n; ++j) {
            const int g = stage.guarantee_point[static_cast<std::size_t>(j)];
            CHECK(stage.live_blocks[static_cast<std::size_t>(j)] <= stage.peak_blocks);
            if (!IsSend(program.ops[static_cast<std::size_t>(j)].kind)) {
              CHECK(g == -1);
              continue;
            }
            ++sends;
            CHECK(g >= 0);
            CHECK(g <= n);
          }
          // Each stage sends something, and the bound is far below the reserve once there are
          // many messages (at least half of the worst case saved from v = 2 on).
          CHECK(sends > 0);
          if (chunks >= 2) CHECK(2 * stage.peak_blocks <= WorstCaseBlocks(program));
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipeoffload
