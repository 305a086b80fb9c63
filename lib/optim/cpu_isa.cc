// Run-time choice of the CPU Adam kernels. An ISA is usable only when this build compiled its
// kernel file with the ISA's flags (PO_OPTIM_X86_KERNELS, set by lib/optim/CMakeLists.txt on
// x86-64) AND the running CPU (and OS, for the AVX-512 register state) supports it:
// __builtin_cpu_supports checks both. The build host's CPU never decides (STYLE.md 2.7).
#include <string_view>

#include "lib/base/check.h"
#include "lib/optim/adam_kernels.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
#if defined(PO_OPTIM_X86_KERNELS)
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#else
    case CpuIsa::kAvx2:
    case CpuIsa::kAvx512:
      return false;
#endif
  }
  return false;
}

CpuIsa BestCpuIsa() {
  if (CpuSupports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (CpuSupports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

namespace internal {
namespace {

KernelScalars ToKernel(const AdamStepScalars& s) {
  return {s.grad_scale,   s.weight_decay,
          s.beta1,        s.one_minus_beta1,
          s.beta2,        s.one_minus_beta2,
          s.decay_factor, s.inv_sqrt_bias_correction2,
          s.epsilon,      s.step_size};
}

KernelSpan ToKernel(const AdamSpan& s) {
  return {s.param,      s.exp_avg, s.exp_avg_sq, s.grad,
          s.param_bf16, s.count,   s.grad_bf16,  s.param_lo};
}

// A field added to the public types must be added to the mirrors (and converted above).
static_assert(sizeof(KernelScalars) == sizeof(AdamStepScalars));
static_assert(sizeof(KernelSpan) == sizeof(AdamSpan));

// The ISA files see only simd_kernels.h's mirror types (see there why).
void Scalar(const AdamStepScalars& scalars, const AdamSpan& span, std::int64_t) {
  AdamUpdateScalar(scalars, span);
}
void Avx2(const AdamStepScalars& scalars, const AdamSpan& span, std::int64_t prefetch_bytes) {
  AdamUpdateAvx2(ToKernel(scalars), ToKernel(span), prefetch_bytes);
}
void Avx512(const AdamStepScalars& scalars, const AdamSpan& span,
            std::int64_t prefetch_bytes) {
  AdamUpdateAvx512(ToKernel(scalars), ToKernel(span), prefetch_bytes);
}

}  // namespace

AdamKernel AdamKernelFor(CpuIsa isa) {
  PO_CHECK_MSG(CpuSupports(isa), "Adam kernel requested for an ISA this CPU lacks");
  switch (isa) {
    case CpuIsa::kAvx512:
      return &Avx512;
    case CpuIsa::kAvx2:
      return &Avx2;
    case CpuIsa::kScalar:
      break;
  }
  return &Scalar;
}

SumOfSquaresBlockKernel SumOfSquaresBlockKernelFor(CpuIsa isa) {
  PO_CHECK_MSG(CpuSupports(isa), "sum-of-squares kernel requested for an ISA this CPU lacks");
  switch (isa) {
    case CpuIsa::kAvx512:
      return &SumOfSquaresBlockAvx512;
    case CpuIsa::kAvx2:
      return &SumOfSquaresBlockAvx2;
    case CpuIsa::kScalar:
      break;
  }
  return &SumOfSquaresBlockScalar;
}

SumOfSquaresBf16BlockKernel SumOfSquaresBf16BlockKernelFor(CpuIsa isa) {
  PO_CHECK_MSG(CpuSupports(isa), "sum-of-squares kernel requested for an ISA this CPU lacks");
  switch (isa) {
    case CpuIsa::kAvx512:
      return &SumOfSquaresBf16BlockAvx512;
    case CpuIsa::kAvx2:
      return &SumOfSquaresBf16BlockAvx2;
    case CpuIsa::kScalar:
      break;
  }
  return &SumOfSquaresBf16BlockScalar;
}

}  // namespace internal
}  // namespace pipeoffload
