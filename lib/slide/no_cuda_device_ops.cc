// Builds without CUDA have no CUDA backend to run on.
#include "lib/slide/device_ops.h"

namespace pipeoffload::internal {

absl::StatusOr<std::unique_ptr<SlideDeviceOps>> CreateCudaSlideDeviceOps(Backend&, SlideDtype) {
  return std::unique_ptr<SlideDeviceOps>();
}

}  // namespace pipeoffload::internal
