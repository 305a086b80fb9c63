// The local RankGroup (rank_group.h): gathers and exchanges pair up however the ranks
// interleave, a rank whose peers never come gets DeadlineExceeded (no hang), and
// AllGatherChecked makes one rank's failure every rank's, in the same words.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "pipeoffload/rank_group.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

TEST_CASE("local all-gathers return every rank's bytes in rank order, round after round",
          "[runtime][group]") {
  constexpr int kRanks = 4;
  constexpr int kRounds = 60;
  auto groups = CreateLocalRankGroups(kRanks, 30.0);
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
      RankGroup& group = *(*groups)[static_cast<std::size_t>(r)];
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

TEST_CASE("local exchanges pair the k-th calls of two ranks", "[runtime][group]") {
  auto groups = CreateLocalRankGroups(4, 30.0);
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

TEST_CASE("a rank whose peers never arrive times out instead of hanging", "[runtime][group]") {
  auto groups = CreateLocalRankGroups(3, 0.2);
  REQUIRE(groups.ok());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<std::string>> all = (*groups)[0]->AllGather("alone");
  REQUIRE_FALSE(all.ok());
  CHECK(all.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(all.status().message()) ==
        "rank 0: collective 0 (all-gather) waited 0.2 s; rank 0 arrived, ranks 1, 2 did not");
  absl::StatusOr<std::string> theirs = (*groups)[1]->Exchange(2, "hello");
  REQUIRE_FALSE(theirs.ok());
  CHECK(theirs.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));

  CHECK(CreateLocalRankGroups(0, 1.0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CreateLocalRankGroups(2, 0.0).status().code() == absl::StatusCode::kInvalidArgument);
}

// Every rank calls AllGatherChecked with `statuses[r]`; returns what each got.
std::vector<absl::StatusOr<std::vector<std::string>>> GatherChecked(
    const std::vector<absl::Status>& statuses) {
  const int n = static_cast<int>(statuses.size());
  auto groups = CreateLocalRankGroups(n, 30.0);
  REQUIRE(groups.ok());
  std::vector<absl::StatusOr<std::vector<std::string>>> results(statuses.size(),
                                                                absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      results[i] = AllGatherChecked(*(*groups)[i], statuses[i], "payload " + std::to_string(r),
                                    "setup (test)");
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

TEST_CASE("AllGatherChecked: payloads when all are OK, else every rank names the failures",
          "[runtime][group]") {
  const absl::Status ok = absl::OkStatus();
  for (const auto& result : GatherChecked({ok, ok, ok})) {
    REQUIRE(result.ok());
    CHECK(*result == std::vector<std::string>{"payload 0", "payload 1", "payload 2"});
  }
  const absl::Status missing = absl::NotFoundError("no file x.json");
  for (const auto& result : GatherChecked({ok, missing, ok})) {
    CHECK(result.status().code() == absl::StatusCode::kNotFound);
    CHECK(std::string(result.status().message()) ==
          "setup (test) failed on 1 of 3 ranks (rank 1): no file x.json");
  }
  for (const auto& result : GatherChecked({missing, missing, missing})) {
    CHECK(std::string(result.status().message()) ==
          "setup (test) failed on every rank: no file x.json");
  }
  // A group of one: nobody else to name.
  for (const auto& result : GatherChecked({missing})) {
    CHECK(std::string(result.status().message()) == "setup (test) failed: no file x.json");
  }
  // Different failures: one line per message, ranks that failed alike together, the first
  // failed rank's code.
  const absl::Status small = absl::ResourceExhaustedError("arena too small");
  for (const auto& result : GatherChecked({small, missing, small})) {
    CHECK(result.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(std::string(result.status().message()) ==
          "setup (test) failed on every rank:\n  ranks 0, 2: arena too small\n  rank 1: no file "
          "x.json");
  }
  // A group whose ranks cannot meet: the group's own error, and the caller is told.
  auto alone = CreateLocalRankGroups(2, 0.1);
  REQUIRE(alone.ok());
  bool group_failed = false;
  absl::StatusOr<std::vector<std::string>> lonely =
      AllGatherChecked(*(*alone)[0], ok, "", "step 3", &group_failed);
  CHECK(group_failed);
  CHECK(lonely.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(lonely.status().message()).find("step 3: the ranks could not meet: ") == 0);
}

TEST_CASE("a failed rank waits kFailedRankWaitSeconds for silent ranks and keeps its own reason",
          "[runtime][group]") {
  // Ranks 0 and 1 failed in the step (their watchdogs fired on rank 2, which is stopped and
  // never arrives): each waits the short failed-rank bound, not the group's 60 s, and names
  // who came, who did not, and why it stopped itself.
  auto groups = CreateLocalRankGroups(3, 60.0);
  REQUIRE(groups.ok());
  std::vector<absl::StatusOr<std::vector<std::string>>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const absl::Status waited = absl::DeadlineExceededError(
          "stage " + std::to_string(r) + " waited 2.0 s for RECV_B1.0<-" + std::to_string(r + 1));
      results[static_cast<std::size_t>(r)] =
          AllGatherChecked(*(*groups)[static_cast<std::size_t>(r)], waited, "", "step 1");
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    const absl::Status& status = results[static_cast<std::size_t>(r)].status();
    CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(status.message()) ==
          "step 1: the ranks could not meet: rank " + std::to_string(r) +
              ": collective 0 (all-gather) waited 5.0 s; ranks 0, 1 arrived, rank 2 did not; "
              "this rank had failed: stage " + std::to_string(r) +
              " waited 2.0 s for RECV_B1.0<-" + std::to_string(r + 1));
  }
  // A group whose timeout is below the bound waits only that long.
  auto quick = CreateLocalRankGroups(2, 0.1);
  REQUIRE(quick.ok());
  absl::StatusOr<std::vector<std::string>> alone =
      AllGatherChecked(*(*quick)[0], absl::InternalError("broken"), "", "step 0");
  CHECK(std::string(alone.status().message()) ==
        "step 0: the ranks could not meet: rank 0: collective 0 (all-gather) waited 0.1 s; "
        "rank 0 arrived, rank 1 did not; this rank had failed: broken");
  CHECK((*quick)[0]->AllGatherWithin("x", 0.0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload
