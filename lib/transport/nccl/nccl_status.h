// Turns ncclResult_t into absl::Status, with the call's text and NCCL's last error message.
#ifndef PIPEOFFLOAD_LIB_TRANSPORT_NCCL_NCCL_STATUS_H_
#define PIPEOFFLOAD_LIB_TRANSPORT_NCCL_NCCL_STATUS_H_

#include <nccl.h>

#include <string_view>

#include "absl/status/status.h"

namespace pipeoffload::internal {

// InvalidArgument for ncclInvalidArgument / ncclInvalidUsage (our bug or the caller's),
// Unavailable for ncclRemoteError / ncclSystemError (a lost peer or network), Internal for the
// rest. The message names `where` (e.g. "nccl transport rank 1"), the call, ncclGetErrorString
// and ncclGetLastError. REQUIRES: result is neither ncclSuccess nor ncclInProgress.
[[nodiscard]] absl::Status NcclStatus(ncclResult_t result, std::string_view where,
                                      std::string_view call);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_TRANSPORT_NCCL_NCCL_STATUS_H_
