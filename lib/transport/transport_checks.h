// Argument checks and names shared by the transports (local, MPI).
#ifndef PIPEOFFLOAD_LIB_TRANSPORT_TRANSPORT_CHECKS_H_
#define PIPEOFFLOAD_LIB_TRANSPORT_TRANSPORT_CHECKS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::internal {

// InvalidArgument naming the transport and the call when `peer` is out of [0, size) or equal to
// `rank`, `bytes` is negative, a non-empty message has no buffer, or the tag's mb / chunk is
// negative.
[[nodiscard]] absl::Status CheckTransfer(std::string_view transport, std::string_view call,
                                         int rank, int size, int peer, const MessageTag& tag,
                                         const void* data, std::int64_t bytes);

// The MPI tag of `tag`: ((mb * max_chunks + chunk) * kNumMessageKinds + kind). Pure, so it is
// tested without MPI. Errors: InvalidArgument when chunk >= max_chunks or the tag exceeds
// `tag_upper_bound` (MPI_TAG_UB), naming the message and both numbers.
[[nodiscard]] absl::StatusOr<int> ComposeMpiTag(const MessageTag& tag, int max_chunks,
                                                std::int64_t tag_upper_bound);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_TRANSPORT_TRANSPORT_CHECKS_H_
