// The causal softmax of attention scores, forward and backward, in place in the attention
// workspace (layout: kernels_attention.cc and kernels_launch.h).
//
// One warp per row, kRowsPerBlock rows per block: rows are short to medium (T <= 16384 floats)
// and their lengths vary (row i has i + 1 visible scores), so warp-level reductions (butterflies,
// deterministic: every lane ends with the same bits) beat block-wide barriers. Each row is read
// twice (the second time mostly from L1/L2): once for its statistics, once to write the result.
//
// In place: the bf16 result of row i overwrites the first half of the same row's fp32 bytes.
// The writing pass walks the row in groups of kUnroll warp-wide chunks; group c's stores can
// only overlap floats of groups <= c, so every lane reads its part of group c, the warp
// synchronizes (__syncwarp orders the memory accesses of its lanes), and only then the lanes
// store.
//
// Probabilities are exp(s - lse) in the forward and in the backward's recomputation alike, so
// both see the same values.
#include "examples/gpt/cuda/kernels_device.cuh"
#include "examples/gpt/cuda/kernels_launch.h"

namespace pipeoffload::gpt::cuda::internal {
namespace {

constexpr int kRowsPerBlock = 8;  // one warp each
constexpr int kThreads = 32 * kRowsPerBlock;

// The end of the columns the products read for row i: the end of its block of row_block rows.
__device__ __forceinline__ int BlockEnd(int i, int T, int row_block) {
  const int end = (i / row_block + 1) * row_block;
  return end < T ? end : T;
}

// kVec consecutive floats at row + j (a float4 when kVec == 4: row + j 16-byte aligned).
template <int kVec>
__device__ __forceinline__ void LoadFloats(const float* row, int j, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 x = *reinterpret_cast<const float4*>(row + j);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
    v[0] = row[j];
  }
}

// kVec consecutive bf16 at out + j (one 8-byte store when kVec == 4).
template <int kVec>
__device__ __forceinline__ void StoreBf16s(__nv_bfloat16* out, int j, const float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    uint2 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    h[0] = __floats2bfloat162_rn(v[0], v[1]);
    h[1] = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(out + j) = raw;
  } else {
    out[j] = __float2bfloat16_rn(v[0]);
  }
}

// Running (max, sum of exp(x - max)) of one lane, and the merge of two lanes' pairs. The merge
// is symmetric bit for bit (max and + commute), so a butterfly leaves every lane the same pair.
__device__ __forceinline__ void AddToSoftmaxSum(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m = -inf at first: exp(-inf) = 0
    m = x;
  } else {
    s += expf(x - m);
  }
}

__device__ __forceinline__ void MergeSoftmaxSum(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  const float mine = m == -INFINITY ? 0.0f : s * expf(m - top);
  const float theirs = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - top);
  m = top;
  s = mine + theirs;
}

__device__ __forceinline__ void WarpMergeSoftmaxSum(float& m, float& s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, offset);
    const float s2 = __shfl_xor_sync(kFullMask, s, offset);
    MergeSoftmaxSum(m, s, m2, s2);
  }
}

// A lane keeps kUnroll chunks' loads in flight at once and one running (max, sum) or dot product
// per element of its vector (combined in a fixed order: short dependency chains); the grid takes
// the longest rows first so that the short ones fill the tail. kVec == 4 needs T % 4 == 0 (rows,
// and so every float4 and every 4-bf16 store, aligned).
constexpr int kUnroll = 4;

__device__ __forceinline__ int LongestFirstRow(int T) {
  return T - 1 - static_cast<int>(blockIdx.x * kRowsPerBlock + threadIdx.x / 32);
}

template <int kVec>
__global__ void AttentionSoftmaxForwardKernel(float* scores, float* lse,
                                              std::int64_t lse_head_stride, int T, int row_block) {
  const int lane = threadIdx.x % 32;
  const int i = LongestFirstRow(T);
  if (i < 0) return;  // the whole warp
  const int g = blockIdx.y;
  float* row = scores + (std::int64_t{g} * T + i) * T;
  constexpr int kChunk = 32 * kVec;
  constexpr int kGroup = kUnroll * kChunk;
  const int visible = i + 1;
  float m[kVec];
  float s[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    m[k] = -INFINITY;
    s[k] = 0.0f;
  }
  for (int base = 0; base < visible; base += kGroup) {
    float v[kUnroll][kVec] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
      if (j < visible) LoadFloats<kVec>(row, j, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (j + k < visible) AddToSoftmaxSum(v[u][k], m[k], s[k]);
      }
    }
  }
#pragma unroll
  for (int k = 1; k < kVec; ++k) MergeSoftmaxSum(m[0], s[0], m[k], s[k]);
  WarpMergeSoftmaxSum(m[0], s[0]);
  const float row_lse = m[0] + logf(s[0]);
  __nv_bfloat16* probs = reinterpret_cast<__nv_bfloat16*>(row);
  const int end = BlockEnd(i, T, row_block);
  for (int base = 0; base < end; base += kGroup) {  // uniform over the warp
    float v[kUnroll][kVec] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
      if (j < visible) LoadFloats<kVec>(row, j, v[u]);
    }
    __syncwarp();  // the group's floats are all read before any lane writes over them
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
      if (j < end) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          v[u][k] = j + k < visible ? expf(v[u][k] - row_lse) : 0.0f;
        }
        StoreBf16s<kVec>(probs, j, v[u]);
      }
    }
  }
  if (lane == 0) lse[g * lse_head_stride + i] = row_lse;
}

template <int kVec>
__global__ void AttentionSoftmaxBackwardKernel(float* scores, float* dprobs, const float* lse,
                                               std::int64_t lse_head_stride, int T, int row_block) {
  const int lane = threadIdx.x % 32;
  const int i = LongestFirstRow(T);
  if (i < 0) return;
  const int g = blockIdx.y;
  const std::int64_t offset = (std::int64_t{g} * T + i) * T;
  float* row = scores + offset;
  float* drow = dprobs + offset;
  const float row_lse = lse[g * lse_head_stride + i];
  constexpr int kChunk = 32 * kVec;
  constexpr int kGroup = kUnroll * kChunk;
  const int visible = i + 1;
  float dots[kVec] = {};
  for (int base = 0; base < visible; base += kGroup) {
    float v[kUnroll][kVec] = {};
    float d[kUnroll][kVec] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
      if (j < visible) {
        LoadFloats<kVec>(row, j, v[u]);
        LoadFloats<kVec>(drow, j, d[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (j + k < visible) dots[k] += expf(v[u][k] - row_lse) * d[u][k];
      }
    }
  }
  float dot = dots[0];
#pragma unroll
  for (int k = 1; k < kVec; ++k) dot += dots[k];
  dot = WarpSum(dot);
  __nv_bfloat16* probs = reinterpret_cast<__nv_bfloat16*>(row);
  __nv_bfloat16* dscores = reinterpret_cast<__nv_bfloat16*>(drow);
  const int end = BlockEnd(i, T, row_block);
  for (int base = 0; base < end; base += kGroup) {
    float v[kUnroll][kVec] = {};
    float d[kUnroll][kVec] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
      if (j < visible) {
        LoadFloats<kVec>(row, j, v[u]);
        LoadFloats<kVec>(drow, j, d[u]);
      }
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kChunk + lane * kVec;
      if (j < end) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const bool shown = j + k < visible;
          const float p = shown ? expf(v[u][k] - row_lse) : 0.0f;
          v[u][k] = p;
          d[u][k] = shown ? p * (d[u][k] - dot) : 0.0f;
        }
        StoreBf16s<kVec>(probs, j, v[u]);
        StoreBf16s<kVec>(dscores, j, d[u]);
      }
    }
  }
}

dim3 Grid(int T, int heads) {
  return dim3(static_cast<unsigned>((T + kRowsPerBlock - 1) / kRowsPerBlock),
              static_cast<unsigned>(heads));
}

}  // namespace

cudaError_t LaunchAttentionSoftmaxForward(float* scores, float* lse, std::int64_t lse_head_stride,
                                          int heads, int T, int row_block, cudaStream_t stream) {
  const dim3 grid = Grid(T, heads);
  if (T % 4 == 0) {
    AttentionSoftmaxForwardKernel<4>
        <<<grid, kThreads, 0, stream>>>(scores, lse, lse_head_stride, T, row_block);
  } else {
    AttentionSoftmaxForwardKernel<1>
        <<<grid, kThreads, 0, stream>>>(scores, lse, lse_head_stride, T, row_block);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAttentionSoftmaxBackward(float* scores, float* dprobs, const float* lse,
                                           std::int64_t lse_head_stride, int heads, int T,
                                           int row_block, cudaStream_t stream) {
  const dim3 grid = Grid(T, heads);
  if (T % 4 == 0) {
    AttentionSoftmaxBackwardKernel<4>
        <<<grid, kThreads, 0, stream>>>(scores, dprobs, lse, lse_head_stride, T, row_block);
  } else {
    AttentionSoftmaxBackwardKernel<1>
        <<<grid, kThreads, 0, stream>>>(scores, dprobs, lse, lse_head_stride, T, row_block);
  }
  return cudaGetLastError();
}

}  // namespace pipeoffload::gpt::cuda::internal
