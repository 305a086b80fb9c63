// The row kernel of the fused cross-entropy (fused_cross_entropy.h) and the fixed-order double
// sum of per-row losses. Abseil-free launchers (llama_cuda_launch.h).
//
// CrossEntropyRowsKernel: one block per row of V logits. Pass one: each thread keeps an online
// (max, sum of exp(l - max)) over its packs (rescaling its sum when its max grows), then the
// block combines the pairs in a butterfly (the combine is symmetric in its two operands up to
// float addition's commutativity, so every lane ends with the same bits) and across warps in
// warp order. Pass two rewrites the row with the gradient. The thread count depends on V only.
#include "examples/gpt/cuda/kernels_device.cuh"
#include "examples/llama/cuda/llama_cuda_launch.h"

namespace pipeoffload::llama::cuda::internal {
namespace {

using gpt::cuda::internal::CanPack;
using gpt::cuda::internal::kFullMask;
using gpt::cuda::internal::kPack;
using gpt::cuda::internal::LoadPack;
using gpt::cuda::internal::StorePack;

constexpr int kMaxRowThreads = 1024;
constexpr int kSumThreads = 1024;

// (m, s) := the pair for the union of the two sets: max, and both sums rescaled to it.
__device__ __forceinline__ void Combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  const float a = m == -INFINITY ? 0.0f : __fmul_rn(s, __expf(__fsub_rn(m, mx)));
  const float b = m2 == -INFINITY ? 0.0f : __fmul_rn(s2, __expf(__fsub_rn(m2, mx)));
  m = mx;
  s = __fadd_rn(a, b);
}

__device__ __forceinline__ void WarpCombine(float& m, float& s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, offset);
    const float s2 = __shfl_xor_sync(kFullMask, s, offset);
    Combine(m, s, m2, s2);
  }
}

template <bool kAligned>
__global__ void CrossEntropyRowsKernel(bf16* logits, float* losses, const std::int32_t* targets,
                                       int V, float grad_scale) {
  __shared__ float warp_m[32];
  __shared__ float warp_s[32];
  __shared__ float target_logit;
  bf16* row = logits + std::int64_t{blockIdx.x} * V;
  const int target = targets[blockIdx.x];
  const bool valid = target >= 0 && target < V;
  // Read before any thread can overwrite the row (pass two runs after the barriers below).
  if (threadIdx.x == 0) target_logit = valid ? __bfloat162float(row[target]) : 0.0f;

  float m = -INFINITY;
  float s = 0.0f;
  const int step = blockDim.x * kPack;
  for (int c = threadIdx.x * kPack; c < V; c += step) {
    float v[kPack];
    const int count = LoadPack<kAligned>(row, c, V, v);
    float pack_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) pack_max = fmaxf(pack_max, v[k]);
    }
    if (pack_max > m) {
      s = m == -INFINITY ? 0.0f : __fmul_rn(s, __expf(__fsub_rn(m, pack_max)));
      m = pack_max;
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) s = __fadd_rn(s, __expf(__fsub_rn(v[k], m)));
    }
  }
  WarpCombine(m, s);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  const int warps = blockDim.x / 32;
  m = lane < warps ? warp_m[lane] : -INFINITY;
  s = lane < warps ? warp_s[lane] : 0.0f;
  WarpCombine(m, s);
  const float lse = __fadd_rn(m, logf(s));
  if (threadIdx.x == 0) losses[blockIdx.x] = valid ? __fsub_rn(lse, target_logit) : NAN;

  for (int c = threadIdx.x * kPack; c < V; c += step) {
    float v[kPack];
    LoadPack<kAligned>(row, c, V, v);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float indicator = c + k == target ? 1.0f : 0.0f;
      v[k] = __fmul_rn(__fsub_rn(__expf(__fsub_rn(v[k], lse)), indicator), grad_scale);
    }
    StorePack<kAligned>(row, c, V, v);
  }
}

__global__ void SumToDoubleKernel(double* result, const float* values, int n) {
  __shared__ double partial[kSumThreads];
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += kSumThreads) sum += static_cast<double>(values[i]);
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kSumThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = partial[0];
}

// Threads per row: about four packs each, a multiple of 32, at most kMaxRowThreads.
int RowThreads(int V) {
  const int packs = (V + kPack - 1) / kPack;
  int threads = ((packs + 3) / 4 + 31) / 32 * 32;
  return threads < 32 ? 32 : (threads > kMaxRowThreads ? kMaxRowThreads : threads);
}

}  // namespace

cudaError_t LaunchCrossEntropyRows(bf16* logits, float* losses, const std::int32_t* targets,
                                   int rows, int V, float grad_scale, cudaStream_t stream) {
  const int threads = RowThreads(V);
  if (CanPack(V, logits)) {
    CrossEntropyRowsKernel<true>
        <<<rows, threads, 0, stream>>>(logits, losses, targets, V, grad_scale);
  } else {
    CrossEntropyRowsKernel<false>
        <<<rows, threads, 0, stream>>>(logits, losses, targets, V, grad_scale);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSumToDouble(double* result, const float* values, int n, cudaStream_t stream) {
  SumToDoubleKernel<<<1, kSumThreads, 0, stream>>>(result, values, n);
  return cudaGetLastError();
}

}  // namespace pipeoffload::llama::cuda::internal
