// gpt_train's wire format: what the ranks tell each other survives its encoding bit for bit,
// and short or long messages are DataLoss. (The rank groups themselves: tests/runtime.)
#include "examples/gpt/train_wire.h"

#include <cmath>
#include <string>
#include <vector>

#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

TEST_CASE("step reports survive the wire bit for bit; short messages are DataLoss",
          "[train][wire]") {
  StepReport report;
  report.status = absl::DeadlineExceededError("stage 2 waited 1.0 s for RECV_B3.1<-3");
  report.losses = {5.5, 1.0 / 3.0, -0.0};
  IterationStats& s = report.stats;
  s.stage = 2;
  s.start_time = 12.5;
  s.end_time = 13.25;
  s.stash_high_water_bytes = 123456789;
  s.stash_physical_high_water_bytes = 223456789;
  s.stash_high_water_entries = 7;
  s.p2p_high_water_bytes = 4096;
  s.other_high_water_bytes = 3;
  s.host_high_water_bytes = 99;
  s.offloaded_bytes = 1 << 20;
  s.reloaded_bytes = 1 << 20;
  s.compute_seconds = 0.125;
  s.wait_seconds = 0.0625;
  s.release_wait_seconds = 0.03125;
  s.ops.push_back(TimedOp{2, 0, Op{OpKind::kRecvGrad, 3, 1, 3}, Engine::kRecv, 1.0, 2.0, 64});
  s.ops.push_back(TimedOp{2, 1, Op{OpKind::kBackward, 3, 1, -1}, Engine::kCompute, 2.0, 3.0, 0});
  s.memory.push_back(MemorySample{1.5, 1000, 1});

  for (const bool timeline : {true, false}) {
    CAPTURE(timeline);
    const std::string bytes = EncodeStepReport(report, timeline);
    absl::StatusOr<StepReport> decoded = DecodeStepReport(bytes);
    REQUIRE(decoded.ok());
    CHECK(decoded->status == report.status);
    CHECK(decoded->losses == report.losses);
    CHECK(std::signbit(decoded->losses[2]));
    const IterationStats& d = decoded->stats;
    CHECK(d.stage == 2);
    CHECK(d.start_time == 12.5);
    CHECK(d.end_time == 13.25);
    CHECK(d.stash_high_water_bytes == 123456789);
    CHECK(d.stash_physical_high_water_bytes == 223456789);
    CHECK(d.stash_high_water_entries == 7);
    CHECK(d.p2p_high_water_bytes == 4096);
    CHECK(d.other_high_water_bytes == 3);
    CHECK(d.host_high_water_bytes == 99);
    CHECK(d.offloaded_bytes == 1 << 20);
    CHECK(d.reloaded_bytes == 1 << 20);
    CHECK(d.compute_seconds == 0.125);
    CHECK(d.wait_seconds == 0.0625);
    CHECK(d.release_wait_seconds == 0.03125);
    if (timeline) {
      REQUIRE(d.ops.size() == 2);
      CHECK(d.ops[0].op == s.ops[0].op);
      CHECK(d.ops[1].engine == Engine::kCompute);
      CHECK(d.ops[0].bytes == 64);
      REQUIRE(d.memory.size() == 1);
      CHECK(d.memory[0].bytes == 1000);
    } else {
      CHECK(d.ops.empty());
      CHECK(d.memory.empty());
    }
    absl::StatusOr<StepReport> cut = DecodeStepReport(bytes.substr(0, bytes.size() - 1));
    CHECK(cut.status().code() == absl::StatusCode::kDataLoss);
    absl::StatusOr<StepReport> longer = DecodeStepReport(bytes + "x");
    CHECK(longer.status().code() == absl::StatusCode::kDataLoss);
  }

  std::vector<TensorHash> hashes = {{3, 0xDEADBEEFCAFEF00Dull}, {0, 1}};
  std::vector<TensorHash> back;
  std::int64_t state = 0;
  REQUIRE(DecodeHashes(EncodeHashes(hashes, 4242), &back, &state).ok());
  REQUIRE(back.size() == 2);
  CHECK(back[0].id == 3);
  CHECK(back[0].hash == 0xDEADBEEFCAFEF00Dull);
  CHECK(back[1].hash == 1u);
  CHECK(state == 4242);
  CHECK(DecodeHashes("abc", &back, &state).code() == absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pipeoffload::gpt
