// NcclLink: the NCCL communicator, stream, header slots and transfer states behind the NCCL
// transport (nccl_link.h has the wire format, the states and the failure rules).
#include "lib/transport/nccl/nccl_link.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/backend/cuda/sm_copy_kernel.h"
#include "lib/base/status_macros.h"
#include "lib/transport/nccl/nccl_status.h"

namespace pipeoffload::internal {
namespace {

constexpr std::int64_t kHeaderBytes = sizeof(WireHeader);
// Bounds on teardown: draining the stream after an abort, and finalizing a healthy
// communicator (which waits for its peers' matching transfers).
constexpr double kDrainSeconds = 10.0;
constexpr double kFinalizeSeconds = 10.0;

std::string DescribeHeader(const WireHeader& header) {
  if (header.kind >= static_cast<std::uint32_t>(kNumMessageKinds)) {
    return absl::StrCat("a message of unknown kind ", header.kind);
  }
  const MessageTag tag{static_cast<MessageKind>(header.kind), header.mb, header.chunk};
  return absl::StrCat(MessageTagToString(tag), " of ", header.bytes, " bytes");
}

void LogTeardown(const std::string& where, const absl::Status& status) {
  std::fprintf(stderr, "pipeoffload: %s teardown: %s\n", where.c_str(),
               std::string(status.message()).c_str());
}

}  // namespace

NcclLink::NcclLink(int rank, int size, int device, const NcclTransportOptions& options)
    : rank_(rank), size_(size), device_(device), options_(options) {}

std::string NcclLink::Where() const {
  return absl::StrCat("nccl transport rank ", rank_, " (cuda:", device_, ")");
}

char* NcclLink::HostSlot(int slot) const { return host_slots_ + slot * kHeaderBytes; }
char* NcclLink::DeviceSlot(int slot) const { return device_slots_ + slot * kHeaderBytes; }
char* NcclLink::MappedSlot(int slot) const { return mapped_slots_ + slot * kHeaderBytes; }

absl::StatusOr<std::shared_ptr<NcclLink>> NcclLink::Create(const ncclUniqueId& id, int rank,
                                                           int size, int device,
                                                           const NcclTransportOptions& options) {
  std::shared_ptr<NcclLink> link(new NcclLink(rank, size, device, options));
  {
    std::lock_guard<std::mutex> lock(link->mu_);
    PO_RETURN_IF_ERROR(link->InitLocked(id));
  }
  // Ring neighbours: the pipeline's P2P partners, including the wrap-around of interleaved
  // schedules. One group for all of them, so no rank waits on a neighbour that waits on another.
  std::vector<int> neighbours = {(rank + 1) % size, (rank + size - 1) % size};
  std::sort(neighbours.begin(), neighbours.end());
  neighbours.erase(std::unique(neighbours.begin(), neighbours.end()), neighbours.end());
  PO_RETURN_IF_ERROR(link->Exchange(neighbours, options.init_timeout_seconds, "warm-up"));
  return link;
}

absl::Status NcclLink::InitLocked(const ncclUniqueId& id) {
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
  const auto slot_bytes = static_cast<std::size_t>(options_.max_pending_messages) *
                          static_cast<std::size_t>(kHeaderBytes);
  // Mapped: the header kernels read and write the host slots directly (see the header).
  PO_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_slots_), slot_bytes,
                                        cudaHostAllocMapped | cudaHostAllocPortable));
  PO_CUDA_RETURN_IF_ERROR(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped_slots_), host_slots_, 0));
  PO_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&device_slots_), slot_bytes));
  for (int slot = options_.max_pending_messages - 1; slot >= 0; --slot) {
    free_slots_.push_back(slot);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: NCCL never blocks this thread waiting for peers, so every wait can time out.
  config.blocking = 0;
  const ncclResult_t result = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  return SettleLocked(result, "ncclCommInitRankConfig", options_.init_timeout_seconds);
}

absl::Status NcclLink::SettleLocked(ncclResult_t result, std::string_view call,
                                    double timeout_seconds) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) {
    absl::Status status = NcclStatus(result, Where(), call);
    AbortLocked(status);
    return status;
  }
  // ncclInProgress counts as success here only because the communicator is non-blocking: NCCL
  // finishes the call on its own thread, and until the communicator's state leaves
  // ncclInProgress nothing may call NCCL on it or enqueue work on its stream.
  ncclResult_t state = ncclInProgress;
  const absl::StatusOr<bool> settled = PollUntil(
      [&]() -> absl::StatusOr<bool> {
        const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
        if (queried != ncclSuccess) return NcclStatus(queried, Where(), "ncclCommGetAsyncError");
        return state != ncclInProgress;
      },
      timeout_seconds);
  absl::Status status;
  if (!settled.ok()) {
    status = settled.status();
  } else if (!*settled) {
    status = absl::DeadlineExceededError(absl::StrFormat(
        "%s: %s still in progress after %.1f s (do all ranks take part, and has every peer "
        "posted its side?)",
        Where(), std::string(call), timeout_seconds));
  } else if (state != ncclSuccess) {
    status = NcclStatus(state, Where(), call);
  }
  if (!status.ok()) AbortLocked(status);
  return status;
}

absl::Status NcclLink::DeadLocked() const {
  if (!failure_.ok()) {
    return absl::UnavailableError(absl::StrCat(
        Where(), ": the NCCL communicator was aborted after an earlier failure: ",
        std::string(failure_.message())));
  }
  return absl::UnavailableError(absl::StrCat(Where(), ": the transport was destroyed"));
}

void NcclLink::AbortLocked(const absl::Status& why) {
  if (failure_.ok()) failure_ = why;
  ScopedDevice guard;
  guard.Enter(device_).IgnoreError();
  if (comm_ != nullptr) {
    // Blocking even on a non-blocking communicator: it stops our kernels and frees the
    // communicator before it returns.
    const ncclResult_t result = ncclCommAbort(comm_);
    if (result != ncclSuccess) LogTeardown(Where(), NcclStatus(result, Where(), "ncclCommAbort"));
    comm_ = nullptr;
  }
  if (stream_ == nullptr) return;
  const absl::StatusOr<bool> drained = PollUntil(
      [&]() -> absl::StatusOr<bool> {
        const cudaError_t query = cudaStreamQuery(stream_);
        if (query == cudaErrorNotReady) return false;
        // Any other error means the stream's work is over too (it failed).
        static_cast<void>(cudaGetLastError());
        return true;
      },
      kDrainSeconds);
  if (!drained.ok() || !*drained) {
    LogTeardown(Where(), absl::DeadlineExceededError(
                             "the P2P stream did not drain after ncclCommAbort; its buffers may "
                             "still be in use"));
  }
}

absl::StatusOr<cudaEvent_t> NcclLink::TakeEventLocked() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  PO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void NcclLink::ReleaseLocked(Transfer& transfer) {
  if (transfer.slot >= 0) free_slots_.push_back(transfer.slot);
  transfer.slot = -1;
  for (cudaEvent_t* event : {&transfer.header_done, &transfer.done}) {
    if (*event != nullptr) spare_events_.push_back(*event);
    *event = nullptr;
  }
}

void NcclLink::FinishLocked(Transfer& transfer) {
  if (transfer.phase == Transfer::Phase::kPosted) --posted_;
  transfer.phase = Transfer::Phase::kFinished;
  ReleaseLocked(transfer);
}

void NcclLink::FailLocked(Transfer& transfer, const absl::Status& error) {
  if (transfer.phase == Transfer::Phase::kPosted) --posted_;
  transfer.phase = Transfer::Phase::kFailed;
  transfer.error = error;
  ReleaseLocked(transfer);
}

absl::StatusOr<std::shared_ptr<Transfer>> NcclLink::Post(bool is_recv, int peer,
                                                         const MessageTag& tag, void* data,
                                                         std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok() || shut_down_) return DeadLocked();
  auto transfer = std::make_shared<Transfer>();
  transfer->is_recv = is_recv;
  transfer->peer = peer;
  transfer->tag = tag;
  transfer->data = data;
  transfer->bytes = bytes;
  transfer->what = absl::StrCat(is_recv ? "receive of " : "send of ", MessageTagToString(tag),
                                is_recv ? " from rank " : " to rank ", peer, " on rank ", rank_);
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  if (bytes > 0) {
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, data);
    static_cast<void>(cudaGetLastError());
    const bool on_device = error == cudaSuccess &&
                           (attributes.type == cudaMemoryTypeDevice ||
                            attributes.type == cudaMemoryTypeManaged) &&
                           attributes.device == device_;
    if (!on_device) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), ": the buffer of the ", transfer->what,
          " is not device memory of cuda:", device_, " (NCCL moves device memory only)"));
    }
  }
  if (peer != rank_) {
    PO_RETURN_IF_ERROR(PostGroupLocked({transfer.get()}));
    return transfer;
  }
  // A message to itself pairs with the oldest unmatched one of the other direction: NCCL needs
  // both halves of a self transfer in one group.
  std::deque<std::shared_ptr<Transfer>>& partners = is_recv ? self_sends_ : self_recvs_;
  if (partners.empty()) {
    (is_recv ? self_recvs_ : self_sends_).push_back(transfer);
    return transfer;
  }
  const std::shared_ptr<Transfer> partner = partners.front();
  if (!(partner->tag == tag) || partner->bytes != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), ": the ", transfer->what, " of ", bytes, " bytes does not match the oldest "
        "unmatched ", partner->what, " of ", partner->bytes,
        " bytes (messages to itself pair in posting order)"));
  }
  partners.pop_front();
  Transfer* send = is_recv ? partner.get() : transfer.get();
  Transfer* recv = is_recv ? transfer.get() : partner.get();
  PO_RETURN_IF_ERROR(PostGroupLocked({send, recv}));
  return transfer;
}

absl::Status NcclLink::PostGroupLocked(const std::vector<Transfer*>& group) {
  // Slots and events first: running out of them enqueues nothing, so it needs no abort.
  for (Transfer* transfer : group) {
    absl::Status status;
    if (free_slots_.empty()) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          Where(), ": ", options_.max_pending_messages, " messages are already in flight ",
          "(NcclTransportOptions::max_pending_messages); cannot post the ", transfer->what));
    } else {
      transfer->slot = free_slots_.back();
      free_slots_.pop_back();
      absl::StatusOr<cudaEvent_t> done = TakeEventLocked();
      status = done.status();
      if (done.ok()) transfer->done = *done;
      if (status.ok() && transfer->is_recv) {
        absl::StatusOr<cudaEvent_t> header_done = TakeEventLocked();
        status = header_done.status();
        if (header_done.ok()) transfer->header_done = *header_done;
      }
    }
    if (!status.ok()) {
      for (Transfer* member : group) FailLocked(*member, status);
      return status;
    }
    if (!transfer->is_recv) {
      WireHeader header;
      header.kind = static_cast<std::uint32_t>(transfer->tag.kind);
      header.mb = transfer->tag.mb;
      header.chunk = transfer->tag.chunk;
      header.sender = rank_;
      header.bytes = transfer->bytes;
      std::memcpy(HostSlot(transfer->slot), &header, sizeof(header));
    }
  }
  absl::Status status = [&]() -> absl::Status {
    for (Transfer* transfer : group) {
      if (transfer->is_recv) continue;
      PO_CUDA_RETURN_IF_ERROR(LaunchSmCopy(DeviceSlot(transfer->slot),
                                           MappedSlot(transfer->slot), kHeaderBytes, stream_));
    }
    PO_RETURN_IF_ERROR(RunGroupLocked(group, /*headers=*/true));
    for (Transfer* transfer : group) {
      if (!transfer->is_recv) continue;
      PO_CUDA_RETURN_IF_ERROR(LaunchSmCopy(MappedSlot(transfer->slot),
                                           DeviceSlot(transfer->slot), kHeaderBytes, stream_));
      PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(transfer->header_done, stream_));
    }
    const bool payload = std::any_of(group.begin(), group.end(),
                                     [](const Transfer* t) { return t->bytes > 0; });
    if (payload) PO_RETURN_IF_ERROR(RunGroupLocked(group, /*headers=*/false));
    for (Transfer* transfer : group) {
      PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(transfer->done, stream_));
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    // Part of the group may be on the stream, out of step with the peer: only an abort ends it.
    AbortLocked(status);
    for (Transfer* transfer : group) FailLocked(*transfer, status);
    return status;
  }
  for (Transfer* transfer : group) {
    transfer->phase = Transfer::Phase::kPosted;
    ++posted_;
  }
  return absl::OkStatus();
}

absl::Status NcclLink::RunGroupLocked(const std::vector<Transfer*>& group, bool headers) {
  const ncclResult_t started = ncclGroupStart();
  if (started != ncclSuccess) return NcclStatus(started, Where(), "ncclGroupStart");
  ncclResult_t first = ncclSuccess;
  const char* first_call = "";
  for (Transfer* transfer : group) {
    if (!headers && transfer->bytes == 0) continue;
    void* buffer = headers ? DeviceSlot(transfer->slot) : transfer->data;
    const auto count = static_cast<std::size_t>(headers ? kHeaderBytes : transfer->bytes);
    const ncclResult_t result =
        transfer->is_recv ? ncclRecv(buffer, count, ncclUint8, transfer->peer, comm_, stream_)
                          : ncclSend(buffer, count, ncclUint8, transfer->peer, comm_, stream_);
    // Inside a group on a non-blocking communicator an operation may report ncclInProgress;
    // the group as a whole is settled below.
    if (result != ncclSuccess && result != ncclInProgress && first == ncclSuccess) {
      first = result;
      first_call = transfer->is_recv ? "ncclRecv" : "ncclSend";
    }
  }
  const ncclResult_t ended = ncclGroupEnd();  // always closes the group, also after an error
  if (first != ncclSuccess) return NcclStatus(first, Where(), first_call);
  return SettleLocked(ended, headers ? "ncclGroupEnd (headers)" : "ncclGroupEnd (payloads)",
                      options_.enqueue_timeout_seconds);
}

absl::Status NcclLink::CheckHeaderLocked(const Transfer& transfer) const {
  WireHeader got;
  std::memcpy(&got, HostSlot(transfer.slot), sizeof(got));
  if (got.magic != kWireMagic) {
    return absl::InternalError(absl::StrFormat(
        "%s: the %s received a corrupt header (magic 0x%08x, expected 0x%08x)", Where(),
        transfer.what, got.magic, kWireMagic));
  }
  const bool matches = got.kind == static_cast<std::uint32_t>(transfer.tag.kind) &&
                       got.mb == transfer.tag.mb && got.chunk == transfer.tag.chunk &&
                       got.sender == transfer.peer && got.bytes == transfer.bytes;
  if (matches) return absl::OkStatus();
  WireHeader expected;
  expected.kind = static_cast<std::uint32_t>(transfer.tag.kind);
  expected.mb = transfer.tag.mb;
  expected.chunk = transfer.tag.chunk;
  expected.bytes = transfer.bytes;
  return absl::InvalidArgumentError(absl::StrCat(
      Where(), ": the ", transfer.what, " expected ", DescribeHeader(expected), " but rank ",
      got.sender, " sent ", DescribeHeader(got),
      ": the two ranks post their messages to each other in different orders or sizes (NCCL "
      "pairs messages by posting order, not by tag)"));
}

absl::StatusOr<bool> NcclLink::TestLocked(Transfer& transfer) {
  switch (transfer.phase) {
    case Transfer::Phase::kFinished:
      return true;
    case Transfer::Phase::kFailed:
      return transfer.error;
    case Transfer::Phase::kUnmatched:
      if (!failure_.ok() || shut_down_) {
        FailLocked(transfer, DeadLocked());
        return transfer.error;
      }
      return false;
    case Transfer::Phase::kPosted:
      break;
  }
  if (!failure_.ok() || shut_down_) {
    FailLocked(transfer, DeadLocked());
    return transfer.error;
  }
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  // Asynchronous failures (a peer died, a network error) surface through the communicator.
  ncclResult_t state = ncclSuccess;
  const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
  absl::Status status;
  if (queried != ncclSuccess) {
    status = NcclStatus(queried, Where(), "ncclCommGetAsyncError");
  } else if (state != ncclSuccess && state != ncclInProgress) {
    status = NcclStatus(state, Where(), absl::StrCat("the ", transfer.what));
  }
  if (status.ok() && transfer.is_recv && !transfer.header_checked) {
    const cudaError_t query = cudaEventQuery(transfer.header_done);
    if (query == cudaErrorNotReady) return false;
    if (query != cudaSuccess) {
      status = CudaStatus(query, "cudaEventQuery(header)", __FILE__, __LINE__);
    } else {
      status = CheckHeaderLocked(transfer);
      transfer.header_checked = status.ok();
    }
  }
  if (status.ok()) {
    const cudaError_t query = cudaEventQuery(transfer.done);
    if (query == cudaErrorNotReady) return false;
    if (query == cudaSuccess) {
      FinishLocked(transfer);
      return true;
    }
    status = CudaStatus(query, "cudaEventQuery(transfer)", __FILE__, __LINE__);
  }
  AbortLocked(status);
  FailLocked(transfer, status);
  return status;
}

absl::StatusOr<bool> NcclLink::Test(Transfer& transfer) {
  std::lock_guard<std::mutex> lock(mu_);
  return TestLocked(transfer);
}

absl::Status NcclLink::Wait(Transfer& transfer, double timeout_seconds) {
  PO_ASSIGN_OR_RETURN(const bool done,
                      PollUntil([&]() { return Test(transfer); }, timeout_seconds));
  if (done) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  switch (transfer.phase) {
    case Transfer::Phase::kFinished:
      return absl::OkStatus();
    case Transfer::Phase::kFailed:
      return transfer.error;
    case Transfer::Phase::kUnmatched:
      // Nothing reached NCCL, so nothing needs cancelling: the request stays posted.
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: %s not finished within %.3f s: no matching %s to itself was posted", Where(),
          transfer.what, timeout_seconds, transfer.is_recv ? "Send" : "Recv"));
    case Transfer::Phase::kPosted:
      break;
  }
  absl::Status status = absl::DeadlineExceededError(absl::StrFormat(
      "%s: %s of %d bytes not finished within %.3f s (the peer did not post its side, or is "
      "stuck); the NCCL communicator was aborted, since NCCL cannot cancel a transfer, and this "
      "transport is unusable from now on",
      Where(), transfer.what, transfer.bytes, timeout_seconds));
  AbortLocked(status);
  FailLocked(transfer, status);
  return status;
}

void NcclLink::Abandon(const std::shared_ptr<Transfer>& transfer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (transfer->phase == Transfer::Phase::kUnmatched) {
    for (auto* queue : {&self_sends_, &self_recvs_}) {
      queue->erase(std::remove(queue->begin(), queue->end(), transfer), queue->end());
    }
    FailLocked(*transfer, absl::CancelledError("abandoned"));
    return;
  }
  if (transfer->phase != Transfer::Phase::kPosted) return;
  absl::StatusOr<bool> done = TestLocked(*transfer);
  if (!done.ok() || *done) return;  // failed (resources returned) or finished
  const absl::Status status = absl::UnavailableError(absl::StrCat(
      Where(), ": the ", transfer->what, " was abandoned before it finished; the communicator "
      "was aborted so that NCCL cannot touch its buffer once the owner frees it"));
  AbortLocked(status);
  FailLocked(*transfer, status);
}

absl::Status NcclLink::OrderAfter(cudaStream_t after, std::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok() || shut_down_) return DeadLocked();
  ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  absl::Status status = [&]() -> absl::Status {
    PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(order_event_, after));
    PO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, order_event_, 0));
    return absl::OkStatus();
  }();
  if (status.ok()) return status;
  status = Annotate(status, absl::StrCat(Where(), ": ordering the P2P stream after the ",
                                         std::string(what)));
  AbortLocked(status);
  return status;
}

absl::Status NcclLink::Exchange(const std::vector<int>& peers, double timeout_seconds,
                                std::string_view what) {
  std::vector<std::shared_ptr<Transfer>> transfers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok() || shut_down_) return DeadLocked();
    ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    std::vector<Transfer*> group;
    for (int peer : peers) {
      for (bool is_recv : {false, true}) {
        auto transfer = std::make_shared<Transfer>();
        transfer->is_recv = is_recv;
        transfer->peer = peer;
        transfer->tag = MessageTag{MessageKind::kBarrier, 0, 0};
        transfer->what = absl::StrCat(std::string(what), " ", is_recv ? "receive from" : "send to",
                                      " rank ", peer, " on rank ", rank_);
        group.push_back(transfer.get());
        transfers.push_back(std::move(transfer));
      }
    }
    PO_RETURN_IF_ERROR(PostGroupLocked(group));
  }
  const auto deadline = DeadlineAfter(timeout_seconds);
  absl::Status status;
  for (const std::shared_ptr<Transfer>& transfer : transfers) {
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    status = Wait(*transfer, std::max(left, 0.0));
    if (!status.ok()) break;
  }
  // After a failure the rest still hold slots and events; the link is aborted by then, so
  // abandoning them only returns those.
  for (const std::shared_ptr<Transfer>& transfer : transfers) Abandon(transfer);
  return status;
}

void NcclLink::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  ScopedDevice guard;
  guard.Enter(device_).IgnoreError();
  if (comm_ != nullptr && posted_ > 0) {
    AbortLocked(absl::UnavailableError(absl::StrCat(
        Where(), ": the transport was destroyed with ", posted_, " transfers in flight")));
  }
  if (comm_ != nullptr) {
    // Finalize flushes the communicator's work and waits for its peers; bounded, then abort.
    const ncclResult_t result = ncclCommFinalize(comm_);
    if (SettleLocked(result, "ncclCommFinalize", kFinalizeSeconds).ok() && comm_ != nullptr) {
      const ncclResult_t destroyed = ncclCommDestroy(comm_);
      if (destroyed != ncclSuccess) {
        LogTeardown(Where(), NcclStatus(destroyed, Where(), "ncclCommDestroy"));
      }
      comm_ = nullptr;
    }
  }
  shut_down_ = true;
}

NcclLink::~NcclLink() {
  Shutdown();
  std::lock_guard<std::mutex> lock(mu_);
  ScopedDevice guard;
  guard.Enter(device_).IgnoreError();
  if (comm_ != nullptr) AbortLocked(absl::UnavailableError("destroyed"));
  for (cudaEvent_t event : spare_events_) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(event));
  if (order_event_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(order_event_));
  if (stream_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaStreamDestroy(stream_));
  if (host_slots_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaFreeHost(host_slots_));
  if (device_slots_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaFree(device_slots_));
}

}  // namespace pipeoffload::internal
