// Token and position embeddings, forward and backward.
//
// The backward's wte gradient is a scatter-add by token id. Float atomics would make it depend
// on timing, so instead each distinct token is owned by the block of its first occurrence (per
// slab of channels): that block walks the later rows in ascending order, collecting the rows
// with the same token, and adds them into registers starting from dwte's current value. Every
// element of dwte thus receives its contributions in ascending (b, t), as the CPU reference
// (kernels_cpu.cc) adds them. Work: O(N / threads) token comparisons per block for the ownership
// test and the walk, plus the rows themselves.
#include "examples/gpt/cuda/kernels_device.cuh"
#include "examples/gpt/cuda/kernels_launch.h"

namespace pipeoffload::gpt::cuda::internal {
namespace {

constexpr int kThreads = 128;

// Channels [slab * kThreads * kVec, ...) of one row: the channel of thread `tid`'s first element.
template <int kVec>
__device__ __forceinline__ int SlabChannel(int slab, int tid) {
  return (slab * kThreads + tid) * kVec;
}

// out[n, :] = wte[tokens[n], :] + wpe[n % T, :]. Grid: (N, slabs).
template <int kVec>
__global__ void EncoderForwardKernel(__nv_bfloat16* out, const std::int32_t* tokens,
                                     const __nv_bfloat16* wte, const __nv_bfloat16* wpe, int T,
                                     int C) {
  const std::int64_t n = blockIdx.x;
  const int c = SlabChannel<kVec>(blockIdx.y, threadIdx.x);
  if (c >= C) return;
  const std::int64_t t = n % T;
  float e[kVec];
  float p[kVec];
  LoadBf16<kVec>(wte + std::int64_t{tokens[n]} * C + c, e);
  LoadBf16<kVec>(wpe + t * C + c, p);
#pragma unroll
  for (int k = 0; k < kVec; ++k) e[k] += p[k];
  StoreBf16<kVec>(out + n * C + c, e);
}

// dwpe[t, :] += dout[b, t, :] for b ascending. Grid: (T, slabs).
template <int kVec>
__global__ void PositionBackwardKernel(float* dwpe, const __nv_bfloat16* dout, int B, int T,
                                       int C) {
  const std::int64_t t = blockIdx.x;
  const int c = SlabChannel<kVec>(blockIdx.y, threadIdx.x);
  if (c >= C) return;
  float acc[kVec];
  LoadF32<kVec>(dwpe + t * C + c, acc);
  for (int b = 0; b < B; ++b) {
    float d[kVec];
    LoadBf16<kVec>(dout + (std::int64_t{b} * T + t) * C + c, d);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] += d[k];
  }
  StoreF32<kVec>(dwpe + t * C + c, acc);
}

// dwte[tokens[n], :] += dout[n', :] over the rows n' >= n holding the same token, ascending, when
// n is that token's first row; blocks of later rows return at once. Grid: (N, slabs).
template <int kVec>
__global__ void TokenBackwardKernel(float* dwte, const __nv_bfloat16* dout,
                                    const std::int32_t* tokens, int N, int C) {
  __shared__ int rows[kThreads];
  __shared__ int warp_counts[kThreads / 32];
  const int n = blockIdx.x;
  const int tid = threadIdx.x;
  const std::int32_t token = tokens[n];
  // Is row n the token's first occurrence? (Uniform over the block.)
  bool earlier = false;
  for (int j = tid; j < n; j += kThreads) earlier |= tokens[j] == token;
  if (__syncthreads_or(earlier)) return;

  const int c = SlabChannel<kVec>(blockIdx.y, tid);
  const bool active = c < C;  // inactive threads still help collect rows
  float acc[kVec];
  if (active) LoadF32<kVec>(dwte + std::int64_t{token} * C + c, acc);
  const int lane = tid % 32;
  const int warp = tid / 32;
  for (int base = n; base < N; base += kThreads) {
    // Collect this tile's matching rows, in ascending order, into rows[0, count).
    const int j = base + tid;
    const bool match = j < N && tokens[j] == token;
    const unsigned ballot = __ballot_sync(kFullMask, match);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0;
    int count = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      offset += w < warp ? warp_counts[w] : 0;
      count += warp_counts[w];
    }
    if (match) rows[offset + __popc(ballot & ((1u << lane) - 1u))] = j;
    __syncthreads();
    if (active) {
      for (int r = 0; r < count; ++r) {
        float d[kVec];
        LoadBf16<kVec>(dout + std::int64_t{rows[r]} * C + c, d);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] += d[k];
      }
    }
    __syncthreads();  // rows and warp_counts are rewritten by the next tile
  }
  if (active) StoreF32<kVec>(dwte + std::int64_t{token} * C + c, acc);
}

unsigned Slabs(int C, int vec) {
  const int per_block = kThreads * vec;
  return static_cast<unsigned>((C + per_block - 1) / per_block);
}

}  // namespace

cudaError_t LaunchEncoderForward(bf16* out, const std::int32_t* tokens, const bf16* wte,
                                 const bf16* wpe, int B, int T, int C, cudaStream_t stream) {
  const unsigned rows = static_cast<unsigned>(std::int64_t{B} * T);
  if (CanPack(C, out, wte, wpe)) {
    EncoderForwardKernel<kPack>
        <<<dim3(rows, Slabs(C, kPack)), kThreads, 0, stream>>>(out, tokens, wte, wpe, T, C);
  } else {
    EncoderForwardKernel<1>
        <<<dim3(rows, Slabs(C, 1)), kThreads, 0, stream>>>(out, tokens, wte, wpe, T, C);
  }
  return cudaGetLastError();
}

cudaError_t LaunchEncoderBackward(float* dwte, float* dwpe, const bf16* dout,
                                  const std::int32_t* tokens, int B, int T, int C,
                                  cudaStream_t stream) {
  const int N = B * T;
  if (CanPack(C, dwte, dwpe, dout)) {
    PositionBackwardKernel<kPack>
        <<<dim3(static_cast<unsigned>(T), Slabs(C, kPack)), kThreads, 0, stream>>>(dwpe, dout, B, T,
                                                                                   C);
    TokenBackwardKernel<kPack>
        <<<dim3(static_cast<unsigned>(N), Slabs(C, kPack)), kThreads, 0, stream>>>(dwte, dout,
                                                                                   tokens, N, C);
  } else {
    PositionBackwardKernel<1>
        <<<dim3(static_cast<unsigned>(T), Slabs(C, 1)), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
    TokenBackwardKernel<1><<<dim3(static_cast<unsigned>(N), Slabs(C, 1)), kThreads, 0, stream>>>(
        dwte, dout, tokens, N, C);
  }
  return cudaGetLastError();
}

}  // namespace pipeoffload::gpt::cuda::internal
