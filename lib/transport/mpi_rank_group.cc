// The MPI RankGroup: all ranks of MPI_COMM_WORLD, over a private duplicate communicator.
//
// Invariants:
//  - Every MPI call is checked; the communicator has MPI_ERRORS_RETURN, so a failure becomes an
//    Unavailable Status with MPI_Error_string's text.
//  - Only non-blocking calls are posted, then polled with MPI_Testall and a short sleep until
//    the group's deadline: a rank whose peers never come reports DeadlineExceeded instead of
//    hanging inside MPI.
//  - Variable-size payloads go in two phases (sizes, then bytes); MPI's non-overtaking rule
//    keeps the two messages of one Exchange in order. An all-gather's sizes go point to point
//    (tag kGatherTag), so that a rank that times out names the ranks it did not hear from.
#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/transport/arrivals.h"
#include "lib/transport/mpi_comm.h"
#include "pipeoffload/rank_group.h"

namespace pipeoffload {
namespace {

constexpr char kWho[] = "mpi rank group";
constexpr double kPollSeconds = 50e-6;
constexpr int kExchangeTag = 7;
constexpr int kGatherTag = 8;  // the sizes of AllGatherWithin

#define PO_GROUP_MPI_RETURN_IF_ERROR(call) PO_MPI_RETURN_IF_ERROR_AS(kWho, call)

class MpiRankGroup final : public RankGroup {
 public:
  MpiRankGroup(internal::MpiComm mpi, double timeout_seconds)
      : mpi_(mpi), timeout_(timeout_seconds) {}
  ~MpiRankGroup() override {
    if (!internal::MpiFinalized()) {
      for (std::unique_ptr<Transfers>& transfers : abandoned_) {
        for (MPI_Request& request : transfers->requests) {
          if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
        }
        // A freed request may still complete into its buffer: leak it (failed calls only).
        static_cast<void>(transfers.release());
      }
    }
    internal::FreeMpiComm(mpi_);
  }

  int rank() const override { return mpi_.rank; }
  int size() const override { return mpi_.size; }
  std::string Name() const override { return "mpi"; }

  double timeout_seconds() const override { return timeout_; }

  absl::StatusOr<std::vector<std::string>> AllGatherWithin(const std::string& mine,
                                                           double wait_seconds) override {
    if (!(wait_seconds > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWho, ": the wait must be positive, got ", wait_seconds));
    }
    const std::int64_t k = next_round_++;
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWho, ": all-gather payload of ", mine.size(), " bytes"));
    }
    const auto n = static_cast<std::size_t>(mpi_.size);
    auto round = std::make_unique<Transfers>(2 * n + 1);
    round->my_size = static_cast<long long>(mine.size());
    round->mine = mine;
    round->sizes.assign(n, 0);
    round->sizes[static_cast<std::size_t>(mpi_.rank)] = round->my_size;
    // The sizes go point to point, not through MPI_Iallgather, so that a rank giving up knows
    // which ranks it heard from. Messages of one (source, tag) are matched in order, so the
    // k-th receive from a rank takes its k-th round. requests[r]: the receive from r;
    // requests[n + r]: the send to r; requests[2n]: the data phase.
    MPI_Request* receives = round->requests.data();
    MPI_Request* sends = receives + n;
    for (int r = 0; r < mpi_.size; ++r) {
      if (r == mpi_.rank) continue;
      const auto i = static_cast<std::size_t>(r);
      PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Irecv(&round->sizes[i], 1, MPI_LONG_LONG, r, kGatherTag,
                                             mpi_.comm, &receives[i]));
      PO_GROUP_MPI_RETURN_IF_ERROR(
          MPI_Isend(&round->my_size, 1, MPI_LONG_LONG, r, kGatherTag, mpi_.comm, &sends[i]));
    }
    const std::string sizes_what = absl::StrCat("collective ", k, " (sizes)");
    if (absl::Status done = Await(receives, mpi_.size, sizes_what, wait_seconds); !done.ok()) {
      std::vector<bool> arrived(n, true);
      for (std::size_t r = 0; r < n; ++r) {
        int flag = 1;
        if (receives[r] != MPI_REQUEST_NULL) MPI_Test(&receives[r], &flag, MPI_STATUS_IGNORE);
        arrived[r] = flag != 0;
      }
      Abandon(std::move(round));
      if (done.code() != absl::StatusCode::kDeadlineExceeded) return done;
      return absl::DeadlineExceededError(
          absl::StrFormat("rank %d: %s waited %.1f s; %s", mpi_.rank, sizes_what, wait_seconds,
                          internal::DescribeArrivals(arrived)));
    }
    if (absl::Status sent = Await(sends, mpi_.size, sizes_what, wait_seconds); !sent.ok()) {
      Abandon(std::move(round));
      return sent;
    }
    std::vector<int> counts(n);
    std::vector<int> displacements(n);
    long long total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if (total + round->sizes[r] > INT_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(kWho, ": all-gather total exceeds 2 GiB"));
      }
      counts[r] = static_cast<int>(round->sizes[r]);
      displacements[r] = static_cast<int>(total);
      total += round->sizes[r];
    }
    round->theirs.assign(static_cast<std::size_t>(total), '\0');
    MPI_Request* data = &round->requests[2 * n];
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Iallgatherv(
        round->mine.data(), static_cast<int>(round->my_size), MPI_BYTE, round->theirs.data(),
        counts.data(), displacements.data(), MPI_BYTE, mpi_.comm, data));
    if (absl::Status done =
            Await(data, 1, absl::StrCat("collective ", k, " (data)"), wait_seconds);
        !done.ok()) {
      Abandon(std::move(round));
      return done;
    }
    std::vector<std::string> result;
    for (std::size_t r = 0; r < n; ++r) {
      result.push_back(round->theirs.substr(static_cast<std::size_t>(displacements[r]),
                                            static_cast<std::size_t>(counts[r])));
    }
    return result;
  }

  absl::StatusOr<std::string> Exchange(int peer, const std::string& mine) override {
    if (peer < 0 || peer >= mpi_.size || peer == mpi_.rank) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", mpi_.rank,
                                                     ": cannot exchange with rank ", peer, " of ",
                                                     mpi_.size));
    }
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWho, ": exchange payload of ", mine.size(), " bytes"));
    }
    auto round = std::make_unique<Transfers>(2);
    round->my_size = static_cast<long long>(mine.size());
    round->mine = mine;
    round->sizes.assign(1, 0);  // the peer's size
    MPI_Request* requests = round->requests.data();
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Irecv(&round->sizes[0], 1, MPI_LONG_LONG, peer,
                                           kExchangeTag, mpi_.comm, &requests[0]));
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Isend(&round->my_size, 1, MPI_LONG_LONG, peer,
                                           kExchangeTag, mpi_.comm, &requests[1]));
    const std::string what = absl::StrCat("exchange with rank ", peer);
    if (absl::Status done = Await(requests, 2, what, timeout_); !done.ok()) {
      Abandon(std::move(round));
      return done;
    }
    const long long their_size = round->sizes[0];
    if (their_size < 0 || their_size > INT_MAX) {
      return absl::DataLossError(
          absl::StrCat(kWho, ": rank ", peer, " announced ", their_size, " bytes"));
    }
    round->theirs.assign(static_cast<std::size_t>(their_size), '\0');
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Irecv(round->theirs.data(), static_cast<int>(their_size),
                                           MPI_BYTE, peer, kExchangeTag, mpi_.comm,
                                           &requests[0]));
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Isend(round->mine.data(), static_cast<int>(round->my_size),
                                           MPI_BYTE, peer, kExchangeTag, mpi_.comm,
                                           &requests[1]));
    if (absl::Status done = Await(requests, 2, what, timeout_); !done.ok()) {
      Abandon(std::move(round));
      return done;
    }
    return std::move(round->theirs);
  }

 private:
  // The buffers and requests of one collective or exchange. MPI may still write into (or read
  // from) them after a timeout, so they live on the heap and a call that gives up hands them
  // to Abandon instead of freeing them.
  struct Transfers {
    explicit Transfers(std::size_t num_requests) : requests(num_requests, MPI_REQUEST_NULL) {}
    long long my_size = 0;
    std::string mine;
    std::vector<long long> sizes;
    std::string theirs;
    std::vector<MPI_Request> requests;
  };

  // Keeps a timed-out call's buffers alive for as long as MPI may use them: to the end of the
  // process (the destructor frees the requests and leaks the few bytes on purpose; only calls
  // that failed ever get here).
  void Abandon(std::unique_ptr<Transfers> transfers) { abandoned_.push_back(std::move(transfers)); }

  // Polls `requests` until all complete or `wait_seconds` pass. On a timeout the requests stay
  // posted (Abandon keeps their buffers): the caller stops using the group.
  absl::Status Await(MPI_Request* requests, int count, const std::string& what,
                     double wait_seconds) {
    const auto deadline = internal::DeadlineAfter(wait_seconds);
    while (true) {
      int flag = 0;
      PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Testall(count, requests, &flag, MPI_STATUSES_IGNORE));
      if (flag) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "rank %d: %s waited %.1f s; some rank never arrived", mpi_.rank, what, wait_seconds));
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
    }
  }

  internal::MpiComm mpi_;
  const double timeout_;
  std::int64_t next_round_ = 0;
  std::vector<std::unique_ptr<Transfers>> abandoned_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RankGroup>> CreateMpiRankGroup(double timeout_seconds) {
  if (!(timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWho, ": the timeout must be positive, got ", timeout_seconds));
  }
  absl::StatusOr<internal::MpiComm> mpi = internal::DupMpiWorld(kWho);
  if (!mpi.ok()) return mpi.status();
  return std::unique_ptr<RankGroup>(new MpiRankGroup(*mpi, timeout_seconds));
}

}  // namespace pipeoffload
