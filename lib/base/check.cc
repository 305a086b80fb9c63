#include "lib/base/check.h"

#include <cstdio>
#include <cstdlib>

namespace pipeoffload::internal {

void CheckFailed(const char* expression, const char* file, int line, const char* function,
                 std::string_view message) {
  std::fprintf(stderr, "pipeoffload: check failed: %s at %s:%d in %s%s%.*s\n", expression, file,
               line, function, message.empty() ? "" : ": ", static_cast<int>(message.size()),
               message.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace pipeoffload::internal
