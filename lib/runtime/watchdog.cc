// Watchdog messages (see watchdog.h).
#include "lib/runtime/watchdog.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::internal {

std::string Watchdog::Where(const Op& current, int current_index) const {
  return absl::StrCat("stage ", stage_, ", op ", current_index, " (", OpToString(current), ")");
}

absl::Status Watchdog::Check(const absl::Status& wait_result, const Op& waited_for,
                             const Op& current, int current_index) const {
  if (wait_result.ok()) return wait_result;
  if (wait_result.code() != absl::StatusCode::kDeadlineExceeded) {
    return Annotate(wait_result, Where(current, current_index));
  }
  std::string context;
  if (!(waited_for == current)) {
    context = absl::StrCat(" (before ", OpToString(current), ", op ", current_index, ")");
  } else {
    context = absl::StrCat(" (op ", current_index, ")");
  }
  return absl::DeadlineExceededError(absl::StrFormat("stage %d waited %.1f s for %s%s: %s",
                                                     stage_, timeout_, OpToString(waited_for),
                                                     context, wait_result.message()));
}

}  // namespace pipeoffload::internal
