// Checked integer arithmetic for counts and byte sizes that come from user input (specs, cost
// models, files, flags). Every product or sum of such values goes through these, so that an
// overflow is an error that names the values, never a wrapped number that later sizes an
// allocation or a loop. Header-only; no state.
#ifndef PIPEOFFLOAD_LIB_BASE_CHECKED_MATH_H_
#define PIPEOFFLOAD_LIB_BASE_CHECKED_MATH_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pipeoffload {

// a * b, or nullopt when it does not fit an int64.
inline std::optional<std::int64_t> CheckedMul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a + b, or nullopt when it does not fit an int64.
inline std::optional<std::int64_t> CheckedAdd(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// ceil(a / b) for a >= 0 and b >= 1, without forming a + b - 1 (which overflows for b near the
// type's maximum: a host link group of INT_MAX stages).
constexpr std::int64_t CeilDiv(std::int64_t a, std::int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

// `value` rounded toward zero as an int64, saturated at the int64 range (converting a double
// outside it is undefined behaviour); NaN gives 0. For byte counts computed in double (cost
// estimates), whose saturated value then fails the byte-total checks with a message.
inline std::int64_t SaturatedInt64(double value) {
  constexpr double kTwoTo63 = 9223372036854775808.0;
  if (!(value == value)) return 0;
  if (value >= kTwoTo63) return std::numeric_limits<std::int64_t>::max();
  if (value < -kTwoTo63) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(value);
}

// The product of `factors` when it fits an int64 and is at most `limit`. Errors: InvalidArgument
// "<what> = 4 * 2147483647 * 2147483647 overflows a 64-bit integer" or "<what> = 4 * 8 * 1024 =
// 32768 exceeds the limit of 4096".
inline absl::StatusOr<std::int64_t> CheckedProduct(std::string_view what,
                                                   std::initializer_list<std::int64_t> factors,
                                                   std::int64_t limit) {
  std::string shown;
  std::int64_t product = 1;
  bool overflow = false;
  for (std::int64_t factor : factors) {
    absl::StrAppend(&shown, shown.empty() ? "" : " * ", factor);
    if (overflow) continue;
    const std::optional<std::int64_t> next = CheckedMul(product, factor);
    if (next.has_value()) {
      product = *next;
    } else {
      overflow = true;
    }
  }
  if (overflow) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " = ", shown,
                                                   " overflows a 64-bit integer (the limit is ",
                                                   limit, ")"));
  }
  if (product > limit) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " = ", shown, " = ",
                                                   product, " exceeds the limit of ", limit));
  }
  return product;
}

// `value` as an int when it lies in [min, max]. Errors: InvalidArgument "<what> must be in
// [min, max] (got value)".
inline absl::StatusOr<int> CheckedInt(std::string_view what, std::int64_t value,
                                      std::int64_t min = std::numeric_limits<int>::min(),
                                      std::int64_t max = std::numeric_limits<int>::max()) {
  if (value < min || value > max || value < std::numeric_limits<int>::min() ||
      value > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " must be in [", min, ", ",
                                                   max, "] (got ", value, ")"));
  }
  return static_cast<int>(value);
}

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_BASE_CHECKED_MATH_H_
