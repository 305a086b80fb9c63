// The schedule gpt_train runs and the numbers around it (see train_plan.h).
#include "examples/gpt/train_plan.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/gpt_params.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"

namespace pipeoffload::gpt {

CostModel TrainCostModel(const std::vector<std::int64_t>& saved_bytes, std::int64_t boundary_bytes,
                         double chunk_units) {
  CostModel cost;
  cost.forward_time = chunk_units;
  cost.backward_time = chunk_units;
  cost.weight_time = chunk_units;
  cost.activation_bytes_per_virtual_stage = saved_bytes;
  cost.activation_bytes = *std::max_element(saved_bytes.begin(), saved_bytes.end());
  cost.boundary_bytes = boundary_bytes;
  const double bandwidth =
      static_cast<double>(cost.activation_bytes) / (kTransferUnits * chunk_units);
  cost.d2h_bandwidth = bandwidth;
  cost.h2d_bandwidth = bandwidth;
  cost.duplex_bandwidth = bandwidth;  // the CPU backend's two copy threads do not slow each other
  cost.p2p_bandwidth =
      static_cast<double>(std::max<std::int64_t>(boundary_bytes, 1)) / (0.1 * chunk_units);
  cost.p2p_latency = 0.0;
  return cost;
}

ChunkTimes MeanChunkTimes(const StageCosts& costs) {
  ChunkTimes mean;
  for (const ChunkTimes& chunk : costs.chunks) {
    mean.forward += chunk.forward;
    mean.backward += chunk.backward;
  }
  const double n = static_cast<double>(costs.chunks.size());
  return ChunkTimes{mean.forward / n, mean.backward / n};
}

LinkFigures SlowestLink(const std::vector<StageCosts>& stages) {
  LinkFigures slowest = stages.front().link;
  for (const StageCosts& stage : stages) {
    slowest.d2h = std::min(slowest.d2h, stage.link.d2h);
    slowest.h2d = std::min(slowest.h2d, stage.link.h2d);
    slowest.duplex = std::min(slowest.duplex, stage.link.duplex);
  }
  return slowest;
}

CostModel MeasuredTrainCostModel(const std::vector<std::int64_t>& saved_bytes,
                                 std::int64_t boundary_bytes,
                                 const std::vector<StageCosts>& stages, int stages_per_device) {
  const double share = static_cast<double>(stages_per_device);
  std::vector<ChunkTimes> means;
  for (const StageCosts& stage : stages) means.push_back(MeanChunkTimes(stage));
  double f = means.front().forward;
  double b = means.front().backward;
  for (const ChunkTimes& mean : means) {
    f = std::min(f, mean.forward);
    b = std::min(b, mean.backward);
  }
  CostModel cost;
  cost.forward_time = share * f;
  cost.backward_time = share * b / 2.0;
  cost.weight_time = share * b / 2.0;
  for (const ChunkTimes& mean : means) {
    cost.stage_time_scale.push_back((mean.forward + mean.backward) / (f + b));
  }
  cost.activation_bytes_per_virtual_stage = saved_bytes;
  cost.activation_bytes = *std::max_element(saved_bytes.begin(), saved_bytes.end());
  cost.boundary_bytes = boundary_bytes;
  const LinkFigures link = SlowestLink(stages);
  cost.d2h_bandwidth = link.d2h / share;
  cost.h2d_bandwidth = link.h2d / share;
  cost.duplex_bandwidth = link.duplex / share;
  cost.host_link_group_size = 1;
  return cost;
}

double ChunkComputeUnits(int n_layer, int num_virtual_stages) {
  return std::max(0.25, static_cast<double>(n_layer) / std::max(num_virtual_stages, 1));
}

absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string why =
        absl::StrCat("cannot read schedule file ", path, ": ", std::strerror(error));
    return error == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<Schedule> schedule = ParseScheduleJson(text.str());
  if (!schedule.ok()) {
    return Annotate(schedule.status(), absl::StrCat("schedule file ", path, " is corrupted"));
  }
  if (absl::Status valid = Validate(*schedule); !valid.ok()) {
    return Annotate(valid, absl::StrCat("schedule file ", path, " is not a valid schedule"));
  }
  return schedule;
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

absl::StatusOr<Schedule> PlanSchedule(const PipelineSpec& spec,
                                      const std::optional<Schedule>& loaded, const CostModel& cost,
                                      double memory_budget_share) {
  if (!loaded.has_value() && spec.offload == OffloadPolicy::kAuto && memory_budget_share > 0) {
    // The share's base: the largest stage's stash peak of the same order without offload.
    PipelineSpec plain = spec;
    plain.offload = OffloadPolicy::kNone;
    absl::StatusOr<Schedule> baseline = Compile(plain, cost);
    if (!baseline.ok()) return Annotate(baseline.status(), "auto: the plan without offload");
    std::int64_t peak = 0;
    if (baseline->predictions.has_value()) {
      const std::vector<StagePrediction>& stages = baseline->predictions.value().stages;
      for (std::size_t d = 0; d < stages.size(); ++d) peak = std::max(peak, stages[d].peak_bytes);
    }
    PipelineSpec budgeted = spec;
    budgeted.memory_budget_bytes = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(memory_budget_share * static_cast<double>(peak)));
    return Compile(budgeted, cost);
  }
  if (!loaded.has_value()) return Compile(spec, cost);
  Schedule schedule = *loaded;
  absl::StatusOr<Timeline> timeline = Simulate(schedule, cost);
  if (!timeline.ok()) return Annotate(timeline.status(), "simulating the schedule file");
  schedule.predictions = std::move(timeline->predictions);
  return schedule;
}

std::int64_t DefaultArenaBytes(const StageProgram& program, const StagePrediction& prediction,
                               std::int64_t boundary_bytes, std::int64_t alignment,
                               std::int64_t largest_entry_bytes, const P2PLifetimes* p2p) {
  const auto aligned = [&](std::int64_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  };
  std::int64_t buffers = 0;
  for (const Op& op : program.ops) {
    if (op.kind == OpKind::kForward || op.kind == OpKind::kBackward ||
        op.kind == OpKind::kRecvActivation || op.kind == OpKind::kRecvGrad) {
      ++buffers;
    }
  }
  const std::int64_t stash = prediction.peak_bytes + prediction.peak_units * alignment;
  const std::int64_t p2p_bytes =
      p2p != nullptr ? P2PBoundBytes(*p2p, std::max<std::int64_t>(boundary_bytes, 1), alignment)
                     : buffers * aligned(std::max<std::int64_t>(boundary_bytes, 1));
  const std::int64_t total = stash + p2p_bytes;
  return aligned(total + total / 4 + alignment + aligned(largest_entry_bytes));
}

std::uint64_t ScheduleFingerprint(const Schedule& schedule) {
  const std::string json = ScheduleToJson(schedule);
  return Fnv1a64(json.data(), static_cast<std::int64_t>(json.size()));
}

}  // namespace pipeoffload::gpt
