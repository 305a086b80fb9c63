// What the MPI transport and the MPI rank group share: MPI errors as Status, and a private
// duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN (MPI started when nobody has yet).
// Includes <mpi.h>: for lib/transport's MPI files only.
#ifndef PIPEOFFLOAD_LIB_TRANSPORT_MPI_COMM_H_
#define PIPEOFFLOAD_LIB_TRANSPORT_MPI_COMM_H_

#include <mpi.h>

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload::internal {

// "<who>: <call> failed: <MPI_Error_string>": InvalidArgument for MPI_ERR_TRUNCATE (a message
// of another size than the receive), Unavailable otherwise.
absl::Status MpiError(int code, std::string_view who, const char* call);

// Returns the Status of a failed MPI call from the enclosing function, naming `who` and the call.
#define PO_MPI_RETURN_IF_ERROR_AS(who, call)                          \
  do {                                                                \
    const int po_mpi_rc_ = (call);                                    \
    if (po_mpi_rc_ != MPI_SUCCESS) {                                  \
      return ::pipeoffload::internal::MpiError(po_mpi_rc_, who, #call); \
    }                                                                 \
  } while (0)

bool MpiFinalized();

// A duplicate of MPI_COMM_WORLD whose errors return (MPI_ERRORS_RETURN) instead of aborting.
struct MpiComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 0;
  bool owns_mpi = false;  // MPI_Init_thread was called here, so FreeMpiComm finalizes
};

// Initializes MPI when nobody has yet, with MPI_THREAD_SERIALIZED (a rank's one driver thread
// makes every MPI call; the CPU backend's copy threads never touch MPI), then duplicates
// MPI_COMM_WORLD. Errors: MpiError's, naming `who`.
[[nodiscard]] absl::StatusOr<MpiComm> DupMpiWorld(std::string_view who);

// Teardown: frees the communicator and finalizes MPI when `comm` owns it; errors are ignored,
// and nothing is called once someone else finalized MPI.
void FreeMpiComm(MpiComm& comm);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_TRANSPORT_MPI_COMM_H_
