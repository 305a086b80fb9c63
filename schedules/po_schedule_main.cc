// po-schedule: the command-line face of the schedule compiler (see UsageText for the options).
// Exit codes: 0 success, 2 bad input (options, files, specs), 1 anything else.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/base/bounded_file.h"
#include "lib/base/status_macros.h"
#include "lib/ir/declared_offload.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/timeline_svg.h"
#include "pipeoffload/trace.h"
#include "pipeoffload/validate.h"
#include "schedules/cli_options.h"
#include "schedules/offload_planner.h"
#include "schedules/report.h"

namespace pipeoffload::cli {
namespace {

absl::Status WriteOutput(const CliOptions& options, const std::string& text) {
  if (options.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return absl::OkStatus();
  }
  std::ofstream out(options.out, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write \"", options.out, "\""));
  std::fprintf(stderr, "po-schedule: wrote %s\n", options.out.c_str());
  return absl::OkStatus();
}

ReportUnits Units(const CliOptions& options) {
  return {options.unit_costs, options.cost.activation_bytes};
}

// Renders a schedule that carries predictions in the requested format.
// `cost` is the model the schedule was planned with (auto may re-cut the chunks).
absl::StatusOr<std::string> Render(const CliOptions& options, const Schedule& schedule,
                                   const CostModel& cost) {
  const std::string& format = options.format;
  if (format == "table") return FormatScheduleTable(schedule, Units(options));
  if (format == "text") return ScheduleToText(schedule);
  if (format == "json") return ScheduleToJson(schedule);
  if (format == "pytorch-csv") return ScheduleToPyTorchCsv(schedule, CsvFlavor::kComputeOnly);
  if (format == "pytorch-csv-comms") {
    return ScheduleToPyTorchCsv(schedule, CsvFlavor::kComputeComms);
  }
  PO_ASSIGN_OR_RETURN(const Timeline timeline, Simulate(schedule, cost));
  if (format == "svg") return TimelineToSvg(schedule, timeline, {options.unit_costs});
  return TimelineToTraceJson(schedule, timeline, options.unit_costs ? 1000.0 : 1e6);
}

// Validates and simulates a schedule that came from a file, keeping its spec.
absl::StatusOr<Schedule> CheckAndPredict(Schedule schedule, const CostModel& cost) {
  PO_RETURN_IF_ERROR(Validate(schedule));
  PO_ASSIGN_OR_RETURN(Timeline timeline, Simulate(schedule, cost));
  schedule.predictions = std::move(timeline.predictions);
  return schedule;
}

absl::Status RunCompile(const CliOptions& options) {
  std::vector<std::string> alternatives;
  absl::StatusOr<Schedule> schedule =
      options.spec.offload == OffloadPolicy::kAuto
          ? internal::PlanAuto(options.spec, options.cost,
                               options.show_alternatives ? &alternatives : nullptr)
          : Compile(options.spec, options.cost);
  for (const std::string& line : alternatives) std::fprintf(stderr, "auto: %s\n", line.c_str());
  PO_RETURN_IF_ERROR(schedule.status());
  const CostModel cost = internal::RechunkedCost(options.cost, options.spec.chunks_per_stage,
                                                 schedule->spec.chunks_per_stage);
  PO_ASSIGN_OR_RETURN(const std::string text, Render(options, *schedule, cost));
  return WriteOutput(options, text);
}

absl::Status RunCompare(const CliOptions& options) {
  PipelineSpec baseline = options.spec;
  baseline.family = Family::k1F1B;
  baseline.offload = OffloadPolicy::kNone;
  baseline.chunks_per_stage = 1;
  std::int64_t auto_budget = 0;
  if (absl::StatusOr<Schedule> base = Compile(
          baseline, internal::RechunkedCost(options.cost, options.spec.chunks_per_stage, 1));
      base.ok()) {
    for (const StagePrediction& s : base->predictions->stages) {
      auto_budget = std::max(auto_budget, s.peak_bytes / 2);
    }
  }
  // The cost model describes one chunk at the spec's v; rows with another v cut the same layers
  // differently, so every row prices the same model.
  const int cost_v = options.spec.chunks_per_stage;
  std::vector<ComparisonRow> rows = ComparisonRows(options.spec, auto_budget);
  for (ComparisonRow& row : rows) {
    std::fprintf(stderr, "po-schedule: compiling %s\n", row.label.c_str());
    row.result = Compile(
        row.spec, internal::RechunkedCost(options.cost, cost_v, row.spec.chunks_per_stage));
  }
  return WriteOutput(options, FormatComparison(rows, Units(options)));
}

absl::Status RunImport(const CliOptions& options) {
  PO_ASSIGN_OR_RETURN(const std::string csv,
                      ReadBoundedFile(options.input, {"schedule CSV", kMaxScheduleFileBytes,
                                                      /*text=*/true}));
  absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(
      csv, CsvImportOptions{options.stages_given ? options.spec.num_stages : 0,
                            options.placement, options.spec.family});
  if (!parsed.ok()) return Annotate(parsed.status(), options.input);
  Schedule schedule = *std::move(parsed);
  bool has_comm = false;
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) has_comm = has_comm || IsP2P(op.kind);
  }
  if (!has_comm && schedule.spec.num_stages > 1) {
    PO_ASSIGN_OR_RETURN(schedule, LowerCommunication(schedule));
  }
  PO_ASSIGN_OR_RETURN(schedule, CheckAndPredict(std::move(schedule), options.cost));
  PO_ASSIGN_OR_RETURN(const std::string text, Render(options, schedule, options.cost));
  return WriteOutput(options, text);
}

absl::Status RunValidate(const CliOptions& options) {
  PO_ASSIGN_OR_RETURN(const std::string json,
                      ReadBoundedFile(options.input, {"schedule file", kMaxScheduleFileBytes,
                                                      /*text=*/true}));
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(json);
  if (!parsed.ok()) return Annotate(parsed.status(), options.input);
  PO_RETURN_IF_ERROR(Annotate(internal::CheckDeclaredOffload(*parsed), options.input));
  PO_ASSIGN_OR_RETURN(const Schedule schedule,
                      CheckAndPredict(*std::move(parsed), options.cost));
  std::fprintf(stderr, "po-schedule: %s is a valid schedule\n", options.input.c_str());
  PO_ASSIGN_OR_RETURN(const std::string text, Render(options, schedule, options.cost));
  return WriteOutput(options, text);
}

int Main(int argc, char** argv) {
  absl::StatusOr<CliOptions> options = ParseCommandLine(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "po-schedule: error: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(UsageText().c_str(), stdout);
    return 0;
  }
  absl::Status status;
  switch (options->command) {
    case Command::kCompile: status = RunCompile(*options); break;
    case Command::kCompare: status = RunCompare(*options); break;
    case Command::kImport: status = RunImport(*options); break;
    case Command::kValidate: status = RunValidate(*options); break;
  }
  if (status.ok()) return 0;
  std::fprintf(stderr, "po-schedule: error: %s\n", std::string(status.message()).c_str());
  const bool user_error = status.code() == absl::StatusCode::kInvalidArgument ||
                          status.code() == absl::StatusCode::kFailedPrecondition ||
                          status.code() == absl::StatusCode::kNotFound ||
                          status.code() == absl::StatusCode::kResourceExhausted;
  return user_error ? 2 : 1;
}

}  // namespace
}  // namespace pipeoffload::cli

int main(int argc, char** argv) { return pipeoffload::cli::Main(argc, argv); }
