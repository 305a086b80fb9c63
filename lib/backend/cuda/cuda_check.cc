// The reporters behind PO_CUDA_CHECK and PO_CUDA_LOG_IF_ERROR (cuda_check.h).
#include "lib/backend/cuda/cuda_check.h"

#include <cstdio>
#include <cstdlib>

namespace pipeoffload::internal {
namespace {

void Report(const char* what, cudaError_t error, const char* statement, const char* file,
            int line) {
  int device = -1;
  // Best effort: after a fatal error even this may fail, which is why -1 is printed then.
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  std::fprintf(stderr, "pipeoffload: %s: %s at %s:%d on device %d: %s: %s\n", what, statement,
               file, line, device, cudaGetErrorName(error), cudaGetErrorString(error));
  std::fflush(stderr);
}

}  // namespace

void CudaFatal(cudaError_t error, const char* statement, const char* file, int line) {
  Report("cuda check failed", error, statement, file, line);
  std::abort();
}

void CudaLogError(cudaError_t error, const char* statement, const char* file, int line) {
  Report("cuda call failed (ignored during teardown)", error, statement, file, line);
  // Clears the thread's last-error state; sticky errors (a lost context) stay, by design.
  static_cast<void>(cudaGetLastError());
}

}  // namespace pipeoffload::internal
