// po_stage (c_api.h, "one rank's stage"): this process's stage of a pipeline whose stages are
// the ranks of an MPI job, as a PipelineStage (pipeline.h) over the caller's callbacks. Open
// joins the job (rank_transport.h) and opens the stage collectively; run gathers every rank's
// outcome after each iteration, so that all ranks succeed or fail together with one message.
//
// State: open until a run fails, then broken (reads and free only), as po_pipeline. Members die
// in the order the stage needs: the stage first, then its model, and the job last (its rank
// group finalizes MPI).
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/status_macros.h"
#include "lib/c_api/c_api_internal.h"
#include "lib/c_api/rank_transport.h"
#include "lib/c_api/stage_backends.h"
#include "lib/c_api/stage_callbacks.h"
#include "lib/c_api/stage_setup.h"
#include "pipeoffload/pipeline.h"

struct po_stage {
  pipeoffload::c_api::RankJob job;  // destroyed last
  std::unique_ptr<pipeoffload::c_api::CallbackFailures> failures;
  std::unique_ptr<pipeoffload::c_api::CallbackStageModel> model;
  std::unique_ptr<pipeoffload::PipelineStage> stage;  // destroyed first
  std::vector<po_iteration_stats> stats;              // [iteration] of the last run
  bool broken = false;                                // a run failed
};

namespace pipeoffload::c_api {
namespace {

// Chunks per stage the MPI transport's tags must encode: the schedule's where it is known
// before the file is read, else a bound large enough for any schedule this library compiles
// (a larger one fails its first message with an error naming both numbers).
int MaxChunks(const StageOptions& options) {
  if (options.spec.has_value()) return options.spec->chunks_per_stage;
  if (options.schedule.has_value()) return options.schedule->spec.chunks_per_stage;
  return 64;
}

absl::Status OpenStage(const po_stage_callbacks* callbacks, const po_pipeline_options* options,
                       std::int32_t transport, po_stage** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_RETURN_IF_ERROR(NotNull(callbacks, "callbacks"));
  PO_ASSIGN_OR_RETURN(const po_pipeline_options chosen,
                      ReadPipelineOptions(options, /*min_cuda_device=*/-1));
  PO_ASSIGN_OR_RETURN(const po_stage_callbacks table, ReadCallbacks(callbacks, 0));
  // The stage count is the job's, known once it is joined; check the rest of the options first
  // (ToStageOptions checks the source again against the job's size below).
  PO_ASSIGN_OR_RETURN(const StageOptions unchecked, ToStageOptions(chosen, 0, ""));
  auto stage = std::make_unique<po_stage>();
  PO_ASSIGN_OR_RETURN(stage->job, JoinRankJob(transport, chosen, MaxChunks(unchecked)));
  const int rank = stage->job.transport->rank();
  const int ranks = stage->job.transport->size();
  PO_ASSIGN_OR_RETURN(StageOptions stage_options,
                      ToStageOptions(chosen, ranks, "ranks are in the job"));
  stage_options.backend = stage->job.backend.get();
  stage_options.transport = stage->job.transport.get();
  stage_options.group = stage->job.group.get();
  stage->failures = std::make_unique<CallbackFailures>();
  stage->model = std::make_unique<CallbackStageModel>(table, rank, *stage->failures);
  absl::StatusOr<std::unique_ptr<PipelineStage>> opened =
      PipelineStage::Open(stage_options, *stage->model);
  // A saved_bytes answer <= 0 is this rank's reason, whatever Open says.
  if (std::optional<absl::Status> failure = stage->failures->first()) return *failure;
  if (!opened.ok()) return opened.status();
  stage->stage = *std::move(opened);
  const Schedule& schedule = stage->stage->schedule();
  if (schedule.spec.split_backward && table.backward_weight == nullptr) {
    return absl::InvalidArgumentError(
        "po_stage_callbacks.backward_weight is NULL, but the schedule splits W");
  }
  PO_ASSIGN_OR_RETURN(const std::uint64_t stream, ComputeStreamHandle(stage->job.backend.get()));
  stage->model->Prepare(stream, schedule.spec.split_backward, schedule.spec.chunks_per_stage);
  if (std::optional<absl::Status> failure = stage->failures->first()) return *failure;
  *out = stage.release();
  return absl::OkStatus();
}

absl::Status RunStage(po_stage* stage, std::int32_t num_iterations, po_iteration_fn on_iteration,
                      void* user) {
  PO_RETURN_IF_ERROR(NotNull(stage, "stage"));
  if (num_iterations < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_iterations must be >= 1 (got ", num_iterations, ")"));
  }
  if (stage->broken) {
    return absl::FailedPreconditionError(
        "an earlier run of this stage failed, and messages of that iteration may still sit "
        "between the ranks; free it and open a new one");
  }
  stage->stats.clear();
  for (int i = 0; i < num_iterations; ++i) {
    const std::string iteration = absl::StrCat("iteration ", i);
    absl::StatusOr<IterationStats> stats = stage->stage->Run();
    // This rank's reason: its own callback's failure, which caused the rest (c_api.h), else
    // the runtime's; then every rank's, so that all of them report the same.
    absl::Status mine = stats.status();
    if (std::optional<absl::Status> failure = stage->failures->first()) mine = *failure;
    absl::StatusOr<std::vector<std::string>> agreed =
        AllGatherChecked(*stage->job.group, mine, "", iteration);
    if (!agreed.ok()) {
      stage->broken = true;
      return agreed.status();
    }
    stage->stats.push_back(ToC(*stats));
    if (on_iteration != nullptr) {
      PO_RETURN_IF_ERROR(Annotate(CallIterationCallback(on_iteration, user, i), iteration));
    }
  }
  return absl::OkStatus();
}

absl::Status StageStats(const po_stage* stage, std::int32_t iteration, po_iteration_stats* out) {
  PO_RETURN_IF_ERROR(NotNull(stage, "stage"));
  PO_RETURN_IF_ERROR(
      CheckIndex(iteration, stage->stats.size(), "iteration (of the last run's finished ones)"));
  return WriteVersioned(stage->stats[static_cast<std::size_t>(iteration)], out,
                        kIterationStatsSizeV1, "po_iteration_stats");
}

absl::Status StageSchedule(const po_stage* stage, po_schedule** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_RETURN_IF_ERROR(NotNull(stage, "stage"));
  *out = ScheduleHandleOf(*stage->stage).release();
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipeoffload::c_api

namespace c_api = pipeoffload::c_api;

extern "C" {

po_status po_stage_open(const po_stage_callbacks* callbacks, const po_pipeline_options* options,
                        int32_t transport, po_stage** out) {
  return c_api::Boundary(
      __func__, [&] { return c_api::OpenStage(callbacks, options, transport, out); });
}

po_status po_stage_run(po_stage* stage, int32_t num_iterations, po_iteration_fn on_iteration,
                       void* user) {
  return c_api::Boundary(
      __func__, [&] { return c_api::RunStage(stage, num_iterations, on_iteration, user); });
}

po_status po_stage_rank(const po_stage* stage, int32_t* rank, int32_t* num_stages) {
  return c_api::Boundary(__func__, [&] {
    PO_RETURN_IF_ERROR(c_api::NotNull(stage, "stage"));
    PO_RETURN_IF_ERROR(c_api::NotNull(rank, "rank"));
    PO_RETURN_IF_ERROR(c_api::NotNull(num_stages, "num_stages"));
    *rank = stage->job.transport->rank();
    *num_stages = stage->job.transport->size();
    return absl::OkStatus();
  });
}

po_status po_stage_stats(const po_stage* stage, int32_t iteration, po_iteration_stats* out) {
  return c_api::Boundary(__func__, [&] { return c_api::StageStats(stage, iteration, out); });
}

po_status po_stage_schedule(const po_stage* stage, po_schedule** out) {
  return c_api::Boundary(__func__, [&] { return c_api::StageSchedule(stage, out); });
}

void po_stage_free(po_stage* stage) { delete stage; }

}  // extern "C"
