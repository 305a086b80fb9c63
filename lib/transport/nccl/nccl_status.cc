// NcclStatus (nccl_status.h).
#include "lib/transport/nccl/nccl_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pipeoffload::internal {

absl::Status NcclStatus(ncclResult_t result, std::string_view where, std::string_view call) {
  const char* last = ncclGetLastError(nullptr);
  std::string message = absl::StrCat(std::string(where), ": ", std::string(call),
                                     " failed: ", ncclGetErrorString(result));
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, " (", last, ")");
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace pipeoffload::internal
