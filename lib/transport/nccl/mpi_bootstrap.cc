// MPI bootstrap of the NCCL transport (mpi_bootstrap.h). Every MPI call goes through
// PO_BOOT_MPI_RETURN_IF_ERROR; the session's communicator returns errors instead of aborting.
#include "lib/transport/nccl/mpi_bootstrap.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace pipeoffload::internal {
namespace {

absl::Status MpiError(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  return absl::UnavailableError(absl::StrCat("nccl transport bootstrap: ", call,
                                             " failed: ", std::string(text, length)));
}

#define PO_BOOT_MPI_RETURN_IF_ERROR(call)                        \
  do {                                                           \
    const int po_boot_rc_ = (call);                              \
    if (po_boot_rc_ != MPI_SUCCESS) return MpiError(po_boot_rc_, #call); \
  } while (0)

bool Finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace

absl::StatusOr<MpiSession> StartMpi() {
  if (Finalized()) {
    return absl::UnavailableError(
        "nccl transport bootstrap: MPI was already finalized in this process (MPI cannot be "
        "initialized twice; keep MPI up, e.g. with MPI_Init in main, while creating several "
        "transports)");
  }
  MpiSession session;
  int initialized = 0;
  PO_BOOT_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    PO_BOOT_MPI_RETURN_IF_ERROR(
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    session.owns_mpi = true;
  }
  absl::Status status = [&]() -> absl::Status {
    PO_BOOT_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &session.comm));
    PO_BOOT_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(session.comm, MPI_ERRORS_RETURN));
    PO_BOOT_MPI_RETURN_IF_ERROR(MPI_Comm_rank(session.comm, &session.rank));
    PO_BOOT_MPI_RETURN_IF_ERROR(MPI_Comm_size(session.comm, &session.size));
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    EndMpi(session);
    return status;
  }
  return session;
}

void EndMpi(MpiSession& session) {
  if (Finalized()) return;
  if (session.comm != MPI_COMM_NULL) MPI_Comm_free(&session.comm);
  session.comm = MPI_COMM_NULL;
  if (session.owns_mpi) MPI_Finalize();
  session.owns_mpi = false;
}

absl::StatusOr<int> LocalRank(const MpiSession& session) {
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}) {
    const char* value = std::getenv(variable);
    if (value == nullptr) continue;
    char* end = nullptr;
    errno = 0;
    const long parsed = std::strtol(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0' || parsed < 0 || parsed > 1 << 20) {
      return absl::InvalidArgumentError(absl::StrCat("nccl transport bootstrap: ", variable, "=\"",
                                                     value,
                                                     "\" is not a non-negative integer"));
    }
    return static_cast<int>(parsed);
  }
  MPI_Comm node = MPI_COMM_NULL;
  PO_BOOT_MPI_RETURN_IF_ERROR(
      MPI_Comm_split_type(session.comm, MPI_COMM_TYPE_SHARED, session.rank, MPI_INFO_NULL, &node));
  int local = 0;
  const int rc = MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Comm_rank(node communicator)");
  return local;
}

absl::Status AllRanksOk(const MpiSession& session, bool ok, std::string_view step) {
  int mine = ok ? 1 : 0;
  int all = 0;
  PO_BOOT_MPI_RETURN_IF_ERROR(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, session.comm));
  if (all == 1 || !ok) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("nccl transport rank ", session.rank,
                                             ": another rank failed while ", std::string(step),
                                             " (see its error)"));
}

absl::Status Broadcast(const MpiSession& session, void* data, int bytes, int root) {
  PO_BOOT_MPI_RETURN_IF_ERROR(MPI_Bcast(data, bytes, MPI_BYTE, root, session.comm));
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal
