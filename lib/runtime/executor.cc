// The executor: one stage's StageProgram per Run, op by op, in program order.
//
// Invariants:
//  - Ops are issued strictly in program order on the calling thread. The only concurrency is
//    the backend's copy engines and the peers behind the transport, reached through events and
//    requests; every wait on them is bounded by the watchdog.
//  - Buffers: every P2P buffer is an arena block (category kP2P) with exactly one owner at a
//    time: a posted receive (receives_) until the op that consumes it (F or B) takes it and
//    frees it after the model call; an F output / B input-gradient (activations_ / grads_)
//    until its SEND posts it (sends_) or, when p = 1, the next local chunk consumes it; a send
//    until its request finishes. Stash entries belong to the ActivationStash.
//  - Memory accounting follows program order, as the compiler models it: the stash's LOGICAL
//    bytes grow at F and RELOAD and shrink at RELEASE and at B (unsplit) / W (split), so the
//    measured stash high-water (the stash's own counter) equals the predicted peak exactly.
//  - RELEASE does not block the stage's thread: the entry leaves the logical count at once, but
//    its device block stays allocated (PHYSICALLY, arena category kStash) until its D2H copy has
//    finished (activation_stash.cc). Blocks come back to the arena (i) after every op, those
//    whose copy is done (ReclaimReleased(kFinished), never blocking); (ii) when an allocation
//    (stash F / RELOAD, or a P2P buffer here) finds the arena full: the oldest pending copy is
//    host-waited and its block returned, until the request fits or nothing is pending; (iii) at
//    the end of Run, all of them (kAll) before the end-of-iteration checks. A block returned
//    only after its copy completed may go to anyone (compute, an H2D reload, a RECV that a
//    transport writes): nothing reads it any more, and its poison fill (compute queue) lands
//    after the copy. Physical stash bytes >= logical; both fit the arena budget. Host time in
//    those waits is release_wait_seconds (part of wait_seconds).
//    ActivationStashOptions::wait_for_copy_at_release restores the blocking RELEASE.
//  - Events: before a send posts a buffer written by compute, compute_done_ is recorded on the
//    compute queue and host-waited (a no-op on the CPU backend, required on asynchronous ones:
//    a transport may read the buffer from any thread or stream, and the Transport interface
//    has no queue to make wait instead). The stash owns the copy events (activation_stash.cc).
//  - Device memory the host cannot touch (CUDA) is only accepted with a transport that moves
//    it (Transport::AcceptsDeviceMemory); the executor itself never reads stash or P2P bytes
//    then (the stash's poison scan skips such backends).
//  - P2P buffers freed right after a model call may still be read by compute work enqueued on
//    an asynchronous backend, and the next owner of such a block may be a receive, which a
//    transport writes from another stream or thread. So on those backends a RECV first
//    host-waits the compute queue too (cheap: a SEND just before has usually waited already).
//  - P2P plan (ExecutorOptions::p2p_guarantee_points, from AnalyzeP2P): before op j, every
//    posted send whose guarantee point is <= j is waited for and its block freed, so live P2P
//    blocks follow WalkP2P's walk and never exceed its peak. Such a wait cannot deadlock: the
//    peer posted the matching receive before anything that led here. But some transports move
//    a message only while its RECEIVER tests or waits (the local transport with copiers), so
//    with a plan every blocking wait of the executor (a send at its guarantee point, a receive
//    in TakeInput) tests the awaited transfer and all posted receives in turn, sleeping briefly
//    between rounds (never a short Transport Wait: on NCCL a timed-out Wait aborts the
//    communicator): a stage blocked here still lets its peers' sends finish. A BARRIER wait
//    does not (it is one Transport call); AnalyzeP2P puts a send's guarantee point past the
//    receiver's last BARRIER before the message's consumer for that reason.
//  - End of Run: no receive, unsent output, send, stash entry or host slot may remain; after an
//    error Reset frees everything the iteration held, so Run can be called again.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/p2p_lifetimes.h"
#include "lib/runtime/program_check.h"
#include "lib/runtime/watchdog.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload {
namespace {

using internal::Placement;
using Key = std::pair<int, int>;  // (mb, chunk)

// With a P2P plan, blocking waits sleep this long between tests of the awaited transfer and of
// the stage's posted receives (see the top comment).
constexpr double kServeSliceSeconds = 0.00005;

// The stash's options: reclaim waits bounded by the watchdog's timeout, and released blocks
// held back only while the stash stays within its predicted peak (plus the slack asked for).
ActivationStashOptions StashOptions(const ExecutorOptions& options,
                                    std::int64_t predicted_peak_bytes) {
  ActivationStashOptions stash = options.stash;
  stash.reclaim_timeout_seconds = options.wait_timeout_seconds;
  stash.physical_limit_bytes =
      options.stash_physical_slack_bytes < 0
          ? 0
          : std::max<std::int64_t>(1, predicted_peak_bytes + options.stash_physical_slack_bytes);
  return stash;
}

class StageExecutor final : public Executor {
 public:
  StageExecutor(const PipelineSpec& spec, const StageProgram& program, StageModel& model,
                Backend& backend, DeviceArena& arena, Transport& transport,
                const ExecutorOptions& options, std::unique_ptr<HostPool> host_pool,
                Event compute_done, std::int64_t predicted_peak_bytes)
      : spec_(spec),
        program_(program),
        place_{spec.num_stages, spec.chunks_per_stage},
        stage_(program.stage),
        model_(model),
        backend_(backend),
        arena_(arena),
        transport_(transport),
        options_(options),
        watchdog_(program.stage, options.wait_timeout_seconds),
        host_pool_(std::move(host_pool)),
        stash_(backend, arena, *host_pool_, StashOptions(options, predicted_peak_bytes)),
        compute_done_(compute_done) {
    for (int chunk = 0; chunk < spec.chunks_per_stage; ++chunk) {
      saved_bytes_.push_back(model.SavedBytes(chunk, spec.split_backward));
    }
    boundary_bytes_ = model.BoundaryBytes();
  }

  ~StageExecutor() override {
    Reset();
    backend_.DestroyEvent(compute_done_);
  }

  absl::StatusOr<IterationStats> Run() override;
  const HostPool& host_pool() const override { return *host_pool_; }

 private:
  struct Message {
    std::unique_ptr<TransferRequest> request;
    void* buffer = nullptr;  // arena P2P block, freed once the message is done with
    int op_index = -1;
    bool finished = false;
  };
  using RecvKey = std::tuple<bool, int, int>;  // (is_grad, mb, chunk)

  absl::Status RunOp(int index, const Op& op);
  absl::Status Forward(int index, const Op& op);
  absl::Status Backward(int index, const Op& op);
  absl::Status BackwardWeight(int index, const Op& op);
  absl::Status Send(int index, const Op& op);
  absl::Status Recv(int index, const Op& op);
  absl::Status Release(int index, const Op& op);
  absl::Status Barrier(int index, const Op& op);
  // Records compute_done_ on the compute queue and host-waits it (bounded by the watchdog).
  absl::Status WaitForCompute(int index, const Op& op);
  absl::StatusOr<void*> TakeInput(int index, const Op& op, bool activation);
  // The entry B or W reads: a reloading entry is ordered before the compute work (no host
  // wait); FinishReloadAfter, right after the model call, host-waits its copy and returns the
  // host slot, so the host blocks only while the GPU already has the op queued.
  absl::StatusOr<void*> ReadyEntry(int index, const Op& op);
  absl::Status FinishReloadAfter(int index, const Op& op);
  absl::StatusOr<void*> AllocateP2P(int index, const Op& op);
  // With a plan: waits for every posted send whose guarantee point is <= `index` and frees its
  // block (before op `index` runs).
  absl::Status WaitGuaranteedSends(int index, const Op& op);
  // Waits for `request` (watchdog-bounded, errors as watchdog_.Check makes them). With a plan,
  // in slices, testing the posted receives in between; without, one Wait.
  absl::Status WaitFor(TransferRequest& request, const Op& waited_for, const Op& current,
                       int index);
  void PollReceives();
  absl::Status CallModel(int index, const absl::Status& result);
  void Poll();
  absl::Status Finish();
  void Reset();
  void SampleMemory();
  void Time(int index, double start, double end);
  double Now() const { return backend_.NowSeconds(); }
  std::string Where(int index, const Op& op) const { return watchdog_.Where(op, index); }

  const PipelineSpec spec_;
  const StageProgram program_;
  const Placement place_;
  const int stage_;
  StageModel& model_;
  Backend& backend_;
  DeviceArena& arena_;
  Transport& transport_;
  const ExecutorOptions options_;
  const internal::Watchdog watchdog_;
  std::unique_ptr<HostPool> host_pool_;
  ActivationStash stash_;
  const Event compute_done_;
  std::vector<std::int64_t> saved_bytes_;  // per chunk
  std::int64_t boundary_bytes_ = 0;

  // Per-iteration state.
  IterationStats stats_;
  std::map<RecvKey, Message> receives_;
  std::vector<Message> sends_;
  std::map<Key, void*> activations_;  // F outputs not yet sent / consumed
  std::map<Key, void*> grads_;        // B input gradients not yet sent / consumed
  std::map<Key, int> offload_ops_;    // op index of each entry's OFFLOAD, for its timing
  std::map<Key, int> reload_ops_;
};

void StageExecutor::Time(int index, double start, double end) {
  TimedOp& timed = stats_.ops[static_cast<std::size_t>(index)];
  timed.start = start;
  timed.end = end;
}

void StageExecutor::SampleMemory() {
  stats_.memory.push_back(MemorySample{Now(), stash_.device_bytes(), stash_.device_entries()});
  stats_.stash_high_water_entries =
      std::max<std::int64_t>(stats_.stash_high_water_entries, stash_.device_entries());
}

absl::StatusOr<void*> StageExecutor::AllocateP2P(int index, const Op& op) {
  // A full arena may hold released stash blocks whose D2H copy is still running: the stash
  // waits for the oldest and retries (its wait counts in release_wait_seconds).
  absl::StatusOr<void*> buffer = stash_.AllocateReclaiming(boundary_bytes_, MemoryCategory::kP2P);
  if (!buffer.ok()) return Annotate(buffer.status(), Where(index, op));
  return buffer;
}

absl::Status StageExecutor::CallModel(int index, const absl::Status& result) {
  if (result.ok()) return result;
  const Op& op = program_.ops[static_cast<std::size_t>(index)];
  return Annotate(result, absl::StrCat(Where(index, op), ": StageModel"));
}

absl::StatusOr<void*> StageExecutor::TakeInput(int index, const Op& op, bool activation) {
  const int l = place_.virtual_stage(stage_, op.chunk);
  if (activation ? l == 0 : l == place_.num_virtual_stages() - 1) return nullptr;
  const int producer = activation ? l - 1 : l + 1;
  auto it = receives_.find(RecvKey(!activation, op.mb, op.chunk));
  if (it != receives_.end()) {
    Message& message = it->second;
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
    // p = 1: the neighbouring virtual stage is a chunk of this stage; no message is involved.
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

absl::Status StageExecutor::FinishReloadAfter(int index, const Op& op) {
  if (stash_.State(op.mb, op.chunk) != StashState::kReloading) return absl::OkStatus();
  const Key key(op.mb, op.chunk);
  const double start = Now();
  absl::StatusOr<StashTransferTimes> times =
      stash_.FinishReload(op.mb, op.chunk, watchdog_.timeout_seconds());
  stats_.wait_seconds += Now() - start;
  const Op reload{OpKind::kReload, op.mb, op.chunk, -1};
  PO_RETURN_IF_ERROR(watchdog_.Check(times.status(), reload, op, index));
  if (auto it = offload_ops_.find(key); it != offload_ops_.end()) {
    Time(it->second, times->offload_start, times->offload_end);
  }
  if (auto it = reload_ops_.find(key); it != reload_ops_.end()) {
    Time(it->second, times->reload_start, times->reload_end);
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> StageExecutor::ReadyEntry(int index, const Op& op) {
  if (stash_.State(op.mb, op.chunk) == StashState::kReloading) {
    // On the CPU backend this blocks (the compute queue is this thread): count it as a wait.
    const double start = Now();
    const absl::Status ordered = stash_.OrderReload(op.mb, op.chunk);
    stats_.wait_seconds += Now() - start;
    const Op reload{OpKind::kReload, op.mb, op.chunk, -1};
    PO_RETURN_IF_ERROR(watchdog_.Check(ordered, reload, op, index));
  }
  absl::StatusOr<void*> saved = stash_.DeviceData(op.mb, op.chunk);
  if (!saved.ok()) return Annotate(saved.status(), Where(index, op));
  absl::StatusOr<std::int64_t> poison = stash_.FindPoison(op.mb, op.chunk);
  if (!poison.ok()) return Annotate(poison.status(), Where(index, op));
  if (*poison >= 0) {
    return absl::DataLossError(absl::StrCat(
        Where(index, op), ": stash entry (mb ", op.mb, ", chunk ", op.chunk,
        ") holds the poison pattern at byte ", *poison, " of ",
        saved_bytes_[static_cast<std::size_t>(op.chunk)],
        ": it reads memory released before its data was safe (a premature RELEASE or a missing "
        "wait on the D2H copy)"));
  }
  return saved;
}

absl::Status StageExecutor::Forward(int index, const Op& op) {
  const bool last = place_.virtual_stage(stage_, op.chunk) == place_.num_virtual_stages() - 1;
  PO_ASSIGN_OR_RETURN(void* input, TakeInput(index, op, /*activation=*/true));
  void* output = nullptr;
  const absl::Status status = [&]() -> absl::Status {
    if (!last) {
      PO_ASSIGN_OR_RETURN(output, AllocateP2P(index, op));
    }
    absl::StatusOr<void*> saved =
        stash_.Create(op.mb, op.chunk, saved_bytes_[static_cast<std::size_t>(op.chunk)]);
    if (!saved.ok()) return Annotate(saved.status(), Where(index, op));
    SampleMemory();
    const double start = Now();
    const absl::Status computed = model_.Forward(op.mb, op.chunk, input, output, *saved);
    const double end = Now();
    Time(index, start, end);
    stats_.compute_seconds += end - start;
    return CallModel(index, computed);
  }();
  // The input buffer was ours from TakeInput on; the arena cannot refuse its own block.
  if (input != nullptr) arena_.Free(input).IgnoreError();
  if (!status.ok()) {
    if (output != nullptr) arena_.Free(output).IgnoreError();
    return status;
  }
  if (output != nullptr) activations_[Key(op.mb, op.chunk)] = output;
  return absl::OkStatus();
}

absl::Status StageExecutor::Backward(int index, const Op& op) {
  const bool first = place_.virtual_stage(stage_, op.chunk) == 0;
  PO_ASSIGN_OR_RETURN(void* grad_output, TakeInput(index, op, /*activation=*/false));
  void* grad_input = nullptr;
  const absl::Status status = [&]() -> absl::Status {
    PO_ASSIGN_OR_RETURN(void* saved, ReadyEntry(index, op));
    if (!first) {
      PO_ASSIGN_OR_RETURN(grad_input, AllocateP2P(index, op));
    }
    const double start = Now();
    const absl::Status computed =
        model_.Backward(op.mb, op.chunk, grad_output, grad_input, saved,
                        /*with_weight_grad=*/!spec_.split_backward);
    const double end = Now();
    Time(index, start, end);
    stats_.compute_seconds += end - start;
    PO_RETURN_IF_ERROR(CallModel(index, computed));
    PO_RETURN_IF_ERROR(FinishReloadAfter(index, op));
    if (spec_.split_backward) return absl::OkStatus();  // W frees the entry
    PO_RETURN_IF_ERROR(Annotate(stash_.Free(op.mb, op.chunk), Where(index, op)));
    SampleMemory();
    return absl::OkStatus();
  }();
  if (grad_output != nullptr) arena_.Free(grad_output).IgnoreError();
  if (!status.ok()) {
    if (grad_input != nullptr) arena_.Free(grad_input).IgnoreError();
    return status;
  }
  if (grad_input != nullptr) grads_[Key(op.mb, op.chunk)] = grad_input;
  return absl::OkStatus();
}

absl::Status StageExecutor::BackwardWeight(int index, const Op& op) {
  PO_ASSIGN_OR_RETURN(void* saved, ReadyEntry(index, op));
  const double start = Now();
  const absl::Status status = model_.BackwardWeight(op.mb, op.chunk, saved);
  const double end = Now();
  Time(index, start, end);
  stats_.compute_seconds += end - start;
  PO_RETURN_IF_ERROR(CallModel(index, status));
  PO_RETURN_IF_ERROR(FinishReloadAfter(index, op));
  PO_RETURN_IF_ERROR(Annotate(stash_.Free(op.mb, op.chunk), Where(index, op)));
  SampleMemory();
  return absl::OkStatus();
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
  // The transport reads the buffer from the host: compute work that wrote it must be done.
  const absl::Status status = WaitForCompute(index, op);
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

absl::Status StageExecutor::WaitForCompute(int index, const Op& op) {
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
    // The block may have been an input that queued compute work still reads (see top).
    PO_RETURN_IF_ERROR(WaitForCompute(index, op));
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

absl::Status StageExecutor::Release(int index, const Op& op) {
  // Does not block unless wait_for_copy_at_release; any wait is counted by the stash
  // (release_wait_seconds, added to wait_seconds at the end of Run).
  const double start = Now();
  const absl::Status status =
      stash_.FinishOffload(op.mb, op.chunk, watchdog_.timeout_seconds());
  const double end = Now();
  const Op offload{OpKind::kOffload, op.mb, op.chunk, -1};
  PO_RETURN_IF_ERROR(watchdog_.Check(status, offload, op, index));
  Time(index, start, end);
  SampleMemory();
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

absl::Status StageExecutor::RunOp(int index, const Op& op) {
  const Key key(op.mb, op.chunk);
  switch (op.kind) {
    case OpKind::kForward:
      return Forward(index, op);
    case OpKind::kBackward:
      return Backward(index, op);
    case OpKind::kBackwardWeight:
      return BackwardWeight(index, op);
    case OpKind::kSendActivation:
    case OpKind::kSendGrad:
      return Send(index, op);
    case OpKind::kRecvActivation:
    case OpKind::kRecvGrad:
      return Recv(index, op);
    case OpKind::kOffload: {
      const double now = Now();
      PO_RETURN_IF_ERROR(Annotate(stash_.StartOffload(op.mb, op.chunk), Where(index, op)));
      Time(index, now, now);  // replaced by the copy's own times once it has finished
      offload_ops_[key] = index;
      stats_.offloaded_bytes += saved_bytes_[static_cast<std::size_t>(op.chunk)];
      return absl::OkStatus();
    }
    case OpKind::kRelease:
      return Release(index, op);
    case OpKind::kReload: {
      const double now = Now();
      PO_RETURN_IF_ERROR(Annotate(stash_.StartReload(op.mb, op.chunk), Where(index, op)));
      Time(index, now, now);
      reload_ops_[key] = index;
      stats_.reloaded_bytes += saved_bytes_[static_cast<std::size_t>(op.chunk)];
      SampleMemory();
      return absl::OkStatus();
    }
    case OpKind::kBarrier:
      return Barrier(index, op);
  }
  return absl::InternalError(absl::StrCat(Where(index, op), ": unknown op kind"));
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

absl::Status StageExecutor::Finish() {
  while (!sends_.empty()) {
    Message& send = sends_.back();
    const Op& op = program_.ops[static_cast<std::size_t>(send.op_index)];
    const double start = Now();
    const absl::Status waited = send.request->Wait(watchdog_.timeout_seconds());
    stats_.wait_seconds += Now() - start;
    PO_RETURN_IF_ERROR(watchdog_.Check(waited, op, op, send.op_index));
    stats_.ops[static_cast<std::size_t>(send.op_index)].end = Now();
    arena_.Free(send.buffer).IgnoreError();
    sends_.pop_back();
  }
  std::string left;
  for (const auto& [key, message] : receives_) {
    absl::StrAppend(&left, left.empty() ? "" : ", ",
                    OpToString(program_.ops[static_cast<std::size_t>(message.op_index)]),
                    " (received, never consumed)");
  }
  for (const auto& [key, buffer] : activations_) {
    absl::StrAppend(&left, left.empty() ? "" : ", ", "output of F", key.first, ".", key.second,
                    " (never sent)");
  }
  for (const auto& [key, buffer] : grads_) {
    absl::StrAppend(&left, left.empty() ? "" : ", ", "input gradient of B", key.first, ".",
                    key.second, " (never sent)");
  }
  if (!left.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", stage_, ": P2P buffers left at iteration end: ", left));
  }
  // Every released block back before the checks (and before the next iteration reuses them).
  const absl::Status reclaimed =
      stash_.ReclaimReleased(ReclaimMode::kAll, watchdog_.timeout_seconds()).status();
  PO_RETURN_IF_ERROR(Annotate(
      reclaimed, absl::StrCat("stage ", stage_, ": waiting for D2H copies at iteration end")));
  PO_RETURN_IF_ERROR(Annotate(stash_.CheckEmpty(), absl::StrCat("stage ", stage_)));
  if (host_pool_->slots_in_use() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", stage_, ": ", host_pool_->slots_in_use(),
        " host pool slots still in use at iteration end"));
  }
  return absl::OkStatus();
}

void StageExecutor::Reset() {
  // Requests first: destroying an unfinished receive cancels it before its buffer is freed.
  for (auto& [key, message] : receives_) {
    message.request.reset();
    arena_.Free(message.buffer).IgnoreError();
  }
  receives_.clear();
  for (Message& message : sends_) {
    message.request.reset();
    arena_.Free(message.buffer).IgnoreError();
  }
  sends_.clear();
  for (auto* outputs : {&activations_, &grads_}) {
    for (const auto& [key, buffer] : *outputs) arena_.Free(buffer).IgnoreError();
    outputs->clear();
  }
  stash_.Clear(watchdog_.timeout_seconds());
  offload_ops_.clear();
  reload_ops_.clear();
}

absl::StatusOr<IterationStats> StageExecutor::Run() {
  stats_ = IterationStats{};
  stats_.stage = stage_;
  stats_.ops.resize(program_.ops.size());
  for (std::size_t i = 0; i < program_.ops.size(); ++i) {
    const Op& op = program_.ops[i];
    TimedOp& timed = stats_.ops[i];
    timed.stage = stage_;
    timed.index = static_cast<int>(i);
    timed.op = op;
    timed.engine = EngineOf(op.kind);
    if (IsP2P(op.kind)) timed.bytes = boundary_bytes_;
    if (op.kind == OpKind::kOffload || op.kind == OpKind::kReload) {
      timed.bytes = saved_bytes_[static_cast<std::size_t>(op.chunk)];
    }
  }
  arena_.ResetHighWater();
  stash_.ResetHighWater();
  host_pool_->ResetHighWater();
  const double release_wait_before = stash_.release_wait_seconds();
  stats_.start_time = Now();
  SampleMemory();
  for (std::size_t i = 0; i < program_.ops.size(); ++i) {
    absl::Status status = WaitGuaranteedSends(static_cast<int>(i), program_.ops[i]);
    if (status.ok()) status = RunOp(static_cast<int>(i), program_.ops[i]);
    if (!status.ok()) {
      Reset();
      return status;
    }
    Poll();
  }
  if (absl::Status status = Finish(); !status.ok()) {
    Reset();
    return status;
  }
  stats_.end_time = Now();
  stats_.release_wait_seconds = stash_.release_wait_seconds() - release_wait_before;
  stats_.wait_seconds += stats_.release_wait_seconds;
  stats_.stash_high_water_bytes = stash_.device_high_water_bytes();
  stats_.stash_physical_high_water_bytes = arena_.Usage(MemoryCategory::kStash).high_water_bytes;
  stats_.p2p_high_water_bytes = arena_.Usage(MemoryCategory::kP2P).high_water_bytes;
  stats_.other_high_water_bytes = arena_.Usage(MemoryCategory::kOther).high_water_bytes;
  stats_.host_high_water_bytes = host_pool_->high_water_bytes();
  return std::move(stats_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(
    const PipelineSpec& spec, const StageProgram& program, StageModel& model, Backend& backend,
    DeviceArena& arena, Transport& transport, const ExecutorOptions& options) {
  if (spec.num_stages != transport.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "executor: the schedule has ", spec.num_stages, " stages but the ", transport.Name(),
        " transport connects ", transport.size(), " ranks; run one rank per stage"));
  }
  if (program.stage != transport.rank()) {
    return absl::FailedPreconditionError(absl::StrCat("executor: the program of stage ",
                                                      program.stage, " was given to rank ",
                                                      transport.rank()));
  }
  if (!(options.wait_timeout_seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor: wait_timeout_seconds must be positive, got ", options.wait_timeout_seconds));
  }
  if (!backend.DeviceMemoryIsHostAccessible() && !transport.AcceptsDeviceMemory()) {
    return absl::UnimplementedError(absl::StrCat(
        "executor: the ", backend.Name(),
        " backend's device memory is not host-accessible and the ", transport.Name(),
        " transport cannot move device memory (staging P2P buffers through host memory is not "
        "implemented yet); use a transport that accepts device memory (NCCL, or the local "
        "transport with receive copiers)"));
  }
  PO_ASSIGN_OR_RETURN(const internal::ProgramNeeds needs,
                      internal::CheckStageProgram(spec, program, model, arena.alignment()));
  const std::int64_t usable = arena.budget_bytes() / arena.alignment() * arena.alignment();
  const std::int64_t free_bytes = usable - arena.reserved_bytes();
  if (needs.stash_peak_aligned_bytes > free_bytes) {
    const Op& peak_op = program.ops[static_cast<std::size_t>(needs.stash_peak_op)];
    return absl::ResourceExhaustedError(absl::StrCat(
        "executor: stage ", program.stage, ": the program's activation stash peaks at ",
        needs.stash_peak_bytes, " bytes (", needs.stash_peak_aligned_bytes, " with the arena's ",
        arena.alignment(), "-byte alignment) at op ", needs.stash_peak_op, " (",
        OpToString(peak_op), "), but the device arena has ", free_bytes, " bytes free (budget ",
        arena.budget_bytes(), ", ", arena.reserved_bytes(),
        " held by other users); raise the budget or offload more"));
  }
  if (!options.p2p_guarantee_points.empty()) {
    // The plan's P2P peak on top of the stash peak, both aligned as the arena aligns them.
    absl::StatusOr<P2PLifetimes> p2p =
        WalkP2P(spec, program, options.p2p_guarantee_points);
    if (!p2p.ok()) return Annotate(p2p.status(), "executor");
    const std::int64_t p2p_bytes = P2PBoundBytes(*p2p, model.BoundaryBytes(), arena.alignment());
    if (needs.stash_peak_aligned_bytes + p2p_bytes > free_bytes) {
      // peak_op >= 0 here: with no P2P block the stash check above already decided.
      const Op& peak_op = program.ops[static_cast<std::size_t>(std::max(p2p->peak_op, 0))];
      return absl::ResourceExhaustedError(absl::StrCat(
          "executor: stage ", program.stage, ": the program's activation stash peak (",
          needs.stash_peak_aligned_bytes, " bytes aligned) plus its P2P plan's peak of ",
          p2p->peak_blocks, " boundary blocks (", p2p_bytes, " bytes aligned, at op ",
          p2p->peak_op, " ", OpToString(peak_op), ") need ",
          needs.stash_peak_aligned_bytes + p2p_bytes, " bytes, but the device arena has ",
          free_bytes, " bytes free (budget ", arena.budget_bytes(), ", ", arena.reserved_bytes(),
          " held by other users)"));
    }
  }
  PO_ASSIGN_OR_RETURN(std::unique_ptr<HostPool> host_pool,
                      HostPool::Create(backend, needs.host_slots));
  PO_ASSIGN_OR_RETURN(const Event compute_done, backend.CreateEvent());
  return std::unique_ptr<Executor>(new StageExecutor(spec, program, model, backend, arena,
                                                     transport, options, std::move(host_pool),
                                                     compute_done, needs.stash_peak_bytes));
}

}  // namespace pipeoffload
