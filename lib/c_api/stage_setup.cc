// The option and callback readers shared by po_pipeline and po_stage (stage_setup.h).
#include "lib/c_api/stage_setup.h"

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "lib/base/status_macros.h"
#include "lib/c_api/c_api_internal.h"

namespace pipeoffload::c_api {
namespace {

constexpr std::size_t kPipelineOptionsSizeV1 = 64;
constexpr std::size_t kStageCallbacksSizeV1 = 56;
// Fields appended since the first release start past its size (no implicit padding).
static_assert(offsetof(po_stage_callbacks, retained_bytes) == kStageCallbacksSizeV1);
static_assert(offsetof(po_stage_callbacks, recompute) + 8 ==
              offsetof(po_stage_callbacks, backward_reads_retained));
static_assert(offsetof(po_stage_callbacks, backward_reads_retained) + 8 ==
              sizeof(po_stage_callbacks));
static_assert(offsetof(po_iteration_stats, recompute_seconds) == kIterationStatsSizeV1);
static_assert(offsetof(po_iteration_stats, recompute_seconds) + 8 == sizeof(po_iteration_stats));
static_assert(offsetof(po_compute_args, recompute) == 72);  // the first release's sizeof
static_assert(offsetof(po_compute_args, retained_bytes) + 8 == sizeof(po_compute_args));
static_assert(PO_RECOMPUTE_NONE == static_cast<int>(Recompute::kNone));
static_assert(PO_RECOMPUTE_LEAN == static_cast<int>(Recompute::kLean));
static_assert(PO_RECOMPUTE_FULL == static_cast<int>(Recompute::kFull));

// Exactly one schedule source, as StageOptions wants it.
absl::Status ReadScheduleSource(const po_pipeline_options& options, int num_stages,
                                std::string_view stage_count_source, StageOptions& out) {
  const int sources = (options.spec != nullptr) + (options.schedule != nullptr) +
                      (options.schedule_file != nullptr);
  if (sources != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "po_pipeline_options: give exactly one of spec, schedule and schedule_file (got ",
        sources, ")"));
  }
  int stages_in_schedule = num_stages;
  if (options.spec != nullptr) {
    PO_ASSIGN_OR_RETURN(out.spec, ToPipelineSpec(options.spec));
    stages_in_schedule = out.spec->num_stages;
  } else if (options.schedule != nullptr) {
    out.schedule = options.schedule->schedule;
    stages_in_schedule = out.schedule->spec.num_stages;
  } else {
    out.schedule_file = options.schedule_file;  // Open checks its stage count
  }
  if (num_stages > 0 && stages_in_schedule != num_stages) {
    return absl::FailedPreconditionError(
        absl::StrCat("the schedule has ", stages_in_schedule, " stages but ", num_stages, " ",
                     std::string(stage_count_source), " (one per stage)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<po_pipeline_options> ReadPipelineOptions(const po_pipeline_options* in,
                                                     int min_cuda_device) {
  po_pipeline_options defaults;
  po_pipeline_options_init(&defaults);
  PO_ASSIGN_OR_RETURN(const po_pipeline_options options,
                      ReadVersioned(in, defaults, kPipelineOptionsSizeV1, "po_pipeline_options"));
  if (options.reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("po_pipeline_options.reserved must be 0 (got ", options.reserved, ")"));
  }
  if (!(options.nominal_chunk_time > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "po_pipeline_options.nominal_chunk_time must be > 0 (got ", options.nominal_chunk_time,
        ")"));
  }
  if (options.cuda_device < min_cuda_device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "po_pipeline_options.cuda_device must be >= ", min_cuda_device, " (got ",
        options.cuda_device, ")"));
  }
  if (options.arena_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("po_pipeline_options.arena_budget_bytes must be >= 0 (got ",
                     options.arena_budget_bytes, ")"));
  }
  return options;
}

absl::StatusOr<StageOptions> ToStageOptions(const po_pipeline_options& options, int num_stages,
                                            std::string_view stage_count_source) {
  StageOptions stage;
  PO_RETURN_IF_ERROR(ReadScheduleSource(options, num_stages, stage_count_source, stage));
  stage.costs.source = CostSource::kNominal;
  stage.costs.nominal_chunk_time = options.nominal_chunk_time;
  stage.executor.wait_timeout_seconds = options.wait_timeout_seconds;  // Open checks it
  stage.arena.budget_bytes = options.arena_budget_bytes;
  return stage;
}

// Callback table d of the caller's array, whose stride is the first table's struct_size (the
// caller's sizeof; c_api.h). Checks what must be set.
absl::StatusOr<po_stage_callbacks> ReadCallbacks(const po_stage_callbacks* tables, int d) {
  const std::uint32_t stride = tables[0].struct_size;
  const auto* table = reinterpret_cast<const po_stage_callbacks*>(
      reinterpret_cast<const char*>(tables) + static_cast<std::size_t>(d) * stride);
  const std::string name = absl::StrCat("po_stage_callbacks[", d, "]");
  if (table->struct_size != stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".struct_size is ", table->struct_size, " but [0]'s is ", stride,
        "; every table of the array has the caller's sizeof"));
  }
  po_stage_callbacks defaults;
  po_stage_callbacks_init(&defaults);
  absl::StatusOr<po_stage_callbacks> read =
      ReadVersioned(table, defaults, kStageCallbacksSizeV1, "po_stage_callbacks");
  if (!read.ok()) return Annotate(read.status(), absl::StrCat("stage ", d));
  const po_stage_callbacks callbacks = *read;
  if (callbacks.reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".reserved must be 0 (got ", callbacks.reserved, ")"));
  }
  const std::pair<const void*, const char*> required[] = {
      {reinterpret_cast<const void*>(callbacks.saved_bytes), "saved_bytes"},
      {reinterpret_cast<const void*>(callbacks.forward), "forward"},
      {reinterpret_cast<const void*>(callbacks.backward), "backward"}};
  for (const auto& [function, field] : required) {
    PO_RETURN_IF_ERROR(NotNull(function, absl::StrCat(name, ".", field)));
  }
  // Recompute is offered whole or not at all: half a table would fail mid-run instead.
  const int recompute_set = (callbacks.retained_bytes != nullptr) +
                            (callbacks.forward_retaining != nullptr) +
                            (callbacks.recompute != nullptr);
  if (recompute_set != 0 && recompute_set != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": set all of retained_bytes, forward_retaining and recompute, or none (",
        recompute_set, " of 3 are set)"));
  }
  if (callbacks.backward_reads_retained != nullptr && recompute_set == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": backward_reads_retained is set without the recompute callbacks (retained_bytes, "
              "forward_retaining, recompute); it only says how B reads what they keep"));
  }
  if (callbacks.boundary_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".boundary_bytes must be > 0 (got ",
                                                   callbacks.boundary_bytes, ")"));
  }
  if (d > 0 && callbacks.boundary_bytes != tables[0].boundary_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".boundary_bytes is ", callbacks.boundary_bytes, " but stage 0's is ",
        tables[0].boundary_bytes, "; every stage passes activations of one size"));
  }
  return callbacks;
}

po_iteration_stats ToC(const IterationStats& stats) {
  po_iteration_stats out;
  std::memset(&out, 0, sizeof(out));
  out.struct_size = sizeof(out);
  out.stage = stats.stage;
  out.stash_high_water_bytes = stats.stash_high_water_bytes;
  out.stash_physical_high_water_bytes = stats.stash_physical_high_water_bytes;
  out.stash_high_water_entries = stats.stash_high_water_entries;
  out.p2p_high_water_bytes = stats.p2p_high_water_bytes;
  out.host_high_water_bytes = stats.host_high_water_bytes;
  out.offloaded_bytes = stats.offloaded_bytes;
  out.reloaded_bytes = stats.reloaded_bytes;
  out.start_time = stats.start_time;
  out.end_time = stats.end_time;
  out.compute_seconds = stats.compute_seconds;
  out.wait_seconds = stats.wait_seconds;
  out.recompute_seconds = stats.recompute_seconds;
  return out;
}

std::unique_ptr<po_schedule> ScheduleHandleOf(const PipelineStage& stage) {
  auto handle = std::make_unique<po_schedule>();
  handle->schedule = stage.schedule();
  handle->cost = stage.plan().planned_with;
  handle->unit_costs = true;  // nominal costs: a chunk takes nominal_chunk_time units
  return handle;
}

}  // namespace pipeoffload::c_api
