// Invariant checks for bugs (never for user input, which gets a Status). A failed check prints
// the expression, the location and an optional message, then aborts.
#ifndef PIPEOFFLOAD_LIB_BASE_CHECK_H_
#define PIPEOFFLOAD_LIB_BASE_CHECK_H_

#include <string_view>

namespace pipeoffload::internal {

[[noreturn]] void CheckFailed(const char* expression, const char* file, int line,
                              const char* function, std::string_view message);

}  // namespace pipeoffload::internal

#define PO_CHECK_MSG(condition, message)                                              \
  do {                                                                                \
    if (!(condition)) {                                                               \
      ::pipeoffload::internal::CheckFailed(#condition, __FILE__, __LINE__, __func__,  \
                                           (message));                                \
    }                                                                                 \
  } while (0)

#define PO_CHECK(condition) PO_CHECK_MSG(condition, "")

#ifdef NDEBUG
#define PO_DCHECK(condition) \
  do {                       \
  } while (0)
#else
#define PO_DCHECK(condition) PO_CHECK(condition)
#endif

#endif  // PIPEOFFLOAD_LIB_BASE_CHECK_H_
