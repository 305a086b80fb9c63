// LayerSlidingEngineImpl, part 2: one step, op by op (program.h), with the event protocol of
// engine_impl.h.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/slide/engine_impl.h"

namespace pipeoffload::internal {

std::byte* LayerSlidingEngineImpl::ParamsOf(int unit, int slot) const {
  if (slot >= 0) return static_cast<std::byte*>(slots_[static_cast<std::size_t>(slot)].params);
  return static_cast<std::byte*>(resident_[static_cast<std::size_t>(unit)].params);
}

absl::Status LayerSlidingEngineImpl::Copy(QueueKind queue, void* dst, const void* src,
                                          std::int64_t bytes, SlideEngineKind engine,
                                          std::string_view what, int unit, int mb) {
  const Queue q = backend_.queue(queue);
  PO_ASSIGN_OR_RETURN(const std::optional<Event> mark, recorder_->Begin(q));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(q, dst, src, bytes));
  (queue == QueueKind::kH2D ? step_h2d_bytes_ : step_d2h_bytes_) += bytes;
  if (!recorder_->enabled()) return absl::OkStatus();
  std::string name = absl::StrCat(std::string(what), " ",
                                  shape_.units[static_cast<std::size_t>(unit)].name);
  if (mb >= 0) absl::StrAppend(&name, " mb", mb);
  return recorder_->End(mark, q, engine, std::move(name), unit, mb, bytes);
}

absl::StatusOr<SlidingStepResult> LayerSlidingEngineImpl::Step(const SlidingStepOptions& options) {
  if (!error_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layer sliding: the engine failed earlier and must be recreated: ", error_.message()));
  }
  const bool defer =
      options_.max_grad_norm > 0.0 || options_.update_timing == UpdateTiming::kAfterBackward;
  // A bad learning rate is the caller's to fix; the engine stays usable.
  PO_ASSIGN_OR_RETURN(const StepScalars first, Scalars(options.learning_rate, adam_step_ + 1, 1.0f));
  SlidingStepResult result;
  ++step_seq_;
  learning_rate_ = options.learning_rate;
  step_h2d_bytes_ = 0;
  step_d2h_bytes_ = 0;
  wait_seconds_ = 0.0;
  const double start = backend_.NowSeconds();
  if (!defer) {
    step_scalars_ = first;
    ++adam_step_;
    worker_->SetScalars(step_seq_, step_scalars_);
    result.applied = true;
  } else {
    step_scalars_.reset();
  }
  for (const SlideOp& op : program_.ops) {
    const absl::Status status = Execute(op, result);
    if (!status.ok()) {
      error_ = Annotate(status, absl::StrCat("layer sliding step ", step_seq_, ", ",
                                             std::string(SlideOpKindName(op.kind)),
                                             op.unit >= 0 ? absl::StrCat(" ", shape_.units[static_cast<std::size_t>(op.unit)].name) : "",
                                             op.mb >= 0 ? absl::StrCat(" mb ", op.mb) : ""));
      return error_;
    }
  }
  if (options_.update_timing == UpdateTiming::kAfterBackward) {
    const double wait_start = backend_.NowSeconds();
    error_ = worker_->Drain();
    wait_seconds_ += backend_.NowSeconds() - wait_start;
    PO_RETURN_IF_ERROR(error_);
  }
  result.step = adam_step_;
  result.step_seconds = backend_.NowSeconds() - start;
  result.cpu_adam_seconds = worker_->TakeAdamSeconds();
  result.gpu_wait_seconds = wait_seconds_;
  result.h2d_bytes = step_h2d_bytes_;
  result.d2h_bytes = step_d2h_bytes_;
  // Every drive request of the step's checkpoints finished before its load was handed out.
  if (checkpoint_tier_ != nullptr) result.nvme_checkpoint_bytes = checkpoint_tier_->TakeBytes();
  result.device_high_water_bytes = arena_->Usage(MemoryCategory::kOther).high_water_bytes;
  error_ = recorder_->Resolve();
  PO_RETURN_IF_ERROR(error_);
  result.records = recorder_->Take();
  for (const SlideRecord& record : result.records) {
    if (record.engine == SlideEngineKind::kCompute) result.compute_busy_seconds += record.end - record.start;
  }
  return result;
}

absl::Status LayerSlidingEngineImpl::Execute(const SlideOp& op, SlidingStepResult& result) {
  switch (op.kind) {
    case SlideOpKind::kBeginStep:
      return model_.BeginStep(step_seq_ - 1, M_);  // data steps count from 0, as the plain trainer's
    case SlideOpKind::kUpload:
      return Upload(op);
    case SlideOpKind::kForward:
      return Forward(op);
    case SlideOpKind::kSaveCheckpoint:
      return SaveCheckpoint(op);
    case SlideOpKind::kLoadCheckpoint:
      return LoadCheckpoint(op);
    case SlideOpKind::kBeginGrads:
      return BeginGrads(op);
    case SlideOpKind::kBackward:
      return Backward(op);
    case SlideOpKind::kFinishGrads:
      return FinishGrads(op);
    case SlideOpKind::kEndUse:
      return backend_.RecordEvent(slots_[static_cast<std::size_t>(op.slot)].compute_done,
                                  backend_.queue(QueueKind::kCompute));
    case SlideOpKind::kGradsOut:
      return GradsOut(op);
    case SlideOpKind::kGpuUpdate:
      return GpuUpdate(op.unit);
    case SlideOpKind::kNorm:
      return Norm(result);
  }
  return absl::InternalError("layer sliding: unknown op");
}

absl::Status LayerSlidingEngineImpl::Upload(const SlideOp& op) {
  const int unit = op.unit;
  const int owner = Borrowed(unit);
  if (op.wait_update) {
    const double wait_start = backend_.NowSeconds();
    PO_RETURN_IF_ERROR(worker_->WaitUpdated(unit, step_seq_ - 1));
    if (owner >= 0) PO_RETURN_IF_ERROR(worker_->WaitUpdated(owner, step_seq_ - 1));
    wait_seconds_ += backend_.NowSeconds() - wait_start;
  }
  Slot& slot = slots_[static_cast<std::size_t>(op.slot)];
  const Queue h2d = backend_.queue(QueueKind::kH2D);
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d, slot.compute_done));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d, slot.grads_done));
  const std::int64_t own_bytes = Own(unit) * dtype_bytes_;
  PO_RETURN_IF_ERROR(Copy(QueueKind::kH2D, slot.params, host_[static_cast<std::size_t>(unit)].upload,
                          own_bytes, SlideEngineKind::kH2D, "upload", unit, -1));
  if (owner >= 0) {
    PO_RETURN_IF_ERROR(Copy(QueueKind::kH2D, static_cast<std::byte*>(slot.params) + own_bytes,
                            host_[static_cast<std::size_t>(owner)].upload, Own(owner) * dtype_bytes_,
                            SlideEngineKind::kH2D, "upload borrowed", unit, -1));
  }
  slot.unit = unit;
  return backend_.RecordEvent(slot.uploaded, h2d);
}

absl::Status LayerSlidingEngineImpl::Forward(const SlideOp& op) {
  const Queue compute = backend_.queue(QueueKind::kCompute);
  const int in = op.unit % 2;
  const int out = (op.unit + 1) % 2;
  const auto mb = static_cast<std::size_t>(op.mb);
  if (op.slot >= 0) {
    PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(compute, slots_[static_cast<std::size_t>(op.slot)].uploaded));
  }
  // The buffer held the previous unit's input until its checkpoint save finished.
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(compute, act_saved_[out][mb]));
  UnitCall call;
  call.unit = op.unit;
  call.mb = op.mb;
  call.num_microbatches = M_;
  call.params = ParamsOf(op.unit, op.slot);
  call.input = op.unit > 0 ? act_[in][mb] : nullptr;
  call.output = act_[out][mb];
  call.workspace = workspace_;
  PO_ASSIGN_OR_RETURN(const std::optional<Event> mark, recorder_->Begin(compute));
  PO_RETURN_IF_ERROR(model_.Forward(call));
  PO_RETURN_IF_ERROR(recorder_->End(mark, compute, SlideEngineKind::kCompute,
                                    absl::StrCat("F ", shape_.units[static_cast<std::size_t>(op.unit)].name, " mb", op.mb),
                                    op.unit, op.mb, 0));
  return backend_.RecordEvent(act_fwd_done_[out][mb], compute);
}

absl::Status LayerSlidingEngineImpl::SaveCheckpoint(const SlideOp& op) {
  const Queue d2h = backend_.queue(QueueKind::kD2H);
  const int set = op.unit % 2;
  const auto mb = static_cast<std::size_t>(op.mb);
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(d2h, act_fwd_done_[set][mb]));
  // In pinned host memory, or through a staging buffer the tier writes to the drive once the
  // D2H's event fires.
  const bool on_nvme = CheckpointOnNvme(op.unit);
  CheckpointTier::Lent staging;
  void* host = nullptr;  // checkpoints_ holds no buffers for the units on the drive
  if (!on_nvme) {
    host = checkpoints_[static_cast<std::size_t>(op.unit)][mb];
  } else {
    const double wait_start = backend_.NowSeconds();
    PO_ASSIGN_OR_RETURN(staging, checkpoint_tier_->AcquireForSave(op.unit, op.mb));
    wait_seconds_ += backend_.NowSeconds() - wait_start;
    host = staging.data;
  }
  PO_RETURN_IF_ERROR(Copy(QueueKind::kD2H, host, act_[set][mb], shape_.activation_bytes,
                          SlideEngineKind::kD2H, on_nvme ? "save checkpoint (NVMe)" : "save checkpoint",
                          op.unit, op.mb));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(act_saved_[set][mb], d2h));
  if (!on_nvme) return absl::OkStatus();
  PO_RETURN_IF_ERROR(backend_.RecordEvent(staging.event, d2h));
  return checkpoint_tier_->SaveEnqueued(staging.buffer);
}

absl::Status LayerSlidingEngineImpl::LoadCheckpoint(const SlideOp& op) {
  const Queue h2d = backend_.queue(QueueKind::kH2D);
  const int set = op.unit % 2;
  const auto mb = static_cast<std::size_t>(op.mb);
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d, *act_reader_done_[set]));
  // From pinned host memory, or from the staging buffer the tier read it into (free again once
  // the H2D's event fires).
  const bool on_nvme = CheckpointOnNvme(op.unit);
  CheckpointTier::Lent staging;
  const void* host = nullptr;  // checkpoints_ holds no buffers for the units on the drive
  if (!on_nvme) {
    host = checkpoints_[static_cast<std::size_t>(op.unit)][mb];
  } else {
    const double wait_start = backend_.NowSeconds();
    PO_ASSIGN_OR_RETURN(staging, checkpoint_tier_->AcquireLoaded(op.unit, op.mb));
    wait_seconds_ += backend_.NowSeconds() - wait_start;
    host = staging.data;
  }
  PO_RETURN_IF_ERROR(Copy(QueueKind::kH2D, act_[set][mb], host, shape_.activation_bytes,
                          SlideEngineKind::kH2D, on_nvme ? "load checkpoint (NVMe)" : "load checkpoint",
                          op.unit, op.mb));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(act_loaded_[set][mb], h2d));
  if (!on_nvme) return absl::OkStatus();
  PO_RETURN_IF_ERROR(backend_.RecordEvent(staging.event, h2d));
  return checkpoint_tier_->LoadEnqueued(staging.buffer);
}

absl::Status LayerSlidingEngineImpl::BeginGrads(const SlideOp& op) {
  const Queue compute = backend_.queue(QueueKind::kCompute);
  // A borrower's part of the accumulator is read by a D2H copy before anyone rewrites it.
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(compute, *side_saved_));
  bool owner = false;
  for (int u = 0; u < num_units_; ++u) owner = owner || Borrowed(u) == op.unit;
  const int borrower_owner = Borrowed(op.unit);
  const std::int64_t view = Own(op.unit) + (borrower_owner >= 0 ? Own(borrower_owner) : 0);
  if (!owner) return backend_.FillAsync(compute, accum_, 0, view * 4);
  // The owner starts from its borrower's gradients (saved at the borrower's kFinishGrads).
  const Queue h2d = backend_.queue(QueueKind::kH2D);
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*accum_done_, compute));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d, *accum_done_));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(h2d, *side_saved_));
  PO_RETURN_IF_ERROR(Copy(QueueKind::kH2D, accum_, side_, Own(op.unit) * 4, SlideEngineKind::kH2D,
                          "borrowed gradients to", op.unit, -1));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*side_loaded_, h2d));
  return backend_.QueueWaitEvent(compute, *side_loaded_);
}

absl::Status LayerSlidingEngineImpl::Backward(const SlideOp& op) {
  const Queue compute = backend_.queue(QueueKind::kCompute);
  const auto mb = static_cast<std::size_t>(op.mb);
  const int in = op.unit % 2;
  if (op.slot >= 0) {
    PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(compute, slots_[static_cast<std::size_t>(op.slot)].uploaded));
  }
  if (IsCheckpointed(op.unit, num_units_)) {
    PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(compute, act_loaded_[in][mb]));
  }
  UnitCall call;
  call.unit = op.unit;
  call.mb = op.mb;
  call.num_microbatches = M_;
  call.params = ParamsOf(op.unit, op.slot);
  call.input = op.unit > 0 ? act_[in][mb] : nullptr;
  call.grad_output = op.unit + 1 < num_units_ ? grad_[(op.unit + 1) % 2][mb] : nullptr;
  call.grad_input = op.unit > 0 ? grad_[in][mb] : nullptr;
  call.grad_accum = accum_;
  call.workspace = workspace_;
  PO_ASSIGN_OR_RETURN(const std::optional<Event> mark, recorder_->Begin(compute));
  PO_RETURN_IF_ERROR(model_.Backward(call));
  return recorder_->End(mark, compute, SlideEngineKind::kCompute,
                        absl::StrCat("B ", shape_.units[static_cast<std::size_t>(op.unit)].name, " mb", op.mb),
                        op.unit, op.mb, 0);
}

absl::Status LayerSlidingEngineImpl::FinishGrads(const SlideOp& op) {
  const Queue compute = backend_.queue(QueueKind::kCompute);
  void* wire = op.slot >= 0 ? slots_[static_cast<std::size_t>(op.slot)].grads
                            : resident_[static_cast<std::size_t>(op.unit)].grads;
  PO_ASSIGN_OR_RETURN(const std::optional<Event> mark, recorder_->Begin(compute));
  PO_RETURN_IF_ERROR(device_ops_->CastGrads(accum_, wire, Own(op.unit), sums_ + op.unit, partials_));
  PO_RETURN_IF_ERROR(recorder_->End(mark, compute, SlideEngineKind::kCompute,
                                    absl::StrCat("grads ", shape_.units[static_cast<std::size_t>(op.unit)].name),
                                    op.unit, -1, Own(op.unit) * dtype_bytes_));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*act_reader_done_[op.unit % 2], compute));
  const int owner = Borrowed(op.unit);
  if (owner < 0) return absl::OkStatus();
  // The borrowed part (fp32, after the own part) goes to the host for the owner's turn.
  const Queue d2h = backend_.queue(QueueKind::kD2H);
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*accum_done_, compute));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(d2h, *accum_done_));
  PO_RETURN_IF_ERROR(Copy(QueueKind::kD2H, side_, accum_ + Own(op.unit), Own(owner) * 4,
                          SlideEngineKind::kD2H, "borrowed gradients of", op.unit, -1));
  return backend_.RecordEvent(*side_saved_, d2h);
}

absl::Status LayerSlidingEngineImpl::GradsOut(const SlideOp& op) {
  const std::int64_t n = Own(op.unit);
  int landing = -1;
  GradsHome* home = &parked_[static_cast<std::size_t>(op.unit)];
  if (home->data == nullptr) {
    const double wait_start = backend_.NowSeconds();
    PO_ASSIGN_OR_RETURN(landing, worker_->AcquireLanding());
    wait_seconds_ += backend_.NowSeconds() - wait_start;
    home = &landing_[static_cast<std::size_t>(landing)];
  }
  Slot& slot = slots_[static_cast<std::size_t>(op.slot)];
  const Queue d2h = backend_.queue(QueueKind::kD2H);
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(d2h, slot.compute_done));
  UpdateTask task;
  task.unit = op.unit;
  task.step = step_seq_;
  task.grads = home->data;
  task.landing = landing;
  const std::int64_t chunk = options_.grad_chunk_elements;
  for (std::int64_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    const std::int64_t count = std::min(chunk, n - begin);
    PO_RETURN_IF_ERROR(Copy(QueueKind::kD2H, static_cast<std::byte*>(home->data) + begin * dtype_bytes_,
                            static_cast<std::byte*>(slot.grads) + begin * dtype_bytes_,
                            count * dtype_bytes_, SlideEngineKind::kD2H, "gradients", op.unit, -1));
    const Event landed = home->chunk_events[static_cast<std::size_t>(c)];
    PO_RETURN_IF_ERROR(backend_.RecordEvent(landed, d2h));
    task.chunks.push_back({landed, begin, count});
  }
  PO_RETURN_IF_ERROR(backend_.RecordEvent(slot.grads_done, d2h));
  worker_->Submit(std::move(task));
  return absl::OkStatus();
}

absl::Status LayerSlidingEngineImpl::GpuUpdate(int unit) {
  if (!step_scalars_.has_value()) return absl::OkStatus();  // non-finite norm: step skipped
  const Resident& r = resident_[static_cast<std::size_t>(unit)];
  const Queue compute = backend_.queue(QueueKind::kCompute);
  PO_ASSIGN_OR_RETURN(const std::optional<Event> mark, recorder_->Begin(compute));
  for (const auto& [run, decay] : host_[static_cast<std::size_t>(unit)].runs) {
    AdamSpan span;
    span.exp_avg = r.exp_avg + run.offset;
    span.exp_avg_sq = r.exp_avg_sq + run.offset;
    const std::byte* grads = static_cast<const std::byte*>(r.grads) + run.offset * dtype_bytes_;
    if (shape_.param_dtype == SlideDtype::kFp32) {
      span.param = static_cast<float*>(r.params) + run.offset;
      span.grad = reinterpret_cast<const float*>(grads);
    } else {
      span.param_bf16 = static_cast<std::uint16_t*>(r.params) + run.offset;  // split master
      span.param_lo = r.master_lo + run.offset;
      span.grad_bf16 = reinterpret_cast<const std::uint16_t*>(grads);
    }
    span.count = run.count;
    PO_RETURN_IF_ERROR(device_ops_->Adam(decay ? step_scalars_->decay : step_scalars_->no_decay, span));
  }
  ++resident_updates_[static_cast<std::size_t>(unit)];
  return recorder_->End(mark, compute, SlideEngineKind::kCompute,
                        absl::StrCat("adam ", shape_.units[static_cast<std::size_t>(unit)].name),
                        unit, -1, Own(unit) * 28);
}

absl::Status LayerSlidingEngineImpl::Norm(SlidingStepResult& result) {
  const Queue compute = backend_.queue(QueueKind::kCompute);
  const Queue d2h = backend_.queue(QueueKind::kD2H);
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*sums_ready_, compute));
  PO_RETURN_IF_ERROR(backend_.QueueWaitEvent(d2h, *sums_ready_));
  PO_RETURN_IF_ERROR(backend_.CopyAsync(d2h, sums_host_, sums_, 8 * static_cast<std::int64_t>(num_units_)));
  PO_RETURN_IF_ERROR(backend_.RecordEvent(*sums_copied_, d2h));
  const double wait_start = backend_.NowSeconds();
  PO_RETURN_IF_ERROR(backend_.WaitEvent(*sums_copied_, options_.timeout_seconds));
  wait_seconds_ += backend_.NowSeconds() - wait_start;
  // The global norm: units in ascending order, as the plain trainer sums them.
  double total = 0.0;
  for (int u = 0; u < num_units_; ++u) total += sums_host_[u];
  result.grad_norm = std::sqrt(total);
  result.clip_coefficient = 1.0f;
  const bool defer =
      options_.max_grad_norm > 0.0 || options_.update_timing == UpdateTiming::kAfterBackward;
  if (!defer) return absl::OkStatus();
  const float coefficient = options_.max_grad_norm > 0.0
                                ? ClipCoefficient(result.grad_norm, options_.max_grad_norm)
                                : 1.0f;
  result.clip_coefficient = coefficient;
  absl::StatusOr<StepScalars> scalars = Scalars(learning_rate_, adam_step_ + 1, coefficient);
  if (scalars.ok()) {
    step_scalars_ = *scalars;
    ++adam_step_;
    result.applied = true;
  } else {
    step_scalars_.reset();  // a non-finite norm: every update of this step is skipped
    result.applied = false;
  }
  worker_->SetScalars(step_seq_, step_scalars_);
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal
