// The engine of the NCCL transport: one non-blocking NCCL communicator, the stream its transfers
// run on, the header slots and completion events of transfers in flight, and the pairing of
// messages a rank sends to itself. nccl_transport.cc wraps it in the Transport interface.
//
// Wire format: every message is a 32-byte WireHeader (tag, size, sender) in one NCCL group,
// then its payload (when bytes > 0) in a second group. The receiver copies the header to pinned
// host memory and records `header_done` between the two groups, so it can name both messages
// when the peer sent something else: NCCL pairs transfers between two ranks by posting order,
// without tags, and a mismatch in size would otherwise just hang. Headers move between host and
// device slots by a one-block kernel (LaunchSmCopy), never by cudaMemcpyAsync: on a copy engine
// they would queue behind the runtime's bulk offload / reload copies, and hold up the in-order
// stream with them.
//
// Transfer states (any other transition is a bug):
//   kUnmatched  a self message waiting for its partner; nothing handed to NCCL yet
//   kPosted     header (+ payload) enqueued; slot and events held
//   kFinished   `done` completed (and, for a receive, its header matched); resources returned
//   kFailed     error set; resources returned once the stream no longer uses them
// Failures are final (Abort): after a timeout on a posted transfer, an NCCL or CUDA error, a
// header mismatch or an abandoned posted transfer, the communicator is aborted, the stream
// drained, and every later call fails with Unavailable naming that first failure.
// Ordering after compute (Transport::OrderAfter): the stream waits on an event recorded on the
// caller's stream (cudaStreamWaitEvent), so everything posted later, headers included, runs
// after that work; the host never waits. An abort still drains the stream: ncclCommAbort stops
// NCCL's kernels, and the waits left end once the caller's stream has run past them (bounded by
// kDrainSeconds like the rest). A failed ordering aborts too: a later transfer would otherwise
// run unordered, on a buffer that compute still writes or reads.
// Every method takes mu_ (the transport is used from one thread, but requests may be destroyed
// on another) and makes the link's device current.
#ifndef PIPEOFFLOAD_LIB_TRANSPORT_NCCL_NCCL_LINK_H_
#define PIPEOFFLOAD_LIB_TRANSPORT_NCCL_NCCL_LINK_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::internal {

inline constexpr std::uint32_t kWireMagic = 0x504F4E43u;  // "PONC"

// What precedes every payload on the wire. Plain old data, copied byte for byte.
struct WireHeader {
  std::uint32_t magic = kWireMagic;
  std::uint32_t kind = 0;   // MessageKind
  std::int32_t mb = 0;
  std::int32_t chunk = 0;
  std::int32_t sender = 0;  // the sending rank
  std::int32_t reserved = 0;
  std::int64_t bytes = 0;   // payload size
};
static_assert(sizeof(WireHeader) == 32, "the wire header is 32 bytes on every rank");

struct Transfer {
  enum class Phase : std::uint8_t { kUnmatched, kPosted, kFinished, kFailed };
  bool is_recv = false;
  int peer = -1;
  MessageTag tag;
  void* data = nullptr;
  std::int64_t bytes = 0;
  std::string what;  // "receive of activation(mb 1, chunk 0) from rank 0 on rank 1"
  Phase phase = Phase::kUnmatched;
  int slot = -1;                       // header slot while posted
  cudaEvent_t header_done = nullptr;   // receives: header copied to its host slot
  cudaEvent_t done = nullptr;          // header and payload transferred
  bool header_checked = false;         // receives: the header matched what was expected
  absl::Status error;
};

class NcclLink {
 public:
  // Creates the communicator (non-blocking, rank `rank` of `size`, on `device`) from `id`, its
  // stream and its slots, then warms up: one header exchange with each ring neighbour (itself
  // when size is 1), all within options.init_timeout_seconds. Collective over all ranks.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<NcclLink>> Create(
      const ncclUniqueId& id, int rank, int size, int device, const NcclTransportOptions& options);
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  // Posts a send or a receive of `bytes` bytes of device memory at `data`. Self messages pair
  // with the oldest unmatched one of the other direction (and only then reach NCCL).
  // Errors: InvalidArgument for a buffer that is not device memory of this device, or a self
  // message whose tag or size differs from its partner's; ResourceExhausted when
  // max_pending_messages are in flight; Unavailable after a failure; NCCL's and CUDA's errors
  // (which abort the communicator).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Transfer>> Post(bool is_recv, int peer,
                                                               const MessageTag& tag, void* data,
                                                               std::int64_t bytes);
  // TransferRequest::Test and Wait (transport.h), with the failure rules above.
  [[nodiscard]] absl::StatusOr<bool> Test(Transfer& transfer);
  [[nodiscard]] absl::Status Wait(Transfer& transfer, double timeout_seconds);
  // The request owning `transfer` is gone: an unmatched self message is withdrawn, a posted
  // one that has not finished aborts the communicator (its buffer may be freed next).
  void Abandon(const std::shared_ptr<Transfer>& transfer);
  // Transfers posted from now on start on the device only after the work enqueued on `after`
  // (a stream of this link's device) so far. `what` names that stream in errors. Errors:
  // Unavailable after a failure; the CUDA call that failed (which aborts the communicator).
  [[nodiscard]] absl::Status OrderAfter(cudaStream_t after, std::string_view what);
  // Header exchange with each of `peers` (both directions, one group), waited for.
  // Errors: DeadlineExceeded after `timeout_seconds` (aborting), the Post / Test errors.
  [[nodiscard]] absl::Status Exchange(const std::vector<int>& peers, double timeout_seconds,
                                      std::string_view what);
  // The transport is being destroyed: finalizes the communicator (aborts it when transfers are
  // still pending or finalizing takes too long). Later calls fail with Unavailable.
  void Shutdown();

 private:
  NcclLink(int rank, int size, int device, const NcclTransportOptions& options);
  absl::Status InitLocked(const ncclUniqueId& id);
  // Hands `group` (sends and receives, any peers) to NCCL: headers, then payloads.
  absl::Status PostGroupLocked(const std::vector<Transfer*>& group);
  absl::Status RunGroupLocked(const std::vector<Transfer*>& group, bool headers);
  // Waits (bounded) until the non-blocking communicator has left ncclInProgress.
  absl::Status SettleLocked(ncclResult_t result, std::string_view call, double timeout_seconds);
  absl::StatusOr<bool> TestLocked(Transfer& transfer);
  absl::Status CheckHeaderLocked(const Transfer& transfer) const;
  void AbortLocked(const absl::Status& why);
  // kPosted/kUnmatched -> kFinished / kFailed; both return the slot and events. FailLocked on
  // a posted transfer only after AbortLocked drained the stream.
  void FinishLocked(Transfer& transfer);
  void FailLocked(Transfer& transfer, const absl::Status& error);
  void ReleaseLocked(Transfer& transfer);
  char* HostSlot(int slot) const;
  char* DeviceSlot(int slot) const;
  char* MappedSlot(int slot) const;  // HostSlot(slot) as the device sees it
  absl::StatusOr<cudaEvent_t> TakeEventLocked();
  absl::Status DeadLocked() const;
  std::string Where() const;

  const int rank_;
  const int size_;
  const int device_;
  const NcclTransportOptions options_;

  std::mutex mu_;
  ncclComm_t comm_ = nullptr;  // null once aborted or finalized
  cudaStream_t stream_ = nullptr;
  char* host_slots_ = nullptr;    // max_pending_messages WireHeaders, pinned and mapped
  char* mapped_slots_ = nullptr;  // host_slots_ as the device sees them
  char* device_slots_ = nullptr;  // the same, on the device
  std::vector<int> free_slots_;
  std::vector<cudaEvent_t> spare_events_;
  // OrderAfter's, re-recorded each time: a stream wait captures the event's state when it is
  // enqueued, so one event serves every ordering.
  cudaEvent_t order_event_ = nullptr;
  std::deque<std::shared_ptr<Transfer>> self_sends_;  // unmatched, oldest first
  std::deque<std::shared_ptr<Transfer>> self_recvs_;
  int posted_ = 0;         // transfers in kPosted
  absl::Status failure_;  // the first failure; OK while the link is healthy
  bool shut_down_ = false;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_TRANSPORT_NCCL_NCCL_LINK_H_
