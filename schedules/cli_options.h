// Command-line options of po-schedule: one table of options, each with its help text, parsed
// into a CliOptions. No I/O beyond reading the cost-model file named on the command line
// (through ReadBoundedFile: a regular file, at most kMaxCostModelFileBytes).
#ifndef PIPEOFFLOAD_SCHEDULES_CLI_OPTIONS_H_
#define PIPEOFFLOAD_SCHEDULES_CLI_OPTIONS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::cli {

enum class Command { kCompile, kCompare, kImport, kValidate };

struct CliOptions {
  Command command = Command::kCompile;
  PipelineSpec spec;           // family and offload resolved from --policy / --family
  CostModel cost;              // after --unit-costs / --gpt-* / --cost-model / field flags
  std::string format = "table";  // table | text | json | pytorch-csv[-comms] | trace | svg
  std::string out;             // output file; empty = stdout
  std::string input;           // import: the PyTorch CSV; validate: the schedule JSON
  bool stages_given = false;   // import: --stages given (else the CSV's rows)
  std::optional<Placement> placement;  // --placement; import: else inferred from the CSV
  bool show_alternatives = false;  // auto: print every candidate weighed
  bool unit_costs = false;         // times in units (trace scale, table units)
  bool help = false;
};

// Parses argv (argv[0] is the program). Errors: InvalidArgument naming the option and the
// problem ("--stages: expected an integer >= 1, got \"x\""), or the cost-model file's error.
[[nodiscard]] absl::StatusOr<CliOptions> ParseCommandLine(int argc, const char* const* argv);

// The --help text: commands, every option with its meaning and default, and examples.
std::string UsageText();

}  // namespace pipeoffload::cli

#endif  // PIPEOFFLOAD_SCHEDULES_CLI_OPTIONS_H_
