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
#include "lib/transport/mpi_comm.h"
#include "lib/transport/transport_checks.h"
#include "pipeoffload/transport.h"

namespace pipeoffload {
namespace {

// Returns the Status of a failed MPI call, with the call's text and MPI_Error_string.
#define PO_MPI_RETURN_IF_ERROR(call) PO_MPI_RETURN_IF_ERROR_AS("mpi transport", call)

absl::Status MpiError(int code, const char* call) {
  return internal::MpiError(code, "mpi transport", call);
}

class MpiRequest final : public TransferRequest {
 public:
  MpiRequest(bool is_recv, std::string what, std::int64_t bytes, double poll_interval)
      : is_recv_(is_recv), what_(std::move(what)), bytes_(bytes), poll_interval_(poll_interval) {}

  ~MpiRequest() override {
    if (request_ == MPI_REQUEST_NULL || internal::MpiFinalized()) return;
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
  MpiTransport(const MpiTransportOptions& options, internal::MpiComm comm, std::int64_t tag_ub)
      : options_(options), mpi_(comm), tag_ub_(tag_ub) {}

  ~MpiTransport() override { internal::FreeMpiComm(mpi_); }

  std::string Name() const override { return "mpi"; }
  int rank() const override { return mpi_.rank; }
  int size() const override { return mpi_.size; }

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
            internal::CheckTransfer("mpi", call, mpi_.rank, mpi_.size, peer, tag, data, bytes);
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
                     is_recv ? " from rank " : " to rank ", peer, " on rank ", mpi_.rank);
    auto request = std::make_unique<MpiRequest>(is_recv, what, bytes,
                                                options_.poll_interval_seconds);
    const int count = static_cast<int>(bytes);
    if (is_recv) {
      PO_MPI_RETURN_IF_ERROR(
          MPI_Irecv(data, count, MPI_BYTE, peer, *mpi_tag, mpi_.comm, request->request()));
    } else {
      PO_MPI_RETURN_IF_ERROR(
          MPI_Isend(data, count, MPI_BYTE, peer, *mpi_tag, mpi_.comm, request->request()));
    }
    return std::unique_ptr<TransferRequest>(std::move(request));
  }

  const MpiTransportOptions options_;
  internal::MpiComm mpi_;
  const std::int64_t tag_ub_;
};

absl::StatusOr<std::unique_ptr<Transport>> Create(const MpiTransportOptions& options) {
  if (options.max_chunks < 1 || !(options.poll_interval_seconds >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpi transport: need max_chunks >= 1 and poll_interval_seconds >= 0, got ",
        options.max_chunks, " and ", options.poll_interval_seconds));
  }
  absl::StatusOr<internal::MpiComm> mpi = internal::DupMpiWorld("mpi transport");
  if (!mpi.ok()) return mpi.status();
  const MPI_Comm comm = mpi->comm;
  void* attribute = nullptr;
  int found = 0;
  if (const int rc = MPI_Comm_get_attr(comm, MPI_TAG_UB, &attribute, &found); rc != MPI_SUCCESS) {
    internal::FreeMpiComm(*mpi);
    return MpiError(rc, "MPI_Comm_get_attr(MPI_TAG_UB)");
  }
  // The standard guarantees at least 32767 when the attribute is missing.
  const std::int64_t tag_ub = found ? *static_cast<int*>(attribute) : 32767;
  return std::unique_ptr<Transport>(new MpiTransport(options, *mpi, tag_ub));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateMpiTransport(
    const MpiTransportOptions& options) {
  return Create(options);
}

}  // namespace pipeoffload
