// CudaStatus and ScopedDevice (cuda_status.h).
#include "lib/backend/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_check.h"

namespace pipeoffload::internal {

absl::Status CudaStatus(cudaError_t error, const char* statement, const char* file, int line) {
  // Clear first: cudaGetDevice below must not report this error back to us.
  static_cast<void>(cudaGetLastError());
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    device = -1;
    static_cast<void>(cudaGetLastError());
  }
  std::string message =
      absl::StrCat("cuda:", device, ": ", statement, " failed: ", cudaGetErrorName(error), ": ",
                   cudaGetErrorString(error), " (", file, ":", line, ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) PO_CUDA_LOG_IF_ERROR(cudaSetDevice(previous_));
}

absl::Status ScopedDevice::Enter(int device) {
  int current = -1;
  PO_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  if (current == device) return absl::OkStatus();
  PO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  previous_ = current;
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal
