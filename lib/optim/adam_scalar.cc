// The scalar Adam reference (adam.h's contract, one element at a time, fp32 or bf16 gradients,
// fp32 or split masters) and the scalar block sums of squares (fp32 and bf16). Built without ISA
// flags and with -ffp-contract=off: these are the bits every other kernel, CPU or GPU, must
// reproduce, so nothing here may be fused or reassociated.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/optim/adam_kernels.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {
namespace {

// Byte ranges of two arrays of `count` elements overlap.
bool Overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

// The gradient of element i as fp32: as stored, or the exact bf16 upcast (Bf16BitsToFloat's
// shift, written here because that function lives in another file: a call per element made the
// scalar update ~25% slower).
float GradAt(const float* grad, std::int64_t i) { return grad[i]; }
float GradAt(const std::uint16_t* grad, std::int64_t i) {
  const std::uint32_t bits = static_cast<std::uint32_t>(grad[i]) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// A split master's halves (adam.h: SplitMaster / JoinSplitMaster, written here for the same
// reason as GradAt): bits = (hi << 16) + sign-extended lo, and back hi = (bits + 0x8000) >> 16,
// lo = bits & 0xffff, all modulo 2^32.
float JoinAt(const std::uint16_t* hi, const std::uint16_t* lo, std::int64_t i) {
  const auto low =
      static_cast<std::uint32_t>(static_cast<std::int32_t>(static_cast<std::int16_t>(lo[i])));
  const std::uint32_t bits = (static_cast<std::uint32_t>(hi[i]) << 16) + low;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
void SplitAt(float p, std::uint16_t* hi, std::uint16_t* lo, std::int64_t i) {
  std::uint32_t bits;
  std::memcpy(&bits, &p, sizeof(bits));
  hi[i] = static_cast<std::uint16_t>((bits + 0x8000u) >> 16);
  lo[i] = static_cast<std::uint16_t>(bits & 0xffffu);
}

// One element of the contract, in its order. `kL2` / `kDecoupled`: which weight-decay line runs
// (adam.h: read off weight_decay != 0 and decay_factor != 1). `kSplit`: the master is
// param_bf16 (hi) and param_lo joined, and is written back split (param is null). `Grad`: float
// or std::uint16_t (bf16 bits), the array `grad` points to.
template <bool kL2, bool kDecoupled, bool kSplit, typename Grad>
void UpdateRange(const AdamStepScalars& s, const AdamSpan& span, const Grad* grad) {
  for (std::int64_t i = 0; i < span.count; ++i) {
    float p;
    if constexpr (kSplit) {
      p = JoinAt(span.param_bf16, span.param_lo, i);
    } else {
      p = span.param[i];
    }
    float m = span.exp_avg[i];
    float v = span.exp_avg_sq[i];
    float g = GradAt(grad, i) * s.grad_scale;
    if constexpr (kL2) g = g + s.weight_decay * p;
    m = s.beta1 * m + s.one_minus_beta1 * g;
    v = s.beta2 * v + s.one_minus_beta2 * (g * g);
    if constexpr (kDecoupled) p = p * s.decay_factor;
    const float d = std::sqrt(v) * s.inv_sqrt_bias_correction2 + s.epsilon;
    p = p - s.step_size * (m / d);
    if constexpr (kSplit) {
      SplitAt(p, span.param_bf16, span.param_lo, i);
    } else {
      span.param[i] = p;
    }
    span.exp_avg[i] = m;
    span.exp_avg_sq[i] = v;
    if constexpr (!kSplit) {
      if (span.param_bf16 != nullptr) span.param_bf16[i] = FloatToBf16Bits(p);
    }
  }
}

template <bool kL2, bool kDecoupled, bool kSplit>
void UpdateMaster(const AdamStepScalars& s, const AdamSpan& span) {
  if (span.grad_bf16 != nullptr) {
    UpdateRange<kL2, kDecoupled, kSplit>(s, span, span.grad_bf16);
  } else {
    UpdateRange<kL2, kDecoupled, kSplit>(s, span, span.grad);
  }
}

template <bool kL2, bool kDecoupled>
void UpdateSpan(const AdamStepScalars& s, const AdamSpan& span) {
  if (span.param_lo != nullptr) {
    UpdateMaster<kL2, kDecoupled, true>(s, span);
  } else {
    UpdateMaster<kL2, kDecoupled, false>(s, span);
  }
}

// The fixed lane tree of simd_kernels.h over one block, fp32 or bf16 (exactly upcast).
template <typename T>
double SumOfSquaresBlock(const T* x, std::int64_t count) {
  double lanes[internal::kSumLanes] = {};
  for (std::int64_t i = 0; i < count; ++i) {
    const double xi = GradAt(x, i);
    lanes[i % internal::kSumLanes] += xi * xi;
  }
  for (int width = internal::kSumLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] = lanes[j] + lanes[j + width];
  }
  return lanes[0];
}

}  // namespace

absl::Status CheckAdamSpan(const AdamSpan& span) {
  if (span.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Adam span: count = ", span.count, " must be >= 0"));
  }
  if (span.count > std::numeric_limits<std::int64_t>::max() / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("Adam span: count = ", span.count, " is too large to address"));
  }
  if (span.count == 0) return absl::OkStatus();
  const bool split = span.param_lo != nullptr;
  if (split && span.param != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Adam span: param must be null when param_lo is set (a split master is param_bf16 and "
        "param_lo; count = ",
        span.count, ")"));
  }
  if (split && span.param_bf16 == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Adam span: param_bf16 is null but param_lo is set (a split master's high halves live "
        "in param_bf16; count = ",
        span.count, ")"));
  }
  const struct {
    const char* name;
    const void* ptr;
    std::size_t bytes;
  } arrays[] = {
      {"param", span.param, sizeof(float)},
      {"exp_avg", span.exp_avg, sizeof(float)},
      {"exp_avg_sq", span.exp_avg_sq, sizeof(float)},
      {"grad", span.grad, sizeof(float)},
      {"grad_bf16", span.grad_bf16, sizeof(std::uint16_t)},
      {"param_bf16", span.param_bf16, sizeof(std::uint16_t)},
      {"param_lo", span.param_lo, sizeof(std::uint16_t)},
  };
  constexpr int kArrays = sizeof(arrays) / sizeof(arrays[0]);
  constexpr int kRequired = 3;  // param, exp_avg, exp_avg_sq; then one of the two gradients
  // A split master has no param (checked above); param_bf16 and param_lo stand in for it.
  for (int i = split ? 1 : 0; i < kRequired; ++i) {
    if (arrays[i].ptr == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Adam span: ", arrays[i].name, " is null (count = ", span.count, ")"));
    }
  }
  if ((span.grad == nullptr) == (span.grad_bf16 == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Adam span: exactly one of grad and grad_bf16 must be set, but ",
        span.grad == nullptr ? "both are null" : "both are set", " (count = ", span.count, ")"));
  }
  const auto n = static_cast<std::size_t>(span.count);
  for (int i = 0; i < kArrays; ++i) {
    for (int j = i + 1; j < kArrays; ++j) {
      if (Overlap(arrays[i].ptr, n * arrays[i].bytes, arrays[j].ptr, n * arrays[j].bytes)) {
        return absl::InvalidArgumentError(absl::StrCat("Adam span: ", arrays[i].name, " and ",
                                                       arrays[j].name, " overlap (count = ",
                                                       span.count, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void AdamUpdateScalar(const AdamStepScalars& scalars, const AdamSpan& span) {
  if (!CheckAdamSpan(span).ok()) return;
  const bool l2 = scalars.weight_decay != 0.0f;
  const bool decoupled = scalars.decay_factor != 1.0f;
  if (l2 && decoupled) {
    UpdateSpan<true, true>(scalars, span);
  } else if (l2) {
    UpdateSpan<true, false>(scalars, span);
  } else if (decoupled) {
    UpdateSpan<false, true>(scalars, span);
  } else {
    UpdateSpan<false, false>(scalars, span);
  }
}

namespace internal {

double SumOfSquaresBlockScalar(const float* x, std::int64_t count) {
  return SumOfSquaresBlock(x, count);
}

double SumOfSquaresBf16BlockScalar(const std::uint16_t* x, std::int64_t count) {
  return SumOfSquaresBlock(x, count);
}

}  // namespace internal
}  // namespace pipeoffload
