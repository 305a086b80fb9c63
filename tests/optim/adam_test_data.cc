// Test data for the CPU Adam tests (adam_test_data.h).
#include "tests/optim/adam_test_data.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipeoffload::testing {
namespace {

// Uniform in [0, 1) and standard normal from the raw engine output, so the values do not depend
// on the standard library's distributions.
class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  double Sign() { return Uniform() < 0.5 ? -1.0 : 1.0; }

 private:
  std::mt19937_64 engine_;
};

std::int64_t AlignIndex(const void* base, std::size_t element_size) {
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  return static_cast<std::int64_t>((64 - address % 64) % 64 / element_size);
}

}  // namespace

std::uint32_t Bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FromBits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

AdamBuffers::AdamBuffers(std::int64_t count, ArrayOffsets offsets) : count_(count) {
  // Each array gets a region of `stride` floats starting on a 64-byte boundary.
  const std::int64_t stride = (count + 15) / 16 * 16 + 32;
  storage_.assign(static_cast<std::size_t>(4 * stride + 16), 0.0f);
  float* base = storage_.data() + AlignIndex(storage_.data(), sizeof(float));
  param_ = base + offsets.param;
  exp_avg_ = base + stride + offsets.exp_avg;
  exp_avg_sq_ = base + 2 * stride + offsets.exp_avg_sq;
  grad_ = base + 3 * stride + offsets.grad;
  bf16_storage_.assign(static_cast<std::size_t>(stride + 32), 0);
  bf16_ = bf16_storage_.data() + AlignIndex(bf16_storage_.data(), sizeof(std::uint16_t)) +
          offsets.bf16;
  grad_bf16_storage_.assign(static_cast<std::size_t>(stride + 32), 0);
  grad_bf16_ = grad_bf16_storage_.data() +
               AlignIndex(grad_bf16_storage_.data(), sizeof(std::uint16_t)) + offsets.grad_bf16;
}

AdamSpan AdamBuffers::Span(bool with_bf16, bool bf16_grad) {
  AdamSpan span;
  span.param = param_;
  span.exp_avg = exp_avg_;
  span.exp_avg_sq = exp_avg_sq_;
  span.grad = bf16_grad ? nullptr : grad_;
  span.grad_bf16 = bf16_grad ? grad_bf16_ : nullptr;
  span.param_bf16 = with_bf16 ? bf16_ : nullptr;
  span.count = count_;
  return span;
}

void AdamBuffers::FillState(std::uint64_t seed) {
  Random random(seed);
  for (std::int64_t i = 0; i < count_; ++i) {
    const double kind = random.Uniform();
    double p = random.Sign() * (0.05 + 0.95 * random.Uniform());
    if (kind < 0.01) p = 0.0;
    if (kind >= 0.01 && kind < 0.02) p = random.Sign() * random.Uniform() * 1e-39;  // denormal
    param_[i] = static_cast<float>(p);
    exp_avg_[i] = static_cast<float>(0.01 * random.Normal());
    exp_avg_sq_[i] = kind > 0.95 ? 0.0f : static_cast<float>(1e-4 * random.Uniform());
    bf16_[i] = 0xdead;
  }
}

void AdamBuffers::FillGrad(std::uint64_t seed) {
  Random random(seed);
  for (std::int64_t i = 0; i < count_; ++i) {
    const double kind = random.Uniform();
    double g = random.Normal() * std::pow(10.0, -4.0 + 5.0 * random.Uniform());
    if (kind < 0.02) g = 0.0;
    if (kind >= 0.02 && kind < 0.03) g = -0.0;
    if (kind >= 0.03 && kind < 0.05) g = random.Sign() * random.Uniform() * 1e-39;  // denormal
    if (kind >= 0.05 && kind < 0.051) g = random.Sign() * 1e30;  // g * g overflows
    grad_[i] = static_cast<float>(g);
  }
}

void AdamBuffers::FillGradBf16(std::uint64_t seed, bool non_finite) {
  // Payloads of every kind: quiet, signalling (the quiet bit clear), both signs.
  constexpr std::uint16_t kNaNs[] = {0x7fc0, 0xffc0, 0x7fc1, 0xffff, 0x7f81, 0xffa3};
  Random random(seed);
  for (std::int64_t i = 0; i < count_; ++i) {
    const double kind = random.Uniform();
    const double g = random.Normal() * std::pow(10.0, -4.0 + 5.0 * random.Uniform());
    std::uint16_t bits = FloatToBf16Bits(static_cast<float>(g));
    if (kind < 0.02) bits = 0x0000;
    if (kind >= 0.02 && kind < 0.03) bits = 0x8000;
    if (kind >= 0.03 && kind < 0.05) {  // bf16 subnormal: exponent 0, mantissa 1..127
      bits = static_cast<std::uint16_t>(1 + static_cast<int>(random.Uniform() * 127.0));
      if (random.Sign() < 0) bits |= 0x8000;
    }
    if (kind >= 0.05 && kind < 0.051) bits = random.Sign() < 0 ? 0xf149 : 0x7149;  // ~1e30
    if (non_finite && kind >= 0.06 && kind < 0.07) bits = random.Sign() < 0 ? 0xff80 : 0x7f80;
    if (non_finite && kind >= 0.07 && kind < 0.08) {
      bits = kNaNs[static_cast<std::size_t>(random.Uniform() * 6.0)];
    }
    grad_bf16_[i] = bits;
    grad_[i] = Bf16BitsToFloat(bits);
  }
}

void AdamBuffers::CopyFrom(AdamBuffers& other) {
  const auto bytes = static_cast<std::size_t>(count_) * sizeof(float);
  std::memcpy(param_, other.param(), bytes);
  std::memcpy(exp_avg_, other.exp_avg(), bytes);
  std::memcpy(exp_avg_sq_, other.exp_avg_sq(), bytes);
  std::memcpy(grad_, other.grad(), bytes);
  std::memcpy(bf16_, other.bf16(), static_cast<std::size_t>(count_) * sizeof(std::uint16_t));
  std::memcpy(grad_bf16_, other.grad_bf16(),
              static_cast<std::size_t>(count_) * sizeof(std::uint16_t));
}

void AdamBuffers::CopyGradFrom(AdamBuffers& other) {
  std::memcpy(grad_, other.grad(), static_cast<std::size_t>(count_) * sizeof(float));
  std::memcpy(grad_bf16_, other.grad_bf16(),
              static_cast<std::size_t>(count_) * sizeof(std::uint16_t));
}

std::int64_t FirstBitDifference(const float* a, const float* b, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    if (Bits(a[i]) != Bits(b[i])) return i;
  }
  return -1;
}

std::int64_t FirstBitDifference(const std::uint16_t* a, const std::uint16_t* b,
                                std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    if (a[i] != b[i]) return i;
  }
  return -1;
}

std::string CompareBuffers(AdamBuffers& want, AdamBuffers& got, bool with_bf16) {
  const struct {
    const char* name;
    const float* want;
    const float* got;
  } arrays[] = {{"param", want.param(), got.param()},
                {"exp_avg", want.exp_avg(), got.exp_avg()},
                {"exp_avg_sq", want.exp_avg_sq(), got.exp_avg_sq()}};
  for (const auto& a : arrays) {
    const std::int64_t i = FirstBitDifference(a.want, a.got, want.count());
    if (i >= 0) {
      return absl::StrFormat("%s[%d]: want %.9g (0x%08x) got %.9g (0x%08x)", a.name, i,
                             a.want[i], Bits(a.want[i]), a.got[i], Bits(a.got[i]));
    }
  }
  if (with_bf16) {
    const std::int64_t i = FirstBitDifference(want.bf16(), got.bf16(), want.count());
    if (i >= 0) {
      return absl::StrFormat("bf16[%d]: want 0x%04x got 0x%04x (param %.9g)", i, want.bf16()[i],
                             got.bf16()[i], got.param()[i]);
    }
  }
  return "";
}

}  // namespace pipeoffload::testing
