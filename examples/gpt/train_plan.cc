// The job's spec and nominal chunk time (see train_plan.h).
#include "examples/gpt/train_plan.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload::gpt {

double ChunkComputeUnits(int n_layer, int num_virtual_stages) {
  return std::max(0.25, static_cast<double>(n_layer) / std::max(num_virtual_stages, 1));
}

Placement JobPlacement(const PipelineSpec& spec) {
  absl::StatusOr<PipelineSpec> resolved = ResolveSpec(spec);
  return resolved.ok() ? resolved->placement : spec.placement;
}

namespace {

// GptCudaStageModel follows the placement (GptCudaStageOptions::placement) as the CPU model
// does, but its V layout has not run on a GPU yet (gpt_cuda_gpu_tests' "zbv and dualpipev"
// case proves it bitwise against 1F1B); until it has, --backend cuda refuses V schedules here,
// before any device is touched.
absl::Status CheckModelPlacement(const TrainOptions& options, const PipelineSpec& spec,
                                 const std::string& source) {
  if (options.backend != TrainBackend::kCuda) return absl::OkStatus();
  absl::StatusOr<PipelineSpec> resolved = ResolveSpec(spec);
  if (!resolved.ok() || resolved->placement != Placement::kV) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      source, " is ", std::string(FamilyName(resolved->family)),
      " with placement v (chunk 1 of stage d is virtual stage 2p - 1 - d), which --backend cuda "
      "does not run yet (the CUDA GPT's V layout is untested on a GPU); use a loop-placement "
      "schedule (1f1b, interleaved, group-interleaved) or --backend cpu"));
}

}  // namespace

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
    PO_ASSIGN_OR_RETURN(PipelineSpec spec, TrainSpec(options, num_ranks));
    const std::string source = options.family.empty()
                                   ? absl::StrCat("--schedule ", options.schedule)
                                   : absl::StrCat("--family ", options.family);
    PO_RETURN_IF_ERROR(CheckModelPlacement(options, spec, source));
    return spec;
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
  PO_RETURN_IF_ERROR(CheckModelPlacement(options, spec, source));
  return spec;
}

}  // namespace pipeoffload::gpt
