// po_pipeline (c_api.h, "running a pipeline with C callbacks"): every stage of one process as a
// LocalPipeline (pipeline.h) over the callers' callbacks. Open reads the versioned options and
// callback tables, checks them, and opens the stages; run keeps each finished iteration's
// stats and, when it fails, reports the first callback failure (the stages that waited for
// the failed one time out later, and their errors only say so).
//
// State: a pipeline is open (run may be called) until a run fails, then broken (reads and
// free only). Its members die in the order LocalPipeline's contract needs: the stages first,
// then the models and backends they use.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/status_macros.h"
#include "lib/c_api/c_api_internal.h"
#include "lib/c_api/stage_backends.h"
#include "lib/c_api/stage_callbacks.h"
#include "lib/c_api/stage_setup.h"
#include "pipeoffload/pipeline.h"

struct po_pipeline {
  std::unique_ptr<pipeoffload::c_api::CallbackFailures> failures;
  std::vector<std::unique_ptr<pipeoffload::c_api::CallbackStageModel>> models;
  std::vector<std::unique_ptr<pipeoffload::Backend>> backends;  // empty: each stage's own CPU
  std::unique_ptr<pipeoffload::LocalPipeline> stages;           // destroyed first
  std::vector<std::vector<po_iteration_stats>> stats;  // [iteration][stage] of the last run
  bool broken = false;                                 // a run failed
};

namespace pipeoffload::c_api {
namespace {

// After Open, when the schedule is known: W needs its callback, and every model its stream
// and entry sizes.
absl::Status PrepareModels(po_pipeline& pipeline,
                           const std::vector<po_stage_callbacks>& callbacks) {
  const Schedule& schedule = pipeline.stages->stage(0).schedule();
  for (std::size_t d = 0; d < callbacks.size(); ++d) {
    if (schedule.spec.split_backward && callbacks[d].backward_weight == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "po_stage_callbacks[", d, "].backward_weight is NULL, but the schedule splits W"));
    }
    const Backend* backend = pipeline.backends.empty() ? nullptr : pipeline.backends[d].get();
    PO_ASSIGN_OR_RETURN(const std::uint64_t stream, ComputeStreamHandle(backend));
    pipeline.models[d]->Prepare(stream, schedule.spec.split_backward,
                                schedule.spec.chunks_per_stage);
  }
  // Prepare asked saved_bytes again; an answer <= 0 now is as fatal as at Open.
  if (std::optional<absl::Status> failure = pipeline.failures->first()) return *failure;
  return absl::OkStatus();
}

absl::Status OpenPipeline(const po_stage_callbacks* tables, std::int32_t num_stages,
                          const po_pipeline_options* options, po_pipeline** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_RETURN_IF_ERROR(NotNull(tables, "callbacks"));
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be >= 1 (got ", num_stages, ")"));
  }
  PO_ASSIGN_OR_RETURN(const po_pipeline_options chosen,
                      ReadPipelineOptions(options, /*min_cuda_device=*/0));
  PO_ASSIGN_OR_RETURN(const StageOptions stage_options,
                      ToStageOptions(chosen, num_stages, "callback tables were given"));
  std::vector<po_stage_callbacks> callbacks;
  for (int d = 0; d < num_stages; ++d) {
    PO_ASSIGN_OR_RETURN(po_stage_callbacks table, ReadCallbacks(tables, d));
    callbacks.push_back(table);
  }
  auto pipeline = std::make_unique<po_pipeline>();
  pipeline->failures = std::make_unique<CallbackFailures>();
  PO_ASSIGN_OR_RETURN(pipeline->backends,
                      CreateStageBackends(chosen.backend, chosen.cuda_device, num_stages));
  std::vector<StageModel*> models;
  std::vector<Backend*> backends;
  for (int d = 0; d < num_stages; ++d) {
    pipeline->models.push_back(std::make_unique<CallbackStageModel>(
        callbacks[static_cast<std::size_t>(d)], d, *pipeline->failures));
    models.push_back(pipeline->models.back().get());
  }
  for (const std::unique_ptr<Backend>& backend : pipeline->backends) {
    backends.push_back(backend.get());
  }
  absl::StatusOr<std::unique_ptr<LocalPipeline>> stages =
      LocalPipeline::Open(stage_options, models, backends);
  // A saved_bytes answer <= 0 is the reason Open failed, whatever it says.
  if (std::optional<absl::Status> failure = pipeline->failures->first()) return *failure;
  if (!stages.ok()) return stages.status();
  pipeline->stages = *std::move(stages);
  PO_RETURN_IF_ERROR(PrepareModels(*pipeline, callbacks));
  *out = pipeline.release();
  return absl::OkStatus();
}

absl::Status RunPipeline(po_pipeline* pipeline, std::int32_t num_iterations,
                         po_iteration_fn on_iteration, void* user) {
  PO_RETURN_IF_ERROR(NotNull(pipeline, "pipeline"));
  if (num_iterations < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_iterations must be >= 1 (got ", num_iterations, ")"));
  }
  if (pipeline->broken) {
    return absl::FailedPreconditionError(
        "an earlier run of this pipeline failed, and messages of that iteration may still sit "
        "between its stages; free it and open a new one");
  }
  pipeline->stats.clear();
  for (int i = 0; i < num_iterations; ++i) {
    const std::string iteration = absl::StrCat("iteration ", i);
    absl::StatusOr<std::vector<IterationStats>> stats = pipeline->stages->Run();
    if (!stats.ok()) {
      pipeline->broken = true;
      // The first callback failure caused the rest (c_api.h); else the runtime's own error.
      const std::optional<absl::Status> failure = pipeline->failures->first();
      return Annotate(failure.value_or(stats.status()), iteration);
    }
    std::vector<po_iteration_stats>& row = pipeline->stats.emplace_back();
    for (const IterationStats& stage : *stats) row.push_back(ToC(stage));
    if (on_iteration != nullptr) {
      PO_RETURN_IF_ERROR(Annotate(CallIterationCallback(on_iteration, user, i), iteration));
    }
  }
  return absl::OkStatus();
}

absl::Status PipelineStats(const po_pipeline* pipeline, std::int32_t iteration,
                           std::int32_t stage, po_iteration_stats* out) {
  PO_RETURN_IF_ERROR(NotNull(pipeline, "pipeline"));
  PO_RETURN_IF_ERROR(CheckIndex(stage, static_cast<std::size_t>(pipeline->stages->num_stages()),
                                "stage"));
  PO_RETURN_IF_ERROR(CheckIndex(iteration, pipeline->stats.size(),
                                "iteration (of the last run's finished ones)"));
  return WriteVersioned(pipeline->stats[static_cast<std::size_t>(iteration)]
                                       [static_cast<std::size_t>(stage)],
                        out, kIterationStatsSizeV1, "po_iteration_stats");
}

absl::Status PipelineSchedule(const po_pipeline* pipeline, po_schedule** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_RETURN_IF_ERROR(NotNull(pipeline, "pipeline"));
  *out = ScheduleHandleOf(pipeline->stages->stage(0)).release();
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipeoffload::c_api

namespace c_api = pipeoffload::c_api;

extern "C" {

void po_pipeline_options_init(po_pipeline_options* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
  options->backend = PO_BACKEND_CPU;
  options->nominal_chunk_time = 1.0;
  options->wait_timeout_seconds = pipeoffload::ExecutorOptions{}.wait_timeout_seconds;
}

po_status po_pipeline_open(const po_stage_callbacks* callbacks, int32_t num_stages,
                           const po_pipeline_options* options, po_pipeline** out) {
  return c_api::Boundary(
      __func__, [&] { return c_api::OpenPipeline(callbacks, num_stages, options, out); });
}

po_status po_pipeline_run(po_pipeline* pipeline, int32_t num_iterations,
                          po_iteration_fn on_iteration, void* user) {
  return c_api::Boundary(__func__, [&] {
    return c_api::RunPipeline(pipeline, num_iterations, on_iteration, user);
  });
}

po_status po_pipeline_num_stages(const po_pipeline* pipeline, int32_t* out) {
  return c_api::Boundary(__func__, [&] {
    PO_RETURN_IF_ERROR(c_api::NotNull(pipeline, "pipeline"));
    PO_RETURN_IF_ERROR(c_api::NotNull(out, "out"));
    *out = pipeline->stages->num_stages();
    return absl::OkStatus();
  });
}

po_status po_pipeline_stats(const po_pipeline* pipeline, int32_t iteration, int32_t stage,
                            po_iteration_stats* out) {
  return c_api::Boundary(
      __func__, [&] { return c_api::PipelineStats(pipeline, iteration, stage, out); });
}

po_status po_pipeline_schedule(const po_pipeline* pipeline, po_schedule** out) {
  return c_api::Boundary(__func__, [&] { return c_api::PipelineSchedule(pipeline, out); });
}

void po_pipeline_free(po_pipeline* pipeline) { delete pipeline; }

}  // extern "C"
