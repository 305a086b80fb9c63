// The gpt_train side channel (local group) and its wire format: gathers and exchanges pair up
// however the ranks interleave, a rank whose peers never come gets DeadlineExceeded (no hang),
// and messages survive their encoding bit for bit.
#include "examples/gpt/train_group.h"

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "examples/gpt/train_wire.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

TEST_CASE("local all-gathers return every rank's bytes in rank order, round after round",
          "[train][group]") {
  constexpr int kRanks = 4;
  constexpr int kRounds = 60;
  auto groups = CreateLocalTrainGroups(kRanks, 30.0);
  REQUIRE(groups.ok());
  // Payload of rank r in round k: k bytes of (r + k) (empty in round 0), so sizes and contents
  // differ per rank and round.
  const auto payload = [](int r, int k) {
    return std::string(static_cast<std::size_t>(k + r), static_cast<char>('a' + (r + k) % 26));
  };
  std::vector<int> mismatches(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      TrainGroup& group = *(*groups)[static_cast<std::size_t>(r)];
      for (int k = 0; k < kRounds; ++k) {
        if ((k + r) % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        absl::StatusOr<std::vector<std::string>> all = group.AllGather(payload(r, k));
        if (!all.ok() || all->size() != kRanks) {
          ++mismatches[r];
          continue;
        }
        for (int q = 0; q < kRanks; ++q) mismatches[r] += (*all)[q] != payload(q, k);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(mismatches == std::vector<int>(kRanks, 0));
  CHECK((*groups)[2]->rank() == 2);
  CHECK((*groups)[2]->size() == kRanks);
  CHECK((*groups)[2]->Name() == "local");
}

TEST_CASE("local exchanges pair the k-th calls of two ranks", "[train][group]") {
  auto groups = CreateLocalTrainGroups(4, 30.0);
  REQUIRE(groups.ok());
  constexpr int kCalls = 40;
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      const int peer = 3 - r;  // 0 <-> 3, 1 <-> 2, as stages 0 and p-1 do with the tied grad
      for (int k = 0; k < kCalls; ++k) {
        const std::string mine = std::to_string(r) + ":" + std::to_string(k);
        absl::StatusOr<std::string> theirs =
            (*groups)[static_cast<std::size_t>(r)]->Exchange(peer, mine);
        wrong[r] += !theirs.ok() || *theirs != std::to_string(peer) + ":" + std::to_string(k);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(wrong == std::vector<int>(4, 0));
  CHECK((*groups)[0]->Exchange(0, "x").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*groups)[0]->Exchange(4, "x").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a rank whose peers never arrive times out instead of hanging", "[train][group]") {
  auto groups = CreateLocalTrainGroups(3, 0.2);
  REQUIRE(groups.ok());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::string>> all = (*groups)[0]->AllGather("alone");
  REQUIRE_FALSE(all.ok());
  CHECK(all.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(all.status().message()) ==
        "rank 0: collective 0 (all-gather) waited 0.2 s; only 1 of 3 ranks arrived");
  absl::StatusOr<std::string> theirs = (*groups)[1]->Exchange(2, "hello");
  REQUIRE_FALSE(theirs.ok());
  CHECK(theirs.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));

  CHECK(CreateLocalTrainGroups(0, 1.0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CreateLocalTrainGroups(2, 0.0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("step reports survive the wire bit for bit; short messages are DataLoss",
          "[train][group]") {
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
