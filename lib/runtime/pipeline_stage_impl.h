// PipelineStageImpl: what PipelineStage::Open builds. The set-up phases live in
// stage_open.cc, the iteration and teardown in pipeline_stage.cc.
//
// Invariants:
//  - After a successful Open: plan_.schedule is valid, spec_ == plan_.schedule.spec, and
//    sizes_ holds every stage's sizes; executor_ runs program stage_ of it in arena_, which
//    holds nothing between iterations (Run checks).
//  - Teardown order: the backend drained, the executor, the backend drained again (freeing
//    poisons blocks on the compute queue), the arena, then what Open created (transport,
//    backend): each part is destroyed while everything it uses still exists.
#ifndef PIPEOFFLOAD_LIB_RUNTIME_PIPELINE_STAGE_IMPL_H_
#define PIPEOFFLOAD_LIB_RUNTIME_PIPELINE_STAGE_IMPL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "pipeoffload/pipeline.h"

namespace pipeoffload::internal {

class PipelineStageImpl final : public PipelineStage {
 public:
  PipelineStageImpl(const StageOptions& options, StageModel& model)
      : options_(options), model_(model) {}
  ~PipelineStageImpl() override;

  absl::StatusOr<IterationStats> Run() override;

  int stage() const override { return stage_; }
  const Schedule& schedule() const override { return plan_.schedule; }
  const Plan& plan() const override { return plan_; }
  const ModelSizes& sizes() const override { return sizes_; }
  const std::vector<StageCosts>& measured_costs() const override { return measured_; }
  const ArenaNeed& arena_need() const override { return arena_need_; }
  const std::vector<std::int64_t>& arena_budgets() const override { return arena_budgets_; }
  Backend& backend() override { return *backend_; }
  Transport& transport() override { return *transport_; }
  const HostPool& host_pool() const override { return executor_->host_pool(); }

  // Set-up (stage_open.cc), in order. Each phase leaves its error in `status` rather than
  // returning early where ranks still have to meet.
  absl::Status SetUpLocal();                    // options, spec, backend, transport, own sizes
  void MeasureCosts(absl::Status& status);      // kMeasured (collective when in turns)
  absl::Status GatherStages(absl::Status status);  // every stage's sizes and costs
  absl::Status SetUpRuntime();                  // plan, P2P analysis, arena, executor
  absl::Status Agree(absl::Status status);      // the ranks hold one schedule

 private:
  double timeout() const { return options_.executor.wait_timeout_seconds; }
  int num_stages() const { return spec_.num_stages; }
  absl::Status ResolveSpec();
  absl::Status SizesFromGivenCosts();
  absl::StatusOr<CostModel> SoloCosts() const;

  const StageOptions options_;
  StageModel& model_;
  PipelineSpec spec_;
  std::optional<Schedule> given_;  // a file's or the options' schedule
  int stage_ = 0;
  std::vector<std::int64_t> own_saved_;  // this stage's SavedBytes, by chunk
  // This stage's RetainedBytes(c, kFull / kLean), by chunk (-1: the model does not offer it).
  std::vector<std::int64_t> own_retained_full_, own_retained_lean_;
  // What this stage's RECOMPUTE_LEAN allocates, by chunk (ModelSizes::lean_rebuild_bytes).
  std::vector<std::int64_t> own_lean_rebuild_;
  std::optional<StageCosts> own_costs_;
  ModelSizes sizes_;
  std::vector<StageCosts> measured_;
  Plan plan_;
  ArenaNeed arena_need_;
  std::vector<std::int64_t> arena_budgets_;
  // Owned parts, declared so that they are destroyed last (see the invariants).
  std::unique_ptr<Backend> owned_backend_;
  std::unique_ptr<Transport> owned_transport_;
  Backend* backend_ = nullptr;
  Transport* transport_ = nullptr;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<Executor> executor_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_RUNTIME_PIPELINE_STAGE_IMPL_H_
