// Deterministic device fills (see gpt_cuda_random.h). Grid-stride loops; each element is a
// pure function of (seed, index), so the launch configuration never changes the values.
#include "examples/gpt/cuda/gpt_cuda_random.h"

#include <algorithm>

namespace pipeoffload::gpt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;

__device__ __forceinline__ std::uint64_t Mix64(std::uint64_t z) {
  // SplitMix64's output function (Steele, Lea, Flood 2014).
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1] from the top 24 bits (exact in fp32, never 0, so log() is finite).
__device__ __forceinline__ float Uniform(std::uint64_t bits) {
  return static_cast<float>((bits >> 40) + 1) * (1.0f / 16777216.0f);
}

__global__ void FillNormalKernel(__nv_bfloat16* out, std::int64_t n, float stddev,
                                 std::uint64_t seed) {
  const std::uint64_t key = Mix64(seed ^ 0x9E3779B97F4A7C15ull);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t a = Mix64(key + 2 * static_cast<std::uint64_t>(i));
    const std::uint64_t b = Mix64(key + 2 * static_cast<std::uint64_t>(i) + 1);
    const float radius = sqrtf(-2.0f * logf(Uniform(a)));
    const float angle = 6.2831853071795865f * Uniform(b);
    out[i] = __float2bfloat16_rn(stddev * radius * cosf(angle));
  }
}

__global__ void FillConstantKernel(__nv_bfloat16* out, std::int64_t n, float value) {
  const __nv_bfloat16 v = __float2bfloat16_rn(value);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = v;
  }
}

unsigned int Blocks(std::int64_t n) {
  return static_cast<unsigned int>(std::clamp<std::int64_t>((n + kThreads - 1) / kThreads, 1,
                                                            kMaxBlocks));
}

}  // namespace

cudaError_t LaunchFillNormalBf16(__nv_bfloat16* out, std::int64_t n, float stddev,
                                 std::uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillNormalKernel<<<Blocks(n), kThreads, 0, stream>>>(out, n, stddev, seed);
  return cudaGetLastError();
}

cudaError_t LaunchFillConstantBf16(__nv_bfloat16* out, std::int64_t n, float value,
                                   cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillConstantKernel<<<Blocks(n), kThreads, 0, stream>>>(out, n, value);
  return cudaGetLastError();
}

}  // namespace pipeoffload::gpt::cuda
