// Test kernels (test_kernels.h).
#include "tests/gpu/test_kernels.h"

namespace pipeoffload::testing {
namespace {

constexpr int kThreads = 256;

__device__ unsigned long long GlobalTimerNs() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void SpinKernel(unsigned long long nanoseconds) {
  const unsigned long long start = GlobalTimerNs();
  while (GlobalTimerNs() - start < nanoseconds) {
  }
}

__global__ void AffineForwardKernel(const float* x, const float* a, const float* b, float* y,
                                    std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __fmaf_rn(a[i], x[i], b[i]);  // explicit: the CPU reference uses fmaf
}

__global__ void AffineBackwardKernel(const float* x, const float* gy, const float* a, float* gx,
                                     float* ga, float* gb, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (gx != nullptr) gx[i] = __fmul_rn(a[i], gy[i]);
  ga[i] = __fmaf_rn(gy[i], x[i], ga[i]);
  gb[i] = __fadd_rn(gb[i], gy[i]);
}

unsigned Blocks(std::int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t LaunchSpin(cudaStream_t stream, double seconds) {
  SpinKernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(seconds * 1e9));
  return cudaGetLastError();
}

cudaError_t LaunchAffineForward(const float* x, const float* a, const float* b, float* y,
                                std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AffineForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, a, b, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchAffineBackward(const float* x, const float* gy, const float* a, float* gx,
                                 float* ga, float* gb, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AffineBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, gy, a, gx, ga, gb, n);
  return cudaGetLastError();
}

}  // namespace pipeoffload::testing
