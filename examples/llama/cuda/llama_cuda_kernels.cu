// The Llama model's elementwise and row-wise kernels (llama_cuda_kernels.h): RMSNorm, RoPE,
// SwiGLU, embedding. Abseil-free launchers (llama_cuda_launch.h); the checked entry points are
// llama_cuda_kernels.cc.
//
// RMSNorm runs one group of threads per segment: a warp for segments of up to 1024 elements
// (qk_norm's heads), a block of kNormThreads otherwise (the hidden rows), reduced with the
// deterministic butterflies of the GPT's kernels_device.cuh; the group size depends on C alone.
// Its weight gradient runs in two passes with no atomics: per (chunk of segments, column) a
// partial summed by a fixed set of lanes in a fixed order, then per column the chunks in order.
// Every elementwise operation is rounded explicitly (__f*_rn), so the packed and the scalar
// instantiations give the same bits and no multiply-add is contracted behind our back.
#include "examples/gpt/cuda/kernels_device.cuh"
#include "examples/llama/cuda/llama_cuda_launch.h"

namespace pipeoffload::llama::cuda::internal {
namespace {

using gpt::cuda::internal::BlockSum;
using gpt::cuda::internal::CanPack;
using gpt::cuda::internal::GridFor;
using gpt::cuda::internal::kPack;
using gpt::cuda::internal::LoadBf16;
using gpt::cuda::internal::LoadF32;
using gpt::cuda::internal::LoadPack;
using gpt::cuda::internal::StoreBf16;
using gpt::cuda::internal::StoreF32;
using gpt::cuda::internal::StorePack;
using gpt::cuda::internal::WarpSum;

constexpr int kNormThreads = 256;       // per block of the RMSNorm kernels
constexpr int kWarpSegmentMax = 1024;   // longest segment one warp normalizes
constexpr int kElementThreads = 256;    // elementwise kernels
constexpr int kEmbeddingThreads = 128;  // per token of the embedding backward

// Sum over the kGroup threads of one segment.
template <int kGroup>
__device__ __forceinline__ float GroupSum(float v) {
  if constexpr (kGroup == 32) {
    return WarpSum(v);
  } else {
    return BlockSum(v);
  }
}

__device__ __forceinline__ std::int64_t SegmentOffset(std::int64_t seg, const NormSegments& s) {
  const std::int64_t n = seg / s.heads;
  const std::int64_t h = seg - n * s.heads;
  return n * s.row_stride + h * s.C;
}

// Per segment: rstd = 1 / sqrt(mean(x^2) + eps), out = (x * rstd) * w. Grid: segments / (block
// threads / kGroup); a segment's group returns together, so the reductions see whole groups.
template <int kGroup, bool kAligned>
__global__ void RmsNormForwardKernel(bf16* out, float* rstd, const bf16* inp, const bf16* w,
                                     NormSegments s, float eps) {
  const std::int64_t seg = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kGroup;
  if (seg >= s.segments) return;
  const int lane = threadIdx.x % kGroup;
  const std::int64_t at = SegmentOffset(seg, s);
  float squares = 0.0f;
  for (int c = lane * kPack; c < s.C; c += kGroup * kPack) {
    float v[kPack];
    const int count = LoadPack<kAligned>(inp + at, c, s.C, v);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) squares = __fmaf_rn(v[k], v[k], squares);
    }
  }
  squares = GroupSum<kGroup>(squares);
  const float r =
      __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(squares, static_cast<float>(s.C)), eps)));
  for (int c = lane * kPack; c < s.C; c += kGroup * kPack) {
    float v[kPack];
    float wv[kPack];
    LoadPack<kAligned>(inp + at, c, s.C, v);
    LoadPack<kAligned>(w, c, s.C, wv);
#pragma unroll
    for (int k = 0; k < kPack; ++k) v[k] = __fmul_rn(__fmul_rn(v[k], r), wv[k]);
    StorePack<kAligned>(out + at, c, s.C, v);
  }
  if (lane == 0) rstd[seg] = r;
}

// dinp = (w dy - x coef) * r [+ residual], coef = mean(w dy x) * r * r (the CPU's formula).
template <int kGroup, bool kAligned>
__global__ void RmsNormBackwardInputKernel(bf16* dinp, const bf16* dout, const bf16* residual,
                                           const bf16* inp, const bf16* w, const float* rstd,
                                           NormSegments s) {
  const std::int64_t seg = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kGroup;
  if (seg >= s.segments) return;
  const int lane = threadIdx.x % kGroup;
  const std::int64_t at = SegmentOffset(seg, s);
  const float r = rstd[seg];
  float sum = 0.0f;
  for (int c = lane * kPack; c < s.C; c += kGroup * kPack) {
    float x[kPack];
    float dy[kPack];
    float wv[kPack];
    const int count = LoadPack<kAligned>(inp + at, c, s.C, x);
    LoadPack<kAligned>(dout + at, c, s.C, dy);
    LoadPack<kAligned>(w, c, s.C, wv);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) sum = __fmaf_rn(__fmul_rn(wv[k], dy[k]), x[k], sum);
    }
  }
  sum = GroupSum<kGroup>(sum);
  const float coef = __fmul_rn(__fmul_rn(__fdiv_rn(sum, static_cast<float>(s.C)), r), r);
  for (int c = lane * kPack; c < s.C; c += kGroup * kPack) {
    float x[kPack];
    float dy[kPack];
    float wv[kPack];
    float res[kPack];
    LoadPack<kAligned>(inp + at, c, s.C, x);
    LoadPack<kAligned>(dout + at, c, s.C, dy);
    LoadPack<kAligned>(w, c, s.C, wv);
    if (residual != nullptr) LoadPack<kAligned>(residual + at, c, s.C, res);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      float dx = __fmul_rn(__fsub_rn(__fmul_rn(wv[k], dy[k]), __fmul_rn(x[k], coef)), r);
      if (residual != nullptr) dx = __fadd_rn(dx, res[k]);
      x[k] = dx;
    }
    StorePack<kAligned>(dinp + at, c, s.C, x);
  }
}

// Pass one of dweight: block (cols x lanes) covers cols packs of kPack columns of one chunk of
// `rows_per_chunk` segments; lane y takes segments s0 + y, s0 + y + lanes, ... in order, then
// lane 0 adds the lanes' sums in lane order into partial[chunk, column]. The block's shape
// depends on C alone (see the launcher), and both paths give a thread the same columns in the
// same order, so the packed and the scalar path give the same bits.
template <bool kAligned>
__global__ void RmsNormWeightPartialKernel(float* partial, const bf16* dout, const bf16* inp,
                                           const float* rstd, NormSegments s, int rows_per_chunk) {
  __shared__ float lanes_sum[kNormThreads * kPack];
  const int cols = blockDim.x;
  const int lanes = blockDim.y;
  const int c = (blockIdx.y * cols + threadIdx.x) * kPack;
  const std::int64_t s0 = std::int64_t{blockIdx.x} * rows_per_chunk;
  const std::int64_t s1 = s0 + rows_per_chunk < s.segments ? s0 + rows_per_chunk : s.segments;
  float acc[kPack];
#pragma unroll
  for (int k = 0; k < kPack; ++k) acc[k] = 0.0f;
  if (c < s.C) {
    for (std::int64_t seg = s0 + threadIdx.y; seg < s1; seg += lanes) {
      const std::int64_t at = SegmentOffset(seg, s);
      const float r = rstd[seg];
      float x[kPack];
      float dy[kPack];
      LoadPack<kAligned>(inp + at, c, s.C, x);  // zeros past the row: they add nothing
      LoadPack<kAligned>(dout + at, c, s.C, dy);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        acc[k] = __fadd_rn(acc[k], __fmul_rn(dy[k], __fmul_rn(x[k], r)));
      }
    }
  }
  float* mine = lanes_sum + (threadIdx.y * cols + threadIdx.x) * kPack;
#pragma unroll
  for (int k = 0; k < kPack; ++k) mine[k] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= s.C) return;
  for (int y = 1; y < lanes; ++y) {
    const float* theirs = lanes_sum + (y * cols + threadIdx.x) * kPack;
#pragma unroll
    for (int k = 0; k < kPack; ++k) acc[k] = __fadd_rn(acc[k], theirs[k]);
  }
  float* out = partial + std::int64_t{blockIdx.x} * s.C;
  if constexpr (kAligned) {
    StoreF32<kPack>(out + c, acc);
  } else {
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (c + k < s.C) out[c + k] = acc[k];
    }
  }
}

// Pass two: block (32 columns x 8 lanes); lane y sums chunks y, y + 8, ... of its column, then
// lane 0 adds the 8 in order and adds the total to dweight.
constexpr int kFinishCols = 32;
constexpr int kFinishLanes = 8;
__global__ void ColumnFinishKernel(float* dweight, const float* partial, std::int64_t chunks,
                                   int C) {
  __shared__ float lanes_sum[kFinishLanes][kFinishCols];
  const int c = blockIdx.x * kFinishCols + threadIdx.x;
  float total = 0.0f;
  if (c < C) {
    for (std::int64_t k = threadIdx.y; k < chunks; k += kFinishLanes) {
      total = __fadd_rn(total, partial[k * C + c]);
    }
  }
  lanes_sum[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int y = 1; y < kFinishLanes; ++y) total = __fadd_rn(total, lanes_sum[y][threadIdx.x]);
  dweight[c] = __fadd_rn(dweight[c], total);
}

// x'[i] = x[i] c - x[i + half] s, x'[i + half] = x[i + half] c + x[i] s, s = sign * sin: the
// CPU's RopeApply operation for operation. Item = (row, head, pack of kVec pairs).
template <int kVec>
__global__ void RopeKernel(bf16* x, const float* cos_sin, std::int64_t items, int heads, int half,
                           int T, std::int64_t row_stride, float sign) {
  const int packs = half / kVec;
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t item = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    const std::int64_t nh = item / packs;
    const int i0 = static_cast<int>(item - nh * packs) * kVec;
    const std::int64_t n = nh / heads;
    const int h = static_cast<int>(nh - n * heads);
    const int t = static_cast<int>(n % T);
    bf16* v = x + n * row_stride + std::int64_t{h} * 2 * half + i0;
    const float* cs = cos_sin + (std::int64_t{t} * half + i0) * 2;  // (kVec, 2)
    float a[kVec];
    float b[kVec];
    float table[2 * kVec];
    LoadBf16<kVec>(v, a);
    LoadBf16<kVec>(v + half, b);
    if constexpr (kVec == kPack) {
      float lo[kPack];
      float hi[kPack];
      LoadF32<kPack>(cs, lo);
      LoadF32<kPack>(cs + kPack, hi);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        table[k] = lo[k];
        table[kPack + k] = hi[k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < 2 * kVec; ++k) table[k] = cs[k];
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float c = table[2 * k];
      const float s = sign * table[2 * k + 1];  // exact: a sign flip
      const float ak = a[k];
      a[k] = __fsub_rn(__fmul_rn(ak, c), __fmul_rn(b[k], s));
      b[k] = __fadd_rn(__fmul_rn(b[k], c), __fmul_rn(ak, s));
    }
    StoreBf16<kVec>(v, a);
    StoreBf16<kVec>(v + half, b);
  }
}

// silu(g) = g / (1 + exp(-g)), the CPU's formula.
template <int kVec>
__global__ void SwiGluForwardKernel(bf16* out, const bf16* gate_up, std::int64_t N, int F) {
  const int packs = F / kVec;
  const std::int64_t items = N * packs;
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t item = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    const std::int64_t n = item / packs;
    const int i = static_cast<int>(item - n * packs) * kVec;
    const bf16* g = gate_up + n * 2 * F + i;
    float gv[kVec];
    float uv[kVec];
    LoadBf16<kVec>(g, gv);
    LoadBf16<kVec>(g + F, uv);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float e = __fadd_rn(1.0f, expf(-gv[k]));
      gv[k] = __fmul_rn(__fdiv_rn(gv[k], e), uv[k]);
    }
    StoreBf16<kVec>(out + n * F + i, gv);
  }
}

// dgate = (dy up) silu'(g), dup = dy silu(g), silu' = sig (1 + g (1 - sig)): the CPU's formulas.
template <int kVec>
__global__ void SwiGluBackwardKernel(bf16* dgate_up, const bf16* dout, const bf16* gate_up,
                                     std::int64_t N, int F) {
  const int packs = F / kVec;
  const std::int64_t items = N * packs;
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t item = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    const std::int64_t n = item / packs;
    const int i = static_cast<int>(item - n * packs) * kVec;
    const std::int64_t at = n * 2 * F + i;
    float gv[kVec];
    float uv[kVec];
    float dy[kVec];
    LoadBf16<kVec>(gate_up + at, gv);
    LoadBf16<kVec>(gate_up + at + F, uv);
    LoadBf16<kVec>(dout + n * F + i, dy);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float e = __fadd_rn(1.0f, expf(-gv[k]));
      const float sig = __fdiv_rn(1.0f, e);
      const float silu = __fdiv_rn(gv[k], e);
      const float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(gv[k], __fsub_rn(1.0f, sig))));
      gv[k] = __fmul_rn(__fmul_rn(dy[k], uv[k]), dsilu);
      uv[k] = __fmul_rn(dy[k], silu);
    }
    StoreBf16<kVec>(dgate_up + at, gv);
    StoreBf16<kVec>(dgate_up + at + F, uv);
  }
}

template <int kVec>
__global__ void EmbeddingForwardKernel(bf16* out, const std::int32_t* tokens, const bf16* table,
                                       int N, int H) {
  const int packs = H / kVec;
  const std::int64_t items = std::int64_t{N} * packs;
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t item = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    const std::int64_t n = item / packs;
    const int c = static_cast<int>(item - n * packs) * kVec;
    const bf16* src = table + std::int64_t{tokens[n]} * H + c;
    bf16* dst = out + n * H + c;
    if constexpr (kVec == kPack) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      *dst = *src;
    }
  }
}

// One block per distinct token (grid-stride): its table row += its rows of dout, in the
// index's (ascending) row order.
template <int kVec>
__global__ void EmbeddingBackwardKernel(float* dtable, const bf16* dout, const std::int32_t* index,
                                        int segments, int N, int H) {
  const std::int32_t* rows = index;
  const std::int32_t* starts = index + N;
  const std::int32_t* tokens = index + N + segments + 1;
  for (int seg = blockIdx.x; seg < segments; seg += gridDim.x) {
    float* d = dtable + std::int64_t{tokens[seg]} * H;
    const int j0 = starts[seg];
    const int j1 = starts[seg + 1];
    for (int c = threadIdx.x * kVec; c < H; c += blockDim.x * kVec) {
      float acc[kVec];
      LoadF32<kVec>(d + c, acc);
      for (int j = j0; j < j1; ++j) {
        float g[kVec];
        LoadBf16<kVec>(dout + std::int64_t{rows[j]} * H + c, g);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], g[k]);
      }
      StoreF32<kVec>(d + c, acc);
    }
  }
}

// Blocks of kNormThreads covering every segment with groups of `group` threads.
unsigned NormBlocks(std::int64_t segments, int group) {
  const std::int64_t per_block = kNormThreads / group;
  return static_cast<unsigned>((segments + per_block - 1) / per_block);
}

bool NormPacked(const NormSegments& s) { return s.C % kPack == 0 && s.row_stride % kPack == 0; }

}  // namespace

cudaError_t LaunchRmsNormForward(bf16* out, float* rstd, const bf16* inp, const bf16* weight,
                                 const NormSegments& s, float eps, cudaStream_t stream) {
  const bool packed = NormPacked(s) && CanPack(s.C, out, inp, weight);
  if (s.C <= kWarpSegmentMax) {
    const unsigned blocks = NormBlocks(s.segments, 32);
    if (packed) {
      RmsNormForwardKernel<32, true>
          <<<blocks, kNormThreads, 0, stream>>>(out, rstd, inp, weight, s, eps);
    } else {
      RmsNormForwardKernel<32, false>
          <<<blocks, kNormThreads, 0, stream>>>(out, rstd, inp, weight, s, eps);
    }
  } else {
    const unsigned blocks = NormBlocks(s.segments, kNormThreads);
    if (packed) {
      RmsNormForwardKernel<kNormThreads, true>
          <<<blocks, kNormThreads, 0, stream>>>(out, rstd, inp, weight, s, eps);
    } else {
      RmsNormForwardKernel<kNormThreads, false>
          <<<blocks, kNormThreads, 0, stream>>>(out, rstd, inp, weight, s, eps);
    }
  }
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* residual,
                                       const bf16* inp, const bf16* weight, const float* rstd,
                                       const NormSegments& s, cudaStream_t stream) {
  const bool packed = NormPacked(s) && CanPack(s.C, dinp, dout, inp, weight) &&
                      (residual == nullptr || CanPack(s.C, residual));
  if (s.C <= kWarpSegmentMax) {
    const unsigned blocks = NormBlocks(s.segments, 32);
    if (packed) {
      RmsNormBackwardInputKernel<32, true>
          <<<blocks, kNormThreads, 0, stream>>>(dinp, dout, residual, inp, weight, rstd, s);
    } else {
      RmsNormBackwardInputKernel<32, false>
          <<<blocks, kNormThreads, 0, stream>>>(dinp, dout, residual, inp, weight, rstd, s);
    }
  } else {
    const unsigned blocks = NormBlocks(s.segments, kNormThreads);
    if (packed) {
      RmsNormBackwardInputKernel<kNormThreads, true>
          <<<blocks, kNormThreads, 0, stream>>>(dinp, dout, residual, inp, weight, rstd, s);
    } else {
      RmsNormBackwardInputKernel<kNormThreads, false>
          <<<blocks, kNormThreads, 0, stream>>>(dinp, dout, residual, inp, weight, rstd, s);
    }
  }
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormBackwardWeight(float* dweight, float* scratch, const bf16* dout,
                                        const bf16* inp, const float* rstd, const NormSegments& s,
                                        int rows_per_chunk, cudaStream_t stream) {
  const std::int64_t chunks = (s.segments + rows_per_chunk - 1) / rows_per_chunk;
  const bool packed = NormPacked(s) && CanPack(s.C, scratch, dout, inp);
  // Column threads: enough for the row's packs, a power of two up to 32; the rest are lanes.
  int cols = 32;
  while (cols > 1 && cols / 2 * kPack >= s.C) cols /= 2;
  const dim3 block(cols, kNormThreads / cols);
  const int per_block = cols * kPack;
  const dim3 grid(static_cast<unsigned>(chunks),
                  static_cast<unsigned>((s.C + per_block - 1) / per_block));
  if (packed) {
    RmsNormWeightPartialKernel<true>
        <<<grid, block, 0, stream>>>(scratch, dout, inp, rstd, s, rows_per_chunk);
  } else {
    RmsNormWeightPartialKernel<false>
        <<<grid, block, 0, stream>>>(scratch, dout, inp, rstd, s, rows_per_chunk);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const unsigned finish_blocks = static_cast<unsigned>((s.C + kFinishCols - 1) / kFinishCols);
  ColumnFinishKernel<<<finish_blocks, dim3(kFinishCols, kFinishLanes), 0, stream>>>(
      dweight, scratch, chunks, s.C);
  return cudaGetLastError();
}

cudaError_t LaunchRope(bf16* x, const float* cos_sin, int N, int T, int heads, int hd,
                       std::int64_t row_stride, bool transpose, cudaStream_t stream) {
  const int half = hd / 2;
  const float sign = transpose ? -1.0f : 1.0f;
  const bool packed = half % kPack == 0 && row_stride % kPack == 0 && CanPack(kPack, x, cos_sin);
  const std::int64_t pairs = std::int64_t{N} * heads * half;
  if (packed) {
    const std::int64_t items = pairs / kPack;
    RopeKernel<kPack><<<GridFor(items, kElementThreads), kElementThreads, 0, stream>>>(
        x, cos_sin, items, heads, half, T, row_stride, sign);
  } else {
    RopeKernel<1><<<GridFor(pairs, kElementThreads), kElementThreads, 0, stream>>>(
        x, cos_sin, pairs, heads, half, T, row_stride, sign);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluForward(bf16* out, const bf16* gate_up, std::int64_t N, int F,
                                cudaStream_t stream) {
  const std::int64_t n = N * F;
  if (CanPack(F, out, gate_up)) {
    SwiGluForwardKernel<kPack>
        <<<GridFor(n / kPack, kElementThreads), kElementThreads, 0, stream>>>(out, gate_up, N, F);
  } else {
    SwiGluForwardKernel<1>
        <<<GridFor(n, kElementThreads), kElementThreads, 0, stream>>>(out, gate_up, N, F);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluBackward(bf16* dgate_up, const bf16* dout, const bf16* gate_up,
                                 std::int64_t N, int F, cudaStream_t stream) {
  const std::int64_t n = N * F;
  if (CanPack(F, dgate_up, dout, gate_up)) {
    SwiGluBackwardKernel<kPack>
        <<<GridFor(n / kPack, kElementThreads), kElementThreads, 0, stream>>>(dgate_up, dout,
                                                                              gate_up, N, F);
  } else {
    SwiGluBackwardKernel<1><<<GridFor(n, kElementThreads), kElementThreads, 0, stream>>>(
        dgate_up, dout, gate_up, N, F);
  }
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(bf16* out, const std::int32_t* tokens, const bf16* table, int N,
                                   int H, cudaStream_t stream) {
  const std::int64_t n = std::int64_t{N} * H;
  if (CanPack(H, out, table)) {
    EmbeddingForwardKernel<kPack>
        <<<GridFor(n / kPack, kElementThreads), kElementThreads, 0, stream>>>(out, tokens, table, N,
                                                                              H);
  } else {
    EmbeddingForwardKernel<1>
        <<<GridFor(n, kElementThreads), kElementThreads, 0, stream>>>(out, tokens, table, N, H);
  }
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(float* dtable, const bf16* dout, const std::int32_t* index,
                                    int segments, int N, int H, cudaStream_t stream) {
  const unsigned blocks = GridFor(segments, 1);
  if (CanPack(H, dtable, dout)) {
    EmbeddingBackwardKernel<kPack>
        <<<blocks, kEmbeddingThreads, 0, stream>>>(dtable, dout, index, segments, N, H);
  } else {
    EmbeddingBackwardKernel<1>
        <<<blocks, kEmbeddingThreads, 0, stream>>>(dtable, dout, index, segments, N, H);
  }
  return cudaGetLastError();
}

}  // namespace pipeoffload::llama::cuda::internal
