// The job's spec and nominal chunk time (see train_plan.h).
#include "examples/gpt/train_plan.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload::gpt {

double ChunkComputeUnits(int n_layer, int num_virtual_stages) {
  return std::max(0.25, static_cast<double>(n_layer) / std::max(num_virtual_stages, 1));
}

Placement JobPlacement(const PipelineSpec& spec) {
  absl::StatusOr<PipelineSpec> resolved = ResolveSpec(spec);
  return resolved.ok() ? resolved->placement : spec.placement;
}

absl::StatusOr<PipelineSpec> JobSpec(const TrainOptions& options,
                                     const std::optional<Schedule>& loaded, int num_ranks,
                                     std::string_view transport_name) {
  const std::string transport(transport_name);
  const auto mismatch = [&](int stages, const std::string& source) {
    return absl::FailedPreconditionError(
        absl::StrCat("the schedule has ", stages, " stages (", source, ") but the ", transport,
                     " job has ", num_ranks, " ranks; gpt_train runs one rank per stage (",
                     transport_name == "mpi" ? absl::StrCat("mpirun -np ", stages)
                                             : absl::StrCat("--stages ", stages),
                     ")"));
  };
  if (!loaded.has_value()) {
    if (options.stages_given && options.stages != num_ranks) {
      return mismatch(options.stages, absl::StrCat("--stages ", options.stages));
    }
    return TrainSpec(options, num_ranks);
  }
  const PipelineSpec& spec = loaded->spec;
  const std::string source = absl::StrCat("--schedule-file ", options.schedule_file);
  if (spec.num_stages != num_ranks) return mismatch(spec.num_stages, source);
  const auto conflict = [&](const char* flag, std::int64_t given, std::int64_t in_file) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", given, " conflicts with ", source,
                                                   ", which has ", in_file,
                                                   "; drop the flag or use another file"));
  };
  if (options.stages_given && options.stages != spec.num_stages) {
    return conflict("--stages", options.stages, spec.num_stages);
  }
  if (options.chunks_given && options.chunks != spec.chunks_per_stage) {
    return conflict("--chunks", options.chunks, spec.chunks_per_stage);
  }
  if (options.microbatches_given && options.config.num_microbatches != spec.num_microbatches) {
    return conflict("--microbatches", options.config.num_microbatches, spec.num_microbatches);
  }
  if (options.split_given && !spec.split_backward) {
    return absl::InvalidArgumentError(
        absl::StrCat("--split-backward conflicts with ", source, ", which has no W ops"));
  }
  return spec;
}

}  // namespace pipeoffload::gpt
