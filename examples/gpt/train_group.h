// The gpt_train ranks' side channel: the few collective exchanges the pipeline driver needs
// around the runtime (setup agreement, per-step losses and status, the tied-embedding gradient,
// checksums, traces). The runtime's Transport carries the pipeline's own traffic; this carries
// everything else, so the pipeline's tags stay the schedule's alone.
//
// Two implementations: local (ranks are threads of one process, `--transport local`) and MPI
// (ranks of an mpirun job). Every wait is bounded by the group's timeout, so a rank whose peers
// never arrive gets DeadlineExceeded naming the call, never a hang.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_GROUP_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::gpt {

// One rank's endpoint. Thread-compatible: one thread per endpoint. Collective calls
// (AllGather) must be made by every rank in the same order; Exchange pairs the k-th call of
// rank a naming b with the k-th call of b naming a.
class TrainGroup {
 public:
  virtual ~TrainGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string Name() const = 0;  // "local", "mpi"

  // Every rank's `mine` (any bytes, any length), indexed by rank.
  // Errors: DeadlineExceeded when some rank does not arrive within the timeout (the message
  // says which call); Unavailable for an MPI failure.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> AllGather(
      const std::string& mine) = 0;

  // Sends `mine` to `peer` and returns what `peer` sent in its paired call.
  // Errors: InvalidArgument for a peer out of range or equal to rank(); as AllGather otherwise.
  [[nodiscard]] virtual absl::StatusOr<std::string> Exchange(int peer, const std::string& mine) = 0;

  // Ends the whole job at once with `exit_code` (MPI_Abort; the process exits for local ranks),
  // for failures after which the ranks cannot meet again. Print the reason first.
  [[noreturn]] virtual void Abort(int exit_code) = 0;
};

// `num_ranks` endpoints of one in-process group (element r is rank r), for threads.
// Errors: InvalidArgument for num_ranks < 1 or a non-positive timeout.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<TrainGroup>>> CreateLocalTrainGroups(
    int num_ranks, double timeout_seconds);

// True when gpt_train was built with MPI support.
bool MpiAvailable();
// True when this process looks like a rank started by mpirun / mpiexec / srun (their
// environment variables), without initializing MPI.
bool LaunchedByMpi();

// The group of all ranks of MPI_COMM_WORLD. Initializes MPI when nobody has yet (and finalizes
// it when destroyed), so create it before the MPI transport, and destroy it after.
// Errors: Unimplemented when built without MPI; Unavailable when MPI fails to start;
// InvalidArgument for a non-positive timeout.
[[nodiscard]] absl::StatusOr<std::unique_ptr<TrainGroup>> CreateMpiTrainGroup(
    double timeout_seconds);

// The runtime's MPI transport for the pipeline (CreateMpiTransport), able to tag up to
// `max_chunks` chunks per stage. Create it after the MPI group.
// Errors: Unimplemented when built without MPI; CreateMpiTransport's.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Transport>> CreateMpiStageTransport(int max_chunks);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_GROUP_H_
