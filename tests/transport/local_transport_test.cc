// Local transport: matching by (sender, receiver, tag), FIFO per tag, sizes, timeouts, barriers,
// many threads at once; and the MPI tag composition (pure, no MPI needed).
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lib/transport/transport_checks.h"
#include "pipeoffload/transport.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

std::vector<std::unique_ptr<Transport>> Ranks(int n) {
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> ranks = CreateLocalTransports(n);
  REQUIRE(ranks.ok());
  return std::move(*ranks);
}

void SendInts(Transport& from, int peer, MessageTag tag, const std::vector<int>& data) {
  absl::StatusOr<std::unique_ptr<TransferRequest>> sent =
      from.Send(peer, tag, data.data(), static_cast<std::int64_t>(data.size() * 4));
  REQUIRE(sent.ok());
  REQUIRE((*sent)->Wait(1.0).ok());
}

std::vector<int> RecvInts(Transport& at, int peer, MessageTag tag, std::size_t count) {
  std::vector<int> data(count, -1);
  absl::StatusOr<std::unique_ptr<TransferRequest>> received =
      at.Recv(peer, tag, data.data(), static_cast<std::int64_t>(count * 4));
  REQUIRE(received.ok());
  const absl::Status waited = (*received)->Wait(5.0);
  INFO(waited.ToString());
  REQUIRE(waited.ok());
  return data;
}

TEST_CASE("local transport matches messages by kind, mb, chunk and sender",
          "[runtime][transport]") {
  auto ranks = Ranks(3);
  const MessageTag act00{MessageKind::kActivation, 0, 0};
  const MessageTag act10{MessageKind::kActivation, 1, 0};
  const MessageTag act01{MessageKind::kActivation, 0, 1};
  const MessageTag grad00{MessageKind::kGrad, 0, 0};
  SendInts(*ranks[0], 1, act00, {1});
  SendInts(*ranks[0], 1, act10, {2});
  SendInts(*ranks[0], 1, act01, {3});
  SendInts(*ranks[0], 1, grad00, {4});
  SendInts(*ranks[2], 1, act00, {5});
  // Received in another order than sent: each receive gets its own message.
  CHECK(RecvInts(*ranks[1], 2, act00, 1) == std::vector<int>{5});
  CHECK(RecvInts(*ranks[1], 0, grad00, 1) == std::vector<int>{4});
  CHECK(RecvInts(*ranks[1], 0, act01, 1) == std::vector<int>{3});
  CHECK(RecvInts(*ranks[1], 0, act00, 1) == std::vector<int>{1});
  CHECK(RecvInts(*ranks[1], 0, act10, 1) == std::vector<int>{2});
}

TEST_CASE("local transport keeps messages of one tag in order", "[runtime][transport]") {
  auto ranks = Ranks(2);
  const MessageTag tag{MessageKind::kGrad, 3, 2};
  for (int i = 0; i < 10; ++i) SendInts(*ranks[1], 0, tag, {i, i * i});
  for (int i = 0; i < 10; ++i) CHECK(RecvInts(*ranks[0], 1, tag, 2) == std::vector<int>{i, i * i});
}

TEST_CASE("a receive posted before the send completes when the message arrives",
          "[runtime][transport]") {
  auto ranks = Ranks(2);
  const MessageTag tag{MessageKind::kActivation, 7, 0};
  std::vector<int> data(100, 0);
  absl::StatusOr<std::unique_ptr<TransferRequest>> received =
      ranks[1]->Recv(0, tag, data.data(), 400);
  REQUIRE(received.ok());
  CHECK_FALSE(*(*received)->Test());
  const std::vector<int> nines(100, 9);
  bool sent = false;
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sent = ranks[0]->Send(1, tag, nines.data(), 400).ok();
  });
  REQUIRE((*received)->Wait(5.0).ok());
  sender.join();
  CHECK(sent);
  CHECK(*(*received)->Test());
  CHECK(data == std::vector<int>(100, 9));
}

TEST_CASE("local transport reports size mismatches and timeouts clearly",
          "[runtime][transport]") {
  auto ranks = Ranks(2);
  const MessageTag tag{MessageKind::kActivation, 2, 1};
  SendInts(*ranks[0], 1, tag, {1, 2, 3});
  std::vector<int> data(4);
  absl::StatusOr<std::unique_ptr<TransferRequest>> received =
      ranks[1]->Recv(0, tag, data.data(), 16);
  REQUIRE(received.ok());
  absl::Status status = (*received)->Wait(1.0);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) ==
        "local transport: rank 1 expected 16 bytes of activation(mb 2, chunk 1) from rank 0 "
        "but the message has 12");
  CHECK((*received)->Test().status().code() == absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::unique_ptr<TransferRequest>> never =
      ranks[1]->Recv(0, MessageTag{MessageKind::kGrad, 9, 0}, data.data(), 16);
  REQUIRE(never.ok());
  const auto start = std::chrono::steady_clock::now();
  status = (*never)->Wait(0.2);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  CHECK(status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(status.message()).find("rank 1 received no grad(mb 9, chunk 0) from rank 0") !=
        std::string::npos);
}

TEST_CASE("local transport rejects bad peers and sizes", "[runtime][transport]") {
  auto ranks = Ranks(2);
  int x = 0;
  const MessageTag tag{MessageKind::kActivation, 0, 0};
  for (int peer : {-1, 2, 0}) {
    absl::Status status = ranks[0]->Send(peer, tag, &x, 4).status();
    CAPTURE(peer);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(ranks[0]->Send(1, tag, nullptr, 4).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ranks[0]->Recv(1, MessageTag{MessageKind::kGrad, -1, 0}, &x, 4).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(CreateLocalTransports(0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("local barriers pair the k-th calls and time out alone", "[runtime][transport]") {
  auto ranks = Ranks(2);
  std::vector<int> order;
  std::mutex mu;
  int failures = 0;  // Catch2 assertions are not thread-safe: count, check after join
  std::thread other([&] {
    for (int k = 0; k < 5; ++k) {
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(10 + k);
      }
      if (!ranks[1]->Barrier(0, 5.0).ok()) ++failures;
    }
  });
  for (int k = 0; k < 5; ++k) {
    REQUIRE(ranks[0]->Barrier(1, 5.0).ok());
    // Rank 1 reached its k-th barrier before rank 0 passed its own k-th.
    std::lock_guard<std::mutex> lock(mu);
    CHECK(static_cast<int>(order.size()) >= k + 1);
  }
  other.join();
  CHECK(failures == 0);
  const absl::Status alone = ranks[0]->Barrier(1, 0.1);
  CHECK(alone.code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("local transport carries a ring of messages between many threads",
          "[runtime][transport]") {
  constexpr int kRanks = 4;
  constexpr int kMessages = 200;
  auto ranks = Ranks(kRanks);
  std::vector<int> mismatches(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      Transport& me = *ranks[static_cast<std::size_t>(r)];
      const int next = (r + 1) % kRanks;
      const int prev = (r + kRanks - 1) % kRanks;
      for (int i = 0; i < kMessages; ++i) {
        std::vector<int> out(32, r * 1000 + i);
        auto sent = me.Send(next, MessageTag{MessageKind::kActivation, i, 0}, out.data(), 128);
        std::vector<int> in(32, -1);
        auto received = me.Recv(prev, MessageTag{MessageKind::kActivation, i, 0}, in.data(), 128);
        if (!sent.ok() || !received.ok() || !(*received)->Wait(10.0).ok() ||
            in != std::vector<int>(32, prev * 1000 + i)) {
          ++mismatches[static_cast<std::size_t>(r)];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(mismatches == std::vector<int>(kRanks, 0));
}

TEST_CASE("MPI tags are composed compactly and checked against MPI_TAG_UB",
          "[runtime][transport]") {
  using internal::ComposeMpiTag;
  CHECK(*ComposeMpiTag(MessageTag{MessageKind::kActivation, 0, 0}, 16, 32767) == 0);
  CHECK(*ComposeMpiTag(MessageTag{MessageKind::kGrad, 0, 0}, 16, 32767) == 1);
  CHECK(*ComposeMpiTag(MessageTag{MessageKind::kBarrier, 0, 0}, 16, 32767) == 2);
  CHECK(*ComposeMpiTag(MessageTag{MessageKind::kActivation, 0, 1}, 16, 32767) == 3);
  CHECK(*ComposeMpiTag(MessageTag{MessageKind::kGrad, 2, 3}, 16, 32767) == (2 * 16 + 3) * 3 + 1);
  // Distinct messages get distinct tags.
  std::set<int> tags;
  for (int mb = 0; mb < 50; ++mb) {
    for (int chunk = 0; chunk < 4; ++chunk) {
      for (MessageKind kind : {MessageKind::kActivation, MessageKind::kGrad}) {
        tags.insert(*ComposeMpiTag(MessageTag{kind, mb, chunk}, 4, 32767));
      }
    }
  }
  CHECK(tags.size() == 50 * 4 * 2);
  absl::StatusOr<int> big = ComposeMpiTag(MessageTag{MessageKind::kGrad, 700, 1}, 16, 32767);
  REQUIRE(big.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(big.status().message());
  INFO(message);
  CHECK(message.find("would be 33604, above this MPI's MPI_TAG_UB of 32767") != std::string::npos);
  CHECK(ComposeMpiTag(MessageTag{MessageKind::kGrad, 0, 16}, 16, 32767).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload
