// The NCCL transport (cuda.h): MPI bootstrap, GPU choice, and the Transport / TransferRequest
// interfaces over an NcclLink (nccl_link.h owns the communicator and the transfer states).
//
// Create is collective over MPI_COMM_WORLD. Every step a rank can fail alone (GPU choice, the
// unique id, the communicator) is followed by AllRanksOk on every rank, so a failure on one rank
// becomes an error on all of them instead of a hang in the next collective.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/transport/nccl/mpi_bootstrap.h"
#include "lib/transport/nccl/nccl_link.h"
#include "lib/transport/nccl/nccl_status.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/cuda_stream.h"
#include "pipeoffload/transport.h"

namespace pipeoffload {
namespace {

using internal::MpiSession;
using internal::NcclLink;
using internal::Transfer;

class NcclRequest final : public TransferRequest {
 public:
  NcclRequest(std::shared_ptr<NcclLink> link, std::shared_ptr<Transfer> transfer)
      : link_(std::move(link)), transfer_(std::move(transfer)) {}
  ~NcclRequest() override { link_->Abandon(transfer_); }

  absl::StatusOr<bool> Test() override { return link_->Test(*transfer_); }
  absl::Status Wait(double timeout_seconds) override {
    return link_->Wait(*transfer_, timeout_seconds);
  }

 private:
  // The link outlives every request (shared), so a request destroyed after its transport still
  // finds the state it needs to report "destroyed".
  const std::shared_ptr<NcclLink> link_;
  const std::shared_ptr<Transfer> transfer_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(MpiSession session, std::shared_ptr<NcclLink> link)
      : session_(session), link_(std::move(link)) {}

  ~NcclTransport() override {
    link_->Shutdown();
    link_.reset();
    internal::EndMpi(session_);
  }

  std::string Name() const override { return "nccl"; }
  bool AcceptsDeviceMemory() const override { return true; }
  int rank() const override { return session_.rank; }
  int size() const override { return session_.size; }
  int device() const { return link_->device(); }

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

  // A CUDA backend's queue on this transport's GPU: its raw stream is what the link's stream
  // waits on (an event is recorded on the queue's device, so the devices must agree).
  bool CanOrderAfter(const Queue& queue) const override { return OrderStream(queue).ok(); }

  absl::Status OrderAfter(const Queue& queue) override {
    PO_ASSIGN_OR_RETURN(cudaStream_t stream, OrderStream(queue));
    return link_->OrderAfter(stream, absl::StrCat(QueueName(queue), " queue of ",
                                                  queue.owner()->Name()));
  }

  absl::Status Barrier(int peer, double timeout_seconds) override {
    if (peer < 0 || peer >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("nccl transport: rank ", rank(),
                                                     " Barrier with peer ", peer,
                                                     ": peer out of range [0, ", size(), ")"));
    }
    return link_->Exchange({peer}, timeout_seconds, "barrier");
  }

 private:
  absl::StatusOr<std::unique_ptr<TransferRequest>> Post(bool is_recv, int peer,
                                                        const MessageTag& tag, void* data,
                                                        std::int64_t bytes) {
    const std::string where =
        absl::StrCat("nccl transport: rank ", rank(), " ", is_recv ? "Recv" : "Send", " of ",
                     MessageTagToString(tag), " with peer ", peer);
    // Self messages are allowed here (unlike internal::CheckTransfer's transports).
    if (peer < 0 || peer >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": peer out of range [0, ", size(), ")"));
    }
    if (bytes < 0 || (bytes > 0 && data == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", bytes, " bytes needs a buffer and a non-negative size"));
    }
    if (tag.mb < 0 || tag.chunk < 0 || tag.kind == MessageKind::kBarrier) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": mb and chunk must be >= 0 and barrier tags are Barrier's own"));
    }
    PO_ASSIGN_OR_RETURN(std::shared_ptr<Transfer> transfer,
                        link_->Post(is_recv, peer, tag, data, bytes));
    return std::unique_ptr<TransferRequest>(new NcclRequest(link_, std::move(transfer)));
  }

  // The stream of `queue` when the transport can order after it, else InvalidArgument saying
  // why (not a CUDA backend's queue, or one on another GPU).
  // Called before every post (CanOrderAfter), so the message is only built on failure.
  absl::StatusOr<cudaStream_t> OrderStream(const Queue& queue) const {
    auto where = [&] {
      return absl::StrCat("nccl transport: rank ", rank(), " cannot order its transfers after the ",
                          QueueName(queue), " queue");
    };
    if (queue.owner() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": the queue has no backend"));
    }
    absl::StatusOr<int> device = CudaBackendDevice(*queue.owner());
    if (!device.ok()) return Annotate(device.status(), where());
    if (*device != link_->device()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), " of ", queue.owner()->Name(),
                                                     ": it is on cuda:", *device,
                                                     ", the transport on cuda:",
                                                     link_->device()));
    }
    absl::StatusOr<cudaStream_t> stream = CudaQueueStream(queue);
    if (!stream.ok()) return Annotate(stream.status(), where());
    return *stream;
  }

  MpiSession session_;
  std::shared_ptr<NcclLink> link_;
};

absl::Status CheckOptions(const NcclTransportOptions& options) {
  if (options.device < -1 || !(options.init_timeout_seconds > 0) ||
      !(options.enqueue_timeout_seconds > 0) || options.max_pending_messages < 1 ||
      options.max_pending_messages > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl transport: need device >= -1, positive timeouts and max_pending_messages in "
        "[1, 2^20]; got device ", options.device, ", init_timeout_seconds ",
        options.init_timeout_seconds, ", enqueue_timeout_seconds ",
        options.enqueue_timeout_seconds, ", max_pending_messages ",
        options.max_pending_messages));
  }
  return absl::OkStatus();
}

// The rank's GPU: options.device, else its local rank; FailedPrecondition when out of range.
absl::StatusOr<int> ChooseDevice(const MpiSession& session, const NcclTransportOptions& options) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl transport rank ", session.rank, ": no usable CUDA device (cudaGetDeviceCount: ",
        cudaGetErrorName(error), ": ", cudaGetErrorString(error), ")"));
  }
  int device = options.device;
  if (device < 0) {
    PO_ASSIGN_OR_RETURN(device, internal::LocalRank(session));
  }
  if (device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl transport rank ", session.rank, ": wants CUDA device ", device,
        options.device < 0 ? " (its local rank on this node)" : "", " but ", count,
        " are visible; run at most one rank per GPU (NCCL cannot put two ranks of one "
        "communicator on one GPU)"));
  }
  return device;
}

// Rank 0's ncclUniqueId, on every rank. The flag travels with the id, so a failure on rank 0
// reaches the others instead of leaving them waiting in ncclCommInitRankConfig.
absl::StatusOr<ncclUniqueId> ShareUniqueId(const MpiSession& session) {
  struct Packet {
    int ok = 0;
    ncclUniqueId id;
  } packet{};
  absl::Status local;
  if (session.rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&packet.id);
    if (result == ncclSuccess) {
      packet.ok = 1;
    } else {
      local = internal::NcclStatus(result, "nccl transport rank 0", "ncclGetUniqueId");
    }
  }
  PO_RETURN_IF_ERROR(
      internal::Broadcast(session, &packet, static_cast<int>(sizeof(packet)), /*root=*/0));
  if (!local.ok()) return local;
  if (packet.ok != 1) {
    return absl::UnavailableError(absl::StrCat("nccl transport rank ", session.rank,
                                               ": rank 0 could not create the NCCL unique id"));
  }
  return packet.id;
}

absl::StatusOr<std::unique_ptr<Transport>> CreateOnSession(const MpiSession& session,
                                                           const NcclTransportOptions& options) {
  const absl::StatusOr<int> device = ChooseDevice(session, options);
  const absl::Status all_devices = internal::AllRanksOk(session, device.ok(), "choosing GPUs");
  if (!device.ok()) return device.status();
  PO_RETURN_IF_ERROR(all_devices);
  PO_ASSIGN_OR_RETURN(const ncclUniqueId id, ShareUniqueId(session));
  absl::StatusOr<std::shared_ptr<NcclLink>> link =
      NcclLink::Create(id, session.rank, session.size, *device, options);
  const absl::Status all_links =
      internal::AllRanksOk(session, link.ok(), "creating the NCCL communicator");
  if (!link.ok()) return link.status();
  PO_RETURN_IF_ERROR(all_links);
  return std::unique_ptr<Transport>(new NcclTransport(session, std::move(*link)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateNcclTransport(
    const NcclTransportOptions& options) {
  PO_RETURN_IF_ERROR(CheckOptions(options));
  PO_ASSIGN_OR_RETURN(MpiSession session, internal::StartMpi());
  absl::StatusOr<std::unique_ptr<Transport>> transport = CreateOnSession(session, options);
  if (!transport.ok()) internal::EndMpi(session);
  return transport;
}

absl::StatusOr<int> NcclTransportDevice(const Transport& transport) {
  const auto* nccl = dynamic_cast<const NcclTransport*>(&transport);
  if (nccl == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("NcclTransportDevice: the ", transport.Name(),
                                                    " transport is not an NCCL transport"));
  }
  return nccl->device();
}

}  // namespace pipeoffload
