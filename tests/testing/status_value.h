// OkValue: a StatusOr as an optional, so tests can compare a result with its exact expected
// value in one CHECK (StatusOr has no operator== with its value type).
#ifndef PIPEOFFLOAD_TESTS_TESTING_STATUS_VALUE_H_
#define PIPEOFFLOAD_TESTS_TESTING_STATUS_VALUE_H_

#include <optional>

#include "absl/status/statusor.h"

namespace pipeoffload::testing {

template <typename T>
std::optional<T> OkValue(const absl::StatusOr<T>& result) {
  return result.ok() ? std::optional<T>(*result) : std::nullopt;
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_TESTING_STATUS_VALUE_H_
