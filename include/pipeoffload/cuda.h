// The CUDA backend and the NCCL transport (DESIGN.md section 5): factories behind the Backend
// and Transport interfaces. No CUDA, NCCL or MPI types appear here, so a trainer can include it
// anywhere; the raw compute stream is in cuda_stream.h.
//
// Targets: pipeoffload::backend_cuda (po_backend_cuda, built when PO_WITH_CUDA is on) and
// pipeoffload::transport_nccl (po_transport_nccl, built when NCCL and MPI are found too).
#ifndef PIPEOFFLOAD_CUDA_H_
#define PIPEOFFLOAD_CUDA_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/transport.h"

namespace pipeoffload {

// CUDA devices visible to this process; 0 when there is no driver or no device (the reason is
// not an error here: callers decide whether a missing GPU is one). Errors: Internal for any
// other CUDA failure.
[[nodiscard]] absl::StatusOr<int> CudaDeviceCount();

struct CudaBackendOptions {
  int device = 0;  // CUDA ordinal; with the NCCL transport, use NcclTransportDevice's
};

// One device as a Backend, "cuda:<device>":
//  - queues are non-blocking streams (they never synchronize with the legacy default stream):
//    the built-in compute, D2H and H2D ones, and one more per CreateQueue; work on one stream
//    runs in order; Synchronize covers every one of them;
//  - AllocateDevice is cudaMalloc (call it at init only: cudaMalloc/cudaFree synchronize the
//    device), AllocateHost is cudaHostAlloc (pinned, portable to every context);
//    DeviceMemoryIsHostAccessible() is false;
//  - CopyAsync is cudaMemcpyAsync (direction inferred from the pointers), FillAsync a kernel on
//    the queue's stream; both return once enqueued; BackendStats count bytes at enqueue time;
//  - QueueWaitEvent is cudaStreamWaitEvent and never blocks the caller, on every queue
//    (unlike the CPU backend, whose compute queue is the calling thread);
//  - WaitEvent and Synchronize poll cudaEventQuery until their timeout (they never call the
//    unbounded cudaEventSynchronize / cudaStreamSynchronize), so a hung kernel surfaces as
//    DeadlineExceeded naming the event and its queue;
//  - EventTime is on NowSeconds' clock (event timestamps converted through anchor events whose
//    host times are measured; error a few microseconds).
// Every method makes the backend's device current for its duration and restores the caller's.
// Errors: InvalidArgument for a negative device; FailedPrecondition when there is no such
// device (naming how many there are, or why there are none); the CUDA calls' errors
// (ResourceExhausted for out-of-memory, Internal otherwise, each naming the call).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    const CudaBackendOptions& options = {});

// A receive copier for CreateLocalTransports (stages as threads of one process on ONE GPU,
// each with its own CUDA backend): copies device to device on `backend`'s compute stream, so
// the copy runs after the kernels already enqueued there, then polls until it has finished
// (DeadlineExceeded after `timeout_seconds`), so the sender may reuse its buffer at once.
// Give rank r's receives rank r's backend. Errors: InvalidArgument when `backend` is not a
// CUDA backend or the timeout is not positive.
[[nodiscard]] absl::StatusOr<LocalCopyFunction> CudaDeviceCopier(Backend& backend,
                                                                 double timeout_seconds = 60.0);

struct NcclTransportOptions {
  // CUDA ordinal of this rank's GPU; -1 picks the rank's local index on its node (the
  // launcher's OMPI_COMM_WORLD_LOCAL_RANK, else MPI_COMM_TYPE_SHARED), which must be below the
  // number of visible devices (NCCL cannot put two ranks of one communicator on one GPU).
  int device = -1;
  // Bound on communicator creation and the neighbour warm-up (all ranks must arrive).
  double init_timeout_seconds = 120.0;
  // Bound on handing one operation to NCCL (a first message to a peer that is not a pipeline
  // neighbour sets up its connection, which needs that peer to post too).
  double enqueue_timeout_seconds = 60.0;
  // Sends and receives that may be in flight at once (each holds a 32-byte header slot).
  int max_pending_messages = 1024;
};

// NCCL point-to-point messages between the ranks of an MPI job, one communicator per process:
//  - bootstrap: MPI (MPI_Init_thread when not initialized yet, then MPI_Finalize at
//    destruction); rank 0's ncclUniqueId is broadcast over a duplicate of MPI_COMM_WORLD with
//    MPI_ERRORS_RETURN; rank() and size() are MPI_COMM_WORLD's;
//  - the communicator is non-blocking, its transfers run on a stream of the transport's own,
//    and the ring neighbours (rank +- 1 mod size) exchange one small message at Create so their
//    connections exist before the first real transfer;
//  - buffers are device memory of this rank's GPU. A Send reads its buffer when the stream gets
//    to it: the caller must have finished writing it, or called OrderAfter (transport.h) on the
//    queue that writes it, which CanOrderAfter accepts for any queue of a CUDA backend on this
//    GPU (the executor does so before every SEND and RECV instead of host-waiting its compute
//    queue); a finished receive's data is ready for any stream;
//  - messages to one peer are matched in posting order (NCCL has no tags): both ranks must post
//    them in the same order, as a schedule that is deadlock-free under rendezvous semantics
//    does. Each message carries a 32-byte header with its tag and size, which the receiver
//    checks: a mismatch fails the receive with InvalidArgument naming both messages;
//  - unlike the local and MPI transports, a rank may message itself (peer == rank()), which is
//    how a one-GPU job tests NCCL; self messages pair in posting order and must agree on tag
//    and size (InvalidArgument on the second of the two posts otherwise);
//  - Barrier(peer) is an exchange of headers with `peer`.
// Failures are final: when a Wait times out on a transfer NCCL has started, when NCCL or CUDA
// reports an error, or when a request is destroyed before its transfer finished, the
// communicator is aborted (ncclCommAbort is the only way to cancel an NCCL transfer), and this
// and every later call return Unavailable (DeadlineExceeded for the timeout itself) naming the
// first failure. A Wait that times out on a self message whose partner was never posted
// leaves it posted (DeadlineExceeded), as the Transport contract says.
// Errors of Create: InvalidArgument for bad options; FailedPrecondition for no usable GPU;
// Unavailable when MPI or NCCL fails to start or another rank failed (naming the step);
// DeadlineExceeded past init_timeout_seconds.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Transport>> CreateNcclTransport(
    const NcclTransportOptions& options = {});

// The CUDA ordinal an NCCL transport's communicator uses (give it to CreateCudaBackend).
// Errors: InvalidArgument when `transport` is not an NCCL transport.
[[nodiscard]] absl::StatusOr<int> NcclTransportDevice(const Transport& transport);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_CUDA_H_
