// po_schedule's life: compile a spec, parse or load a file, free. Every handle made here holds
// a schedule that passed Validate, which is what lets the read-only calls (inspect.cc,
// export.cc, predictions.cc) simulate and render it without checking it again.
#include <algorithm>
#include <memory>
#include <utility>

#include "lib/base/status_macros.h"
#include "lib/ir/declared_offload.h"
#include "lib/c_api/c_api_internal.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_planner.h"

namespace pipeoffload::c_api {
namespace {

absl::Status Publish(Schedule schedule, CostChoice choice, po_schedule** out) {
  auto handle = std::make_unique<po_schedule>();
  handle->schedule = std::move(schedule);
  handle->cost = std::move(choice.cost);
  handle->unit_costs = choice.unit_costs;
  *out = handle.release();
  return absl::OkStatus();
}

bool HasComm(const Schedule& schedule) {
  return std::any_of(schedule.stages.begin(), schedule.stages.end(),
                     [](const StageProgram& program) {
                       return std::any_of(program.ops.begin(), program.ops.end(),
                                          [](const Op& op) { return IsP2P(op.kind); });
                     });
}

// A PyTorch CSV as po-schedule import reads it: a compute-only file (or one whose pipeline has
// no neighbours to talk to) gets its SEND/RECV pairs from the compiler's lowering.
absl::StatusOr<Schedule> ParseCsv(std::string_view data, const po_load_options& options) {
  if (options.num_stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "po_load_options.num_stages must be >= 1 for a PyTorch CSV, which does not record "
        "the pipeline's ranks (got ",
        options.num_stages, ")"));
  }
  PO_ASSIGN_OR_RETURN(const Family hint, FamilyNamed(options.family, "po_load_options.family"));
  PO_ASSIGN_OR_RETURN(Schedule schedule, ParsePyTorchCsv(data, options.num_stages, hint));
  if (HasComm(schedule) || schedule.spec.num_stages == 1) return schedule;
  return LowerCommunication(schedule);
}

absl::StatusOr<Schedule> ParseAny(std::string_view data, const po_load_options& options) {
  switch (options.format) {
    case PO_FORMAT_JSON: {
      PO_ASSIGN_OR_RETURN(Schedule schedule, ParseScheduleJson(data));
      PO_RETURN_IF_ERROR(internal::CheckDeclaredOffload(schedule));
      return schedule;
    }
    case PO_FORMAT_PYTORCH_CSV:
    case PO_FORMAT_PYTORCH_CSV_COMMS:
      return ParseCsv(data, options);
    case PO_FORMAT_TEXT:
    case PO_FORMAT_TRACE:
    case PO_FORMAT_SVG:
      return absl::InvalidArgumentError(absl::StrCat(
          "po_load_options.format ", options.format,
          " is written for humans and tools and cannot be read back; load PO_FORMAT_JSON or a "
          "PyTorch CSV"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "po_load_options.format: unknown format ", options.format,
          "; expected PO_FORMAT_JSON (0), PO_FORMAT_PYTORCH_CSV (2) or _COMMS (3)"));
  }
}

absl::Status ParseInto(std::string_view data, const po_load_options* load,
                       const po_cost_options* cost, std::string_view source,
                       po_schedule** out) {
  po_load_options defaults;
  po_load_options_init(&defaults);
  PO_ASSIGN_OR_RETURN(const po_load_options options,
                      ReadVersioned(load, defaults, kLoadOptionsSizeV1, "po_load_options"));
  if (options.reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("po_load_options.reserved must be 0 (got ", options.reserved, ")"));
  }
  PO_ASSIGN_OR_RETURN(CostChoice choice, ToCostModel(cost));
  // Errors name the file they came from, when there is one.
  const auto from_source = [&](const absl::Status& status) {
    return source.empty() ? status : Annotate(status, source);
  };
  absl::StatusOr<Schedule> schedule = ParseAny(data, options);
  if (!schedule.ok()) return from_source(schedule.status());
  // The read-only calls rely on this (file comment); a file that breaks an invariant is the
  // caller's to fix, and Validate's message says where.
  if (absl::Status valid = Validate(*schedule); !valid.ok()) return from_source(valid);
  return Publish(*std::move(schedule), std::move(choice), out);
}

absl::Status CompileSchedule(const po_spec* spec, const po_cost_options* cost,
                             po_schedule** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_ASSIGN_OR_RETURN(const PipelineSpec pipeline, ToPipelineSpec(spec));
  PO_ASSIGN_OR_RETURN(CostChoice choice, ToCostModel(cost));
  PO_ASSIGN_OR_RETURN(Schedule schedule, Compile(pipeline, choice.cost));
  // auto may cut the same layers into another v; its predictions come from the re-cut model
  // (offload_planner.h), and so must any later simulation of this handle.
  choice.cost = internal::RechunkedCost(choice.cost, pipeline.chunks_per_stage,
                                        schedule.spec.chunks_per_stage);
  return Publish(std::move(schedule), std::move(choice), out);
}

absl::Status ParseSchedule(const char* data, std::size_t size, const po_load_options* options,
                           const po_cost_options* cost, po_schedule** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  if (size > 0) {
    PO_RETURN_IF_ERROR(NotNull(data, "data"));
  }
  return ParseInto(std::string_view(data, size), options, cost, /*source=*/"", out);
}

absl::Status LoadSchedule(const char* path, const po_load_options* options,
                          const po_cost_options* cost, po_schedule** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_RETURN_IF_ERROR(NotNull(path, "path"));
  PO_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  return ParseInto(text, options, cost, path, out);
}

}  // namespace
}  // namespace pipeoffload::c_api

namespace c_api = pipeoffload::c_api;

extern "C" {

po_status po_schedule_compile(const po_spec* spec, const po_cost_options* cost,
                              po_schedule** out) {
  return c_api::Boundary(__func__, [&] { return c_api::CompileSchedule(spec, cost, out); });
}

po_status po_schedule_parse(const char* data, size_t size, const po_load_options* options,
                            const po_cost_options* cost, po_schedule** out) {
  return c_api::Boundary(__func__,
                         [&] { return c_api::ParseSchedule(data, size, options, cost, out); });
}

po_status po_schedule_load(const char* path, const po_load_options* options,
                           const po_cost_options* cost, po_schedule** out) {
  return c_api::Boundary(__func__,
                         [&] { return c_api::LoadSchedule(path, options, cost, out); });
}

void po_schedule_free(po_schedule* schedule) { delete schedule; }

}  // extern "C"
