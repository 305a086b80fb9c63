// The per-step scalars, the clipping coefficient and the bf16 conversions (adam.h): exact values
// for hand-picked cases, an independent oracle for bf16 rounding, and every invalid option field.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "pipeoffload/adam.h"
#include "tests/optim/adam_test_data.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::Bits;
using testing::FromBits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST_CASE("MakeAdamStepScalars computes the bias corrections in double", "[optim][scalars]") {
  AdamOptions options;
  options.learning_rate = 3e-4f;
  options.beta1 = 0.9f;
  options.beta2 = 0.95f;
  options.epsilon = 1e-6f;
  options.weight_decay = 0.1f;
  const std::int64_t step = GENERATE(1, 2, 10, 1000, 1000000);
  CAPTURE(step);
  const double b1 = options.beta1;
  const double b2 = options.beta2;
  const double lr = options.learning_rate;
  const double wd = options.weight_decay;
  const double t = static_cast<double>(step);

  SECTION("AdamW: decoupled decay, no L2") {
    auto scalars = MakeAdamStepScalars(options, step, 0.25f);
    REQUIRE(scalars.ok());
    CHECK(scalars->grad_scale == 0.25f);
    CHECK(scalars->weight_decay == 0.0f);
    CHECK(scalars->decay_factor == static_cast<float>(1.0 - lr * wd));
    CHECK(scalars->beta1 == options.beta1);
    CHECK(scalars->one_minus_beta1 == static_cast<float>(1.0 - b1));
    CHECK(scalars->beta2 == options.beta2);
    CHECK(scalars->one_minus_beta2 == static_cast<float>(1.0 - b2));
    CHECK(scalars->inv_sqrt_bias_correction2 ==
          static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(b2, t))));
    CHECK(scalars->epsilon == options.epsilon);
    CHECK(scalars->step_size == static_cast<float>(lr / (1.0 - std::pow(b1, t))));
  }
  SECTION("Adam: L2 in the gradient, no decay") {
    options.decoupled_weight_decay = false;
    auto scalars = MakeAdamStepScalars(options, step);
    REQUIRE(scalars.ok());
    CHECK(scalars->grad_scale == 1.0f);
    CHECK(scalars->weight_decay == options.weight_decay);
    CHECK(scalars->decay_factor == 1.0f);
    CHECK(scalars->step_size == static_cast<float>(lr / (1.0 - std::pow(b1, t))));
  }
}

TEST_CASE("MakeAdamStepScalars: the first step's values by hand", "[optim][scalars]") {
  // Defaults: lr 1e-3, betas 0.9 / 0.999. At t = 1 the bias corrections are 1 - beta exactly
  // (in double), so step_size = lr / (1 - beta1) and inv_sqrt_bc2 = 1 / sqrt(1 - beta2).
  auto scalars = MakeAdamStepScalars(AdamOptions{}, 1);
  REQUIRE(scalars.ok());
  CHECK(scalars->step_size == static_cast<float>(double{1e-3f} / (1.0 - double{0.9f})));
  CHECK(scalars->step_size == Approx(0.01f).epsilon(1e-6));
  // 1 - 0.999f is 9.9998713e-4 (0.999f is not 0.999), hence 31.62298 and not sqrt(1000).
  CHECK(scalars->inv_sqrt_bias_correction2 ==
        static_cast<float>(1.0 / std::sqrt(1.0 - double{0.999f})));
  CHECK(scalars->inv_sqrt_bias_correction2 == Approx(31.62298).epsilon(1e-6));
  CHECK(scalars->decay_factor == 1.0f);  // weight_decay 0
}

TEST_CASE("MakeAdamStepScalars rejects every invalid field, naming it", "[optim][scalars][errors]") {
  struct Case {
    const char* field;
    AdamOptions options;
    std::int64_t step;
    float grad_scale;
  };
  auto with = [](auto change) {
    AdamOptions o;
    o.weight_decay = 0.01f;
    change(o);
    return o;
  };
  const Case cases[] = {
      {"step", AdamOptions{}, 0, 1.0f},
      {"step", AdamOptions{}, -5, 1.0f},
      {"learning_rate", with([](AdamOptions& o) { o.learning_rate = -1e-3f; }), 1, 1.0f},
      {"learning_rate", with([](AdamOptions& o) { o.learning_rate = kNaN; }), 1, 1.0f},
      {"learning_rate", with([](AdamOptions& o) { o.learning_rate = kInf; }), 1, 1.0f},
      {"epsilon", with([](AdamOptions& o) { o.epsilon = -1e-8f; }), 1, 1.0f},
      {"epsilon", with([](AdamOptions& o) { o.epsilon = kNaN; }), 1, 1.0f},
      {"epsilon", with([](AdamOptions& o) { o.epsilon = kInf; }), 1, 1.0f},
      {"weight_decay", with([](AdamOptions& o) { o.weight_decay = -0.1f; }), 1, 1.0f},
      {"weight_decay", with([](AdamOptions& o) { o.weight_decay = kNaN; }), 1, 1.0f},
      {"weight_decay", with([](AdamOptions& o) { o.weight_decay = kInf; }), 1, 1.0f},
      {"beta1", with([](AdamOptions& o) { o.beta1 = -0.1f; }), 1, 1.0f},
      {"beta1", with([](AdamOptions& o) { o.beta1 = 1.0f; }), 1, 1.0f},
      {"beta1", with([](AdamOptions& o) { o.beta1 = kNaN; }), 1, 1.0f},
      {"beta2", with([](AdamOptions& o) { o.beta2 = -0.1f; }), 1, 1.0f},
      {"beta2", with([](AdamOptions& o) { o.beta2 = 1.0f; }), 1, 1.0f},
      {"beta2", with([](AdamOptions& o) { o.beta2 = kNaN; }), 1, 1.0f},
      {"grad_scale", AdamOptions{}, 1, 0.0f},
      {"grad_scale", AdamOptions{}, 1, -1.0f},
      {"grad_scale", AdamOptions{}, 1, kNaN},
      {"grad_scale", AdamOptions{}, 1, kInf},
      {"learning_rate * weight_decay", with([](AdamOptions& o) {
         o.learning_rate = 10.0f;
         o.weight_decay = 0.1f;
       }),
       1, 1.0f},
  };
  for (const Case& c : cases) {
    CAPTURE(c.field, c.step, c.grad_scale, c.options.learning_rate, c.options.beta1,
            c.options.beta2, c.options.epsilon, c.options.weight_decay);
    auto scalars = MakeAdamStepScalars(c.options, c.step, c.grad_scale);
    REQUIRE_FALSE(scalars.ok());
    CHECK(scalars.status().code() == absl::StatusCode::kInvalidArgument);
    const std::string message(scalars.status().message());
    CAPTURE(message);
    CHECK(message.find(c.field) != std::string::npos);
  }
  // The same lr * wd is fine for Adam (L2 does not multiply p by 1 - lr * wd), and the
  // boundaries of the valid ranges are accepted.
  AdamOptions l2 = with([](AdamOptions& o) {
    o.learning_rate = 10.0f;
    o.decoupled_weight_decay = false;
  });
  CHECK(MakeAdamStepScalars(l2, 1).ok());
  AdamOptions edges = with([](AdamOptions& o) {
    o.learning_rate = 0.0f;
    o.beta1 = 0.0f;
    o.beta2 = 0.0f;
    o.epsilon = 0.0f;
    o.weight_decay = 0.0f;
  });
  CHECK(MakeAdamStepScalars(edges, 1).ok());
  CHECK(MakeAdamStepScalars(AdamOptions{}, std::numeric_limits<std::int64_t>::max()).ok());
}

TEST_CASE("ClipCoefficient clips above max_norm and flags non-finite norms", "[optim][scalars]") {
  CHECK(ClipCoefficient(0.5, 1.0) == 1.0f);
  CHECK(ClipCoefficient(1.0, 1.0) == static_cast<float>(1.0 / (1.0 + 1e-6)));  // just below 1
  CHECK(ClipCoefficient(4.0, 1.0) == static_cast<float>(1.0 / (4.0 + 1e-6)));
  CHECK(ClipCoefficient(1e9, 0.0) == 1.0f);   // clipping off
  CHECK(ClipCoefficient(1e9, -1.0) == 1.0f);  // clipping off
  CHECK(ClipCoefficient(std::numeric_limits<double>::infinity(), 1.0) == 0.0f);
  CHECK(std::isnan(ClipCoefficient(std::nan(""), 1.0)));
  CHECK(std::isnan(ClipCoefficient(-1.0, 1.0)));
  // Both non-finite cases make the step fail instead of silently not clipping.
  CHECK_FALSE(MakeAdamStepScalars(AdamOptions{}, 1,
                                  ClipCoefficient(std::numeric_limits<double>::infinity(), 1.0))
                  .ok());
  CHECK_FALSE(MakeAdamStepScalars(AdamOptions{}, 1, ClipCoefficient(std::nan(""), 1.0)).ok());
}

TEST_CASE("bf16 rounding: hand-picked values", "[optim][bf16]") {
  struct Case {
    std::uint32_t in;
    std::uint16_t out;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80, "1.0"},
      {0xbfc00000, 0xbfc0, "-1.5"},
      {0x3f808000, 0x3f80, "tie, kept bit even: down"},
      {0x3f818000, 0x3f82, "tie, kept bit odd: up"},
      {0xbf818000, 0xbf82, "negative tie, odd: away from zero"},
      {0x3f808001, 0x3f81, "just above the tie: up"},
      {0x3f807fff, 0x3f80, "just below the tie: down"},
      {0x3fff8000, 0x4000, "tie carries into the exponent"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0"},
      {0x7f800000, 0x7f80, "+inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x7f7fffff, 0x7f80, "largest float rounds to +inf"},
      {0x7f7f7fff, 0x7f7f, "largest float that stays finite"},
      {0x7f7f8000, 0x7f80, "tie at the top, odd: to +inf"},
      {0x00000001, 0x0000, "smallest denormal: down to +0"},
      {0x80000001, 0x8000, "smallest negative denormal: down to -0"},
      {0x00008000, 0x0000, "denormal tie, even: down"},
      {0x00018000, 0x0002, "denormal tie, odd: up"},
      {0x00008001, 0x0001, "denormal just above the tie: smallest bf16 denormal"},
      {0x007fffff, 0x0080, "largest denormal rounds to the smallest normal"},
      {0x00400000, 0x0040, "denormal kept exactly"},
      {0x7fc00000, 0x7fc0, "quiet NaN"},
      {0xffc00000, 0xffc0, "negative quiet NaN"},
      {0x7f800001, 0x7fc0, "signalling NaN, payload in the low half: quieted, not inf"},
      {0xff812345, 0xffc1, "negative signalling NaN: sign and top payload kept, quieted"},
      {0x7fffffff, 0x7fff, "NaN with all payload bits: not rounded into the sign"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what, c.in, c.out);
    CHECK(FloatToBf16Bits(FromBits(c.in)) == c.out);
  }
}

TEST_CASE("bf16 rounding agrees with a nearest-even oracle on random floats",
          "[optim][bf16]") {
  // Oracle: of the two bf16 values around x (truncation and the next one away from zero), take
  // the nearer in exact double arithmetic, the even one on a tie.
  std::mt19937 engine(12345);
  int checked = 0;
  for (int i = 0; i < 1000000; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(engine());
    const float x = FromBits(bits);
    if (std::isnan(x) || std::isinf(x)) continue;
    const std::uint16_t down = static_cast<std::uint16_t>(bits >> 16);
    const std::uint16_t up = static_cast<std::uint16_t>(down + 1);  // away from zero
    const double dx = x;
    const double d_down = std::fabs(dx - double{Bf16BitsToFloat(down)});
    // The next one may be infinite: then x is below the midpoint unless it is at it, which the
    // integer rule gets right; the oracle treats "up" as 2^128.
    const float up_value = Bf16BitsToFloat(up);
    const double up_double =
        std::isinf(up_value) ? std::copysign(std::ldexp(1.0, 128), dx) : double{up_value};
    const double d_up = std::fabs(dx - up_double);
    const std::uint16_t want =
        d_down < d_up ? down : (d_up < d_down ? up : ((down & 1) == 0 ? down : up));
    CAPTURE(bits);
    REQUIRE(FloatToBf16Bits(x) == want);
    ++checked;
  }
  CHECK(checked > 990000);
}

TEST_CASE("bf16 to float is exact and round-trips every bf16", "[optim][bf16]") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = Bf16BitsToFloat(bits);
    CAPTURE(b);
    REQUIRE(Bits(x) == b << 16);
    const std::uint16_t want = std::isnan(x) ? static_cast<std::uint16_t>(bits | 0x40) : bits;
    REQUIRE(FloatToBf16Bits(x) == want);
  }
}

}  // namespace
}  // namespace pipeoffload
