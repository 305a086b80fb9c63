// LayerNorm forward and backward, and the bias gradient of a linear layer.
//
// LayerNormApply (the output stage alone, for recomputing a LayerNorm output that was not saved)
// is elementwise and shares Normalize with the forward kernels, so it reproduces their bits.
//
// Row-wise kernels run one block per row, reduced with the deterministic block sums of
// kernels_device.cuh. Aligned rows of up to kMaxCachedPacks * kRowThreads * kPack elements
// (C <= 8192) stay in registers (as packed bf16) between the passes, so each input is read from
// memory once; other rows are read again per pass (from L2). All variants give a thread the same
// elements in the same order with the same explicitly rounded arithmetic, so the result bits
// depend on the sizes only, never on the alignment that picks the variant.
//
// Column sums (weight and bias gradients) run in two stages so that no float atomics are needed:
// stage one gives every chunk of kColumnSumRowsPerChunk rows and every column its partial sum,
// in row order, in `scratch`; stage two adds the chunks in order and adds the total to the
// gradient.
#include "examples/gpt/cuda/kernels_device.cuh"
#include "examples/gpt/cuda/kernels_launch.h"
#include "examples/gpt/kernels_cpu.h"

namespace pipeoffload::gpt::cuda::internal {
namespace {

constexpr int kRowThreads = 128;     // per row of a row-wise kernel
constexpr int kColumnThreads = 128;  // per slab of columns in stage one
constexpr int kFinishThreads = 256;  // stage two: one thread per column

// The arithmetic the loop and the cached kernels share, rounded explicitly (__f*_rn) so that no
// multiply-add is contracted in one kernel and not in the other: both give the same bits.
__device__ __forceinline__ float AddSquare(float acc, float v, float m) {
  const float d = __fsub_rn(v, m);
  return __fmaf_rn(d, d, acc);
}
__device__ __forceinline__ float Normalize(float v, float m, float s, float w, float b) {
  return __fmaf_rn(__fmul_rn(__fsub_rn(v, m), s), w, b);
}
__device__ __forceinline__ void AddDnorm(float x, float dy, float w, float m, float s,
                                         float& dnorm_sum, float& dnorm_norm_sum) {
  const float dnorm = __fmul_rn(w, dy);
  dnorm_sum = __fadd_rn(dnorm_sum, dnorm);
  dnorm_norm_sum = __fmaf_rn(dnorm, __fmul_rn(__fsub_rn(x, m), s), dnorm_norm_sum);
}
// dx + rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)).
__device__ __forceinline__ float AddDx(float dx, float x, float dy, float w, float m, float s,
                                       float dnorm_mean, float dnorm_norm_mean) {
  const float norm = __fmul_rn(__fsub_rn(x, m), s);
  const float t = __fmaf_rn(-norm, dnorm_norm_mean, __fsub_rn(__fmul_rn(w, dy), dnorm_mean));
  return __fmaf_rn(t, s, dx);
}

// Per row n of inp (N,C): mean, rstd, out = (x - mean) * rstd * w + b. Grid: N. Thread t reads
// the packs t, t + kRowThreads, ... of the row, once per pass.
template <bool kAligned>
__global__ void LayerNormForwardKernel(__nv_bfloat16* out, float* mean, float* rstd,
                                       const __nv_bfloat16* inp, const __nv_bfloat16* w,
                                       const __nv_bfloat16* b, int C) {
  const std::int64_t row = std::int64_t{blockIdx.x} * C;
  const __nv_bfloat16* x = inp + row;
  const int first = threadIdx.x * kPack;
  constexpr int kStep = kRowThreads * kPack;
  float sum = 0.0f;
  for (int c = first; c < C; c += kStep) {
    float v[kPack];
    const int count = LoadPack<kAligned>(x, c, C, v);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) sum = __fadd_rn(sum, v[k]);
    }
  }
  const float m = BlockSum(sum) / static_cast<float>(C);
  // The variance from the deviations (two passes), as the CPU: no cancellation of E[x^2] - m^2.
  float squares = 0.0f;
  for (int c = first; c < C; c += kStep) {
    float v[kPack];
    const int count = LoadPack<kAligned>(x, c, C, v);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) squares = AddSquare(squares, v[k], m);
    }
  }
  const float s = 1.0f / sqrtf(BlockSum(squares) / static_cast<float>(C) + kLayerNormEps);
  for (int c = first; c < C; c += kStep) {
    float v[kPack];
    float wv[kPack];
    float bv[kPack];
    LoadPack<kAligned>(x, c, C, v);
    LoadPack<kAligned>(w, c, C, wv);
    LoadPack<kAligned>(b, c, C, bv);
#pragma unroll
    for (int k = 0; k < kPack; ++k) v[k] = Normalize(v[k], m, s, wv[k], bv[k]);
    StorePack<kAligned>(out + row, c, C, v);
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
}

constexpr int kMaxCachedPacks = 8;  // per thread: C <= 8 * 128 * 8 = 8192

// LayerNormForwardKernel for aligned rows of at most kPacks * kRowThreads packs, the row held
// in registers: the same packs per thread in the same order, so the same bits.
template <int kPacks>
__global__ void LayerNormForwardCachedKernel(__nv_bfloat16* out, float* mean, float* rstd,
                                             const __nv_bfloat16* inp, const __nv_bfloat16* w,
                                             const __nv_bfloat16* b, int C) {
  const std::int64_t row = std::int64_t{blockIdx.x} * C;
  uint4 x[kPacks];
  float sum = 0.0f;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int c = (threadIdx.x + p * kRowThreads) * kPack;
    if (c < C) {
      x[p] = *reinterpret_cast<const uint4*>(inp + row + c);
      float v[kPack];
      UnpackBf16(x[p], v);
#pragma unroll
      for (int k = 0; k < kPack; ++k) sum = __fadd_rn(sum, v[k]);
    }
  }
  const float m = BlockSum(sum) / static_cast<float>(C);
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int c = (threadIdx.x + p * kRowThreads) * kPack;
    if (c < C) {
      float v[kPack];
      UnpackBf16(x[p], v);
#pragma unroll
      for (int k = 0; k < kPack; ++k) squares = AddSquare(squares, v[k], m);
    }
  }
  const float s = 1.0f / sqrtf(BlockSum(squares) / static_cast<float>(C) + kLayerNormEps);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int c = (threadIdx.x + p * kRowThreads) * kPack;
    if (c < C) {
      float v[kPack];
      float wv[kPack];
      float bv[kPack];
      UnpackBf16(x[p], v);
      LoadBf16<kPack>(w + c, wv);
      LoadBf16<kPack>(b + c, bv);
#pragma unroll
      for (int k = 0; k < kPack; ++k) v[k] = Normalize(v[k], m, s, wv[k], bv[k]);
      StoreBf16<kPack>(out + row + c, v);
    }
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
}

// LayerNormForward's output stage alone, from the mean and rstd it saved: out = Normalize(x, mean,
// rstd, w, b) per element with the same explicitly rounded arithmetic and the same bf16 rounding,
// so out is bit for bit what the forward wrote (the saved statistics are the very floats the
// forward normalized with). Elementwise, not row-wise: no reduction is needed, so a grid-stride
// loop over packs of kVec elements (kVec = kPack: C a multiple of kPack and every pointer
// 16-byte aligned, so a pack never straddles two rows; kVec = 1 otherwise).
template <int kVec>
__global__ void LayerNormApplyKernel(__nv_bfloat16* out, const __nv_bfloat16* inp,
                                     const __nv_bfloat16* w, const __nv_bfloat16* b,
                                     const float* mean, const float* rstd, std::int64_t n, int C) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x * kVec;
  for (std::int64_t i = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVec; i < n;
       i += stride) {
    const std::int64_t row = i / C;
    const int c = static_cast<int>(i - row * C);
    const float m = mean[row];
    const float s = rstd[row];
    float v[kVec];
    float wv[kVec];
    float bv[kVec];
    LoadBf16<kVec>(inp + i, v);
    LoadBf16<kVec>(w + c, wv);
    LoadBf16<kVec>(b + c, bv);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = Normalize(v[k], m, s, wv[k], bv[k]);
    StoreBf16<kVec>(out + i, v);
  }
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = w * dout, per row.
template <bool kAligned>
__global__ void LayerNormBackwardInputKernel(__nv_bfloat16* dinp, const __nv_bfloat16* dout,
                                             const __nv_bfloat16* inp, const __nv_bfloat16* w,
                                             const float* mean, const float* rstd, int C) {
  const std::int64_t row = std::int64_t{blockIdx.x} * C;
  const float m = mean[blockIdx.x];
  const float s = rstd[blockIdx.x];
  const int first = threadIdx.x * kPack;
  constexpr int kStep = kRowThreads * kPack;
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int c = first; c < C; c += kStep) {
    float x[kPack];
    float dy[kPack];
    float wv[kPack];
    const int count = LoadPack<kAligned>(inp + row, c, C, x);
    LoadPack<kAligned>(dout + row, c, C, dy);
    LoadPack<kAligned>(w, c, C, wv);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) AddDnorm(x[k], dy[k], wv[k], m, s, dnorm_sum, dnorm_norm_sum);
    }
  }
  const float dnorm_mean = BlockSum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_norm_mean = BlockSum(dnorm_norm_sum) / static_cast<float>(C);
  for (int c = first; c < C; c += kStep) {
    float x[kPack];
    float dy[kPack];
    float wv[kPack];
    float dx[kPack];
    LoadPack<kAligned>(inp + row, c, C, x);
    LoadPack<kAligned>(dout + row, c, C, dy);
    LoadPack<kAligned>(w, c, C, wv);
    LoadPack<kAligned>(dinp + row, c, C, dx);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      dx[k] = AddDx(dx[k], x[k], dy[k], wv[k], m, s, dnorm_mean, dnorm_norm_mean);
    }
    StorePack<kAligned>(dinp + row, c, C, dx);
  }
}

// LayerNormBackwardInputKernel with inp and dout of an aligned row held in registers.
template <int kPacks>
__global__ void LayerNormBackwardInputCachedKernel(__nv_bfloat16* dinp, const __nv_bfloat16* dout,
                                                   const __nv_bfloat16* inp, const __nv_bfloat16* w,
                                                   const float* mean, const float* rstd, int C) {
  const std::int64_t row = std::int64_t{blockIdx.x} * C;
  const float m = mean[blockIdx.x];
  const float s = rstd[blockIdx.x];
  uint4 x[kPacks];
  uint4 dy[kPacks];
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int c = (threadIdx.x + p * kRowThreads) * kPack;
    if (c < C) {
      x[p] = *reinterpret_cast<const uint4*>(inp + row + c);
      dy[p] = *reinterpret_cast<const uint4*>(dout + row + c);
      float xv[kPack];
      float dyv[kPack];
      float wv[kPack];
      UnpackBf16(x[p], xv);
      UnpackBf16(dy[p], dyv);
      LoadBf16<kPack>(w + c, wv);
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        AddDnorm(xv[k], dyv[k], wv[k], m, s, dnorm_sum, dnorm_norm_sum);
    }
  }
  const float dnorm_mean = BlockSum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_norm_mean = BlockSum(dnorm_norm_sum) / static_cast<float>(C);
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int c = (threadIdx.x + p * kRowThreads) * kPack;
    if (c < C) {
      float xv[kPack];
      float dyv[kPack];
      float wv[kPack];
      float dx[kPack];
      UnpackBf16(x[p], xv);
      UnpackBf16(dy[p], dyv);
      LoadBf16<kPack>(w + c, wv);
      LoadBf16<kPack>(dinp + row + c, dx);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        dx[k] = AddDx(dx[k], xv[k], dyv[k], wv[k], m, s, dnorm_mean, dnorm_norm_mean);
      }
      StoreBf16<kPack>(dinp + row + c, dx);
    }
  }
}

// Packs per thread of the cached kernels for an aligned row of C elements: the smallest power
// of two that covers the row, or 0 when the row is too long to cache.
int CachedPacks(int C) {
  const int packs = (C / kPack + kRowThreads - 1) / kRowThreads;
  for (int p = 1; p <= kMaxCachedPacks; p *= 2) {
    if (packs <= p) return p;
  }
  return 0;
}

// Stage one of dw, db: partial[chunk, c] = sum over the chunk's rows of norm * dout, and
// partial[chunk, C + c] = sum of dout. Grid: (chunks, column slabs).
template <int kVec>
__global__ void LayerNormWeightPartialKernel(float* partial, const __nv_bfloat16* dout,
                                             const __nv_bfloat16* inp, const float* mean,
                                             const float* rstd, int N, int C) {
  const int c = (blockIdx.y * kColumnThreads + threadIdx.x) * kVec;
  if (c >= C) return;
  const int r0 = blockIdx.x * kColumnSumRowsPerChunk;
  const int r1 = min(N, r0 + kColumnSumRowsPerChunk);
  float dw[kVec];
  float db[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) dw[k] = db[k] = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const float m = mean[r];
    const float s = rstd[r];
    float x[kVec];
    float dy[kVec];
    LoadBf16<kVec>(inp + std::int64_t{r} * C + c, x);
    LoadBf16<kVec>(dout + std::int64_t{r} * C + c, dy);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      dw[k] = __fmaf_rn(__fmul_rn(__fsub_rn(x[k], m), s), dy[k], dw[k]);
      db[k] = __fadd_rn(db[k], dy[k]);
    }
  }
  float* out = partial + std::int64_t{blockIdx.x} * 2 * C;
  StoreF32<kVec>(out + c, dw);
  StoreF32<kVec>(out + C + c, db);
}

// Stage one of the bias gradient: partial[chunk, c] = sum over the chunk's rows of dout.
template <int kVec>
__global__ void BiasPartialKernel(float* partial, const __nv_bfloat16* dout, int N, int OC) {
  const int c = (blockIdx.y * kColumnThreads + threadIdx.x) * kVec;
  if (c >= OC) return;
  const int r0 = blockIdx.x * kColumnSumRowsPerChunk;
  const int r1 = min(N, r0 + kColumnSumRowsPerChunk);
  float acc[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[k] = 0.0f;
  for (int r = r0; r < r1; ++r) {
    float dy[kVec];
    LoadBf16<kVec>(dout + std::int64_t{r} * OC + c, dy);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], dy[k]);
  }
  StoreF32<kVec>(partial + std::int64_t{blockIdx.x} * OC + c, acc);
}

// Stage two: for column i of `width`, total = sum over chunks (in order) of partial[chunk, i];
// first[i] += total for i < split, second[i - split] += total otherwise.
__global__ void ColumnFinishKernel(float* first, float* second, int split, const float* partial,
                                   std::int64_t chunks, int width) {
  const int i = blockIdx.x * kFinishThreads + threadIdx.x;
  if (i >= width) return;
  float total = 0.0f;
  for (std::int64_t k = 0; k < chunks; ++k) total += partial[k * width + i];
  if (i < split) {
    first[i] += total;
  } else {
    second[i - split] += total;
  }
}

unsigned Slabs(int columns, int vec) {
  const int per_block = kColumnThreads * vec;
  return static_cast<unsigned>((columns + per_block - 1) / per_block);
}

unsigned FinishBlocks(int width) {
  return static_cast<unsigned>((width + kFinishThreads - 1) / kFinishThreads);
}

}  // namespace

cudaError_t LaunchLayerNormForward(bf16* out, float* mean, float* rstd, const bf16* inp,
                                   const bf16* w, const bf16* b, int N, int C,
                                   cudaStream_t stream) {
  const bool packed = CanPack(C, out, inp, w, b);
  const int cached = packed ? CachedPacks(C) : 0;
  if (cached == 1) {
    LayerNormForwardCachedKernel<1><<<N, kRowThreads, 0, stream>>>(out, mean, rstd, inp, w, b, C);
  } else if (cached == 2) {
    LayerNormForwardCachedKernel<2><<<N, kRowThreads, 0, stream>>>(out, mean, rstd, inp, w, b, C);
  } else if (cached == 4) {
    LayerNormForwardCachedKernel<4><<<N, kRowThreads, 0, stream>>>(out, mean, rstd, inp, w, b, C);
  } else if (cached == 8) {
    LayerNormForwardCachedKernel<8><<<N, kRowThreads, 0, stream>>>(out, mean, rstd, inp, w, b, C);
  } else if (packed) {
    LayerNormForwardKernel<true><<<N, kRowThreads, 0, stream>>>(out, mean, rstd, inp, w, b, C);
  } else {
    LayerNormForwardKernel<false><<<N, kRowThreads, 0, stream>>>(out, mean, rstd, inp, w, b, C);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormApply(bf16* out, const bf16* inp, const bf16* w, const bf16* b,
                                 const float* mean, const float* rstd, int N, int C,
                                 cudaStream_t stream) {
  constexpr int kApplyThreads = 256;
  const std::int64_t n = std::int64_t{N} * C;
  if (CanPack(C, out, inp, w, b)) {
    LayerNormApplyKernel<kPack><<<GridFor(n / kPack, kApplyThreads), kApplyThreads, 0, stream>>>(
        out, inp, w, b, mean, rstd, n, C);
  } else {
    LayerNormApplyKernel<1><<<GridFor(n, kApplyThreads), kApplyThreads, 0, stream>>>(
        out, inp, w, b, mean, rstd, n, C);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackwardInput(bf16* dinp, const bf16* dout, const bf16* inp,
                                         const bf16* w, const float* mean, const float* rstd, int N,
                                         int C, cudaStream_t stream) {
  const bool packed = CanPack(C, dinp, dout, inp, w);
  const int cached = packed ? CachedPacks(C) : 0;
  if (cached == 1) {
    LayerNormBackwardInputCachedKernel<1>
        <<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C);
  } else if (cached == 2) {
    LayerNormBackwardInputCachedKernel<2>
        <<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C);
  } else if (cached == 4) {
    LayerNormBackwardInputCachedKernel<4>
        <<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C);
  } else if (cached == 8) {
    LayerNormBackwardInputCachedKernel<8>
        <<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C);
  } else if (packed) {
    LayerNormBackwardInputKernel<true>
        <<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C);
  } else {
    LayerNormBackwardInputKernel<false>
        <<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, C);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackwardWeight(float* dw, float* db, float* scratch, const bf16* dout,
                                          const bf16* inp, const float* mean, const float* rstd,
                                          int N, int C, cudaStream_t stream) {
  const std::int64_t chunks = ColumnSumChunks(N);
  const unsigned grid_x = static_cast<unsigned>(chunks);
  if (CanPack(C, scratch, dout, inp)) {
    LayerNormWeightPartialKernel<kPack>
        <<<dim3(grid_x, Slabs(C, kPack)), kColumnThreads, 0, stream>>>(scratch, dout, inp, mean,
                                                                       rstd, N, C);
  } else {
    LayerNormWeightPartialKernel<1><<<dim3(grid_x, Slabs(C, 1)), kColumnThreads, 0, stream>>>(
        scratch, dout, inp, mean, rstd, N, C);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  ColumnFinishKernel<<<FinishBlocks(2 * C), kFinishThreads, 0, stream>>>(dw, db, C, scratch, chunks,
                                                                         2 * C);
  return cudaGetLastError();
}

cudaError_t LaunchBiasBackward(float* dbias, float* scratch, const bf16* dout, int N, int OC,
                               cudaStream_t stream) {
  const std::int64_t chunks = ColumnSumChunks(N);
  const unsigned grid_x = static_cast<unsigned>(chunks);
  if (CanPack(OC, scratch, dout)) {
    BiasPartialKernel<kPack>
        <<<dim3(grid_x, Slabs(OC, kPack)), kColumnThreads, 0, stream>>>(scratch, dout, N, OC);
  } else {
    BiasPartialKernel<1>
        <<<dim3(grid_x, Slabs(OC, 1)), kColumnThreads, 0, stream>>>(scratch, dout, N, OC);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  ColumnFinishKernel<<<FinishBlocks(OC), kFinishThreads, 0, stream>>>(dbias, dbias, OC, scratch,
                                                                      chunks, OC);
  return cudaGetLastError();
}

}  // namespace pipeoffload::gpt::cuda::internal
