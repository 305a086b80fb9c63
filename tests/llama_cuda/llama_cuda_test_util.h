// Helpers of the CUDA Llama tests (kernels, units, model): the GPT kernel tests' device arrays
// and bf16 conversions (tests/gpt_cuda/kernel_test_util.h), plus the comparison every test here
// uses: a norm-relative bound and an element-wise bound scaled by the tensor's RMS, the worst
// element printed, NaN never passing.
#ifndef PIPEOFFLOAD_TESTS_LLAMA_CUDA_LLAMA_CUDA_TEST_UTIL_H_
#define PIPEOFFLOAD_TESTS_LLAMA_CUDA_LLAMA_CUDA_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/gpt_cuda/kernel_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama::cuda::testing {

using gpt::cuda::testing::DeviceArray;
using gpt::cuda::testing::RandomBf16Values;
using gpt::cuda::testing::RoundBf16;
using gpt::cuda::testing::SameBits;
using gpt::cuda::testing::TestStream;
using gpt::cuda::testing::ToBf16;
using gpt::cuda::testing::ToFloat;

// `value` of a StatusOr, REQUIRE-ing it is OK.
template <typename T>
T ValueOrFail(absl::StatusOr<T> result) {
  INFO(result.status().ToString());
  REQUIRE(result.ok());
  return std::move(*result);
}

// n normal(0, stddev) values rounded to bf16 (what the GPU reads, exactly).
inline std::vector<float> NormalBf16(std::int64_t n, float stddev, std::uint64_t seed,
                                     float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (float& x : out) x = RoundBf16(normal(rng));
  return out;
}

// The comparison of every test: passes when
//   ||got - want|| / ||want|| <= norm_tol, and
//   |got_i - want_i| <= elem_tol * (|want_i| + rms(want)) for every i,
// the second catching a few wild elements a norm hides, the RMS term keeping near-zero elements
// from failing on rounding. Prints one line (what, both measures, the worst element) so the
// device run's log keeps the margins; a NaN or infinity in `got` fails both.
inline void ExpectClose(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want, double norm_tol, double elem_tol) {
  REQUIRE(got.size() == want.size());
  REQUIRE(!want.empty());
  double diff2 = 0.0;
  double norm2 = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff2 += d * d;
    norm2 += static_cast<double>(want[i]) * want[i];
  }
  const double rms = std::sqrt(norm2 / static_cast<double>(want.size()));
  double rel = std::sqrt(diff2) / std::max(std::sqrt(norm2), 1e-30);
  std::int64_t worst = 0;
  double worst_ratio = -1.0;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double bound = elem_tol * (std::fabs(static_cast<double>(want[i])) + rms) + 1e-30;
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio =
        std::isfinite(got[i]) ? d / bound : std::numeric_limits<double>::infinity();
    if (!(ratio <= 1.0)) ++failures;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = static_cast<std::int64_t>(i);
    }
  }
  if (!std::isfinite(rel)) rel = std::numeric_limits<double>::infinity();
  const auto w = static_cast<std::size_t>(worst);
  std::printf("  %-36s rel %.3e (tol %.1e)  worst [%lld] got %.6g want %.6g (%.2f of bound)%s\n",
              what.c_str(), rel, norm_tol, static_cast<long long>(worst), got[w], want[w],
              worst_ratio, rel <= norm_tol && failures == 0 ? "" : "  FAIL");
  std::fflush(stdout);
  INFO(what << ": relative error " << rel << " (tolerance " << norm_tol << "), " << failures
            << " of " << want.size() << " elements beyond " << elem_tol
            << " x (|want| + rms); worst element " << worst << ": got " << got[w] << ", want "
            << want[w]);
  CHECK(rel <= norm_tol);
  CHECK(failures == 0);
}

// Number of elements whose bits differ (the bitwise checks report how many, not megabytes).
template <typename T>
std::int64_t BitMismatches(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return -1;
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) ++count;
  }
  return count;
}

}  // namespace pipeoffload::llama::cuda::testing

#endif  // PIPEOFFLOAD_TESTS_LLAMA_CUDA_LLAMA_CUDA_TEST_UTIL_H_
