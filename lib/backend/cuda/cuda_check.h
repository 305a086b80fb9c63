// Checks for CUDA runtime calls, in the abort and the ignore-in-teardown flavours. Free of
// Abseil so that .cu files can include it; the Status flavour is cuda_status.h.
//
// PO_CUDA_CHECK is for calls that cannot fail unless the program has a bug or the device is
// lost (tests, benchmarks, examples). Library code that a caller could act on returns a Status
// instead (PO_CUDA_RETURN_IF_ERROR); destructors use PO_CUDA_LOG_IF_ERROR.
#ifndef PIPEOFFLOAD_LIB_BACKEND_CUDA_CUDA_CHECK_H_
#define PIPEOFFLOAD_LIB_BACKEND_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

namespace pipeoffload::internal {

// Prints "cuda check failed: <statement> at <file>:<line> on device <d>: <name>: <text>" to
// stderr and aborts.
[[noreturn]] void CudaFatal(cudaError_t error, const char* statement, const char* file,
                            int line);

// Prints the same line (as a warning) and returns; clears the error state of the calling thread
// so the next call does not report it again.
void CudaLogError(cudaError_t error, const char* statement, const char* file, int line);

}  // namespace pipeoffload::internal

// Aborts with the statement, location, device and CUDA's message when `call` fails.
#define PO_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    const cudaError_t po_cuda_error_ = (call);                                       \
    if (po_cuda_error_ != cudaSuccess) {                                             \
      ::pipeoffload::internal::CudaFatal(po_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

// Logs a failure of `call` and carries on: for destructors and teardown after an error.
#define PO_CUDA_LOG_IF_ERROR(call)                                                       \
  do {                                                                                   \
    const cudaError_t po_cuda_error_ = (call);                                           \
    if (po_cuda_error_ != cudaSuccess) {                                                 \
      ::pipeoffload::internal::CudaLogError(po_cuda_error_, #call, __FILE__, __LINE__);  \
    }                                                                                    \
  } while (0)

#endif  // PIPEOFFLOAD_LIB_BACKEND_CUDA_CUDA_CHECK_H_
