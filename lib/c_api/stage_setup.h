// What po_pipeline (every stage of one process) and po_stage (one rank's stage) read and write
// alike: the versioned pipeline options and callback tables, checked and turned into
// StageOptions, and the iteration stats handed back. Nothing here is exported.
#ifndef PIPEOFFLOAD_LIB_C_API_STAGE_SETUP_H_
#define PIPEOFFLOAD_LIB_C_API_STAGE_SETUP_H_

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "lib/c_api/c_api_internal.h"
#include "pipeoffload/c_api.h"
#include "pipeoffload/pipeline.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload::c_api {

inline constexpr std::size_t kIterationStatsSizeV1 = 96;

// `in` over po_pipeline_options_init's defaults, checked (reserved, timeouts, budget).
// `min_cuda_device` is the lowest cuda_device accepted: 0, or -1 where "this rank's local
// index" has a meaning (po_stage over NCCL).
[[nodiscard]] absl::StatusOr<po_pipeline_options> ReadPipelineOptions(
    const po_pipeline_options* in, int min_cuda_device);

// The StageOptions of a pipeline of `num_stages` stages: the one schedule source (its stage
// count must be num_stages, unless num_stages is 0: not known yet; FailedPrecondition otherwise, saying "the schedule has S stages
// but <num_stages> <stage_count_source> (one per stage)"), nominal costs, the timeouts and
// the arena budget.
[[nodiscard]] absl::StatusOr<StageOptions> ToStageOptions(const po_pipeline_options& options,
                                                          int num_stages,
                                                          std::string_view stage_count_source);

// Callback table d of the caller's array, whose stride is the first table's struct_size (the
// caller's sizeof; c_api.h). Checks what must be set, and that every table's boundary_bytes is
// the first's.
[[nodiscard]] absl::StatusOr<po_stage_callbacks> ReadCallbacks(const po_stage_callbacks* tables,
                                                               int d);

// The C view of one stage's measured iteration.
po_iteration_stats ToC(const IterationStats& stats);

// A new po_schedule holding the schedule `stage` runs, with the predictions and cost model it
// was planned (or re-simulated) with (po_pipeline_schedule, po_stage_schedule).
std::unique_ptr<po_schedule> ScheduleHandleOf(const PipelineStage& stage);

}  // namespace pipeoffload::c_api

#endif  // PIPEOFFLOAD_LIB_C_API_STAGE_SETUP_H_
