// The executor's P2P side (stage_executor.h): receive and send buffers, posting, waiting for
// messages, BARRIER, and the P2P plan's waits at guarantee points.
#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/runtime/stage_executor.h"

namespace pipeoffload::internal {
namespace {

// With a P2P plan, blocking waits sleep this long between tests of the awaited transfer and of
// the stage's posted receives (see stage_executor.h).
constexpr double kServeSliceSeconds = 0.00005;

}  // namespace

absl::StatusOr<void*> StageExecutor::AllocateP2P(int index, const Op& op) {
  // A full arena may hold released stash blocks whose D2H copy is still running: the stash
  // waits for the oldest and retries (its wait counts in release_wait_seconds).
  absl::StatusOr<void*> buffer = stash_.AllocateReclaiming(boundary_bytes_, MemoryCategory::kP2P);
  if (!buffer.ok()) return Annotate(buffer.status(), Where(index, op));
  return buffer;
}

absl::StatusOr<void*> StageExecutor::TakeInput(int index, const Op& op, bool activation) {
  const int l = place_.virtual_stage(stage_, op.chunk);
  if (activation ? l == 0 : l == place_.num_virtual_stages() - 1) return nullptr;
  const int producer = activation ? l - 1 : l + 1;
  auto it = receives_.find(RecvKey(!activation, op.mb, op.chunk));
  if (it != receives_.end()) {
    Message& message = it->second;
    // Host-waited, not ordered on the device. An NCCL receive could make the compute queue wait
    // for its completion event instead, but the request would then have to outlive this op
    // (destroying an unfinished NCCL request aborts the communicator) and be tracked to the end
    // of Run, compute would read a message whose header the host has not checked yet, and an
    // unmatched self message is not on the stream at all. Left for later (issue 16).
    if (!message.finished) {
      const double start = Now();
      const Op& recv_op = program_.ops[static_cast<std::size_t>(message.op_index)];
      const absl::Status waited = WaitFor(*message.request, recv_op, op, index);
      stats_.wait_seconds += Now() - start;
      PO_RETURN_IF_ERROR(waited);
      message.finished = true;
      stats_.ops[static_cast<std::size_t>(message.op_index)].end = Now();
    }
    void* buffer = message.buffer;
    receives_.erase(it);
    return buffer;
  }
  if (place_.stage_of(producer) == stage_) {
    // p = 1, or V placement's turn (virtual stages p - 1 and p on stage p - 1): the
    // neighbouring virtual stage is a chunk of this stage; no message is involved.
    std::map<Key, void*>& local = activation ? activations_ : grads_;
    auto produced = local.find(Key(op.mb, place_.chunk_of(producer)));
    if (produced == local.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(index, op), ": its input comes from ", activation ? "F" : "B", op.mb, ".",
          place_.chunk_of(producer), " on this stage, which has not run"));
    }
    void* buffer = produced->second;
    local.erase(produced);
    return buffer;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      Where(index, op), ": no ", activation ? "RECV_F" : "RECV_B", op.mb, ".", op.chunk, "<-",
      place_.stage_of(producer), " was posted before it, so its input never arrives"));
}

absl::Status StageExecutor::Send(int index, const Op& op) {
  const bool activation = op.kind == OpKind::kSendActivation;
  std::map<Key, void*>& outputs = activation ? activations_ : grads_;
  auto it = outputs.find(Key(op.mb, op.chunk));
  if (it == outputs.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(index, op), ": it sends the output of ", activation ? "F" : "B", op.mb, ".",
        op.chunk, ", which has not run on this stage or was already sent"));
  }
  void* buffer = it->second;
  outputs.erase(it);
  const int l = place_.virtual_stage(stage_, op.chunk);
  const MessageTag tag{activation ? MessageKind::kActivation : MessageKind::kGrad, op.mb,
                       place_.chunk_of(activation ? l + 1 : l - 1)};
  // Compute work that wrote the buffer must be done before the transport reads it.
  const absl::Status status = OrderAfterCompute(index, op);
  absl::StatusOr<std::unique_ptr<TransferRequest>> request =
      status.ok() ? transport_.Send(op.peer, tag, buffer, boundary_bytes_)
                  : absl::StatusOr<std::unique_ptr<TransferRequest>>(status);
  if (!request.ok()) {
    arena_.Free(buffer).IgnoreError();
    return status.ok() ? Annotate(request.status(), Where(index, op)) : status;
  }
  stats_.ops[static_cast<std::size_t>(index)].start = Now();
  sends_.push_back(Message{std::move(*request), buffer, index, false});
  return absl::OkStatus();
}

absl::Status StageExecutor::OrderAfterCompute(int index, const Op& op) {
  const Queue compute = backend_.queue(QueueKind::kCompute);
  if (transport_.CanOrderAfter(compute)) {
    // On the device (NCCL: its stream waits on an event of the compute stream); the stage's
    // thread goes on to enqueue more compute meanwhile.
    ++stats_.p2p_device_orders;
    return Annotate(transport_.OrderAfter(compute), Where(index, op));
  }
  ++stats_.p2p_compute_waits;
  // Not counted in wait_seconds: the stage is busy computing meanwhile.
  absl::Status status = backend_.RecordEvent(compute_done_, backend_.queue(QueueKind::kCompute));
  if (status.ok()) {
    status = watchdog_.Check(backend_.WaitEvent(compute_done_, watchdog_.timeout_seconds()), op,
                             op, index);
  }
  return status;
}

absl::Status StageExecutor::Recv(int index, const Op& op) {
  const bool activation = op.kind == OpKind::kRecvActivation;
  const RecvKey key(!activation, op.mb, op.chunk);
  if (receives_.count(key) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(index, op), ": posted again before its data was consumed"));
  }
  if (!backend_.DeviceMemoryIsHostAccessible()) {
    // The block may have been an input that queued compute work still reads (stage_executor.h).
    // Ordering the transport after the compute queue makes that safe without a host wait too:
    // the receive's writes (NCCL: kernels on its own stream) start only once every compute op
    // enqueued so far has finished, and the block allocated below was freed before this call,
    // so every compute op that reads it is among those.
    PO_RETURN_IF_ERROR(OrderAfterCompute(index, op));
  }
  PO_ASSIGN_OR_RETURN(void* buffer, AllocateP2P(index, op));
  const MessageTag tag{activation ? MessageKind::kActivation : MessageKind::kGrad, op.mb,
                       op.chunk};
  absl::StatusOr<std::unique_ptr<TransferRequest>> request =
      transport_.Recv(op.peer, tag, buffer, boundary_bytes_);
  if (!request.ok()) {
    arena_.Free(buffer).IgnoreError();
    return Annotate(request.status(), Where(index, op));
  }
  stats_.ops[static_cast<std::size_t>(index)].start = Now();
  receives_[key] = Message{std::move(*request), buffer, index, false};
  return absl::OkStatus();
}

absl::Status StageExecutor::Barrier(int index, const Op& op) {
  const double start = Now();
  const absl::Status status = transport_.Barrier(op.peer, watchdog_.timeout_seconds());
  const double end = Now();
  stats_.wait_seconds += end - start;
  PO_RETURN_IF_ERROR(watchdog_.Check(status, op, op, index));
  Time(index, start, end);
  return absl::OkStatus();
}

absl::Status StageExecutor::WaitFor(TransferRequest& request, const Op& waited_for,
                                    const Op& current, int index) {
  if (options_.p2p_guarantee_points.empty()) {
    return watchdog_.Check(request.Wait(watchdog_.timeout_seconds()), waited_for, current, index);
  }
  // Test and sleep, never a short Wait: a Wait that times out may be final (the NCCL transport
  // aborts its communicator then, since NCCL cannot cancel a transfer).
  const double deadline = Now() + watchdog_.timeout_seconds();
  while (true) {
    absl::StatusOr<bool> done = request.Test();
    if (!done.ok()) return watchdog_.Check(done.status(), waited_for, current, index);
    if (*done) return absl::OkStatus();
    PollReceives();  // a peer blocked on a send to us may need our receive tested to finish
    if (Now() >= deadline) {
      return watchdog_.Check(
          absl::DeadlineExceededError(absl::StrCat("not finished within ",
                                                   watchdog_.timeout_seconds(), " s")),
          waited_for, current, index);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(kServeSliceSeconds));
  }
}

absl::Status StageExecutor::WaitGuaranteedSends(int index, const Op& op) {
  if (options_.p2p_guarantee_points.empty()) return absl::OkStatus();
  for (auto it = sends_.begin(); it != sends_.end();) {
    const auto send_index = static_cast<std::size_t>(it->op_index);
    if (options_.p2p_guarantee_points[send_index] > index) {
      ++it;
      continue;
    }
    const double start = Now();
    const absl::Status waited = WaitFor(*it->request, program_.ops[send_index], op, index);
    stats_.wait_seconds += Now() - start;
    PO_RETURN_IF_ERROR(waited);
    stats_.ops[send_index].end = Now();
    arena_.Free(it->buffer).IgnoreError();
    it = sends_.erase(it);
  }
  return absl::OkStatus();
}

void StageExecutor::PollReceives() {
  for (auto& [key, message] : receives_) {
    if (message.finished) continue;
    absl::StatusOr<bool> done = message.request->Test();
    if (done.ok() && *done) {
      message.finished = true;
      stats_.ops[static_cast<std::size_t>(message.op_index)].end = Now();
    }
  }
}

void StageExecutor::Poll() {
  // Finished transfers get their end time now rather than when someone waits for them, and
  // finished sends give their buffers back early. Errors surface at the wait.
  PollReceives();
  for (auto it = sends_.begin(); it != sends_.end();) {
    absl::StatusOr<bool> done = it->request->Test();
    if (done.ok() && *done) {
      stats_.ops[static_cast<std::size_t>(it->op_index)].end = Now();
      arena_.Free(it->buffer).IgnoreError();
      it = sends_.erase(it);
    } else {
      ++it;
    }
  }
  // Released stash blocks whose D2H copy has finished go back to the arena (no wait).
  stash_.ReclaimReleased(ReclaimMode::kFinished, 0.0).status().IgnoreError();
}

}  // namespace pipeoffload::internal
