// MPI errors and the private communicator (see mpi_comm.h).
#include "lib/transport/mpi_comm.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pipeoffload::internal {

absl::Status MpiError(int code, std::string_view who, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  int error_class = code;
  MPI_Error_class(code, &error_class);
  const std::string message = absl::StrCat(std::string(who), ": ", call, " failed: ", std::string(text, length));
  if (error_class == MPI_ERR_TRUNCATE) return absl::InvalidArgumentError(message);
  return absl::UnavailableError(message);
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

absl::StatusOr<MpiComm> DupMpiWorld(std::string_view who) {
  MpiComm out;
  if (MpiFinalized()) {
    // MPI starts once per process: MPI_Init after MPI_Finalize is erroneous (it may abort).
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(who),
                     ": MPI was already finalized in this process; it can be started only once "
                     "(keep one MPI group or transport alive for the whole job, or initialize "
                     "MPI yourself)"));
  }
  int initialized = 0;
  PO_MPI_RETURN_IF_ERROR_AS(who, MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    PO_MPI_RETURN_IF_ERROR_AS(who,
                              MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    out.owns_mpi = true;
  }
  PO_MPI_RETURN_IF_ERROR_AS(who, MPI_Comm_dup(MPI_COMM_WORLD, &out.comm));
  PO_MPI_RETURN_IF_ERROR_AS(who, MPI_Comm_set_errhandler(out.comm, MPI_ERRORS_RETURN));
  PO_MPI_RETURN_IF_ERROR_AS(who, MPI_Comm_rank(out.comm, &out.rank));
  PO_MPI_RETURN_IF_ERROR_AS(who, MPI_Comm_size(out.comm, &out.size));
  return out;
}

void FreeMpiComm(MpiComm& comm) {
  if (MpiFinalized()) return;
  if (comm.comm != MPI_COMM_NULL) MPI_Comm_free(&comm.comm);
  if (comm.owns_mpi) MPI_Finalize();
  comm.owns_mpi = false;
}

}  // namespace pipeoffload::internal
