// SmCopyKernel and its launcher (sm_copy_kernel.h).
#include "lib/backend/cuda/sm_copy_kernel.h"

namespace pipeoffload::internal {
namespace {

constexpr int kThreads = 256;

__global__ void SmCopyKernel(std::uint32_t* dst, const std::uint32_t* src,
                             std::int64_t num_words) {
  for (std::int64_t i = threadIdx.x; i < num_words; i += blockDim.x) dst[i] = src[i];
  // The destination may be host memory that the host reads once it sees the kernel done.
  __threadfence_system();
}

}  // namespace

cudaError_t LaunchSmCopy(void* dst, const void* src, std::int64_t bytes, cudaStream_t stream) {
  if (bytes < 0 || bytes % 4 != 0 || bytes > kMaxSmCopyBytes) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  SmCopyKernel<<<1, kThreads, 0, stream>>>(static_cast<std::uint32_t*>(dst),
                                           static_cast<const std::uint32_t*>(src), bytes / 4);
  return cudaGetLastError();
}

}  // namespace pipeoffload::internal
