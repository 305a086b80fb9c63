// What gpt_train decides about its schedule before PipelineStage::Open (pipeoffload/pipeline.h)
// plans it: the job's spec from the flags or a --schedule-file, and the nominal chunk time.
// Pure functions of their inputs.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PLAN_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PLAN_H_

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "examples/gpt/train_options.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::gpt {

// Layers per chunk, n_layer / (p * v), but at least a quarter: a chunk without layers still
// embeds, runs the head or passes the residual stream on. gpt_train's nominal chunk time
// (StageCostOptions::nominal_chunk_time), so plans with different v compare.
double ChunkComputeUnits(int n_layer, int num_virtual_stages);

// The spec's placement once resolved (zbv and dualpipev imply v); the models' chunk layout.
Placement JobPlacement(const PipelineSpec& spec);

// The spec of the job: from a loaded schedule (which must have num_ranks stages and agree with
// the pipeline flags given explicitly: --stages, --chunks, --microbatches, --split-backward),
// else TrainSpec(options, num_ranks) (where an explicit --stages must equal num_ranks).
// `transport_name` ("mpi", "local") words the stage-count error.
// Errors: FailedPrecondition for a stage count that differs from the ranks, naming both and
// how to launch it; InvalidArgument for conflicting flags or a spec the compiler rejects;
// Unimplemented for a V-placement schedule (zbv, dualpipev, a file's placement v) with
// --backend cuda, whose V layout has not been run on a GPU yet (train_plan.cc).
[[nodiscard]] absl::StatusOr<PipelineSpec> JobSpec(const TrainOptions& options,
                                                   const std::optional<Schedule>& loaded,
                                                   int num_ranks, std::string_view transport_name);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PLAN_H_
