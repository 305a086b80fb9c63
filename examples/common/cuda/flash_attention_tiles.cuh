// The tile-level building blocks of the flash attention kernels (flash_attention_kernels.cuh):
// the swizzled shared-memory layout, cp.async tile loads with zero rows past T, the warp's
// m16n8k16 products (operands from shared memory, or P / dS straight from an earlier product's
// accumulator), causal masks and the staged bf16 row stores. A warp owns 16-row tiles of a
// block's output; fragments follow PTX ISA "Matrix Fragments for mma.m16n8k16".
#ifndef PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_TILES_CUH_
#define PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_TILES_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "examples/common/cuda/flash_attention_device.cuh"
#include "examples/common/cuda/flash_attention_launch.h"

namespace pipeoffload::examples::cuda::flash {

using internal::bf16;

inline constexpr int kWarpSize = 32;
// Rows of the block's output each warp owns: one m16n8k16 row tile.
inline constexpr int kWarpRows = 16;

// A shared-memory tile of rows of kHeadDim bf16: row r at r * kRowBytes, its 16-byte chunk c
// stored at chunk c ^ (r % 8), so the 8 row addresses of one ldmatrix phase (8 consecutive rows,
// one chunk) hit 8 different 16-byte bank groups, and so do cp.async's row-contiguous writes.
template <int kHeadDim>
struct Swizzled {
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kChunks = kHeadDim / 8;
  __device__ __forceinline__ static std::uint32_t Offset(int row, int chunk) {
    return static_cast<std::uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
  }
  // The operand loops read chunk 2j + half + 8i of rows row + 8n for compile-time i, j, n.
  // Since (2j + half + 8i) ^ (row & 7) = 8i + ((2j + half) ^ (row & 7)) for j < 4, the
  // lane-dependent part takes only four values, which LaneBases precomputes (few registers
  // whatever the unrolled loop's size), and the rest is an immediate: Offset(row + 8n,
  // 2j' + half) = bases[j' % 4] + ChunkImmediate(j') + 8 n kRowBytes for any j'.
  __device__ __forceinline__ static void LaneBases(std::uint32_t (&bases)[4], int row, int half) {
    const int x = half ^ (row & 7);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      bases[j] = static_cast<std::uint32_t>(row * kRowBytes + (((2 * j) ^ x) << 4));
    }
  }
  __device__ __forceinline__ static constexpr std::uint32_t ChunkImmediate(int pair) {
    return static_cast<std::uint32_t>(((2 * pair) & ~7) << 4);
  }
};

// Rows [row0, row0 + kRows) of a (T, kHeadDim) bf16 matrix (`src` is its row 0, rows `stride`
// elements apart) into the swizzled tile at `dst`; rows >= T become zeros. All kThreads threads
// call it; the copies are cp.async, completed by the caller's commit / wait / barrier.
template <int kRows, int kHeadDim, int kThreads>
__device__ __forceinline__ void LoadTile(std::uint32_t dst, const bf16* src, std::int64_t stride,
                                         int row0, int T) {
  using S = Swizzled<kHeadDim>;
  static_assert(kThreads % S::kChunks == 0, "a thread keeps its chunk column");
  constexpr int kRowStep = kThreads / S::kChunks;
  static_assert(kRowStep % 8 == 0 && kRows % kRowStep == 0, "a thread keeps its swizzle");
  const int c = static_cast<int>(threadIdx.x) % S::kChunks;
  const int r = static_cast<int>(threadIdx.x) / S::kChunks;
  const std::uint32_t lane_dst = dst + S::Offset(r, c);
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const int row = row0 + r + i * kRowStep;
    const bool valid = row < T;
    CpAsync16(lane_dst + i * kRowStep * S::kRowBytes, src + (valid ? row : 0) * stride + c * 8,
              valid);
  }
}

// Floats [row0, row0 + kRows) of a length-T vector into shared memory at `dst`, zeros past T.
template <int kRows, int kThreads>
__device__ __forceinline__ void LoadRowFloats(std::uint32_t dst, const float* src, int row0,
                                              int T) {
  static_assert(kRows <= kThreads, "one float per thread");
  const int r = static_cast<int>(threadIdx.x);
  if (r < kRows) {
    const bool valid = row0 + r < T;
    CpAsync4(dst + 4 * r, src + (valid ? row0 + r : 0), valid);
  }
}

// acc[m] (16 x 8 kNTiles) += A_m B^T for m < kMTiles, with A_m rows [a_row0 + 16 m, +16) of
// tile `a` and B rows [b_row0, b_row0 + 8 kNTiles) of tile `b`, both kHeadDim wide (S = Q K^T
// and its kin); each B fragment is loaded once for all kMTiles row tiles.
// REQUIRES: a_row0 % 16 == 0, b_row0 % 16 == 0.
template <int kHeadDim, int kMTiles, int kNTiles>
__device__ __forceinline__ void GemmNT(float (&acc)[kMTiles][kNTiles][4], std::uint32_t a,
                                       int a_row0, std::uint32_t b, int b_row0, int lane) {
  using S = Swizzled<kHeadDim>;
  static_assert(kNTiles % 2 == 0, "ldmatrix.x4 loads two n-tiles of B");
  // ldmatrix.x4 matrices: A (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
  // (rows 8-15, k 8-15) = a[0..3]; B (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
  // (n 8-15, k 8-15) = b0, b1 of n-tile 0, b0, b1 of n-tile 1.
  std::uint32_t a_bases[4];
  std::uint32_t b_bases[4];
  S::LaneBases(a_bases, a_row0 + (lane & 15), lane >> 4);
  S::LaneBases(b_bases, b_row0 + ((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    std::uint32_t af[kMTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      LdMatrixX4(af[m], a + a_bases[kk % 4] + S::ChunkImmediate(kk) + m * 16 * S::kRowBytes);
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; nt += 2) {
      std::uint32_t bf[4];
      LdMatrixX4(bf, b + b_bases[kk % 4] + S::ChunkImmediate(kk) + nt * 8 * S::kRowBytes);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        Mma(acc[m][nt], af[m], bf[0], bf[1]);
        Mma(acc[m][nt + 1], af[m], bf[2], bf[3]);
      }
    }
  }
}

// One row tile: acc (16 x 8 kNTiles) += A B^T, A rows [a_row0, +16).
template <int kHeadDim, int kNTiles>
__device__ __forceinline__ void GemmNT(float (&acc)[kNTiles][4], std::uint32_t a, int a_row0,
                                       std::uint32_t b, int b_row0, int lane) {
  GemmNT<kHeadDim, 1, kNTiles>(reinterpret_cast<float(&)[1][kNTiles][4]>(acc), a, a_row0, b,
                               b_row0, lane);
}

// A 16 x 8 kNTiles fp32 accumulator rounded to bf16 pairs: pk[nt][0] = row g, pk[nt][1] =
// row g + 8 (columns 2q, 2q + 1 each). Two consecutive n-tiles of it are one m16k16 A fragment
// {pk[2j][0], pk[2j][1], pk[2j+1][0], pk[2j+1][1]}: the C and A layouts agree, so P and dS go
// from one product into the next without shared memory.
template <int kNTiles>
__device__ __forceinline__ void PackRows(const float (&acc)[kNTiles][4],
                                         std::uint32_t (&pk)[kNTiles][2]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    pk[nt][0] = PackBf16(acc[nt][0], acc[nt][1]);
    pk[nt][1] = PackBf16(acc[nt][2], acc[nt][3]);
  }
}

// acc[m] (16 x kHeadDim) += P_m B for m < kMTiles, with P_m (16 x 16 kKSteps, bf16) packed by
// PackRows and B rows [b_row0, b_row0 + 16 kKSteps) of tile `b` (O += P V and its kin).
// REQUIRES: b_row0 % 16 == 0.
template <int kHeadDim, int kMTiles, int kKSteps>
__device__ __forceinline__ void GemmRegNN(float (&acc)[kMTiles][kHeadDim / 8][4],
                                          const std::uint32_t (&pk)[kMTiles][2 * kKSteps][2],
                                          std::uint32_t b, int b_row0, int lane) {
  using S = Swizzled<kHeadDim>;
  // ldmatrix.x4.trans matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
  // (k 8-15, n 8-15) = b0, b1 of n-tile 0, b0, b1 of n-tile 1.
  std::uint32_t b_bases[4];
  S::LaneBases(b_bases, b_row0 + (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int dt = 0; dt < kHeadDim / 8; dt += 2) {
      std::uint32_t bf[4];
      LdMatrixX4Trans(bf, b + b_bases[(dt / 2) % 4] + S::ChunkImmediate(dt / 2) +
                              kk * 16 * S::kRowBytes);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        const std::uint32_t af[4] = {pk[m][2 * kk][0], pk[m][2 * kk][1], pk[m][2 * kk + 1][0],
                                     pk[m][2 * kk + 1][1]};
        Mma(acc[m][dt], af, bf[0], bf[1]);
        Mma(acc[m][dt + 1], af, bf[2], bf[3]);
      }
    }
  }
}

// One row tile: acc (16 x kHeadDim) += P B.
template <int kHeadDim, int kKSteps>
__device__ __forceinline__ void GemmRegNN(float (&acc)[kHeadDim / 8][4],
                                          const std::uint32_t (&pk)[2 * kKSteps][2],
                                          std::uint32_t b, int b_row0, int lane) {
  GemmRegNN<kHeadDim, 1, kKSteps>(reinterpret_cast<float(&)[1][kHeadDim / 8][4]>(acc),
                                  reinterpret_cast<const std::uint32_t(&)[1][2 * kKSteps][2]>(pk),
                                  b, b_row0, lane);
}

// The row and column of element i of n-tile nt of a fragment whose tile starts at (row0, col0).
__device__ __forceinline__ int FragmentRow(int row0, int lane, int i) {
  return row0 + (lane >> 2) + 8 * (i >> 1);
}
__device__ __forceinline__ int FragmentCol(int col0, int lane, int nt, int i) {
  return col0 + nt * 8 + 2 * (lane & 3) + (i & 1);
}

// s = -inf where masked(row, col), for the 16 x 8 kNTiles fragment tile at (row0, col0).
template <int kNTiles, typename Masked>
__device__ __forceinline__ void Mask(float (&s)[kNTiles][4], int row0, int col0, int lane,
                                     Masked masked) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (masked(FragmentRow(row0, lane, i), FragmentCol(col0, lane, nt, i))) s[nt][i] = -INFINITY;
    }
  }
}

// Writes the warp's 16 x kHeadDim accumulator, rows g scaled by scale_a and g + 8 by scale_b,
// as bf16 to rows [row0, row0 + 16) of `dst` (row 0 of the sequence, rows `stride` apart; rows
// >= T skipped). Stages through the warp's own rows [stage_row0, +16) of the tile at `stage`
// (no other warp reads them), so that the global stores are whole 16-byte chunks of rows.
template <int kHeadDim>
__device__ __forceinline__ void StoreRows(const float (&acc)[kHeadDim / 8][4], float scale_a,
                                          float scale_b, unsigned char* stage, int stage_row0,
                                          bf16* dst, std::int64_t stride, int row0, int T,
                                          int lane) {
  using S = Swizzled<kHeadDim>;
  SyncWarp();  // the warp's last reads of its staging rows are done
#pragma unroll
  for (int dt = 0; dt < kHeadDim / 8; ++dt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float scale = r == 0 ? scale_a : scale_b;
      const int row = stage_row0 + (lane >> 2) + 8 * r;
      *reinterpret_cast<std::uint32_t*>(stage + S::Offset(row, dt) + 4 * (lane & 3)) =
          PackBf16(acc[dt][2 * r] * scale, acc[dt][2 * r + 1] * scale);
    }
  }
  SyncWarp();
  constexpr int kPerLane = kWarpRows * S::kChunks / kWarpSize;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int index = lane + i * kWarpSize;
    const int r = index / S::kChunks;
    const int c = index % S::kChunks;
    if (row0 + r < T) {
      *reinterpret_cast<uint4*>(dst + (row0 + r) * stride + c * 8) =
          *reinterpret_cast<const uint4*>(stage + S::Offset(stage_row0 + r, c));
    }
  }
}

}  // namespace pipeoffload::examples::cuda::flash

#endif  // PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_TILES_CUH_
