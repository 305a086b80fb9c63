// LayerSlidingEngineImpl: the layer-sliding runtime (layer_sliding.h). Its methods live in
// engine.cc (creation, buffers, parameter access) and engine_step.cc (one step's ops).
//
// Invariants:
//  - One thread (the caller of Step) issues every device operation, in program order
//    (program.h); the only other threads are the UpdateWorker's (CPU Adam, the m, v tier on
//    NVMe) and the CheckpointTier's (checkpoints on NVMe: copy events -> drive requests). The
//    caller's thread blocks on the host only (a) before a unit's first upload of a step, for
//    that unit's update of the previous step, (b) for a free landing buffer before handing
//    gradients out, (c) at the norm, for the sums of squares, (d) before saving a checkpoint
//    that lives on NVMe, for a free staging buffer (one whose last write or H2D finished),
//    (e) before loading such a checkpoint, for its drive read; every such wait is bounded by
//    SlidingOptions::timeout_seconds.
//  - Device ordering is by events, each recorded by this thread before any wait on it is
//    enqueued (an event never recorded counts as complete, so a wait enqueued too early would
//    pass: the program's order rules that out):
//      slot_uploaded[s]      H2D, after an upload into slot s   -> compute before its use
//      slot_compute_done[s]  compute, at kEndUse                -> H2D before the next upload
//                                                                  into s; D2H before the
//                                                                  slot's gradients go out
//      slot_grads_done[s]    D2H, after the slot's gradients    -> H2D before the next upload
//      act_fwd_done[a][mb]   compute, after the forward writing act[a][mb] -> its checkpoint save
//      act_saved[a][mb]      D2H, after that save               -> compute before the forward
//                                                                  that overwrites act[a][mb]
//      act_reader_done[a]    compute, after the backward that read act[a] -> H2D loads into it
//      act_loaded[a][mb]     H2D, after a checkpoint load       -> compute before its backward
//      staging event [b]     D2H after a save into NVMe staging buffer b, H2D after a load
//                            from it -> the CheckpointTier's host wait before it writes b to the
//                            drive / hands b out again (checkpoint_tier.h)
//      accum_done / side_*   the accumulator's hand-over of a borrower's gradients to the owner
//      chunk events          D2H, per gradient chunk            -> the UpdateWorker's host wait
//      sums_copied           D2H, the sums of squares           -> the norm's host wait
//  - Buffers: everything on the device is carved from one DeviceArena made at creation; host
//    memory from HostBlocks made at creation. Nothing is allocated in a step (trace events
//    excepted, and only with record_trace).
//  - Parameters: a sliding unit's truth is its fp32 master on the host; its upload copy (the
//    master itself for fp32 models; for bf16 ones the master is split, adam.h's SplitMaster,
//    and the upload copy is its high half) is rewritten only by its update, which runs after
//    the unit's last use of the step and before its first upload of the next step. A resident
//    unit's master (split the same way), m, v, wire gradients and parameters stay on the
//    device; a resident
//    borrower's parameter block holds its own parameters followed by its owner's (the owner's
//    parameter pointer points into it), so the borrower's view is contiguous.
#ifndef PIPEOFFLOAD_LIB_SLIDE_ENGINE_IMPL_H_
#define PIPEOFFLOAD_LIB_SLIDE_ENGINE_IMPL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lib/slide/checkpoint_tier.h"
#include "lib/slide/device_ops.h"
#include "lib/slide/host_memory.h"
#include "lib/slide/nvme_tier.h"
#include "lib/slide/program.h"
#include "lib/slide/recorder.h"
#include "lib/slide/update_worker.h"
#include "pipeoffload/layer_sliding.h"
#include "pipeoffload/memory.h"

namespace pipeoffload::internal {

class LayerSlidingEngineImpl final : public LayerSlidingEngine {
 public:
  static absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> Create(Backend& backend,
                                                                    SlidingModel& model,
                                                                    const SlidingOptions& options);
  ~LayerSlidingEngineImpl() override;

  absl::Status SetUnitParams(int unit, std::span<const float> values) override;
  absl::Status GetUnitParams(int unit, std::span<float> values) override;
  absl::Status GetUnitOptimizerState(int unit, std::span<float> exp_avg,
                                     std::span<float> exp_avg_sq) override;
  absl::StatusOr<SlidingStepResult> Step(const SlidingStepOptions& options) override;
  absl::Status Flush() override;
  const SlidingPlan& plan() const override { return plan_; }
  std::vector<std::int64_t> unit_update_counts() const override;
  SlidingSetupStats setup_stats() const override { return setup_; }

 private:
  struct Slot {
    void* params = nullptr;  // capacity elements of the dtype
    void* grads = nullptr;
    std::int64_t capacity = 0;
    int unit = -1;  // occupant (for the ops' pointers)
    Event uploaded{nullptr, -1}, compute_done{nullptr, -1}, grads_done{nullptr, -1};  // set at creation
  };
  struct Resident {
    void* params = nullptr;  // own parameters (dtype); a borrower's block continues with its owner's
    void* grads = nullptr;   // own wire gradients
    std::uint16_t* master_lo = nullptr;  // bf16 models: the master's low halves (params: high)
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
  };
  // Gradient destinations of a sliding unit on the host, with their chunk events.
  struct GradsHome {
    void* data = nullptr;
    std::vector<Event> chunk_events;
  };

  LayerSlidingEngineImpl(Backend& backend, SlidingModel& model, const SlidingOptions& options,
                         SlidingModelShape shape, SlidingPlan plan, SlideProgram program);

  absl::Status AllocateDevice();
  absl::Status AllocateHost();
  absl::Status CreateEvents();
  absl::Status CheckUnit(int unit, std::size_t size, std::string_view what) const;
  std::int64_t Own(int unit) const { return shape_.units[static_cast<std::size_t>(unit)].param_count; }
  int Borrowed(int unit) const { return shape_.units[static_cast<std::size_t>(unit)].borrowed_unit; }
  bool CheckpointOnNvme(int unit) const {
    return plan_.nvme_checkpoints[static_cast<std::size_t>(unit)];
  }
  absl::Status CreateCheckpointTier();
  bool IsSliding(int unit) const {
    return plan_.placement[static_cast<std::size_t>(unit)] == UnitPlace::kSliding;
  }
  std::byte* ParamsOf(int unit, int slot) const;
  absl::StatusOr<StepScalars> Scalars(float learning_rate, std::int64_t step, float grad_scale) const;

  // engine_step.cc: one op each.
  absl::Status Execute(const SlideOp& op, SlidingStepResult& result);
  absl::Status Upload(const SlideOp& op);
  absl::Status Forward(const SlideOp& op);
  absl::Status SaveCheckpoint(const SlideOp& op);
  absl::Status LoadCheckpoint(const SlideOp& op);
  absl::Status BeginGrads(const SlideOp& op);
  absl::Status Backward(const SlideOp& op);
  absl::Status FinishGrads(const SlideOp& op);
  absl::Status GradsOut(const SlideOp& op);
  absl::Status GpuUpdate(int unit);
  absl::Status Norm(SlidingStepResult& result);
  absl::Status Copy(QueueKind queue, void* dst, const void* src, std::int64_t bytes,
                    SlideEngineKind engine, std::string_view what, int unit, int mb);

  Backend& backend_;
  SlidingModel& model_;
  const SlidingOptions options_;
  const SlidingModelShape shape_;
  const SlidingPlan plan_;
  const SlideProgram program_;
  const int num_units_;
  const int M_;
  const std::int64_t dtype_bytes_;
  SlidingSetupStats setup_;

  std::unique_ptr<SlideDeviceOps> device_ops_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<CpuAdam> cpu_adam_;
  std::unique_ptr<SlideRecorder> recorder_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<CheckpointTier> checkpoint_tier_;  // checkpoints on NVMe, or null
  std::unique_ptr<UpdateWorker> worker_;  // last: destroyed first (it reads the host state)

  // Device.
  std::vector<Slot> slots_;
  std::array<std::vector<void*>, 2> act_, grad_;  // [unit % 2][mb]
  float* accum_ = nullptr;
  void* workspace_ = nullptr;
  double* sums_ = nullptr;      // one per unit
  double* partials_ = nullptr;  // CastGrads scratch
  std::vector<Resident> resident_;
  // Host.
  std::vector<HostBlock> blocks_;
  std::vector<UnitHostState> host_;  // per unit (sliding units filled)
  std::vector<GradsHome> landing_;   // landing buffers, or
  std::vector<GradsHome> parked_;    // per unit, when gradients are parked
  std::vector<std::vector<void*>> checkpoints_;  // [unit][mb]; empty for units on NVMe
  float* side_ = nullptr;  // a borrower's gradients for its owner
  double* sums_host_ = nullptr;
  // Events.
  std::array<std::vector<Event>, 2> act_fwd_done_, act_saved_, act_loaded_;
  std::array<std::optional<Event>, 2> act_reader_done_;
  std::optional<Event> accum_done_, side_saved_, side_loaded_, sums_ready_, sums_copied_;
  std::vector<Event> events_;  // every event above, for destruction

  std::int64_t step_seq_ = 0;    // Step calls
  float learning_rate_ = 0.0f;   // this step's
  std::int64_t step_h2d_bytes_ = 0;
  std::int64_t step_d2h_bytes_ = 0;
  double wait_seconds_ = 0.0;    // host blocking of this step
  std::int64_t adam_step_ = 0;   // applied optimizer steps
  std::optional<StepScalars> step_scalars_;  // this step's (known at start, or at the norm)
  std::vector<std::int64_t> resident_updates_;
  absl::Status error_;           // sticky: after an error the engine must be destroyed
  bool compute_synchronous_ = false;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_ENGINE_IMPL_H_
