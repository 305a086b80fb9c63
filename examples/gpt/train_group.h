// gpt_train's ranks: the library's rank groups (pipeoffload/rank_group.h: local threads, or the
// ranks of an mpirun job) carry the few collective exchanges around the pipeline (set-up
// agreement, per-step losses and status, the tied-embedding gradient, checksums, traces), and
// the MPI transport carries the pipeline's own traffic. What is gpt_train's own here: whether
// MPI is there, the job's end when the ranks cannot meet again.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_GROUP_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_GROUP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "pipeoffload/rank_group.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::gpt {

// True when gpt_train was built with MPI support.
bool MpiAvailable();
// True when this process looks like a rank started by mpirun / mpiexec / srun (their
// environment variables), without initializing MPI.
bool LaunchedByMpi();

// CreateMpiRankGroup: create it before the MPI transport, and destroy it after (it finalizes
// MPI). Errors: Unimplemented when built without MPI; CreateMpiRankGroup's.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RankGroup>> CreateMpiTrainGroup(
    double timeout_seconds);

// The runtime's MPI transport for the pipeline (CreateMpiTransport), able to tag up to
// `max_chunks` chunks per stage. Create it after the MPI group.
// Errors: Unimplemented when built without MPI; CreateMpiTransport's.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Transport>> CreateMpiStageTransport(int max_chunks);

// Ends the whole job at once with `exit_code` (MPI_Abort for an MPI group; the process exits
// for local ranks), for failures after which the ranks cannot meet again. Print the reason
// first.
[[noreturn]] void AbortJob(const RankGroup& group, int exit_code);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_GROUP_H_
