// The CPU kernels behind include/pipeoffload/adam.h with the public types, for CpuAdam and the
// tests: one Adam kernel and one block sum-of-squares kernel per ISA, picked at run time. Each
// Adam kernel implements the update contract of adam.h over a whole span (tail included) and
// produces the same bits as AdamUpdateScalar; each sum-of-squares kernel follows the lane tree
// of simd_kernels.h and produces the same bits as SumOfSquaresBlockScalar.
//
// REQUIRES (all kernels): as simd_kernels.h (unchecked: CpuAdam::Update checks).
#ifndef PIPEOFFLOAD_LIB_OPTIM_ADAM_KERNELS_H_
#define PIPEOFFLOAD_LIB_OPTIM_ADAM_KERNELS_H_

#include <cstdint>

#include "lib/optim/simd_kernels.h"
#include "pipeoffload/adam.h"

namespace pipeoffload::internal {

// `prefetch_bytes`: see simd_kernels.h (the scalar kernel ignores it).
using AdamKernel = void (*)(const AdamStepScalars& scalars, const AdamSpan& span,
                            std::int64_t prefetch_bytes);
// Sum of squares of one block: REQUIRES 0 <= count <= kSumBlock.
using SumOfSquaresBlockKernel = double (*)(const float* x, std::int64_t count);
// The same over bf16 bit patterns (the bits of SumOfSquaresBlockKernel on the upcast values).
using SumOfSquaresBf16BlockKernel = double (*)(const std::uint16_t* x, std::int64_t count);

// Scalar (adam_scalar.cc; AdamUpdateScalar is the public name of the scalar Adam kernel).
double SumOfSquaresBlockScalar(const float* x, std::int64_t count);
double SumOfSquaresBf16BlockScalar(const std::uint16_t* x, std::int64_t count);

// The kernels of `isa`. REQUIRES: CpuSupports(isa) (checked: a bug otherwise).
AdamKernel AdamKernelFor(CpuIsa isa);
SumOfSquaresBlockKernel SumOfSquaresBlockKernelFor(CpuIsa isa);
SumOfSquaresBf16BlockKernel SumOfSquaresBf16BlockKernelFor(CpuIsa isa);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_ADAM_KERNELS_H_
