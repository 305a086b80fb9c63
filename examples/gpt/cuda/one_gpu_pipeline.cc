// The one-GPU pipeline rig (see one_gpu_pipeline.h).
#include "examples/gpt/cuda/one_gpu_pipeline.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda.h"

namespace pipeoffload::gpt::cuda {
namespace {

constexpr std::int64_t kArenaAlignment = 256;

std::int64_t Aligned(std::int64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

}  // namespace

std::int64_t OneGpuArenaBytes(const StageProgram& program, const StagePrediction& prediction,
                              std::int64_t boundary_bytes) {
  std::int64_t buffers = 0;
  for (const Op& op : program.ops) {
    if (op.kind == OpKind::kForward || op.kind == OpKind::kBackward ||
        op.kind == OpKind::kRecvActivation || op.kind == OpKind::kRecvGrad) {
      ++buffers;
    }
  }
  const std::int64_t stash = prediction.peak_bytes + prediction.peak_units * kArenaAlignment;
  const std::int64_t total = stash + buffers * Aligned(std::max<std::int64_t>(boundary_bytes, 1));
  return Aligned(total + total / 4 + kArenaAlignment);
}

absl::StatusOr<std::unique_ptr<OneGpuPipeline>> OneGpuPipeline::Create(
    const Schedule& schedule, const std::vector<Backend*>& backends,
    const std::vector<StageModel*>& models, const OneGpuPipelineOptions& options) {
  const int p = schedule.spec.num_stages;
  if (static_cast<int>(backends.size()) != p || static_cast<int>(models.size()) != p ||
      static_cast<int>(schedule.stages.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat("a ", p, "-stage schedule needs ", p,
                                                   " backends and models, got ", backends.size(),
                                                   " and ", models.size()));
  }
  if (!schedule.predictions.has_value()) {
    return absl::InvalidArgumentError("the schedule has no predictions (compile it first)");
  }
  std::unique_ptr<OneGpuPipeline> rig(new OneGpuPipeline(schedule, backends, options));
  LocalTransportOptions transport_options;
  for (Backend* backend : backends) {
    PO_ASSIGN_OR_RETURN(LocalCopyFunction copier,
                        CudaDeviceCopier(*backend, options.wait_timeout_seconds));
    transport_options.receive_copiers.push_back(std::move(copier));
  }
  PO_ASSIGN_OR_RETURN(rig->transports_, CreateLocalTransports(p, transport_options));
  ExecutorOptions executor_options;
  executor_options.wait_timeout_seconds = options.wait_timeout_seconds;
  for (int d = 0; d < p; ++d) {
    const auto stage = static_cast<std::size_t>(d);
    DeviceArenaOptions arena_options;
    arena_options.budget_bytes =
        OneGpuArenaBytes(schedule.stages[stage], schedule.predictions->stages[stage],
                         models[stage]->BoundaryBytes());
    arena_options.alignment = kArenaAlignment;
    arena_options.poison_on_free = options.poison_on_free;
    PO_ASSIGN_OR_RETURN(std::unique_ptr<DeviceArena> arena,
                        DeviceArena::Create(*backends[stage], arena_options));
    absl::StatusOr<std::unique_ptr<Executor>> executor =
        Executor::Create(schedule.spec, schedule.stages[stage], *models[stage], *backends[stage],
                         *arena, *rig->transports_[stage], executor_options);
    if (!executor.ok()) return Annotate(executor.status(), absl::StrCat("stage ", d));
    rig->arenas_.push_back(std::move(arena));
    rig->executors_.push_back(*std::move(executor));
  }
  return rig;
}

OneGpuPipeline::~OneGpuPipeline() {
  executors_.clear();
  for (Backend* backend : backends_) {
    static_cast<void>(backend->Synchronize(options_.wait_timeout_seconds));
  }
  arenas_.clear();
  transports_.clear();
}

std::int64_t OneGpuPipeline::arena_bytes(int stage) const {
  return arenas_[static_cast<std::size_t>(stage)]->budget_bytes();
}

absl::StatusOr<std::vector<IterationStats>> OneGpuPipeline::RunStep() {
  const std::size_t p = executors_.size();
  std::vector<std::optional<absl::StatusOr<IterationStats>>> results(p);
  std::vector<std::thread> threads;
  for (std::size_t d = 0; d < p; ++d) {
    threads.emplace_back([this, &results, d] { results[d] = executors_[d]->Run(); });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<IterationStats> stats;
  for (std::size_t d = 0; d < p; ++d) {
    if (!(*results[d]).ok()) return Annotate((*results[d]).status(), absl::StrCat("stage ", d));
    stats.push_back(std::move(*(*results[d])));
  }
  for (Backend* backend : backends_) {
    PO_RETURN_IF_ERROR(backend->Synchronize(options_.wait_timeout_seconds));
  }
  return stats;
}

}  // namespace pipeoffload::gpt::cuda
