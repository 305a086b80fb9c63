// MPI transport: non-blocking MPI_Isend / MPI_Irecv on host buffers over a private duplicate
// of MPI_COMM_WORLD. Open MPI 4.1 here is not CUDA-aware, so buffers are host memory.
//
// Invariants:
//  - Every MPI call goes through PO_MPI_RETURN_IF_ERROR: the communicator has
//    MPI_ERRORS_RETURN, so a failure becomes a Status with MPI_Error_string's text instead of
//    MPI's default abort.
//  - Waits poll MPI_Test with a short sleep, never MPI_Wait, so every wait honours its timeout
//    and the runtime's watchdog can fire instead of hanging in MPI.
//  - Tags are ComposeMpiTag's ((mb * max_chunks + chunk) * 3 + kind), checked against the
//    communicator's MPI_TAG_UB on every message; MPI's non-overtaking rule keeps messages of one
//    (source, tag) in posting order, which pairs the k-th Barrier calls of two ranks.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/clock.h"
#include "lib/transport/transport_checks.h"
#include "pipeoffload/transport.h"

namespace pipeoffload {
namespace {

absl::Status MpiError(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  int error_class = code;
  MPI_Error_class(code, &error_class);
  const std::string message =
      absl::StrCat("mpi transport: ", call, " failed: ", std::string(text, length));
  if (error_class == MPI_ERR_TRUNCATE) return absl::InvalidArgumentError(message);
  return absl::UnavailableError(message);
}

bool Finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// Returns the Status of a failed MPI call, with the call's text and MPI_Error_string.
#define PO_MPI_RETURN_IF_ERROR(call)                                   \
  do {                                                                 \
    const int po_mpi_rc_ = (call);                                     \
    if (po_mpi_rc_ != MPI_SUCCESS) return MpiError(po_mpi_rc_, #call); \
  } while (0)

class MpiRequest final : public TransferRequest {
 public:
  MpiRequest(bool is_recv, std::string what, std::int64_t bytes, double poll_interval)
      : is_recv_(is_recv), what_(std::move(what)), bytes_(bytes), poll_interval_(poll_interval) {}

  ~MpiRequest() override {
    if (request_ == MPI_REQUEST_NULL || Finalized()) return;
    // Abandoned after an error: cancel a receive so it cannot write into a freed buffer; a send
    // is left to finish (cancelling sends is deprecated), as the interface documents.
    if (is_recv_) MPI_Cancel(&request_);
    MPI_Request_free(&request_);
  }

  MPI_Request* request() { return &request_; }

  absl::StatusOr<bool> Test() override {
    if (!error_.ok()) return error_;
    if (request_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      error_ = MpiError(rc, "MPI_Test");
      error_ = absl::Status(error_.code(), absl::StrCat(error_.message(), " (", what_, ")"));
      return error_;
    }
    if (!flag) return false;
    if (is_recv_) {
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      if (count != bytes_) {
        error_ = absl::InvalidArgumentError(absl::StrCat("mpi transport: ", what_, " expected ",
                                                         bytes_, " bytes, the message has ",
                                                         count));
        return error_;
      }
    }
    return true;
  }

  absl::Status Wait(double timeout_seconds) override {
    const auto deadline = internal::DeadlineAfter(timeout_seconds);
    while (true) {
      absl::StatusOr<bool> done = Test();
      if (!done.ok()) return done.status();
      if (*done) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "mpi transport: %s not finished within %.3f s", what_, timeout_seconds));
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(poll_interval_));
    }
  }

 private:
  const bool is_recv_;
  const std::string what_;
  const std::int64_t bytes_;
  const double poll_interval_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  absl::Status error_;
};

class MpiTransport final : public Transport {
 public:
  MpiTransport(const MpiTransportOptions& options, MPI_Comm comm, int rank, int size,
               std::int64_t tag_ub, bool owns_mpi)
      : options_(options), comm_(comm), rank_(rank), size_(size), tag_ub_(tag_ub),
        owns_mpi_(owns_mpi) {}

  ~MpiTransport() override {
    // Teardown: errors are ignored, and nothing is called once someone else finalized MPI.
    if (Finalized()) return;
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  std::string Name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::StatusOr<std::unique_ptr<TransferRequest>> Send(int peer, const MessageTag& tag,
                                                        const void* data,
                                                        std::int64_t bytes) override {
    return Post(/*is_recv=*/false, peer, tag, const_cast<void*>(data), bytes);
  }

  absl::StatusOr<std::unique_ptr<TransferRequest>> Recv(int peer, const MessageTag& tag,
                                                        void* data,
                                                        std::int64_t bytes) override {
    return Post(/*is_recv=*/true, peer, tag, data, bytes);
  }

  absl::Status Barrier(int peer, double timeout_seconds) override {
    const MessageTag tag{MessageKind::kBarrier, 0, 0};
    absl::StatusOr<std::unique_ptr<TransferRequest>> sent = Send(peer, tag, nullptr, 0);
    if (!sent.ok()) return sent.status();
    absl::StatusOr<std::unique_ptr<TransferRequest>> received = Recv(peer, tag, nullptr, 0);
    if (!received.ok()) return received.status();
    const auto deadline = internal::DeadlineAfter(timeout_seconds);
    if (absl::Status ok = (*received)->Wait(timeout_seconds); !ok.ok()) return ok;
    const double left = std::chrono::duration<double>(
                            deadline - std::chrono::steady_clock::now()).count();
    return (*sent)->Wait(left > 0 ? left : 0.0);
  }

 private:
  absl::StatusOr<std::unique_ptr<TransferRequest>> Post(bool is_recv, int peer,
                                                        const MessageTag& tag, void* data,
                                                        std::int64_t bytes) {
    const char* call = is_recv ? "Recv" : "Send";
    if (absl::Status ok =
            internal::CheckTransfer("mpi", call, rank_, size_, peer, tag, data, bytes);
        !ok.ok()) {
      return ok;
    }
    if (bytes > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mpi transport: ", MessageTagToString(tag), " of ", bytes,
          " bytes exceeds MPI's int count; split boundary messages below 2 GiB"));
    }
    absl::StatusOr<int> mpi_tag = internal::ComposeMpiTag(tag, options_.max_chunks, tag_ub_);
    if (!mpi_tag.ok()) return mpi_tag.status();
    const std::string what =
        absl::StrCat(is_recv ? "receive of " : "send of ", MessageTagToString(tag),
                     is_recv ? " from rank " : " to rank ", peer, " on rank ", rank_);
    auto request = std::make_unique<MpiRequest>(is_recv, what, bytes,
                                                options_.poll_interval_seconds);
    const int count = static_cast<int>(bytes);
    if (is_recv) {
      PO_MPI_RETURN_IF_ERROR(
          MPI_Irecv(data, count, MPI_BYTE, peer, *mpi_tag, comm_, request->request()));
    } else {
      PO_MPI_RETURN_IF_ERROR(
          MPI_Isend(data, count, MPI_BYTE, peer, *mpi_tag, comm_, request->request()));
    }
    return std::unique_ptr<TransferRequest>(std::move(request));
  }

  const MpiTransportOptions options_;
  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const std::int64_t tag_ub_;
  const bool owns_mpi_;
};

absl::StatusOr<std::unique_ptr<Transport>> Create(const MpiTransportOptions& options) {
  if (options.max_chunks < 1 || !(options.poll_interval_seconds >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpi transport: need max_chunks >= 1 and poll_interval_seconds >= 0, got ",
        options.max_chunks, " and ", options.poll_interval_seconds));
  }
  int initialized = 0;
  PO_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  bool owns_mpi = false;
  if (!initialized) {
    int provided = 0;
    PO_MPI_RETURN_IF_ERROR(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    owns_mpi = true;
  }
  MPI_Comm comm = MPI_COMM_NULL;
  PO_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  PO_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0;
  int size = 0;
  PO_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank));
  PO_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size));
  void* attribute = nullptr;
  int found = 0;
  PO_MPI_RETURN_IF_ERROR(MPI_Comm_get_attr(comm, MPI_TAG_UB, &attribute, &found));
  // The standard guarantees at least 32767 when the attribute is missing.
  const std::int64_t tag_ub = found ? *static_cast<int*>(attribute) : 32767;
  return std::unique_ptr<Transport>(
      new MpiTransport(options, comm, rank, size, tag_ub, owns_mpi));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateMpiTransport(
    const MpiTransportOptions& options) {
  return Create(options);
}

}  // namespace pipeoffload
