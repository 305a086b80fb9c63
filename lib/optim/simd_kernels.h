// What the per-ISA kernel files (adam_avx2.cc, adam_avx512.cc) see: plain structs mirroring
// AdamStepScalars and AdamSpan, and the kernels' declarations. Deliberately free of adam.h and
// Abseil: those pull in <iostream>, whose static initializer would then be compiled with the
// file's ISA flags and run at program start on every CPU, AVX or not. Only <cstdint> here.
// The GPU Adam kernel takes the same two structs (lib/optim/cuda/adam_kernel_internal.h), so
// this header must also stay something nvcc compiles.
//
// REQUIRES (all kernels): the CPU supports the kernel's ISA (CpuSupports); pointers valid for
// `count` elements (param_bf16 may be null; exactly one of grad and grad_bf16 non-null), arrays
// not overlapping, count >= 0. The kernels do not check; adam_kernels.h has the public-typed
// entry points and CpuAdam::Update checks. Each Adam kernel picks the gradient's type once per
// call (grad_bf16 != nullptr), never per element.
#ifndef PIPEOFFLOAD_LIB_OPTIM_SIMD_KERNELS_H_
#define PIPEOFFLOAD_LIB_OPTIM_SIMD_KERNELS_H_

#include <cstdint>

namespace pipeoffload::internal {

// AdamStepScalars, field for field (adam.h documents them).
struct KernelScalars {
  float grad_scale;
  float weight_decay;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float decay_factor;
  float inv_sqrt_bias_correction2;
  float epsilon;
  float step_size;
};

// AdamSpan, field for field.
struct KernelSpan {
  float* param;
  float* exp_avg;
  float* exp_avg_sq;
  const float* grad;
  std::uint16_t* param_bf16;
  std::int64_t count;
  const std::uint16_t* grad_bf16;
  std::uint16_t* param_lo;  // split master: param null, param_bf16 the high halves
};

// The sum of squares is taken over fixed blocks of kSumBlock elements counted from x[0]. Inside
// a block, lane j of 16 accumulates double(x[i])^2 for i = j, j + 16, ... in index order (the
// square of an fp32 value is exact in double, so only the additions round); the 16 lanes are then
// reduced by the fixed tree s8[j] = a[j] + a[j+8], s4[j] = s8[j] + s8[j+4],
// s2[j] = s4[j] + s4[j+2], s = s2[0] + s2[1]. Every ISA implements exactly this, so a block's
// sum is the same bits on every ISA; CpuAdam adds the block sums in block order. The bf16 block
// kernels upcast each element exactly and then follow the same lanes and tree, so they give the
// bits of the fp32 kernels on the upcast values.
inline constexpr std::int64_t kSumBlock = 8192;
inline constexpr int kSumLanes = 16;

// `prefetch_bytes` > 0: software-prefetch each read stream that far ahead (a tuning knob,
// CpuAdamOptions::prefetch_bytes; the bits never depend on it).
//
// AVX2 (adam_avx2.cc, built with -mavx2). Same bits as AdamUpdateScalar.
void AdamUpdateAvx2(const KernelScalars& scalars, const KernelSpan& span,
                    std::int64_t prefetch_bytes);
// REQUIRES 0 <= count <= kSumBlock. Same bits as SumOfSquaresBlockScalar.
double SumOfSquaresBlockAvx2(const float* x, std::int64_t count);
// x: bf16 bit patterns. Same bits as SumOfSquaresBf16BlockScalar.
double SumOfSquaresBf16BlockAvx2(const std::uint16_t* x, std::int64_t count);

// AVX-512F (adam_avx512.cc, built with -mavx512f).
void AdamUpdateAvx512(const KernelScalars& scalars, const KernelSpan& span,
                      std::int64_t prefetch_bytes);
double SumOfSquaresBlockAvx512(const float* x, std::int64_t count);
double SumOfSquaresBf16BlockAvx512(const std::uint16_t* x, std::int64_t count);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_SIMD_KERNELS_H_
