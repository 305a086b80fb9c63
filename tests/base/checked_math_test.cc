// Checked arithmetic: the exact edges of the int64 range, CeilDiv where a + b - 1 would wrap, and
// the messages that name the factors and the limit.
#include "lib/base/checked_math.h"

#include <cstdint>
#include <limits>
#include <string>

#include "tests/testing/catch.h"
#include "tests/testing/status_value.h"

namespace pipeoffload {
namespace {

using testing::OkValue;

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

TEST_CASE("CheckedMul and CheckedAdd fail exactly past the int64 range") {
  CHECK(CheckedMul(3037000499, 3037000499) == std::int64_t{9223372030926249001});
  CHECK(!CheckedMul(3037000500, 3037000500).has_value());
  CHECK(CheckedMul(kMax, 1) == kMax);
  CHECK(!CheckedMul(kMax, 2).has_value());
  CHECK(CheckedMul(kMin, 1) == kMin);
  CHECK(!CheckedMul(kMin, -1).has_value());
  CHECK(CheckedMul(0, kMax) == 0);
  CHECK(CheckedAdd(kMax - 1, 1) == kMax);
  CHECK(!CheckedAdd(kMax, 1).has_value());
  CHECK(!CheckedAdd(kMin, -1).has_value());
  CHECK(CheckedAdd(kMin, kMax) == -1);
}

TEST_CASE("CeilDiv is ceil(a / b) also for b near the int maximum") {
  CHECK(CeilDiv(0, 1) == 0);
  CHECK(CeilDiv(7, 2) == 4);
  CHECK(CeilDiv(8, 2) == 4);
  CHECK(CeilDiv(1, std::numeric_limits<int>::max()) == 1);
  CHECK(CeilDiv(4096, std::numeric_limits<int>::max()) == 1);
  CHECK(CeilDiv(kMax, kMax) == 1);
  CHECK(CeilDiv(kMax, 2) == kMax / 2 + 1);
}

TEST_CASE("CheckedProduct names the factors, the product and the limit") {
  CHECK(OkValue(CheckedProduct("p * v * m", {4, 2, 8}, 64)) == std::int64_t{64});
  const absl::StatusOr<std::int64_t> over = CheckedProduct("p * v * m", {4, 2, 9}, 64);
  REQUIRE(!over.ok());
  CHECK(over.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(over.status().message()) ==
        "p * v * m = 4 * 2 * 9 = 72 exceeds the limit of 64");
  const absl::StatusOr<std::int64_t> wrapped =
      CheckedProduct("entries", {4, 2147483647, 2147483647}, 1 << 22);
  REQUIRE(!wrapped.ok());
  CHECK(std::string(wrapped.status().message()) ==
        "entries = 4 * 2147483647 * 2147483647 overflows a 64-bit integer (the limit is "
        "4194304)");
}

TEST_CASE("CheckedInt narrows only values in range") {
  CHECK(OkValue(CheckedInt("hidden", 2147483647)) == 2147483647);
  CHECK(OkValue(CheckedInt("hidden", -2147483648LL)) == std::numeric_limits<int>::min());
  const absl::StatusOr<int> wide = CheckedInt("hidden", 4294967296LL);
  REQUIRE(!wide.ok());
  CHECK(std::string(wide.status().message()) ==
        "hidden must be in [-2147483648, 2147483647] (got 4294967296)");
  const absl::StatusOr<int> low = CheckedInt("stages", 0, 1, 4096);
  REQUIRE(!low.ok());
  CHECK(std::string(low.status().message()) == "stages must be in [1, 4096] (got 0)");
}

}  // namespace
}  // namespace pipeoffload
