// Device helpers shared by the GPT kernels: packed bf16/fp32 loads and stores, deterministic
// warp and block reductions, and the choice between the 128-bit and the scalar path.
//
// Determinism: the reductions are butterflies (__shfl_xor_sync) followed by an in-order sum of
// the warps' results. Float addition is commutative bit for bit, so every lane of a butterfly ends
// with the same bits, and the order depends only on blockDim, which every launcher derives from
// the sizes alone.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_DEVICE_CUH_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pipeoffload::gpt::cuda::internal {

// Elements per 128-bit access of bf16 (and per two of fp32).
inline constexpr int kPack = 8;
inline constexpr unsigned kFullMask = 0xffffffffu;

// True when every pointer is 16-byte aligned and `row` (elements) is a multiple of kPack, so that
// every row of every tensor starts on a 16-byte boundary: the 128-bit path applies.
inline bool Aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
template <typename... Ptrs>
inline bool CanPack(std::int64_t row, const Ptrs*... ptrs) {
  return row % kPack == 0 && (Aligned16(ptrs) && ...);
}

// The kPack bf16 values of one 128-bit word, as floats.
__device__ __forceinline__ void UnpackBf16(const uint4& raw, float (&f)[kPack]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kPack / 2; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

template <int kVec>
__device__ __forceinline__ void LoadBf16(const __nv_bfloat16* p, float (&f)[kVec]) {
  if constexpr (kVec == kPack) {
    UnpackBf16(*reinterpret_cast<const uint4*>(p), f);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) f[i] = __bfloat162float(p[i]);
  }
}

template <int kVec>
__device__ __forceinline__ void StoreBf16(__nv_bfloat16* p, const float (&f)[kVec]) {
  if constexpr (kVec == kPack) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < kPack / 2; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) p[i] = __float2bfloat16_rn(f[i]);
  }
}

template <int kVec>
__device__ __forceinline__ void LoadF32(const float* p, float (&f)[kVec]) {
  if constexpr (kVec == kPack) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) f[i] = p[i];
  }
}

template <int kVec>
__device__ __forceinline__ void StoreF32(float* p, const float (&f)[kVec]) {
  if constexpr (kVec == kPack) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(f[4], f[5], f[6], f[7]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) p[i] = f[i];
  }
}

// Rows read and written in logical packs of kPack elements, so that a thread sees the same
// elements in the same order whether the row goes through 128-bit accesses (kAligned: the row's
// pointer 16-byte aligned and its length a multiple of kPack) or element by element (any
// alignment and length). A reduction over a row then gives the same bits on either path, so
// results never depend on where a buffer happens to lie. LoadPack returns how many of the
// pack's elements lie inside the row of n (the rest read as 0 and must be skipped).
template <bool kAligned>
__device__ __forceinline__ int LoadPack(const __nv_bfloat16* row, int c, int n, float (&f)[kPack]) {
  if constexpr (kAligned) {
    UnpackBf16(*reinterpret_cast<const uint4*>(row + c), f);
    return kPack;
  } else {
    const int count = n - c < kPack ? n - c : kPack;
#pragma unroll
    for (int k = 0; k < kPack; ++k) f[k] = k < count ? __bfloat162float(row[c + k]) : 0.0f;
    return count;
  }
}

template <bool kAligned>
__device__ __forceinline__ void StorePack(__nv_bfloat16* row, int c, int n,
                                          const float (&f)[kPack]) {
  if constexpr (kAligned) {
    StoreBf16<kPack>(row + c, f);
  } else {
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (c + k < n) row[c + k] = __float2bfloat16_rn(f[k]);
    }
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// The sum (or max) over the block, returned to every thread. blockDim.x: a multiple of 32, at
// most 1024. Every thread of the block must call it; it may be called again right after.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = WarpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = lane < warps ? partial[lane] : 0.0f;
  total = WarpSum(total);
  __syncthreads();  // partial may be written again by the next call
  return total;
}

__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = WarpMax(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = lane < warps ? partial[lane] : -INFINITY;
  total = WarpMax(total);
  __syncthreads();
  return total;
}

// Blocks for a grid-stride loop over `items` with `threads` per block: enough to fill the GPU
// many times over, capped so the grid stays legal for any n.
inline unsigned GridFor(std::int64_t items, int threads) {
  constexpr std::int64_t kMaxBlocks = std::int64_t{1} << 16;
  std::int64_t blocks = (items + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks);
}

}  // namespace pipeoffload::gpt::cuda::internal

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_DEVICE_CUH_
