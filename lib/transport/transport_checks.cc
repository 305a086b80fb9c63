// Names of message kinds and tags, the argument checks every transport applies, and the
// Transport defaults that are not inline (OrderAfter's refusal).
#include "lib/transport/transport_checks.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pipeoffload {

std::string_view MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGrad:
      return "grad";
    case MessageKind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::string MessageTagToString(const MessageTag& tag) {
  if (tag.kind == MessageKind::kBarrier) return "barrier";
  return absl::StrCat(std::string(MessageKindName(tag.kind)), "(mb ", tag.mb, ", chunk ", tag.chunk, ")");
}

absl::Status Transport::OrderAfter(const Queue& queue) {
  const std::string backend = queue.owner() != nullptr ? queue.owner()->Name() : "no backend";
  return absl::InvalidArgumentError(absl::StrCat(
      Name(), " transport: rank ", rank(), " cannot order its transfers after the ",
      QueueName(queue), " queue of ", backend,
      " on the device (Transport::CanOrderAfter is false there): host-wait that queue instead"));
}

namespace internal {

absl::Status CheckTransfer(std::string_view transport, std::string_view call, int rank,
                           int size, int peer, const MessageTag& tag, const void* data,
                           std::int64_t bytes) {
  const std::string where = absl::StrCat(std::string(transport), " transport: rank ", rank, " ", std::string(call), " of ",
                                         MessageTagToString(tag), " with peer ", peer);
  if (peer < 0 || peer >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": peer out of range [0, ", size, ")"));
  }
  if (peer == rank) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a rank cannot message itself"));
  }
  if (bytes < 0 || (bytes > 0 && data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", bytes, " bytes needs a buffer and a non-negative size"));
  }
  if (tag.mb < 0 || tag.chunk < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": mb and chunk must be >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ComposeMpiTag(const MessageTag& tag, int max_chunks,
                                  std::int64_t tag_upper_bound) {
  if (tag.chunk >= max_chunks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpi transport: ", MessageTagToString(tag), " has chunk ", tag.chunk,
        " but the transport encodes chunks below max_chunks = ", max_chunks));
  }
  const std::int64_t value =
      (static_cast<std::int64_t>(tag.mb) * max_chunks + tag.chunk) * kNumMessageKinds +
      static_cast<std::int64_t>(tag.kind);
  if (value > tag_upper_bound) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpi transport: the tag of ", MessageTagToString(tag), " would be ", value,
        ", above this MPI's MPI_TAG_UB of ", tag_upper_bound,
        " (tag = ((mb * max_chunks + chunk) * 3 + kind) with max_chunks = ", max_chunks,
        "); use fewer microbatches per iteration or a smaller max_chunks"));
  }
  return static_cast<int>(value);
}

}  // namespace internal
}  // namespace pipeoffload
