// gpt_train built with MPI: the library's MPI group and transport, and MPI_Abort for the end.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "examples/gpt/train_group.h"

namespace pipeoffload::gpt {

bool MpiAvailable() { return true; }

absl::StatusOr<std::unique_ptr<RankGroup>> CreateMpiTrainGroup(double timeout_seconds) {
  return CreateMpiRankGroup(timeout_seconds);
}

absl::StatusOr<std::unique_ptr<Transport>> CreateMpiStageTransport(int max_chunks) {
  MpiTransportOptions options;
  options.max_chunks = max_chunks;
  return CreateMpiTransport(options);
}

void AbortJob(const RankGroup& group, int exit_code) {
  std::fflush(nullptr);
  if (group.Name() == "mpi") MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // local ranks; and MPI_Abort does not return
}

}  // namespace pipeoffload::gpt
