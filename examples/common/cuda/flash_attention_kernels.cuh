// The flash attention kernels (FlashAttention-2, Dao 2023, with mma.sync on sm_90): the forward,
// the backward's D = rowsum(dO * O), its dK / dV kernel and its dQ kernel. Templates over the
// head dim, instantiated by flash_attention.cu; built from the tiles of
// flash_attention_tiles.cuh over the primitives of flash_attention_device.cuh (PTX lives there).
//
// Notation: per (sequence b, query head h, kv head h / group), S = Q K^T (rows queries, columns
// keys, causal: key <= query), P = exp(S / sqrt(hd) - lse), O = P V; backward dV = P^T dO,
// dP = dO V^T, dS = P (dP - D), dQ = dS K / sqrt(hd), dK = dS^T Q / sqrt(hd).
// Tiles: each warp owns one or two 16-row tiles of the block's output (queries in the forward
// and dQ, keys in dK / dV) and keeps its accumulator in mma fragments (float[hd / 8][4] per
// tile); operand tiles sit in shared memory in the swizzled layout of Swizzled, loaded with
// cp.async (zero rows past T), double-buffered so the next tile loads during the current one's
// math. P and dS go from the accumulator fragments straight into A fragments (the layouts
// agree), never to shared memory.
// Determinism: every sum runs in a fixed order (mma chains in program order, key and query
// blocks in a fixed sequence, a kv group's query heads ascending); there are no atomics.
#ifndef PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_KERNELS_CUH_
#define PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "examples/common/cuda/flash_attention_device.cuh"
#include "examples/common/cuda/flash_attention_launch.h"
#include "examples/common/cuda/flash_attention_tiles.cuh"

namespace pipeoffload::examples::cuda::flash {

using internal::bf16;
using internal::FlashArgs;

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// ---- Forward ---------------------------------------------------------------------------------
// One block per (query block of kBlockM rows, b * NH + h): grid (B * NH, ceil(T / kBlockM)),
// blockIdx.y = 0 the last (heaviest) query block, so the longest blocks start first. Each warp
// owns kMTiles row tiles of 16 (two share every K / V fragment it loads, halving the shared
// memory reads per mma). Key blocks run from the diagonal down; only blocks that cross a row
// tile's diagonal are masked, and a warp skips the blocks wholly above its rows.
template <int HeadDim, int Warps, int MTiles, int MinBlocksPerSm>
struct ForwardTraits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kMTiles = MTiles;
  static constexpr int kWarpRowsAll = MTiles * kWarpRows;
  static constexpr int kBlockM = Warps * kWarpRowsAll;
  static constexpr int kBlockN = 64;
  static constexpr int kThreads = Warps * kWarpSize;
  static constexpr int kMinBlocks = MinBlocksPerSm;
  static constexpr int kQBytes = kBlockM * Swizzled<kHeadDim>::kRowBytes;
  static constexpr int kKVBytes = kBlockN * Swizzled<kHeadDim>::kRowBytes;
  // Q, K[2], V[2].
  static constexpr int kSmemBytes = kQBytes + 4 * kKVBytes;
  __host__ static dim3 Grid(const FlashArgs& a) {
    return dim3(static_cast<unsigned>(a.B * a.NH),
                static_cast<unsigned>((a.T + kBlockM - 1) / kBlockM));
  }
};

// The forward's block shapes, by the variant number of LaunchFlashForwardVariant: 0, 4 warps of
// 2 row tiles (FlashAttention-2's 128 x 64 blocks for hd 128; 255 registers); 1, 8 warps of 1
// row tile at 2 blocks per SM (128 registers); 2, the same at 1 block per SM.
template <int kHeadDim>
using ForwardTwoTiles = ForwardTraits<kHeadDim, 4, 2, 2>;
template <int kHeadDim>
using ForwardOneTile = ForwardTraits<kHeadDim, 8, 1, 2>;
template <int kHeadDim>
using ForwardOneTileWide = ForwardTraits<kHeadDim, 8, 1, 1>;

template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    FlashForwardKernel(const FlashArgs p) {
  constexpr int kHeadDim = Tr::kHeadDim;
  constexpr int kM = Tr::kMTiles;
  constexpr int kNTiles = Tr::kBlockN / 8;
  constexpr int kDTiles = kHeadDim / 8;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int m_block = static_cast<int>(gridDim.y - 1 - blockIdx.y);
  const int b = static_cast<int>(blockIdx.x) / p.NH;
  const int h = static_cast<int>(blockIdx.x) % p.NH;
  const std::int64_t seq_row0 = std::int64_t{b} * p.T;
  const bf16* q = p.q + seq_row0 * p.q_stride + h * kHeadDim;
  const bf16* k = p.k + seq_row0 * p.kv_stride + (h / p.group) * kHeadDim;
  const bf16* v = p.v + seq_row0 * p.kv_stride + (h / p.group) * kHeadDim;

  unsigned char* smem = SharedMemory();
  const std::uint32_t sq = SmemAddress(smem);
  const std::uint32_t sk = sq + Tr::kQBytes;
  const std::uint32_t sv = sk + 2 * Tr::kKVBytes;

  const int row0 = m_block * Tr::kBlockM;
  const int n_blocks = (min(p.T, row0 + Tr::kBlockM) + Tr::kBlockN - 1) / Tr::kBlockN;
  LoadTile<Tr::kBlockM, kHeadDim, Tr::kThreads>(sq, q, p.q_stride, row0, p.T);
  LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sk, k, p.kv_stride, (n_blocks - 1) * Tr::kBlockN,
                                                p.T);
  LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sv, v, p.kv_stride, (n_blocks - 1) * Tr::kBlockN,
                                                p.T);
  CpAsyncCommit();

  const int warp_srow0 = warp * Tr::kWarpRowsAll;  // the warp's first row within the block
  const int warp_row0 = row0 + warp_srow0;
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(kHeadDim));
  float o[kM][kDTiles][4] = {};
  // Per row tile, rows g and g + 8: the running max of S * scale_log2, and this lane's part of
  // sum exp2(S * scale_log2 - max).
  float row_max[kM][2];
  float row_sum[kM][2];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
  }
  for (int it = 0; it < n_blocks; ++it) {
    const int n_block = n_blocks - 1 - it;
    const std::uint32_t buffer = static_cast<std::uint32_t>(it & 1) * Tr::kKVBytes;
    CpAsyncWait<0>();
    __syncthreads();  // this block's K, V visible; everyone is done with the other buffer
    if (n_block > 0) {
      const std::uint32_t next = static_cast<std::uint32_t>((it + 1) & 1) * Tr::kKVBytes;
      LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sk + next, k, p.kv_stride,
                                                    (n_block - 1) * Tr::kBlockN, p.T);
      LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sv + next, v, p.kv_stride,
                                                    (n_block - 1) * Tr::kBlockN, p.T);
    }
    CpAsyncCommit();
    const int key0 = n_block * Tr::kBlockN;
    // Warp-uniform: rows all past T, or keys all above the warp's diagonal.
    if (warp_row0 >= p.T || key0 > warp_row0 + Tr::kWarpRowsAll - 1) continue;

    float s[kM][kNTiles][4] = {};
    GemmNT<kHeadDim, kM, kNTiles>(s, sq, warp_srow0, sk + buffer, 0, lane);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (key0 + Tr::kBlockN - 1 > warp_row0 + m * kWarpRows) {
        Mask(s[m], warp_row0 + m * kWarpRows, key0, lane,
             [](int row, int col) { return col > row; });
      }
    }
    // Online softmax (FlashAttention-2 Algorithm 1) in the log2 domain.
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        block_max[0] = fmaxf(block_max[0], fmaxf(s[m][nt][0], s[m][nt][1]));
        block_max[1] = fmaxf(block_max[1], fmaxf(s[m][nt][2], s[m][nt][3]));
      }
      float neg_max[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float new_max = fmaxf(row_max[m][r], QuadMax(block_max[r]) * scale_log2);
        // A row with nothing unmasked yet keeps max -inf; subtract 0 then (exp2(-inf) = 0),
        // not -inf - -inf = NaN.
        const float use_max = new_max == -INFINITY ? 0.0f : new_max;
        const float correction = Exp2(row_max[m][r] - use_max);
        row_max[m][r] = new_max;
        row_sum[m][r] *= correction;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[m][dt][2 * r] *= correction;
          o[m][dt][2 * r + 1] *= correction;
        }
        neg_max[r] = -use_max;
      }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[m][nt][i] = Exp2(fmaf(s[m][nt][i], scale_log2, neg_max[i >> 1]));
          row_sum[m][i >> 1] += s[m][nt][i];
        }
      }
    }
    std::uint32_t pk[kM][kNTiles][2];
#pragma unroll
    for (int m = 0; m < kM; ++m) PackRows(s[m], pk[m]);
    GemmRegNN<kHeadDim, kM, Tr::kBlockN / 16>(o, pk, sv + buffer, 0, lane);
  }
  CpAsyncWait<0>();
  if (warp_row0 >= p.T) return;  // nothing of this warp is stored (no block barrier follows)

#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = QuadSum(row_sum[m][r]);
      inv_sum[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = warp_row0 + m * kWarpRows + (lane >> 2) + 8 * r;
      if ((lane & 3) == 0 && row < p.T) {
        // lse = ln(sum exp(S / sqrt(hd) - max)) + max = ln 2 * (log2(sum) + max_log2).
        p.lse[(std::int64_t{b} * p.NH + h) * p.T + row] = kLn2 * (log2f(sum) + row_max[m][r]);
      }
    }
    StoreRows<kHeadDim>(o[m], inv_sum[0], inv_sum[1], smem, warp_srow0 + m * kWarpRows,
                        p.out + seq_row0 * p.out_stride + h * kHeadDim, p.out_stride,
                        warp_row0 + m * kWarpRows, p.T, lane);
  }
}

// ---- Backward: D = rowsum(dO * O) ------------------------------------------------------------
// kHeadDim / 8 lanes per (row n, head h), 8 elements each; dsum (B, NH, T).
inline constexpr int kDotThreads = 256;
// Enough blocks to fill the GPU several times over; the kernel strides over the rest.
inline constexpr std::int64_t kDotMaxBlocks = 4096;

template <int kHeadDim>
__host__ inline dim3 DotGrid(const FlashArgs& a) {
  const std::int64_t threads = std::int64_t{a.B} * a.T * a.NH * (kHeadDim / 8);
  const std::int64_t blocks = (threads + kDotThreads - 1) / kDotThreads;
  return dim3(static_cast<unsigned>(blocks < kDotMaxBlocks ? blocks : kDotMaxBlocks));
}

template <int kHeadDim>
__global__ void __launch_bounds__(kDotThreads) FlashBackwardDotKernel(const FlashArgs p) {
  constexpr int kLanes = kHeadDim / 8;
  constexpr int kItemsPerWarp = kWarpSize / kLanes;
  const std::int64_t items = std::int64_t{p.B} * p.T * p.NH;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int part = lane % kLanes;
  const std::int64_t warps = std::int64_t{gridDim.x} * (kDotThreads / kWarpSize);
  // The loop bound is warp-uniform, so every shuffle sees the whole warp.
  for (std::int64_t item0 = (std::int64_t{blockIdx.x} * kDotThreads + threadIdx.x) / kWarpSize *
                            kItemsPerWarp;
       item0 < items; item0 += warps * kItemsPerWarp) {
    const std::int64_t item = item0 + lane / kLanes;
    const bool valid = item < items;
    const std::int64_t n = valid ? item / p.NH : 0;
    const int h = valid ? static_cast<int>(item % p.NH) : 0;
    float sum = 0.0f;
    if (valid) {
      const uint4 dov =
          *reinterpret_cast<const uint4*>(p.dout + n * p.out_stride + h * kHeadDim + part * 8);
      const uint4 ov =
          *reinterpret_cast<const uint4*>(p.out_in + n * p.out_stride + h * kHeadDim + part * 8);
      const std::uint32_t dow[4] = {dov.x, dov.y, dov.z, dov.w};
      const std::uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sum = fmaf(Bf16Low(dow[j]), Bf16Low(ow[j]), sum);
        sum = fmaf(Bf16High(dow[j]), Bf16High(ow[j]), sum);
      }
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) sum += ShflXor(sum, offset);
    if (valid && part == 0) {
      const std::int64_t b = n / p.T;
      const std::int64_t t = n % p.T;
      p.dsum[(b * p.NH + h) * p.T + t] = sum;
    }
  }
}

// ---- Backward: dK, dV --------------------------------------------------------------------------
// One block per (key block of kBlockN keys, b * NKV + kv head): grid (B * NKV, ceil(T / kBlockN)),
// blockIdx.y = 0 the first key block (it meets every query: the heaviest). It walks the group's
// query heads ascending and, per head, the query blocks of kBlockM rows from the one holding its
// first key to the end, so dK and dV (in registers, 16 keys per warp) sum in a fixed order.
template <int kHeadDim>
struct BackwardKVTraits {
  static constexpr int kBlockN = 128;
  static constexpr int kBlockM = 64;
  static constexpr int kWarps = kBlockN / kWarpRows;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kKVBytes = kBlockN * Swizzled<kHeadDim>::kRowBytes;
  static constexpr int kQBytes = kBlockM * Swizzled<kHeadDim>::kRowBytes;
  static constexpr int kRowFloatBytes = kBlockM * 4;
  // K, V, Q[2], dO[2], lse[2], D[2].
  static constexpr int kSmemBytes = 2 * kKVBytes + 4 * kQBytes + 4 * kRowFloatBytes;
  __host__ static dim3 Grid(const FlashArgs& a) {
    return dim3(static_cast<unsigned>(a.B * a.NKV),
                static_cast<unsigned>((a.T + kBlockN - 1) / kBlockN));
  }
};

template <int kHeadDim>
__global__ void __launch_bounds__(BackwardKVTraits<kHeadDim>::kThreads, 1)
    FlashBackwardKVKernel(const FlashArgs p) {
  using Tr = BackwardKVTraits<kHeadDim>;
  constexpr int kNTiles = Tr::kBlockM / 8;  // query columns of S^T
  constexpr int kDTiles = kHeadDim / 8;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int n_block = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.x) / p.NKV;
  const int kvh = static_cast<int>(blockIdx.x) % p.NKV;
  const std::int64_t seq_row0 = std::int64_t{b} * p.T;
  const bf16* k = p.k + seq_row0 * p.kv_stride + kvh * kHeadDim;
  const bf16* v = p.v + seq_row0 * p.kv_stride + kvh * kHeadDim;

  unsigned char* smem = SharedMemory();
  const std::uint32_t sk = SmemAddress(smem);
  const std::uint32_t sv = sk + Tr::kKVBytes;
  const std::uint32_t sq = sv + Tr::kKVBytes;           // Q[2]
  const std::uint32_t sdo = sq + 2 * Tr::kQBytes;       // dO[2]
  const std::uint32_t slse = sdo + 2 * Tr::kQBytes;     // lse[2]
  const std::uint32_t sdsum = slse + 2 * Tr::kRowFloatBytes;  // D[2]
  const float* lse_floats = reinterpret_cast<const float*>(smem + (slse - sk));
  const float* dsum_floats = reinterpret_cast<const float*>(smem + (sdsum - sk));

  const int key_row0 = n_block * Tr::kBlockN;
  const int m_first = key_row0 / Tr::kBlockM;
  const int m_count = (p.T + Tr::kBlockM - 1) / Tr::kBlockM - m_first;
  const int steps = p.group * m_count;
  // Step `step`: query head kvh * group + step / m_count, query block m_first + step % m_count.
  const auto load_step = [&](int step, int buffer) {
    const int h = kvh * p.group + step / m_count;
    const int q_row0 = (m_first + step % m_count) * Tr::kBlockM;
    const std::int64_t head_rows = (std::int64_t{b} * p.NH + h) * p.T;
    const std::uint32_t tile = static_cast<std::uint32_t>(buffer) * Tr::kQBytes;
    const std::uint32_t floats = static_cast<std::uint32_t>(buffer) * Tr::kRowFloatBytes;
    LoadTile<Tr::kBlockM, kHeadDim, Tr::kThreads>(
        sq + tile, p.q + seq_row0 * p.q_stride + h * kHeadDim, p.q_stride, q_row0, p.T);
    LoadTile<Tr::kBlockM, kHeadDim, Tr::kThreads>(
        sdo + tile, p.dout + seq_row0 * p.out_stride + h * kHeadDim, p.out_stride, q_row0, p.T);
    LoadRowFloats<Tr::kBlockM, Tr::kThreads>(slse + floats, p.lse_in + head_rows, q_row0, p.T);
    LoadRowFloats<Tr::kBlockM, Tr::kThreads>(sdsum + floats, p.dsum + head_rows, q_row0, p.T);
  };
  LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sk, k, p.kv_stride, key_row0, p.T);
  LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sv, v, p.kv_stride, key_row0, p.T);
  load_step(0, 0);
  CpAsyncCommit();

  const int warp_key0 = key_row0 + warp * kWarpRows;
  const bool warp_active = warp_key0 < p.T;
  const float scale = 1.0f / sqrtf(static_cast<float>(kHeadDim));
  const float scale_log2 = kLog2e * scale;
  float dk[kDTiles][4] = {};
  float dv[kDTiles][4] = {};
  for (int step = 0; step < steps; ++step) {
    const int buffer = step & 1;
    CpAsyncWait<0>();
    __syncthreads();  // this step's tiles visible; everyone is done with the other buffers
    if (step + 1 < steps) load_step(step + 1, buffer ^ 1);
    CpAsyncCommit();
    const int q_row0 = (m_first + step % m_count) * Tr::kBlockM;
    // Warp-uniform: keys all past T, or queries all before the warp's first key.
    if (!warp_active || q_row0 + Tr::kBlockM - 1 < warp_key0) continue;
    const std::uint32_t q_tile = sq + static_cast<std::uint32_t>(buffer) * Tr::kQBytes;
    const std::uint32_t do_tile = sdo + static_cast<std::uint32_t>(buffer) * Tr::kQBytes;
    const float* lse_rows = lse_floats + buffer * Tr::kBlockM;
    const float* dsum_rows = dsum_floats + buffer * Tr::kBlockM;

    // S^T (16 keys x kBlockM queries) = K Q^T; P^T = exp2(S^T scale_log2 - lse log2e), zero
    // where query < key or query >= T.
    float s[kNTiles][4] = {};
    GemmNT<kHeadDim, kNTiles>(s, sk, warp * kWarpRows, q_tile, 0, lane);
    if (q_row0 < warp_key0 + kWarpRows - 1 || q_row0 + Tr::kBlockM > p.T) {
      const int T = p.T;
      Mask(s, warp_key0, q_row0, lane, [T](int key, int query) { return query < key || query >= T; });
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float lse_log2 = lse_rows[FragmentCol(0, lane, nt, i)] * kLog2e;
        s[nt][i] = Exp2(fmaf(s[nt][i], scale_log2, -lse_log2));
      }
    }
    // dV += P^T dO.
    std::uint32_t pk[kNTiles][2];
    PackRows(s, pk);
    GemmRegNN<kHeadDim, Tr::kBlockM / 16>(dv, pk, do_tile, 0, lane);
    // dP^T = V dO^T; dS^T = P^T (dP^T - D).
    float ds[kNTiles][4] = {};
    GemmNT<kHeadDim, kNTiles>(ds, sv, warp * kWarpRows, do_tile, 0, lane);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ds[nt][i] = s[nt][i] * (ds[nt][i] - dsum_rows[FragmentCol(0, lane, nt, i)]);
      }
    }
    // dK += dS^T Q (scaled by 1 / sqrt(hd) at the end).
    PackRows(ds, pk);
    GemmRegNN<kHeadDim, Tr::kBlockM / 16>(dk, pk, q_tile, 0, lane);
  }
  CpAsyncWait<0>();
  if (!warp_active) return;
  StoreRows<kHeadDim>(dk, scale, scale, smem, warp * kWarpRows,
                      p.dk + seq_row0 * p.kv_stride + kvh * kHeadDim, p.kv_stride, warp_key0,
                      p.T, lane);
  StoreRows<kHeadDim>(dv, 1.0f, 1.0f, smem + Tr::kKVBytes, warp * kWarpRows,
                      p.dv + seq_row0 * p.kv_stride + kvh * kHeadDim, p.kv_stride, warp_key0,
                      p.T, lane);
}

// ---- Backward: dQ ------------------------------------------------------------------------------
// One block per (query block of kBlockM rows, b * NH + h), as the forward, key blocks from the
// diagonal down; dQ in registers (16 rows per warp).
template <int kHeadDim>
struct BackwardQTraits {
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 64;
  static constexpr int kWarps = kBlockM / kWarpRows;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kQBytes = kBlockM * Swizzled<kHeadDim>::kRowBytes;
  static constexpr int kKVBytes = kBlockN * Swizzled<kHeadDim>::kRowBytes;
  // Q, dO, K[2], V[2].
  static constexpr int kSmemBytes = 2 * kQBytes + 4 * kKVBytes;
  __host__ static dim3 Grid(const FlashArgs& a) {
    return dim3(static_cast<unsigned>(a.B * a.NH),
                static_cast<unsigned>((a.T + kBlockM - 1) / kBlockM));
  }
};

template <int kHeadDim>
__global__ void __launch_bounds__(BackwardQTraits<kHeadDim>::kThreads, 1)
    FlashBackwardQKernel(const FlashArgs p) {
  using Tr = BackwardQTraits<kHeadDim>;
  constexpr int kNTiles = Tr::kBlockN / 8;
  constexpr int kDTiles = kHeadDim / 8;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int m_block = static_cast<int>(gridDim.y - 1 - blockIdx.y);
  const int b = static_cast<int>(blockIdx.x) / p.NH;
  const int h = static_cast<int>(blockIdx.x) % p.NH;
  const std::int64_t seq_row0 = std::int64_t{b} * p.T;
  const std::int64_t head_rows = (std::int64_t{b} * p.NH + h) * p.T;
  const bf16* k = p.k + seq_row0 * p.kv_stride + (h / p.group) * kHeadDim;
  const bf16* v = p.v + seq_row0 * p.kv_stride + (h / p.group) * kHeadDim;

  unsigned char* smem = SharedMemory();
  const std::uint32_t sq = SmemAddress(smem);
  const std::uint32_t sdo = sq + Tr::kQBytes;
  const std::uint32_t sk = sdo + Tr::kQBytes;  // K[2]
  const std::uint32_t sv = sk + 2 * Tr::kKVBytes;  // V[2]

  const int row0 = m_block * Tr::kBlockM;
  const int n_blocks = (min(p.T, row0 + Tr::kBlockM) + Tr::kBlockN - 1) / Tr::kBlockN;
  LoadTile<Tr::kBlockM, kHeadDim, Tr::kThreads>(sq, p.q + seq_row0 * p.q_stride + h * kHeadDim,
                                                p.q_stride, row0, p.T);
  LoadTile<Tr::kBlockM, kHeadDim, Tr::kThreads>(
      sdo, p.dout + seq_row0 * p.out_stride + h * kHeadDim, p.out_stride, row0, p.T);
  LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sk, k, p.kv_stride, (n_blocks - 1) * Tr::kBlockN,
                                                p.T);
  LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sv, v, p.kv_stride, (n_blocks - 1) * Tr::kBlockN,
                                                p.T);
  CpAsyncCommit();

  const int warp_row0 = row0 + warp * kWarpRows;
  const float scale = 1.0f / sqrtf(static_cast<float>(kHeadDim));
  const float scale_log2 = kLog2e * scale;
  // Rows g, g + 8: lse (log2 domain) and D; rows past T read as 0 (their P and dS stay finite
  // and are never stored).
  float neg_lse_log2[2];
  float row_dsum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp_row0 + (lane >> 2) + 8 * r;
    neg_lse_log2[r] = row < p.T ? -p.lse_in[head_rows + row] * kLog2e : 0.0f;
    row_dsum[r] = row < p.T ? p.dsum[head_rows + row] : 0.0f;
  }
  float dq[kDTiles][4] = {};
  for (int it = 0; it < n_blocks; ++it) {
    const int n_block = n_blocks - 1 - it;
    const std::uint32_t buffer = static_cast<std::uint32_t>(it & 1) * Tr::kKVBytes;
    CpAsyncWait<0>();
    __syncthreads();
    if (n_block > 0) {
      const std::uint32_t next = static_cast<std::uint32_t>((it + 1) & 1) * Tr::kKVBytes;
      LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sk + next, k, p.kv_stride,
                                                    (n_block - 1) * Tr::kBlockN, p.T);
      LoadTile<Tr::kBlockN, kHeadDim, Tr::kThreads>(sv + next, v, p.kv_stride,
                                                    (n_block - 1) * Tr::kBlockN, p.T);
    }
    CpAsyncCommit();
    const int key0 = n_block * Tr::kBlockN;
    if (warp_row0 >= p.T || key0 > warp_row0 + kWarpRows - 1) continue;

    // P = exp2(S scale_log2 - lse log2e), zero above the diagonal.
    float s[kNTiles][4] = {};
    GemmNT<kHeadDim, kNTiles>(s, sq, warp * kWarpRows, sk + buffer, 0, lane);
    if (key0 + Tr::kBlockN - 1 > warp_row0) {
      Mask(s, warp_row0, key0, lane, [](int row, int col) { return col > row; });
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = Exp2(fmaf(s[nt][i], scale_log2, neg_lse_log2[i >> 1]));
    }
    // dP = dO V^T; dS = P (dP - D).
    float ds[kNTiles][4] = {};
    GemmNT<kHeadDim, kNTiles>(ds, sdo, warp * kWarpRows, sv + buffer, 0, lane);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) ds[nt][i] = s[nt][i] * (ds[nt][i] - row_dsum[i >> 1]);
    }
    // dQ += dS K (scaled by 1 / sqrt(hd) at the end).
    std::uint32_t pk[kNTiles][2];
    PackRows(ds, pk);
    GemmRegNN<kHeadDim, Tr::kBlockN / 16>(dq, pk, sk + buffer, 0, lane);
  }
  CpAsyncWait<0>();
  if (warp_row0 >= p.T) return;
  StoreRows<kHeadDim>(dq, scale, scale, smem, warp * kWarpRows,
                      p.dq + seq_row0 * p.q_stride + h * kHeadDim, p.q_stride, warp_row0, p.T,
                      lane);
}

}  // namespace pipeoffload::examples::cuda::flash

#endif  // PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_KERNELS_CUH_
