// The executor's program order, compute ops, stash and iteration (stage_executor.h), and
// Executor::Create.
#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/runtime/program_check.h"
#include "lib/runtime/stage_executor.h"
#include "pipeoffload/p2p_lifetimes.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload {
namespace internal {

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

absl::Status StageExecutor::CallModel(int index, const absl::Status& result) {
  if (result.ok()) return result;
  const Op& op = program_.ops[static_cast<std::size_t>(index)];
  return Annotate(result, absl::StrCat(Where(index, op), ": StageModel"));
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
        IsRecompute(op.kind) ? EntryBytes(op) : saved_bytes_[static_cast<std::size_t>(op.chunk)],
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
    // A recomputed entry keeps only its retained block until its RECOMPUTE*.
    const Recompute mode = recompute_.ModeOf(op.mb, op.chunk);
    absl::StatusOr<void*> saved = stash_.Create(op.mb, op.chunk, EntryBytes(op));
    if (!saved.ok()) return Annotate(saved.status(), Where(index, op));
    SampleMemory();
    const double start = Now();
    const absl::Status computed =
        mode == Recompute::kNone
            ? model_.Forward(op.mb, op.chunk, input, output, *saved)
            : model_.ForwardRetaining(op.mb, op.chunk, input, output, *saved, mode);
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

absl::Status StageExecutor::RecomputeEntry(int index, const Op& op) {
  // The retained block is read like B reads an entry: the poison scan catches a block freed
  // under it since F. When it was offloaded, its RELOAD is ordered before the recompute here
  // and finished (host slot back) once the recompute is enqueued, as B does.
  PO_RETURN_IF_ERROR(ReadyEntry(index, op).status());
  const Recompute mode = RecomputeOf(op.kind);
  // When the model's B reads the retained block itself, nothing is allocated, counted or run
  // (the compiler's lean_rebuild_bytes = 0).
  const bool in_place = recompute_.InPlace(op.chunk, mode);
  absl::StatusOr<ActivationStash::Regrown> blocks = stash_.Regrow(
      op.mb, op.chunk, saved_bytes_[static_cast<std::size_t>(op.chunk)], in_place);
  if (!blocks.ok()) return Annotate(blocks.status(), Where(index, op));
  if (!in_place) SampleMemory();
  const double start = Now();
  const absl::Status status =
      in_place ? absl::OkStatus()
               : model_.RecomputeSaved(op.mb, op.chunk, blocks->retained, blocks->full, mode);
  const double end = Now();
  Time(index, start, end);
  stats_.compute_seconds += end - start;
  stats_.recompute_seconds += end - start;
  PO_RETURN_IF_ERROR(CallModel(index, status));
  PO_RETURN_IF_ERROR(FinishReloadAfter(index, op));
  // Freed after the call was enqueued: the arena's poison fill is ordered after it on the
  // compute queue, so the model's work still reads the retained bytes.
  PO_RETURN_IF_ERROR(Annotate(stash_.DropRetained(op.mb, op.chunk), Where(index, op)));
  if (!in_place) SampleMemory();
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
      stats_.offloaded_bytes += EntryBytes(op);
      return absl::OkStatus();
    }
    case OpKind::kRelease:
      return Release(index, op);
    case OpKind::kReload: {
      const double now = Now();
      PO_RETURN_IF_ERROR(Annotate(stash_.StartReload(op.mb, op.chunk), Where(index, op)));
      Time(index, now, now);
      reload_ops_[key] = index;
      stats_.reloaded_bytes += EntryBytes(op);
      SampleMemory();
      return absl::OkStatus();
    }
    case OpKind::kBarrier:
      return Barrier(index, op);
    case OpKind::kRecompute:
    case OpKind::kRecomputeLean:
      return RecomputeEntry(index, op);
  }
  return absl::InternalError(absl::StrCat(Where(index, op), ": unknown op kind"));
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
    if (op.kind == OpKind::kOffload || op.kind == OpKind::kReload) timed.bytes = EntryBytes(op);
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

}  // namespace internal

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
  return std::unique_ptr<Executor>(new internal::StageExecutor(spec, program, model, backend, arena,
                                                     transport, options, std::move(host_pool),
                                                     compute_done, needs.stash_peak_bytes,
                                                     needs.recompute));
}

}  // namespace pipeoffload
