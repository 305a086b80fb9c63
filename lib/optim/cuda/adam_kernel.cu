// The fused Adam kernel (fp32 or bf16 gradients), the bf16 <-> fp32 conversions and the
// deterministic sum of squares (adam_kernel.h). The Adam kernel's argument is the CPU kernels'
// KernelScalars + KernelSpan
// (adam_kernel_internal.h). Bitwise parity with AdamUpdateScalar rests on three things:
//  - every multiply and add is an explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn),
//    which nvcc never contracts into an FMA (a plain `a * b + c` it would);
//  - sqrt and division are __fsqrt_rn / __fdiv_rn, correctly rounded like the CPU's sqrtss /
//    divss (nvcc's default -prec-sqrt / -prec-div would do too, but not under --use_fast_math);
//  - denormals are kept (the CPU does not flush them either) and the bf16 rounding is the same
//    integer recipe as FloatToBf16Bits.
#include <algorithm>
#include <cstdint>

#include "lib/optim/cuda/adam_kernel_internal.h"

namespace pipeoffload::internal {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H200's 132 SMs several times over; grid-stride loops cover the rest.
constexpr std::int64_t kMaxBlocks = 2048;

unsigned BlocksFor(std::int64_t work_items) {
  return static_cast<unsigned>(
      std::max<std::int64_t>(1, std::min(kMaxBlocks, (work_items + kThreads - 1) / kThreads)));
}

// FloatToBf16Bits (lib/optim): round to nearest even; NaN -> quiet NaN, sign kept.
__device__ __forceinline__ std::uint16_t ToBf16(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// Split master (adam.h's SplitMaster / JoinSplitMaster): bits = (hi << 16) + sign-extended lo,
// hi = (bits + 0x8000) >> 16, lo = the low half, all modulo 2^32.
__device__ __forceinline__ float JoinSplit(std::uint16_t hi, std::uint16_t lo) {
  return __uint_as_float((static_cast<std::uint32_t>(hi) << 16) +
                         static_cast<std::uint32_t>(static_cast<std::int32_t>(
                             static_cast<std::int16_t>(lo))));
}
// A NaN result is stored as 0x7fc00000 first: this GPU's invalid operations give 0x7fffffff,
// whose high half would be -0 (adam.h's caveat); the CPU's give 0xffc00000, already safe. NaN
// payloads are the one place the GPU and CPU bits may differ (as everywhere in adam.h).
__device__ __forceinline__ void StoreSplit(float p, std::uint16_t* hi, std::uint16_t* lo) {
  std::uint32_t bits = __float_as_uint(p);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) bits = 0x7FC00000u;
  *hi = static_cast<std::uint16_t>((bits + 0x8000u) >> 16);
  *lo = static_cast<std::uint16_t>(bits & 0xFFFFu);
}

// One element of adam.h's contract, line by line. Like the scalar reference (adam_scalar.cc),
// the weight-decay lines run only when they change something (kL2: weight_decay != 0,
// kDecoupled: decay_factor != 1), which matters for the bits of -0, inf and NaN inputs.
template <bool kL2, bool kDecoupled>
__device__ __forceinline__ void AdamElement(const AdamKernelArgs& a, float& p, float& m, float& v,
                                            float grad) {
  float g = __fmul_rn(grad, a.grad_scale);
  if (kL2) g = __fadd_rn(g, __fmul_rn(a.weight_decay, p));
  m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(a.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(a.one_minus_beta2, __fmul_rn(g, g)));
  if (kDecoupled) p = __fmul_rn(p, a.decay_factor);
  const float d = __fadd_rn(__fmul_rn(__fsqrt_rn(v), a.inv_sqrt_bias_correction2), a.epsilon);
  p = __fsub_rn(p, __fmul_rn(a.step_size, __fdiv_rn(m, d)));
}

// Element i of an fp32 or bf16 array as fp32: as stored, or the exact bf16 upcast (bits << 16).
__device__ __forceinline__ float Load(const float* x, std::int64_t i) { return x[i]; }
__device__ __forceinline__ float Load(const std::uint16_t* x, std::int64_t i) {
  return __uint_as_float(static_cast<std::uint32_t>(x[i]) << 16);
}

// Elements 4q .. 4q + 3 as fp32 through one 16-byte (fp32) or 8-byte (bf16) load.
__device__ __forceinline__ float4 Load4(const float* x, std::int64_t q) {
  return reinterpret_cast<const float4*>(x)[q];
}
__device__ __forceinline__ float4 Load4(const std::uint16_t* x, std::int64_t q) {
  const uint2 pairs = reinterpret_cast<const uint2*>(x)[q];
  return make_float4(__uint_as_float(pairs.x << 16), __uint_as_float(pairs.x & 0xFFFF0000u),
                     __uint_as_float(pairs.y << 16), __uint_as_float(pairs.y & 0xFFFF0000u));
}

// The span's gradient array of type Grad (the launcher picks the one that is set).
template <typename Grad>
__device__ __forceinline__ const Grad* GradOf(const AdamKernelArgs& a);
template <>
__device__ __forceinline__ const float* GradOf<float>(const AdamKernelArgs& a) {
  return a.grad;
}
template <>
__device__ __forceinline__ const std::uint16_t* GradOf<std::uint16_t>(const AdamKernelArgs& a) {
  return a.grad_bf16;
}

// Element i, whole: the master read (fp32, or joined from its halves with kSplit), updated,
// written back (with the bf16 copy, or as its halves).
template <bool kL2, bool kDecoupled, bool kSplit, typename Grad>
__device__ __forceinline__ void AdamAt(const AdamKernelArgs& a, const Grad* grad, std::int64_t i) {
  float p = kSplit ? JoinSplit(a.param_bf16[i], a.param_lo[i]) : a.param[i];
  float m = a.exp_avg[i];
  float v = a.exp_avg_sq[i];
  AdamElement<kL2, kDecoupled>(a, p, m, v, Load(grad, i));
  a.exp_avg[i] = m;
  a.exp_avg_sq[i] = v;
  if constexpr (kSplit) {
    StoreSplit(p, &a.param_bf16[i], &a.param_lo[i]);
  } else {
    a.param[i] = p;
    if (a.param_bf16 != nullptr) a.param_bf16[i] = ToBf16(p);
  }
}

// `Grad`: float or std::uint16_t (bf16 bits); kSplit: a split master. Both chosen per launch.
template <bool kL2, bool kDecoupled, bool kSplit, typename Grad>
__global__ void AdamScalarKernel(AdamKernelArgs a) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const Grad* grad = GradOf<Grad>(a);
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < a.count; i += stride) {
    AdamAt<kL2, kDecoupled, kSplit>(a, grad, i);
  }
}

// Four split masters from 8-byte loads of their halves, and back.
__device__ __forceinline__ float4 JoinSplit4(uint2 hi, uint2 lo) {
  return make_float4(JoinSplit(hi.x & 0xFFFFu, lo.x & 0xFFFFu), JoinSplit(hi.x >> 16, lo.x >> 16),
                     JoinSplit(hi.y & 0xFFFFu, lo.y & 0xFFFFu), JoinSplit(hi.y >> 16, lo.y >> 16));
}
__device__ __forceinline__ void StoreSplit4(float4 p, uint2* hi, uint2* lo) {
  std::uint16_t h[4], l[4];
  StoreSplit(p.x, &h[0], &l[0]);
  StoreSplit(p.y, &h[1], &l[1]);
  StoreSplit(p.z, &h[2], &l[2]);
  StoreSplit(p.w, &h[3], &l[3]);
  *hi = make_uint2(h[0] | (static_cast<std::uint32_t>(h[1]) << 16),
                   h[2] | (static_cast<std::uint32_t>(h[3]) << 16));
  *lo = make_uint2(l[0] | (static_cast<std::uint32_t>(l[1]) << 16),
                   l[2] | (static_cast<std::uint32_t>(l[3]) << 16));
}

// Four elements per thread and iteration through 16-byte loads (8-byte bf16 loads and stores);
// the last count % 4 elements go through the scalar body. REQUIRES the alignment VectorAligned
// checks.
template <bool kL2, bool kDecoupled, bool kSplit, typename Grad>
__global__ void AdamVectorKernel(AdamKernelArgs a) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t quads = a.count / 4;
  float4* param4 = reinterpret_cast<float4*>(a.param);
  float4* m4 = reinterpret_cast<float4*>(a.exp_avg);
  float4* v4 = reinterpret_cast<float4*>(a.exp_avg_sq);
  const Grad* grad = GradOf<Grad>(a);
  uint2* bf16x4 = reinterpret_cast<uint2*>(a.param_bf16);
  uint2* lo4 = reinterpret_cast<uint2*>(a.param_lo);
  for (std::int64_t q = first; q < quads; q += stride) {
    float4 p = kSplit ? JoinSplit4(bf16x4[q], lo4[q]) : param4[q];
    float4 m = m4[q];
    float4 v = v4[q];
    const float4 g = Load4(grad, q);
    AdamElement<kL2, kDecoupled>(a, p.x, m.x, v.x, g.x);
    AdamElement<kL2, kDecoupled>(a, p.y, m.y, v.y, g.y);
    AdamElement<kL2, kDecoupled>(a, p.z, m.z, v.z, g.z);
    AdamElement<kL2, kDecoupled>(a, p.w, m.w, v.w, g.w);
    m4[q] = m;
    v4[q] = v;
    if constexpr (kSplit) {
      StoreSplit4(p, &bf16x4[q], &lo4[q]);
    } else {
      param4[q] = p;
      if (bf16x4 != nullptr) {
        bf16x4[q] = make_uint2(ToBf16(p.x) | (static_cast<std::uint32_t>(ToBf16(p.y)) << 16),
                               ToBf16(p.z) | (static_cast<std::uint32_t>(ToBf16(p.w)) << 16));
      }
    }
  }
  for (std::int64_t i = quads * 4 + first; i < a.count; i += stride) {
    AdamAt<kL2, kDecoupled, kSplit>(a, grad, i);
  }
}

bool AlignedTo(const void* ptr, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
}

// The null pointers (the unused gradient, an absent bf16 copy) pass trivially.
bool VectorAligned(const AdamKernelArgs& a) {
  return AlignedTo(a.param, 16) && AlignedTo(a.exp_avg, 16) && AlignedTo(a.exp_avg_sq, 16) &&
         AlignedTo(a.grad, 16) && AlignedTo(a.grad_bf16, 8) && AlignedTo(a.param_bf16, 8) &&
         AlignedTo(a.param_lo, 8);
}

__global__ void Bf16ToFp32Kernel(const std::uint16_t* in, float* out, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    out[i] = __uint_as_float(static_cast<std::uint32_t>(in[i]) << 16);
  }
}

// fp32 -> bf16 bits with ToBf16 (FloatToBf16Bits' rounding and NaN rule).
__global__ void Fp32ToBf16Kernel(const float* in, std::uint16_t* out, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    out[i] = ToBf16(in[i]);
  }
}

// The same, four per thread and iteration: a 16-byte load, an 8-byte store; the last count % 4
// one by one. REQUIRES in 16-byte and out 8-byte aligned.
__global__ void Fp32ToBf16VectorKernel(const float* in, std::uint16_t* out, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t quads = count / 4;
  const float4* in4 = reinterpret_cast<const float4*>(in);
  uint2* out4 = reinterpret_cast<uint2*>(out);
  for (std::int64_t q = first; q < quads; q += stride) {
    const float4 x = in4[q];
    out4[q] = make_uint2(ToBf16(x.x) | (static_cast<std::uint32_t>(ToBf16(x.y)) << 16),
                         ToBf16(x.z) | (static_cast<std::uint32_t>(ToBf16(x.w)) << 16));
  }
  for (std::int64_t i = quads * 4 + first; i < count; i += stride) out[i] = ToBf16(in[i]);
}

// The sum of squares follows CpuAdam::SumOfSquares' recipe exactly (lib/optim/adam_kernels.h),
// so the GPU and the CPU give the same bits: blocks of kSumBlock elements from x[0]; inside a
// block lane j of 16 adds double(x[i])^2 for i = j, j + 16, ... in index order (the square is
// exact in double); the lanes meet in the tree a[j] + a[j+8], then + 4, + 2, + 1; the block sums
// are added in block order. Here 16 consecutive threads of a warp are one block's lanes and the
// tree is three shuffles; a single warp then adds the block sums in order. The lane count is
// the CPU's own constant (simd_kernels.h's kSumLanes), so the two cannot drift apart.
constexpr int kSumBlocksPerCta = kThreads / kSumLanes;

template <typename T>
__global__ void SumOfSquaresBlockKernel(const T* x, std::int64_t count, std::int64_t block,
                                        std::int64_t num_blocks, double* partials) {
  const std::int64_t sum_block =
      static_cast<std::int64_t>(blockIdx.x) * kSumBlocksPerCta + threadIdx.x / kSumLanes;
  const int lane = static_cast<int>(threadIdx.x % kSumLanes);
  const std::int64_t begin = sum_block * block;
  const std::int64_t end = sum_block < num_blocks ? min(begin + block, count) : begin;
  double sum = 0.0;
  for (std::int64_t i = begin + lane; i < end; i += kSumLanes) {
    const double xi = Load(x, i);
    sum = __dadd_rn(sum, __dmul_rn(xi, xi));
  }
  // Every thread takes part in the shuffles (blocks past the end carry zeros and are dropped).
  for (int width = kSumLanes / 2; width >= 1; width /= 2) {
    sum = __dadd_rn(sum, __shfl_down_sync(0xFFFFFFFFu, sum, width, kSumLanes));
  }
  if (lane == 0 && sum_block < num_blocks) partials[sum_block] = sum;
}

// One warp: lane l loads partial i + l, then every lane adds the 32 values in index order
// (broadcast by shuffles), so the running total is the CPU's left-to-right block sum.
__global__ void SumOfBlocksKernel(const double* partials, std::int64_t num_blocks,
                                  double* result, bool accumulate) {
  double total = 0.0;
  for (std::int64_t base = 0; base < num_blocks; base += 32) {
    const std::int64_t mine = base + threadIdx.x;
    const double value = mine < num_blocks ? partials[mine] : 0.0;
    const std::int64_t left = num_blocks - base;
    const int valid = left < 32 ? static_cast<int>(left) : 32;
    for (int j = 0; j < valid; ++j) {
      total = __dadd_rn(total, __shfl_sync(0xFFFFFFFFu, value, j));
    }
  }
  if (threadIdx.x == 0) *result = accumulate ? __dadd_rn(*result, total) : total;
}

template <bool kL2, bool kDecoupled, bool kSplit, typename Grad>
void LaunchAdamVariantOf(const AdamKernelArgs& args, cudaStream_t stream) {
  if (VectorAligned(args)) {
    AdamVectorKernel<kL2, kDecoupled, kSplit, Grad>
        <<<BlocksFor(args.count / 4 + 1), kThreads, 0, stream>>>(args);
  } else {
    AdamScalarKernel<kL2, kDecoupled, kSplit, Grad>
        <<<BlocksFor(args.count), kThreads, 0, stream>>>(args);
  }
}

template <bool kL2, bool kDecoupled, typename Grad>
void LaunchAdamVariantFor(const AdamKernelArgs& args, cudaStream_t stream) {
  if (args.param_lo != nullptr) {
    LaunchAdamVariantOf<kL2, kDecoupled, true, Grad>(args, stream);
  } else {
    LaunchAdamVariantOf<kL2, kDecoupled, false, Grad>(args, stream);
  }
}

// The gradient's type is chosen here, once per launch (exactly one of the two is set).
template <bool kL2, bool kDecoupled>
void LaunchAdamVariant(const AdamKernelArgs& args, cudaStream_t stream) {
  if (args.grad_bf16 != nullptr) {
    LaunchAdamVariantFor<kL2, kDecoupled, std::uint16_t>(args, stream);
  } else {
    LaunchAdamVariantFor<kL2, kDecoupled, float>(args, stream);
  }
}

}  // namespace

cudaError_t LaunchAdamKernel(const AdamKernelArgs& args, cudaStream_t stream) {
  const bool l2 = args.weight_decay != 0.0f;
  const bool decoupled = args.decay_factor != 1.0f;
  if (l2 && decoupled) {
    LaunchAdamVariant<true, true>(args, stream);
  } else if (l2) {
    LaunchAdamVariant<true, false>(args, stream);
  } else if (decoupled) {
    LaunchAdamVariant<false, true>(args, stream);
  } else {
    LaunchAdamVariant<false, false>(args, stream);
  }
  return cudaGetLastError();
}

cudaError_t LaunchBf16ToFp32Kernel(const std::uint16_t* in, float* out, std::int64_t count,
                                   cudaStream_t stream) {
  Bf16ToFp32Kernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, out, count);
  return cudaGetLastError();
}

cudaError_t LaunchFp32ToBf16Kernel(const float* in, std::uint16_t* out, std::int64_t count,
                                   cudaStream_t stream) {
  if (AlignedTo(in, 16) && AlignedTo(out, 8)) {
    Fp32ToBf16VectorKernel<<<BlocksFor(count / 4 + 1), kThreads, 0, stream>>>(in, out, count);
  } else {
    Fp32ToBf16Kernel<<<BlocksFor(count), kThreads, 0, stream>>>(in, out, count);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSumOfSquaresKernels(const void* x, bool x_is_bf16, std::int64_t count,
                                      std::int64_t block, double* partials, double* result,
                                      bool accumulate, cudaStream_t stream) {
  const std::int64_t num_blocks = (count + block - 1) / block;
  const unsigned grid =
      static_cast<unsigned>((num_blocks + kSumBlocksPerCta - 1) / kSumBlocksPerCta);
  if (x_is_bf16) {
    SumOfSquaresBlockKernel<<<grid, kThreads, 0, stream>>>(
        static_cast<const std::uint16_t*>(x), count, block, num_blocks, partials);
  } else {
    SumOfSquaresBlockKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x), count,
                                                           block, num_blocks, partials);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  SumOfBlocksKernel<<<1, 32, 0, stream>>>(partials, num_blocks, result, accumulate);
  return cudaGetLastError();
}

}  // namespace pipeoffload::internal
