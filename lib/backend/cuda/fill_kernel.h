// The kernel behind CudaBackend::FillAsync: the runtime API has no 32-bit memset (that is the
// driver's cuMemsetD32Async, and linking libcuda directly would stop our binaries from even
// loading on machines without a driver, where tests must report "no GPU" instead).
#ifndef PIPEOFFLOAD_LIB_BACKEND_CUDA_FILL_KERNEL_H_
#define PIPEOFFLOAD_LIB_BACKEND_CUDA_FILL_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::internal {

// Enqueues words[0, num_words) = pattern on `stream`. `words` is device memory, 4-byte aligned;
// num_words >= 0 (0 enqueues nothing). Returns the launch's error (cudaGetLastError after it).
cudaError_t LaunchFillWords(std::uint32_t* words, std::uint32_t pattern, std::int64_t num_words,
                            cudaStream_t stream);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BACKEND_CUDA_FILL_KERNEL_H_
