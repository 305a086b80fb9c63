// Status propagation helpers used across lib/ and schedules/.
#ifndef PIPEOFFLOAD_LIB_BASE_STATUS_MACROS_H_
#define PIPEOFFLOAD_LIB_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define PO_STATUS_CONCAT_INNER_(a, b) a##b
#define PO_STATUS_CONCAT_(a, b) PO_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define PO_RETURN_IF_ERROR(expr)                                              \
  do {                                                                        \
    ::absl::Status PO_STATUS_CONCAT_(po_status_, __LINE__) = (expr);          \
    if (!PO_STATUS_CONCAT_(po_status_, __LINE__).ok()) {                      \
      return PO_STATUS_CONCAT_(po_status_, __LINE__);                         \
    }                                                                         \
  } while (0)

// `lhs = value of expr` when `expr` (an absl::StatusOr) is OK, else returns its status.
#define PO_ASSIGN_OR_RETURN(lhs, expr) \
  PO_ASSIGN_OR_RETURN_IMPL_(PO_STATUS_CONCAT_(po_statusor_, __LINE__), lhs, expr)
#define PO_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                              \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace pipeoffload {

// Prefixes `status`'s message with `context` ("stage 2, mb 5: ..."), keeping its code.
inline absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(std::string(context), ": ", std::string(status.message())));
}

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_BASE_STATUS_MACROS_H_
