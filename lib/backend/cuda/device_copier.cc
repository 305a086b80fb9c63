// CudaDeviceCopier: the local transport's receive copier for CUDA backends sharing one GPU.
// The copy itself is the generic compute-queue copier (BackendComputeCopier): the CUDA
// backend's CopyAsync is cudaMemcpyAsync with cudaMemcpyDefault on the compute stream, and its
// WaitEvent polls cudaEventQuery, so nothing here needs CUDA types; this file only makes sure
// the backend is a CUDA one (a host memcpy of device pointers would crash instead of failing).
#include "absl/strings/str_cat.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload {

absl::StatusOr<LocalCopyFunction> CudaDeviceCopier(Backend& backend, double timeout_seconds) {
  if (absl::StatusOr<int> device = CudaBackendDevice(backend); !device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("CudaDeviceCopier: the ", backend.Name(),
                                                   " backend is not a CUDA backend"));
  }
  if (!(timeout_seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaDeviceCopier: timeout_seconds must be positive, got ", timeout_seconds));
  }
  return BackendComputeCopier(backend, timeout_seconds);
}

}  // namespace pipeoffload
