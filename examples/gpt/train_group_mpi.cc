// The MPI TrainGroup: all ranks of MPI_COMM_WORLD, over a private duplicate communicator.
//
// Invariants:
//  - Every MPI call is checked; the communicator has MPI_ERRORS_RETURN, so a failure becomes an
//    Unavailable Status with MPI_Error_string's text.
//  - Only non-blocking calls are posted, then polled with MPI_Testall and a short sleep until
//    the group's deadline: a rank whose peers never come reports DeadlineExceeded instead of
//    hanging inside MPI (the job then ends through Abort).
//  - Variable-size payloads go in two phases (sizes, then bytes); MPI's non-overtaking rule
//    keeps the two messages of one Exchange in order.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/gpt/train_group.h"
#include "lib/backend/clock.h"

namespace pipeoffload::gpt {
namespace {

constexpr double kPollSeconds = 50e-6;
constexpr int kExchangeTag = 7;

absl::Status MpiError(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  return absl::UnavailableError(
      absl::StrCat("mpi train group: ", call, " failed: ", std::string(text, length)));
}

#define PO_GROUP_MPI_RETURN_IF_ERROR(call)                             \
  do {                                                                 \
    const int po_mpi_rc_ = (call);                                     \
    if (po_mpi_rc_ != MPI_SUCCESS) return MpiError(po_mpi_rc_, #call); \
  } while (0)

class MpiTrainGroup final : public TrainGroup {
 public:
  MpiTrainGroup(MPI_Comm comm, int rank, int size, bool owns_mpi, double timeout_seconds)
      : comm_(comm), rank_(rank), size_(size), owns_mpi_(owns_mpi), timeout_(timeout_seconds) {}

  ~MpiTrainGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override { return "mpi"; }

  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) override {
    const std::int64_t k = next_round_++;
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi train group: all-gather payload of ", mine.size(), " bytes"));
    }
    long long my_size = static_cast<long long>(mine.size());
    std::vector<long long> sizes(static_cast<std::size_t>(size_));
    MPI_Request request = MPI_REQUEST_NULL;
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Iallgather(&my_size, 1, MPI_LONG_LONG, sizes.data(), 1,
                                                MPI_LONG_LONG, comm_, &request));
    if (absl::Status done = Await(&request, 1, absl::StrCat("collective ", k, " (sizes)"));
        !done.ok()) {
      return done;
    }
    std::vector<int> counts(static_cast<std::size_t>(size_));
    std::vector<int> displacements(static_cast<std::size_t>(size_));
    long long total = 0;
    for (int r = 0; r < size_; ++r) {
      if (total + sizes[r] > INT_MAX) {
        return absl::InvalidArgumentError("mpi train group: all-gather total exceeds 2 GiB");
      }
      counts[r] = static_cast<int>(sizes[r]);
      displacements[r] = static_cast<int>(total);
      total += sizes[r];
    }
    std::string all(static_cast<std::size_t>(total), '\0');
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Iallgatherv(mine.data(), static_cast<int>(my_size), MPI_BYTE,
                                                 all.data(), counts.data(), displacements.data(),
                                                 MPI_BYTE, comm_, &request));
    if (absl::Status done = Await(&request, 1, absl::StrCat("collective ", k, " (data)"));
        !done.ok()) {
      return done;
    }
    std::vector<std::string> result;
    for (int r = 0; r < size_; ++r) result.push_back(all.substr(displacements[r], counts[r]));
    return result;
  }

  absl::StatusOr<std::string> Exchange(int peer, const std::string& mine) override {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, ": cannot exchange with rank ", peer, " of ", size_));
    }
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi train group: exchange payload of ", mine.size(), " bytes"));
    }
    long long my_size = static_cast<long long>(mine.size());
    long long their_size = 0;
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    PO_GROUP_MPI_RETURN_IF_ERROR(
        MPI_Irecv(&their_size, 1, MPI_LONG_LONG, peer, kExchangeTag, comm_, &requests[0]));
    PO_GROUP_MPI_RETURN_IF_ERROR(
        MPI_Isend(&my_size, 1, MPI_LONG_LONG, peer, kExchangeTag, comm_, &requests[1]));
    const std::string what = absl::StrCat("exchange with rank ", peer);
    if (absl::Status done = Await(requests, 2, what); !done.ok()) return done;
    if (their_size < 0 || their_size > INT_MAX) {
      return absl::DataLossError(
          absl::StrCat("mpi train group: rank ", peer, " announced ", their_size, " bytes"));
    }
    std::string theirs(static_cast<std::size_t>(their_size), '\0');
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Irecv(theirs.data(), static_cast<int>(their_size), MPI_BYTE,
                                           peer, kExchangeTag, comm_, &requests[0]));
    PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Isend(mine.data(), static_cast<int>(my_size), MPI_BYTE, peer,
                                           kExchangeTag, comm_, &requests[1]));
    if (absl::Status done = Await(requests, 2, what); !done.ok()) return done;
    return theirs;
  }

  [[noreturn]] void Abort(int exit_code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  // Polls `requests` until all complete or the deadline passes. On a timeout the requests stay
  // posted: the caller stops using the group and ends the job.
  absl::Status Await(MPI_Request* requests, int count, const std::string& what) {
    const auto deadline = internal::DeadlineAfter(timeout_);
    while (true) {
      int flag = 0;
      PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Testall(count, requests, &flag, MPI_STATUSES_IGNORE));
      if (flag) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "rank %d: %s waited %.1f s; some rank never arrived", rank_, what, timeout_));
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
    }
  }

  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const bool owns_mpi_;
  const double timeout_;
  std::int64_t next_round_ = 0;
};

}  // namespace

bool MpiAvailable() { return true; }

absl::StatusOr<std::unique_ptr<Transport>> CreateMpiStageTransport(int max_chunks) {
  MpiTransportOptions options;
  options.max_chunks = max_chunks;
  return CreateMpiTransport(options);
}

absl::StatusOr<std::unique_ptr<TrainGroup>> CreateMpiTrainGroup(double timeout_seconds) {
  if (!(timeout_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mpi train group: the timeout must be positive, got ", timeout_seconds));
  }
  int initialized = 0;
  PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  bool owns_mpi = false;
  if (!initialized) {
    // SERIALIZED: the rank's one driver thread makes every MPI call (the group's and the
    // transport's); the CPU backend's copy threads never touch MPI.
    int provided = 0;
    PO_GROUP_MPI_RETURN_IF_ERROR(
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    owns_mpi = true;
  }
  MPI_Comm comm = MPI_COMM_NULL;
  PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0;
  int size = 0;
  PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank));
  PO_GROUP_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size));
  return std::unique_ptr<TrainGroup>(
      new MpiTrainGroup(comm, rank, size, owns_mpi, timeout_seconds));
}

}  // namespace pipeoffload::gpt
