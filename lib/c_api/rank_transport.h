// The job a po_stage belongs to (c_api.h, "one rank's stage"): the rank group and transport
// its launcher's processes share (MPI bootstrap; MPI or NCCL messages) and the backend that
// goes with the transport. The only place of the C ABI that knows about MPI and NCCL.
#ifndef PIPEOFFLOAD_LIB_C_API_RANK_TRANSPORT_H_
#define PIPEOFFLOAD_LIB_C_API_RANK_TRANSPORT_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/c_api.h"
#include "pipeoffload/rank_group.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::c_api {

// What a rank's stage runs over. Members die in reverse order: the backend and transport
// first, then the group, which finalizes MPI (rank_group.h).
struct RankJob {
  std::unique_ptr<RankGroup> group;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Backend> backend;  // null: the stage makes a CPU backend of its own
};

// Joins the job for `transport` (PO_TRANSPORT_*) with `options`' backend and device.
// Collective over MPI_COMM_WORLD. PO_TRANSPORT_MPI carries host buffers, so it needs
// PO_BACKEND_CPU; PO_TRANSPORT_NCCL needs PO_BACKEND_CUDA, on options.cuda_device (-1: the
// rank's local index on its node). Errors: InvalidArgument for an unknown transport or a
// backend that does not go with it; Unimplemented when the library was built without it;
// the group's, the transport's and the backend's (Unavailable when MPI cannot start).
[[nodiscard]] absl::StatusOr<RankJob> JoinRankJob(std::int32_t transport,
                                                  const po_pipeline_options& options,
                                                  int max_chunks);

}  // namespace pipeoffload::c_api

#endif  // PIPEOFFLOAD_LIB_C_API_RANK_TRANSPORT_H_
