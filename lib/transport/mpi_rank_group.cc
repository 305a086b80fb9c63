// The MPI RankGroup: all ranks of MPI_COMM_WORLD, over a private duplicate communicator.
//
// Invariants:
//  - Every MPI call is checked; the communicator has MPI_ERRORS_RETURN, so a failure becomes an
//    Unavailable Status with MPI_Error_string's text.
//  - Only non-blocking calls are posted, then polled with MPI_Testall and a short sleep until
//    the group's deadline: a rank whose peers never come reports DeadlineExceeded instead of
//    hanging inside MPI.
//  - Variable-size payloads go in two phases (sizes, then bytes); MPI's non-overtaking rule
//    keeps the two messages of one Exchange in order.
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/transport/mpi_comm.h"
#include "pipeoffload/rank_group.h"

namespace pipeoffload {
namespace {

constexpr char kWho[] = "mpi rank group";
constexpr double kPollSeconds = 50e-6;
constexpr int kExchangeTag = 7;

#define PO_GROUP_MPI_RETURN_IF_ERROR(call) PO_MPI_RETURN_IF_ERROR_AS(kWho, call)

class MpiRankGroup final : public RankGroup {
 public:
  MpiRankGroup(internal::MpiComm mpi, double timeout_seconds)
      : mpi_(mpi), timeout_(timeout_seconds) {}
  ~MpiRankGroup() override { internal::FreeMpiComm(mpi_); }

  int rank() const override { return mpi_.rank; }
  int size() const override { return mpi_.size; }
  std::string Name() const override { return "mpi"; }

  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) override {
    const std::int64_t k = next_round_++;
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWho, ": all-gather payload of ", mine.size(), " bytes"));
    }
    long long my_size = static_cast<long long>(mine.size());
    std::vector<long long> sizes(static_cast<std::size_t>(mpi_.size));
    MPI_Request request = MPI_REQUEST_NULL;
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Iallgather(&my_size, 1, MPI_LONG_LONG, sizes.data(), 1,
                                                MPI_LONG_LONG, mpi_.comm, &request));
    if (absl::Status done = Await(&request, 1, absl::StrCat("collective ", k, " (sizes)"));
        !done.ok()) {
      return done;
    }
    std::vector<int> counts(static_cast<std::size_t>(mpi_.size));
    std::vector<int> displacements(static_cast<std::size_t>(mpi_.size));
    long long total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      if (total + sizes[r] > INT_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(kWho, ": all-gather total exceeds 2 GiB"));
      }
      counts[r] = static_cast<int>(sizes[r]);
      displacements[r] = static_cast<int>(total);
      total += sizes[r];
    }
    std::string all(static_cast<std::size_t>(total), '\0');
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Iallgatherv(mine.data(), static_cast<int>(my_size), MPI_BYTE,
                                                 all.data(), counts.data(), displacements.data(),
                                                 MPI_BYTE, mpi_.comm, &request));
    if (absl::Status done = Await(&request, 1, absl::StrCat("collective ", k, " (data)"));
        !done.ok()) {
      return done;
    }
    std::vector<std::string> result;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      result.push_back(all.substr(static_cast<std::size_t>(displacements[r]),
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
    long long my_size = static_cast<long long>(mine.size());
    long long their_size = 0;
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    PO_GROUP_MPI_RETURN_IF_ERROR(
        MPI_Irecv(&their_size, 1, MPI_LONG_LONG, peer, kExchangeTag, mpi_.comm, &requests[0]));
    PO_GROUP_MPI_RETURN_IF_ERROR(
        MPI_Isend(&my_size, 1, MPI_LONG_LONG, peer, kExchangeTag, mpi_.comm, &requests[1]));
    const std::string what = absl::StrCat("exchange with rank ", peer);
    if (absl::Status done = Await(requests, 2, what); !done.ok()) return done;
    if (their_size < 0 || their_size > INT_MAX) {
      return absl::DataLossError(
          absl::StrCat(kWho, ": rank ", peer, " announced ", their_size, " bytes"));
    }
    std::string theirs(static_cast<std::size_t>(their_size), '\0');
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Irecv(theirs.data(), static_cast<int>(their_size), MPI_BYTE,
                                           peer, kExchangeTag, mpi_.comm, &requests[0]));
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Isend(mine.data(), static_cast<int>(my_size), MPI_BYTE, peer,
                                           kExchangeTag, mpi_.comm, &requests[1]));
    if (absl::Status done = Await(requests, 2, what); !done.ok()) return done;
    return theirs;
  }

 private:
  // Polls `requests` until all complete or the deadline passes. On a timeout the requests stay
  // posted: the caller stops using the group.
  absl::Status Await(MPI_Request* requests, int count, const std::string& what) {
    const auto deadline = internal::DeadlineAfter(timeout_);
    while (true) {
      int flag = 0;
      PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Testall(count, requests, &flag, MPI_STATUSES_IGNORE));
      if (flag) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "rank %d: %s waited %.1f s; some rank never arrived", mpi_.rank, what, timeout_));
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
    }
  }

  internal::MpiComm mpi_;
  const double timeout_;
  std::int64_t next_round_ = 0;
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
