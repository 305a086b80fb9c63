// gpt_train built without MPI: the MPI group is unavailable and says so (the local group and the
// single-process reference still work).
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "examples/gpt/train_group.h"

namespace pipeoffload::gpt {

bool MpiAvailable() { return false; }

absl::StatusOr<std::unique_ptr<RankGroup>> CreateMpiTrainGroup(double /*timeout_seconds*/) {
  return absl::UnimplementedError(
      "gpt_train was built without MPI (configure with MPI installed and -DPO_WITH_MPI=ON); use "
      "--transport local to run the stages as threads");
}

absl::StatusOr<std::unique_ptr<Transport>> CreateMpiStageTransport(int /*max_chunks*/) {
  return absl::UnimplementedError("gpt_train was built without MPI");
}

void AbortJob(const RankGroup& /*group*/, int exit_code) {
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

}  // namespace pipeoffload::gpt
