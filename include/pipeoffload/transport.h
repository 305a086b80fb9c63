// Point-to-point messages between pipeline ranks (DESIGN.md section 5): non-blocking Send/Recv
// of bytes, matched by peer and a tag derived from (kind, mb, chunk), and a pairwise Barrier.
// Implementations: local (stages as threads of one process; target pipeoffload::transport), MPI
// (ranks of an mpirun job, host buffers; pipeoffload::transport_mpi) and NCCL (device buffers,
// one GPU per rank; cuda.h, pipeoffload::transport_nccl).
#ifndef PIPEOFFLOAD_TRANSPORT_H_
#define PIPEOFFLOAD_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {

enum class MessageKind : std::uint8_t {
  kActivation,  // SEND_F / RECV_F
  kGrad,        // SEND_B / RECV_B
  kBarrier,     // BARRIER
};
inline constexpr int kNumMessageKinds = 3;
std::string_view MessageKindName(MessageKind kind);  // "activation", "grad", "barrier"

// What a message carries. `mb` and `chunk` are the RECEIVER's (microbatch, chunk), so both sides
// derive the same tag; both are >= 0 (a barrier uses 0, 0).
struct MessageTag {
  MessageKind kind = MessageKind::kActivation;
  int mb = 0;
  int chunk = 0;
  friend bool operator==(const MessageTag&, const MessageTag&) = default;
};
std::string MessageTagToString(const MessageTag& tag);  // "activation(mb 3, chunk 1)"

// A posted Send or Recv. Destroying an unfinished request abandons it: a receive is cancelled;
// an unfinished send may still read its buffer until the transport is destroyed.
class TransferRequest {
 public:
  virtual ~TransferRequest() = default;
  // True once the transfer finished: a send's buffer may be reused, a receive's buffer holds
  // the message. Errors: the transport's, e.g. a size mismatch (InvalidArgument) or a lost peer
  // (Unavailable); a request that failed keeps returning its error.
  [[nodiscard]] virtual absl::StatusOr<bool> Test() = 0;
  // Blocks until Test() would return true. Errors: DeadlineExceeded after `timeout_seconds`,
  // or Test()'s errors. After a DeadlineExceeded the local and MPI requests stay posted and may
  // be waited on again, but the NCCL transport aborts its communicator (NCCL cannot cancel a
  // transfer): a caller that polls must use Test, and treat a timed-out Wait as final.
  [[nodiscard]] virtual absl::Status Wait(double timeout_seconds) = 0;
};

// One rank's endpoint. Messages between one (sender, receiver, tag) are matched in the order
// posted. Thread-compatible: one thread per endpoint.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string Name() const = 0;  // "local", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // True when Send and Recv may be given device memory of a backend whose memory the host
  // cannot touch (Backend::DeviceMemoryIsHostAccessible() false): the transport moves such
  // buffers itself (NCCL, or the local transport with a device copier). The executor refuses
  // such a backend with a transport that returns false.
  virtual bool AcceptsDeviceMemory() const { return false; }

  // Ordering on the device (instead of on the host). A caller whose buffers are written, or
  // still read, by work it enqueued on a backend queue would otherwise have to host-wait that
  // queue before every Send and Recv (the executor did, and on CUDA that stalls the stage's
  // thread at every P2P op). A transport that moves data on a device stream of its own can
  // instead make that stream wait for the queue, as one cudaStreamWaitEvent, and return at once.
  //
  // Contract: after OrderAfter(queue) returns OK, no transfer this endpoint posts from then on
  // (Send, Recv, Barrier) reads or writes its buffer before all work enqueued on `queue` before
  // the call has finished. The host does not wait. It promises nothing about transfers
  // posted before it, and covers no work enqueued after it: call it again for that.
  //
  // Why a separate call rather than Send/Recv overloads taking an event: one ordering covers
  // every post that follows (a stream is in order), the transport keeps its own event (no
  // Backend Event, which only its backend can record, crosses the interface), and Send/Recv keep
  // one signature for every transport.
  //
  // CanOrderAfter says whether OrderAfter works for `queue` (e.g. NCCL: a CUDA backend's queue
  // on the transport's GPU); it is cheap and constant for a given queue. Default: false, and
  // the caller host-waits as before (local and MPI transports).
  virtual bool CanOrderAfter(const Queue& queue) const {
    static_cast<void>(queue);
    return false;
  }
  // Errors: InvalidArgument when CanOrderAfter(queue) is false; the transport's (NCCL: the CUDA
  // call that failed, which aborts the communicator, since later transfers would no longer be
  // ordered; Unavailable after an earlier failure).
  [[nodiscard]] virtual absl::Status OrderAfter(const Queue& queue);

  // Starts sending `bytes` bytes at `data` to `peer` and returns at once. `data` must stay valid
  // and unchanged until the request finishes. Errors: InvalidArgument for a peer out of range or
  // equal to rank(), a negative size, or a tag the transport cannot encode.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<TransferRequest>> Send(
      int peer, const MessageTag& tag, const void* data, std::int64_t bytes) = 0;
  // Starts receiving exactly `bytes` bytes from `peer` into `data`; `data` must stay valid until
  // the request finishes. A message of another size fails the request with InvalidArgument.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<TransferRequest>> Recv(
      int peer, const MessageTag& tag, void* data, std::int64_t bytes) = 0;

  // Rendezvous with `peer`: returns once `peer` has called Barrier(rank()) as often as this rank
  // has called Barrier(peer) (the k-th call on each side pair up). Errors: DeadlineExceeded
  // after `timeout_seconds`, and the Send/Recv errors.
  [[nodiscard]] virtual absl::Status Barrier(int peer, double timeout_seconds) = 0;
};

// `num_ranks` endpoints sharing mailboxes keyed by (sender, receiver, tag): rank r is element r.
// Sends copy the message into the receiver's mailbox and finish at once; endpoints may live on
// different threads. Errors: InvalidArgument for num_ranks < 1.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateLocalTransports(
    int num_ranks);

// Copies `bytes` (> 0) bytes from `src` to `dst` and returns once `dst` holds them and `src` may
// be overwritten (e.g. a device-to-device copy on the receiver's compute stream, waited for).
using LocalCopyFunction =
    std::function<absl::Status(void* dst, const void* src, std::int64_t bytes)>;

struct LocalTransportOptions {
  // Empty: messages are copied with memcpy (host-accessible memory only), eagerly at Send.
  // One function (used by every rank) or num_ranks functions (rank r's receives use
  // element r): messages are then NOT copied at Send. The receiver copies straight from the
  // sender's buffer with its function when the receive is tested or waited on (rendezvous),
  // and the send finishes once that copy has returned. So buffers may be device memory of
  // one GPU shared by the threads (AcceptsDeviceMemory() is true), and a send's buffer stays
  // in use until its receiver has taken it. Zero-byte messages (barriers) stay eager.
  std::vector<LocalCopyFunction> receive_copiers;
};

// As above, with options. Errors: InvalidArgument for num_ranks < 1, or receive_copiers of a
// size other than 0, 1 or num_ranks, or holding an empty function.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateLocalTransports(
    int num_ranks, const LocalTransportOptions& options);

// A LocalCopyFunction that copies on `backend`'s compute queue (Backend::CopyAsync, so it is
// ordered after the compute work already enqueued there, e.g. a kernel still reading the
// buffer being overwritten) and then waits, up to `timeout_seconds` (DeadlineExceeded), for
// that queue. Give each stage's receives its own backend's copier. `backend` must outlive the
// function. Works for any backend whose compute queue can copy between its buffers (the CPU
// backend, and the CUDA backend for device memory of its GPU: see CudaDeviceCopier in cuda.h).
LocalCopyFunction BackendComputeCopier(Backend& backend, double timeout_seconds);

// Local transports for stages as threads of one process, rank r on backends[r] (e.g. p CUDA
// backends of one GPU, each with its own streams): rank r's receives copy on its own backend's
// compute queue (BackendComputeCopier with `timeout_seconds`), so buffers may be device memory
// the host cannot touch. The backends must outlive the transports.
// Errors: InvalidArgument for no backends, a null one, or a non-positive timeout.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<Transport>>> CreateLocalTransports(
    const std::vector<Backend*>& backends, double timeout_seconds);

// MPI transport (target pipeoffload::transport_mpi, built when MPI is found). Host buffers only
// (Open MPI 4.1 here is not CUDA-aware).
struct MpiTransportOptions {
  // Chunks per stage the tags must encode: tag = ((mb * max_chunks + chunk) * 3 + kind), which
  // must stay below MPI_TAG_UB (checked per message, with an error naming both numbers).
  int max_chunks = 16;
  // How long a polling wait sleeps between MPI_Test calls.
  double poll_interval_seconds = 20e-6;
};

// A transport over a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN (MPI errors come back as
// Status with MPI_Error_string's text). Calls MPI_Init_thread when MPI is not initialized yet,
// and then MPI_Finalize when destroyed. Errors: Unavailable when MPI fails to start,
// InvalidArgument for bad options.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Transport>> CreateMpiTransport(
    const MpiTransportOptions& options = {});

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_TRANSPORT_H_
