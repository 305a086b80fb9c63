// Finite-difference helpers for the GPT gradient tests: central differences of a scalar
// objective, and an element-wise comparison that reports the worst element (never a norm).
#ifndef PIPEOFFLOAD_TESTS_GPT_GRAD_CHECK_H_
#define PIPEOFFLOAD_TESTS_GPT_GRAD_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "examples/gpt/rng.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::testing {

// Numeric gradient of `objective` with respect to x[0..n), by central differences with step h.
// x is restored afterwards. The objective should accumulate in double.
inline std::vector<double> NumericGradient(float* x, std::int64_t n, float h,
                                           const std::function<double()>& objective) {
  std::vector<double> grad(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const float saved = x[i];
    x[i] = saved + h;
    const double plus = objective();
    x[i] = saved - h;
    const double minus = objective();
    x[i] = saved;
    // Divide by the step actually taken (x +- h rounds in float).
    const double step = static_cast<double>(saved + h) - static_cast<double>(saved - h);
    grad[static_cast<std::size_t>(i)] = (plus - minus) / step;
  }
  return grad;
}

// Element-wise check: |analytic - numeric| <= rel_tol * max(|analytic|, |numeric|) + abs_tol
// for every element. On failure prints the worst element and the first offenders.
inline void ExpectGradientsClose(const std::string& what, const float* analytic,
                                 const std::vector<double>& numeric, double rel_tol,
                                 double abs_tol) {
  double worst_excess = -1.0;
  std::size_t worst = 0;
  int failures = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    const double a = analytic[i];
    const double n = numeric[i];
    const double allowed = rel_tol * std::max(std::fabs(a), std::fabs(n)) + abs_tol;
    const double excess = std::fabs(a - n) / allowed;
    if (excess > worst_excess || std::isnan(a)) {
      worst_excess = std::isnan(a) ? INFINITY : excess;
      worst = i;
    }
    if (!(excess <= 1.0)) {
      if (++failures <= 5) first << "  [" << i << "] analytic " << a << " numeric " << n << "\n";
    }
  }
  INFO(what << ": " << numeric.size() << " elements, " << failures << " outside tolerance (rel "
            << rel_tol << ", abs " << abs_tol << "); worst [" << worst << "] analytic "
            << analytic[worst] << " numeric " << numeric[worst] << " (" << worst_excess
            << " x allowed)\n"
            << first.str());
  CHECK(failures == 0);
}

// Deterministic test values: normal(0, scale).
inline std::vector<float> RandomVector(std::int64_t n, std::uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(scale * rng.Normal());
  return v;
}

// sum_i w[i] * y[i] in double: a scalar objective whose gradient with respect to y is w.
inline double WeightedSum(const std::vector<float>& y, const std::vector<float>& w) {
  double sum = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(w[i]) * y[i];
  return sum;
}

}  // namespace pipeoffload::gpt::testing

#endif  // PIPEOFFLOAD_TESTS_GPT_GRAD_CHECK_H_
