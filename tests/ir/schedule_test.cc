// The IR's names: op kinds, families and policies round trip through their names, the kind
// predicates partition the kinds as DESIGN.md section 3 says, and OpToString spells ops the way
// the text form (ScheduleToText, also checked here) and error messages show them.
#include <set>
#include <string>

#include "pipeoffload/schedule.h"
#include "pipeoffload/schedule_io.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

TEST_CASE("every op kind round trips through its name", "[schedule]") {
  std::set<std::string> seen;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const OpKind kind = static_cast<OpKind>(i);
    const std::string_view name = OpKindName(kind);
    CAPTURE(i, std::string(name));
    REQUIRE(!name.empty());
    REQUIRE(OpKindFromName(name) == kind);
    seen.insert(std::string(name));
  }
  REQUIRE(seen.size() == static_cast<std::size_t>(kNumOpKinds));  // names are distinct
  CHECK(seen == std::set<std::string>{"F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B",
                                      "OFFLOAD", "RELEASE", "RELOAD", "BARRIER", "RECOMPUTE",
                                      "RECOMPUTE_LEAN"});
}

TEST_CASE("OpKindFromName is exact and case-sensitive", "[schedule]") {
  for (const char* name : {"", "f", "b", "FF", " F", "F ", "send_f", "SEND", "SEND_F0", "I",
                           "BW", "RELOAD_END", "barrier", "recompute", "RECOMPUTE_",
                           "RECOMPUTE_FULL"}) {
    CAPTURE(name);
    CHECK_FALSE(OpKindFromName(name).has_value());
  }
}

TEST_CASE("op kind predicates match the IR table", "[schedule]") {
  struct Row {
    OpKind kind;
    bool compute, p2p, send, offload, peer, recompute = false;
  };
  const Row rows[] = {
      {OpKind::kForward, true, false, false, false, false},
      {OpKind::kBackward, true, false, false, false, false},
      {OpKind::kBackwardWeight, true, false, false, false, false},
      {OpKind::kSendActivation, false, true, true, false, true},
      {OpKind::kRecvActivation, false, true, false, false, true},
      {OpKind::kSendGrad, false, true, true, false, true},
      {OpKind::kRecvGrad, false, true, false, false, true},
      {OpKind::kOffload, false, false, false, true, false},
      {OpKind::kRelease, false, false, false, true, false},
      {OpKind::kReload, false, false, false, true, false},
      {OpKind::kBarrier, false, false, false, false, true},
      {OpKind::kRecompute, true, false, false, false, false, true},
      {OpKind::kRecomputeLean, true, false, false, false, false, true},
  };
  REQUIRE(std::size(rows) == static_cast<std::size_t>(kNumOpKinds));
  for (const Row& row : rows) {
    CAPTURE(std::string(OpKindName(row.kind)));
    CHECK(IsCompute(row.kind) == row.compute);
    CHECK(IsP2P(row.kind) == row.p2p);
    CHECK(IsSend(row.kind) == row.send);
    CHECK(IsOffload(row.kind) == row.offload);
    CHECK(HasPeer(row.kind) == row.peer);
    CHECK(IsRecompute(row.kind) == row.recompute);
  }
}

TEST_CASE("family and offload policy names round trip", "[schedule]") {
  const std::pair<Family, const char*> families[] = {
      {Family::k1F1B, "1f1b"},
      {Family::kInterleaved, "interleaved"},
      {Family::kGroupInterleaved, "group-interleaved"},
  };
  for (const auto& [family, name] : families) {
    CHECK(FamilyName(family) == name);
    CHECK(FamilyFromName(name) == family);
  }
  const std::pair<OffloadPolicy, const char*> policies[] = {
      {OffloadPolicy::kNone, "none"},       {OffloadPolicy::kHalf, "po-h"},
      {OffloadPolicy::kFull, "po-f"},       {OffloadPolicy::kSelective, "selective"},
      {OffloadPolicy::kAuto, "auto"},
  };
  for (const auto& [policy, name] : policies) {
    CHECK(OffloadPolicyName(policy) == name);
    CHECK(OffloadPolicyFromName(name) == policy);
  }
  for (const char* bad : {"", "1F1B", "Interleaved", "group_interleaved", "poh", "PO-F"}) {
    CAPTURE(bad);
    CHECK_FALSE(FamilyFromName(bad).has_value());
    CHECK_FALSE(OffloadPolicyFromName(bad).has_value());
  }
}

TEST_CASE("OpToString spells ops as kind, mb.chunk and the peer's direction", "[schedule]") {
  CHECK(OpToString({OpKind::kForward, 3, 1, -1}) == "F3.1");
  CHECK(OpToString({OpKind::kBackward, 0, 0, -1}) == "B0.0");
  CHECK(OpToString({OpKind::kBackwardWeight, 12, 2, -1}) == "W12.2");
  CHECK(OpToString({OpKind::kSendActivation, 0, 0, 1}) == "SEND_F0.0->1");
  CHECK(OpToString({OpKind::kRecvActivation, 5, 1, 3}) == "RECV_F5.1<-3");
  CHECK(OpToString({OpKind::kSendGrad, 2, 0, 0}) == "SEND_B2.0->0");
  CHECK(OpToString({OpKind::kRecvGrad, 7, 3, 2}) == "RECV_B7.3<-2");
  CHECK(OpToString({OpKind::kOffload, 4, 1, -1}) == "OFFLOAD4.1");
  CHECK(OpToString({OpKind::kRelease, 4, 1, -1}) == "RELEASE4.1");
  CHECK(OpToString({OpKind::kReload, 4, 1, -1}) == "RELOAD4.1");
  CHECK(OpToString({OpKind::kBarrier, 4, 1, 2}) == "BARRIER4.1~2");
  CHECK(OpToString({OpKind::kBarrier, -1, -1, 0}) == "BARRIER~0");
  CHECK(OpToString({OpKind::kRecompute, 4, 1, -1}) == "RECOMPUTE4.1");
  CHECK(OpToString({OpKind::kRecomputeLean, 0, 2, -1}) == "RECOMPUTE_LEAN0.2");
}

TEST_CASE("PipelineSpec counts virtual stages as p * v", "[schedule]") {
  PipelineSpec spec;
  spec.num_stages = 4;
  spec.chunks_per_stage = 3;
  CHECK(spec.num_virtual_stages() == 12);
}

Schedule TwoStageSchedule() {
  Schedule s;
  s.spec.num_stages = 2;
  s.stages.resize(2);
  s.stages[0].stage = 0;
  s.stages[0].ops = {{OpKind::kForward, 0, 0, -1},
                     {OpKind::kSendActivation, 0, 0, 1},
                     {OpKind::kRecvGrad, 0, 0, 1},
                     {OpKind::kBackward, 0, 0, -1}};
  s.stages[1].stage = 1;
  s.stages[1].ops = {{OpKind::kRecvActivation, 0, 0, 0},
                     {OpKind::kForward, 0, 0, -1},
                     {OpKind::kBackward, 0, 0, -1},
                     {OpKind::kSendGrad, 0, 0, 0}};
  return s;
}

TEST_CASE("ScheduleToText writes a spec line and one row per stage", "[io][text]") {
  Schedule s = TwoStageSchedule();
  CHECK(ScheduleToText(s) ==
        "1f1b p=2 m=1 v=1 g=0 offload=none\n"
        "stage 0 | F0.0 SEND_F0.0->1 RECV_B0.0<-1 B0.0\n"
        "stage 1 | RECV_F0.0<-0 F0.0 B0.0 SEND_B0.0->0\n");

  s.spec.family = Family::kGroupInterleaved;
  s.spec.group_size = 2;
  s.spec.split_backward = true;
  s.spec.offload = OffloadPolicy::kSelective;
  s.spec.offload_fraction = 0.25;
  s.spec.strict = true;
  s.stages[1].ops.clear();
  CHECK(ScheduleToText(s) ==
        "group-interleaved p=2 m=1 v=1 g=2 split-backward offload=selective fraction=0.25 "
        "chunks=0 strict\n"
        "stage 0 | F0.0 SEND_F0.0->1 RECV_B0.0<-1 B0.0\n"
        "stage 1 |\n");
}

TEST_CASE("ScheduleToText summarises predictions when present", "[io][text]") {
  Schedule s = TwoStageSchedule();
  s.spec.offload = OffloadPolicy::kAuto;
  s.spec.memory_budget_bytes = 4096;
  Predictions pred;
  pred.step_time = 12.5;
  pred.step_time_without_offload = 12;
  pred.bubble_ratio = 0.125;
  pred.collisions = 0;
  StagePrediction stage;
  stage.peak_units = 2;
  stage.peak_bytes = 2048;
  stage.peak_units_without_offload = 3;
  stage.peak_bytes_without_offload = 3072;
  stage.host_bytes = 1024;
  stage.offloaded_bytes = 1024;
  stage.busy_time = 6;
  stage.end_time = 12.5;
  pred.stages = {stage};
  pred.links = {{"host:0", 1024, 1024}};
  pred.warnings = {"planned 1 of 2 entries"};
  s.predictions = pred;
  CHECK(ScheduleToText(s) ==
        "1f1b p=2 m=1 v=1 g=0 offload=auto budget=4096B\n"
        "stage 0 | F0.0 SEND_F0.0->1 RECV_B0.0<-1 B0.0\n"
        "stage 1 | RECV_F0.0<-0 F0.0 B0.0 SEND_B0.0->0\n"
        "predicted: step 12.5 (without offload 12), bubble 12.50%, collisions 0\n"
        "stage 0: peak 2 units / 2048 B (without offload 3 / 3072 B), host 1024 B, offloaded "
        "1024 B, busy 6, ends 12.5\n"
        "link host:0: 1024 B d2h, 1024 B h2d\n"
        "warning: planned 1 of 2 entries\n");
}

}  // namespace
}  // namespace pipeoffload
