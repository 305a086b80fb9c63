// The ranks of one pipeline job as a group, for the few collective exchanges around the
// pipeline: agreeing on set-up (every stage's stash sizes and measured costs, the schedule's
// fingerprint, each phase's status), and whatever a trainer needs beside the pipeline (losses,
// a tied gradient, checksums). The Transport carries the schedule's own messages; this carries
// everything else, so the pipeline's tags stay the schedule's alone.
//
// Two implementations: local (ranks are threads of one process) and MPI (ranks of an mpirun
// job, target pipeoffload::transport_mpi). Every wait is bounded by the group's timeout, so a
// rank whose peers never arrive gets DeadlineExceeded naming the call, never a hang.
#ifndef PIPEOFFLOAD_RANK_GROUP_H_
#define PIPEOFFLOAD_RANK_GROUP_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload {

// One rank's endpoint. Thread-compatible: one thread per endpoint. Collective calls
// (AllGather) must be made by every rank in the same order; Exchange pairs the k-th call of
// rank a naming b with the k-th call of b naming a. After an error the group is not used
// again (a late rank may still be inside the call the others gave up on).
class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string Name() const = 0;  // "local", "mpi"

  // Every rank's `mine` (any bytes, any length), indexed by rank, within the group's timeout.
  // Errors: DeadlineExceeded when some rank does not arrive within the timeout, naming the call
  // and the ranks that did not arrive (e.g. "rank 0: collective 3 waited 5.0 s; ranks 1, 2
  // arrived, rank 3 did not"); Unavailable for an MPI failure.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) {
    return AllGatherWithin(mine, timeout_seconds());
  }
  // AllGather, waiting at most `wait_seconds` (> 0) instead of the group's timeout: for a
  // rank that has failed already and only waits a short while for the others to hear it.
  // Errors: as AllGather's; InvalidArgument for a wait that is not positive.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> AllGatherWithin(
      const std::string& mine, double wait_seconds) = 0;
  // The bound of every wait of AllGather and Exchange.
  virtual double timeout_seconds() const = 0;

  // Sends `mine` to `peer` and returns what `peer` sent in its paired call.
  // Errors: InvalidArgument for a peer out of range or equal to rank(); as AllGather otherwise.
  [[nodiscard]] virtual absl::StatusOr<std::string> Exchange(int peer,
                                                             const std::string& mine) = 0;
};

// `num_ranks` endpoints of one in-process group (element r is rank r), for threads.
// Errors: InvalidArgument for num_ranks < 1 or a non-positive timeout.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<RankGroup>>> CreateLocalRankGroups(
    int num_ranks, double timeout_seconds);

// The group of all ranks of MPI_COMM_WORLD over a private duplicate communicator with
// MPI_ERRORS_RETURN (target pipeoffload::transport_mpi). Initializes MPI when nobody has yet
// (MPI_THREAD_SERIALIZED: one driver thread per rank makes every MPI call) and then finalizes
// it when destroyed, so create it before an MPI or NCCL transport and destroy it after.
// Errors: Unavailable when MPI fails to start; InvalidArgument for a non-positive timeout.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RankGroup>> CreateMpiRankGroup(
    double timeout_seconds);

// Collective: every rank's `payload` when every rank's `mine` is OK. Otherwise an error that
// is the same on every rank, with the first failed rank's code and a message naming `phase`
// and each failed rank with its error (ranks that failed alike are named together, e.g.
// "setup failed on every rank: the schedule has 4 stages ..." or "step 3 failed on 1 of 4 ranks
// (rank 2): ..."). Every rank must call it, whatever its own status, so nobody is left waiting.
//
// A rank whose `mine` is an error waits at most kFailedRankWaitSeconds (or the group's timeout
// when shorter) for the others: the ranks that depend on it fail within about that time of it
// (their own waits are bounded), and a rank that is stopped or dead must not keep the live ones
// from reporting. Errors besides: the group's, annotated with `phase`, and with this rank's own
// failure appended when `mine` is one ("...; this rank had failed: <mine>"): then the ranks
// could not meet, the error may differ between them (each names the ranks it did not hear
// from), and when `group_failed` is not null it is set to true (so a caller can end the job
// instead of trying to meet again); DataLoss for a malformed message.
inline constexpr double kFailedRankWaitSeconds = 5.0;
[[nodiscard]] absl::StatusOr<std::vector<std::string>> AllGatherChecked(
    RankGroup& group, const absl::Status& mine, const std::string& payload, std::string_view phase,
    bool* group_failed = nullptr);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_RANK_GROUP_H_
