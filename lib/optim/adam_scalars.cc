// The host-side arithmetic of adam.h that is not per element: the per-step scalars (validated
// options, bias corrections computed in double once per step), the clipping coefficient, and
// the fp32 <-> bf16 bit conversions every kernel must match, and the split master's halves.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {
namespace {

absl::Status BadField(const char* field, double value, const char* requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat("Adam options: ", field, " = ", value, " ", requirement));
}

absl::Status CheckNonNegativeFinite(const char* field, float value) {
  if (!std::isfinite(value) || value < 0.0f) {
    return BadField(field, value, "must be finite and >= 0");
  }
  return absl::OkStatus();
}

absl::Status CheckBeta(const char* field, float value) {
  // NaN fails both comparisons' negation, so it is caught here too.
  if (!(value >= 0.0f && value < 1.0f)) return BadField(field, value, "must be in [0, 1)");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AdamStepScalars> MakeAdamStepScalars(const AdamOptions& options,
                                                    std::int64_t step, float grad_scale) {
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Adam step = ", step, " must be >= 1 (the first update is step 1)"));
  }
  if (auto s = CheckNonNegativeFinite("learning_rate", options.learning_rate); !s.ok()) return s;
  if (auto s = CheckNonNegativeFinite("epsilon", options.epsilon); !s.ok()) return s;
  if (auto s = CheckNonNegativeFinite("weight_decay", options.weight_decay); !s.ok()) return s;
  if (auto s = CheckBeta("beta1", options.beta1); !s.ok()) return s;
  if (auto s = CheckBeta("beta2", options.beta2); !s.ok()) return s;
  if (!std::isfinite(grad_scale) || grad_scale <= 0.0f) {
    return BadField("grad_scale", grad_scale,
                    "must be finite and > 0 (a non-finite gradient norm gives a non-finite or "
                    "zero clipping coefficient: skip the step instead)");
  }
  const double lr = options.learning_rate;
  const double wd = options.weight_decay;
  const double decay = 1.0 - lr * wd;
  if (options.decoupled_weight_decay && !(decay > 0.0)) {
    // p * decay_factor <= 0 would zero or flip every parameter: surely a units mistake.
    return BadField("learning_rate * weight_decay", lr * wd,
                    "must be < 1 for AdamW (decoupled decay multiplies p by 1 - lr * wd)");
  }

  const double beta1 = options.beta1;
  const double beta2 = options.beta2;
  // 1 - beta^t in double: for t up to ~1e9 and beta < 1 this stays in (0, 1]; pow of a huge
  // step underflows to 0 and gives the correction 1, which is the limit.
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));

  AdamStepScalars scalars;
  scalars.grad_scale = grad_scale;
  scalars.weight_decay = options.decoupled_weight_decay ? 0.0f : options.weight_decay;
  scalars.beta1 = options.beta1;
  scalars.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  scalars.beta2 = options.beta2;
  scalars.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  scalars.decay_factor = options.decoupled_weight_decay ? static_cast<float>(decay) : 1.0f;
  scalars.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  scalars.epsilon = options.epsilon;
  scalars.step_size = static_cast<float>(lr / bias_correction1);
  return scalars;
}

float ClipCoefficient(double global_norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0f;  // clipping off (NaN max_norm too)
  if (std::isnan(global_norm) || global_norm < 0.0) {
    // Propagate: MakeAdamStepScalars then rejects the step instead of silently not clipping.
    return std::numeric_limits<float>::quiet_NaN();
  }
  const double coefficient = max_norm / (global_norm + 1e-6);  // +inf norm gives 0
  return coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;
}

std::uint16_t FloatToBf16Bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) {
    // Keep sign and the top of the payload; set the quiet bit so a signalling NaN whose payload
    // lives in the low 16 bits does not become an infinity.
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. A carry
  // out of the mantissa bumps the exponent, which is the correct rounding (up to infinity).
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float Bf16BitsToFloat(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

SplitBf16 SplitMaster(float master) {
  std::uint32_t bits;
  std::memcpy(&bits, &master, sizeof(bits));
  // Unsigned arithmetic wraps modulo 2^32: the NaNs 0x7fff8000-0x7fffffff get hi 0x8000 (-0)
  // and 0xffff8000-0xffffffff hi 0 (+0), adam.h's caveat; JoinSplitMaster still inverts them.
  return {static_cast<std::uint16_t>((bits + 0x8000u) >> 16),
          static_cast<std::uint16_t>(bits & 0xffffu)};
}

float JoinSplitMaster(std::uint16_t hi, std::uint16_t lo) {
  // (hi << 16) + sign-extended lo, modulo 2^32: lo >= 0x8000 is what SplitMaster's rounding
  // carried into hi, taken back out.
  const auto low =
      static_cast<std::uint32_t>(static_cast<std::int32_t>(static_cast<std::int16_t>(lo)));
  const std::uint32_t bits = (static_cast<std::uint32_t>(hi) << 16) + low;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace pipeoffload
