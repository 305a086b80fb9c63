// The in-process RankGroup: ranks are threads sharing one hub.
//
// Invariants (guarded by Hub::mu):
//  - AllGather round k of every rank uses rounds[k]: a rank writes its slot, then waits until
//    all num_ranks slots are written; the last rank to read a round erases it, so rounds never
//    mix however far apart the ranks run.
//  - Exchange: a rank appends to mailbox (self, peer) and takes the front of (peer, self), so
//    the k-th calls of a pair meet.
//  - Every wait is a timed wait on the hub's condition variable; a late rank yields
//    DeadlineExceeded, after which the group is not used again (the caller stops).
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/transport/arrivals.h"
#include "pipeoffload/rank_group.h"

namespace pipeoffload {
namespace {

struct Round {
  std::vector<std::string> slots;
  std::vector<bool> came;  // by rank: wrote its slot
  int arrived = 0;
  int departed = 0;
};

struct Hub {
  explicit Hub(int n) : num_ranks(n) {}
  const int num_ranks;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::int64_t, Round> rounds;
  std::map<std::pair<int, int>, std::deque<std::string>> mailboxes;  // (from, to)
};

class LocalRankGroup final : public RankGroup {
 public:
  LocalRankGroup(std::shared_ptr<Hub> hub, int rank, double timeout_seconds)
      : hub_(std::move(hub)), rank_(rank), timeout_(timeout_seconds) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->num_ranks; }
  std::string Name() const override { return "local"; }

  double timeout_seconds() const override { return timeout_; }

  absl::StatusOr<std::vector<std::string>> AllGatherWithin(const std::string& mine,
                                                           double wait_seconds) override {
    if (!(wait_seconds > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("local rank group: the wait must be positive, got ", wait_seconds));
    }
    const std::int64_t k = next_round_++;
    std::unique_lock<std::mutex> lock(hub_->mu);
    Round& round = hub_->rounds[k];
    round.slots.resize(static_cast<std::size_t>(hub_->num_ranks));
    round.came.resize(static_cast<std::size_t>(hub_->num_ranks));
    round.slots[static_cast<std::size_t>(rank_)] = mine;
    round.came[static_cast<std::size_t>(rank_)] = true;
    ++round.arrived;
    hub_->cv.notify_all();
    const bool all = hub_->cv.wait_until(lock, internal::DeadlineAfter(wait_seconds),
                                         [&] { return round.arrived == hub_->num_ranks; });
    if (!all) {
      return absl::DeadlineExceededError(
          absl::StrFormat("rank %d: collective %d (all-gather) waited %.1f s; %s", rank_, k,
                          wait_seconds, internal::DescribeArrivals(round.came)));
    }
    std::vector<std::string> result = round.slots;
    if (++round.departed == hub_->num_ranks) hub_->rounds.erase(k);
    return result;
  }

  absl::StatusOr<std::string> Exchange(int peer, const std::string& mine) override {
    if (peer < 0 || peer >= hub_->num_ranks || peer == rank_) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": cannot exchange with rank ",
                                                     peer, " of ", hub_->num_ranks));
    }
    std::unique_lock<std::mutex> lock(hub_->mu);
    hub_->mailboxes[{rank_, peer}].push_back(mine);
    hub_->cv.notify_all();
    std::deque<std::string>& inbox = hub_->mailboxes[{peer, rank_}];
    if (!hub_->cv.wait_until(lock, internal::DeadlineAfter(timeout_),
                             [&] { return !inbox.empty(); })) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "rank %d: exchange with rank %d waited %.1f s for the peer", rank_, peer, timeout_));
    }
    std::string theirs = std::move(inbox.front());
    inbox.pop_front();
    return theirs;
  }

 private:
  std::shared_ptr<Hub> hub_;
  const int rank_;
  const double timeout_;
  std::int64_t next_round_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<RankGroup>>> CreateLocalRankGroups(
    int num_ranks, double timeout_seconds) {
  if (num_ranks < 1 || !(timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank group: need num_ranks >= 1 and a positive timeout, got ",
                     num_ranks, " and ", timeout_seconds));
  }
  auto hub = std::make_shared<Hub>(num_ranks);
  std::vector<std::unique_ptr<RankGroup>> groups;
  for (int r = 0; r < num_ranks; ++r) {
    groups.push_back(std::make_unique<LocalRankGroup>(hub, r, timeout_seconds));
  }
  return groups;
}

}  // namespace pipeoffload
