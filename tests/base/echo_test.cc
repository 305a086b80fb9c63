// Echo: short text unchanged, long text cut to its first bytes with the full size, never inside
// a UTF-8 sequence.
#include "lib/base/echo.h"

#include <string>

#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

TEST_CASE("Echo keeps short text and shortens long text to a bounded size") {
  CHECK(Echo("") == "");
  const std::string at_limit(kMaxEchoBytes, 'a');
  CHECK(Echo(at_limit) == at_limit);
  const std::string huge(50'000'000, 'a');
  const std::string shown = Echo(huge);
  CHECK(shown == std::string(kMaxEchoBytes, 'a') + "... (50000000 bytes)");
  CHECK(Echo("abcdef", 3) == "abc... (6 bytes)");
}

TEST_CASE("Echo never cuts a UTF-8 sequence") {
  // "µ" is 0xC2 0xB5: a cut after 4 bytes of "abcµ..." would split it, so it moves before it.
  const std::string text = "abc\xC2\xB5" "defgh";
  CHECK(Echo(text, 4) == "abc... (10 bytes)");
  CHECK(Echo(text, 5) == "abc\xC2\xB5... (10 bytes)");
}

}  // namespace
}  // namespace pipeoffload
