// Shared by the Llama CPU tests: tiny configs, random unit parameters with O(1) activations,
// sampled finite differences and bitwise comparisons (worst / first offender printed).
#ifndef PIPEOFFLOAD_TESTS_LLAMA_CPU_TEST_MODELS_H_
#define PIPEOFFLOAD_TESTS_LLAMA_CPU_TEST_MODELS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "examples/gpt/rng.h"
#include "examples/llama/llama_config.h"
#include "tests/gpt/grad_check.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama::testing {

// Small enough for finite differences over whole tensors: GQA with 2 query heads per kv head.
inline LlamaConfig GradCheckConfig(bool qk_norm, bool attention_bias, bool tied) {
  LlamaConfig c;
  c.vocab_size = 19;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.qk_norm = qk_norm;
  c.attention_bias = attention_bias;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.3f;  // activations and gradients of O(1) at H = 16
  return c;
}

// Unit parameters for gradient checks: matrices N(0, 0.3), biases N(0, 0.3), norm weights
// 1 + N(0, 0.2) (so that a gradient ignoring the weight is caught).
inline std::vector<float> RandomUnitParams(const LlamaConfig& config, int unit,
                                           std::uint64_t seed) {
  std::vector<float> p(static_cast<std::size_t>(UnitParamCount(config, unit)));
  gpt::Rng rng(seed);
  for (const LlamaTensor& t : UnitTensors(config, unit)) {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const double z = rng.Normal();
      p[t.offset + i] = static_cast<float>(t.is_norm ? 1.0 + 0.2 * z : 0.3 * z);
    }
  }
  return p;
}

// Central differences of `objective` at `count` elements of x chosen by `seed` (all of them
// when count >= n); fills `indices` with the chosen ones. x is restored.
inline std::vector<double> SampledNumericGradient(float* x, std::int64_t n, int count,
                                                  std::uint64_t seed, float h,
                                                  const std::function<double()>& objective,
                                                  std::vector<std::int64_t>* indices) {
  indices->clear();
  if (count >= n) {
    for (std::int64_t i = 0; i < n; ++i) indices->push_back(i);
  } else {
    gpt::Rng rng(seed);
    for (int i = 0; i < count; ++i) {
      indices->push_back(static_cast<std::int64_t>(rng.Below(static_cast<std::uint64_t>(n))));
    }
  }
  std::vector<double> grad;
  for (std::int64_t i : *indices) {
    const float saved = x[i];
    x[i] = saved + h;
    const double plus = objective();
    x[i] = saved - h;
    const double minus = objective();
    x[i] = saved;
    grad.push_back((plus - minus) /
                   (static_cast<double>(saved + h) - static_cast<double>(saved - h)));
  }
  return grad;
}

// Checks analytic[indices[k]] against numeric[k] (gpt::testing::ExpectGradientsClose's rule).
inline void ExpectSampledGradientsClose(const std::string& what, const float* analytic,
                                        const std::vector<std::int64_t>& indices,
                                        const std::vector<double>& numeric, double rel,
                                        double abs) {
  std::vector<float> picked;
  for (std::int64_t i : indices) picked.push_back(analytic[i]);
  gpt::testing::ExpectGradientsClose(what, picked.data(), numeric, rel, abs);
}

// Same bits everywhere (a NaN fails even against a NaN).
inline void ExpectBitwiseEqual(const std::string& what, const float* a, const float* b,
                               std::int64_t n) {
  std::int64_t mismatches = 0, first = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0 || std::isnan(a[i])) {
      if (mismatches++ == 0) first = i;
    }
  }
  std::ostringstream first_pair;
  if (first >= 0) {
    first_pair.precision(9);
    first_pair << ", first [" << first << "] " << a[first] << " vs " << b[first];
  }
  INFO(what << ": " << mismatches << " of " << n << " elements differ" << first_pair.str());
  CHECK(mismatches == 0);
}

}  // namespace pipeoffload::llama::testing

#endif  // PIPEOFFLOAD_TESTS_LLAMA_CPU_TEST_MODELS_H_
