// Builds without CUDA have no CUDA backend to run the engine's arithmetic on.
#include "lib/optim/offload_device_ops.h"

namespace pipeoffload::internal {

absl::StatusOr<std::unique_ptr<OffloadDeviceOps>> CreateCudaOffloadDeviceOps(Backend&) {
  return std::unique_ptr<OffloadDeviceOps>();
}

}  // namespace pipeoffload::internal
