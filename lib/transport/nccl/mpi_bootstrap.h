// The MPI side of the NCCL transport's start-up: MPI itself, a private communicator with
// MPI_ERRORS_RETURN (so MPI failures come back as Status instead of MPI's default abort), the
// rank's index on its node, and the collective steps of creating an NCCL communicator.
// Used at Create and teardown only; no MPI call happens while messages flow.
#ifndef PIPEOFFLOAD_LIB_TRANSPORT_NCCL_MPI_BOOTSTRAP_H_
#define PIPEOFFLOAD_LIB_TRANSPORT_NCCL_MPI_BOOTSTRAP_H_

#include <mpi.h>

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload::internal {

struct MpiSession {
  MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD, MPI_ERRORS_RETURN
  int rank = 0;
  int size = 0;
  bool owns_mpi = false;  // this session called MPI_Init_thread, so EndMpi finalizes
};

// Initializes MPI if nobody has (MPI_THREAD_SERIALIZED) and duplicates MPI_COMM_WORLD.
// Errors: Unavailable with MPI_Error_string's text, or when MPI was already finalized.
[[nodiscard]] absl::StatusOr<MpiSession> StartMpi();

// Frees the communicator and finalizes MPI when the session initialized it. Errors ignored
// (teardown); nothing is called once MPI is finalized.
void EndMpi(MpiSession& session);

// This rank's index among the ranks of its node: OMPI_COMM_WORLD_LOCAL_RANK or
// MPI_LOCALRANKID when the launcher sets one, else the rank in MPI_COMM_TYPE_SHARED.
// Errors: InvalidArgument for a variable that is not a non-negative integer; MPI's errors.
[[nodiscard]] absl::StatusOr<int> LocalRank(const MpiSession& session);

// Collective: OK when every rank passes ok = true. A rank that passes true while another passed
// false gets Unavailable naming `step`; the failing rank reports its own error, so call this
// on every rank, also after a local failure, or the others wait forever.
[[nodiscard]] absl::Status AllRanksOk(const MpiSession& session, bool ok, std::string_view step);

// Collective: `bytes` bytes at `data` from rank `root` to every rank.
[[nodiscard]] absl::Status Broadcast(const MpiSession& session, void* data, int bytes, int root);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_TRANSPORT_NCCL_MPI_BOOTSTRAP_H_
