// Small copies done by the SMs (one tiny kernel) instead of the copy engines. A cudaMemcpyAsync
// goes to a copy engine, where a copy of a few bytes queues behind whatever bulk copy of the same
// direction is running: with activation offload that is an OFFLOAD or RELOAD of tens of ms. The
// NCCL transport's 32-byte message headers moved that way held every later message on its
// in-order stream back by up to one bulk copy (two H200s: a send finished 40 ms late, at the end
// of the concurrent 2.15 GB offload; docs/benchmarks.md). A kernel on the same stream keeps the
// stream's order and never waits for a copy engine.
#ifndef PIPEOFFLOAD_LIB_BACKEND_CUDA_SM_COPY_KERNEL_H_
#define PIPEOFFLOAD_LIB_BACKEND_CUDA_SM_COPY_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::internal {

// Enqueues dst[0, bytes) = src[0, bytes) on `stream`, one block of threads copying 4-byte words.
// Both pointers must be device-accessible (device memory, or the device pointer of mapped pinned
// host memory: cudaHostGetDevicePointer) and 4-byte aligned; bytes a multiple of 4 and at most
// kMaxSmCopyBytes (it is meant for headers and flags, not payloads). Writes to host memory are
// fenced system-wide before the kernel ends, so once an event recorded after it completes, the
// host reads what it wrote. Returns cudaErrorInvalidValue for bad sizes, else the launch's error.
inline constexpr std::int64_t kMaxSmCopyBytes = 64 * 1024;
cudaError_t LaunchSmCopy(void* dst, const void* src, std::int64_t bytes, cudaStream_t stream);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BACKEND_CUDA_SM_COPY_KERNEL_H_
