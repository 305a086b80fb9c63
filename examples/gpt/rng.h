// Small deterministic random numbers for the GPT example: the same bits on every compiler and
// standard library (std::normal_distribution and friends differ across libstdc++/libc++ versions,
// so parameter init and data sampling must not use them).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_RNG_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_RNG_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace pipeoffload::gpt {

// SplitMix64 (Steele, Lea, Flood 2014): a good 64-bit mixer, used to derive independent seeds.
inline std::uint64_t SplitMix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A seed that depends on every word of `parts` in order, e.g. DeriveSeed({seed, step, mb}).
inline std::uint64_t DeriveSeed(std::initializer_list<std::uint64_t> parts) {
  std::uint64_t state = 0x6A09E667F3BCC909ull;  // sqrt(2) fraction bits: an arbitrary start
  std::uint64_t out = 0;
  for (std::uint64_t part : parts) {
    state ^= part;
    out = SplitMix64(state);
    state = out;
  }
  return out;
}

// xoshiro256** (Blackman & Vigna 2018), seeded through SplitMix64 as its authors recommend.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (std::uint64_t& word : s_) word = SplitMix64(seed);
  }

  std::uint64_t Next() {
    const std::uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n), n >= 1. Plain modulo: the bias is below n / 2^64, irrelevant for
  // sampling offsets and words.
  std::uint64_t Below(std::uint64_t n) { return Next() % n; }

  // Uniform in (0, 1], from the top 53 bits, so log() below never sees 0.
  double UniformOpen() { return static_cast<double>((Next() >> 11) + 1) * 0x1.0p-53; }

  // Standard normal by Box-Muller, in double, rounded to float at the caller. glibc's log/cos
  // are within an ulp of exact in double, so the float result is the same across libm versions
  // except with probability ~2^-28 per draw.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    const double radius = std::sqrt(-2.0 * std::log(UniformOpen()));
    const double angle = kTwoPi * UniformOpen();
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  static std::uint64_t Rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  std::uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_RNG_H_
