// offload_table: peaks and overheads of the offload policies (issue 3), as a markdown table for
// docs/benchmarks.md. For p in {4, 8, 16, 32}, v in {1, 2, 4} (1f1b for v = 1, group-interleaved
// with its default g = ceil(p/2) otherwise), m = 4p, k in {0.25, 0.5, 1.0} under unit costs
// (F = B = W = 1, one entry 3k each way), and the policies po-f and po-h, it compiles the plan
// and prints the largest per-stage peak with and without it (in chunk units), the share of the
// activation volume offloaded, the predicted overhead against the same order without offload,
// the number of planner warnings, and the wall time of Compile.
//
// Usage: offload_table [--link-group=N] [--split] [--strict]
//        offload_table --shared-links [--worst=N]
//   --link-group=N  stages per host link (CostModel::host_link_group_size; default 2: pairs)
//   --split         split backward (separate W ops)
//   --strict        compile in strict mode (a shortfall is then an error, shown as such)
//   --shared-links  the issue-15 sweep (shared_links_table.h): the same plan with pairs sharing
//                   a host link and on a link each, against the interval-cover bound
//   --worst=N       with --shared-links: the summary and the N worst rows only (default: every
//                   row, then the summary)
//   --help          these flags (the table OffloadTableFlags)
// Exit status: 0, or 2 on a usage error.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "examples/common/flags.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "bench/shared_links_table.h"

namespace {

using pipeoffload::Compile;
using pipeoffload::CostModel;
using pipeoffload::Family;
using pipeoffload::OffloadPolicy;
using pipeoffload::PipelineSpec;
using pipeoffload::Schedule;

struct Options {
  int link_group = 2;
  bool split = false;
  bool strict = false;
  bool shared_links = false;
  int worst = -1;  // --worst=N; -1: every row
  bool help = false;
};

using Flag = pipeoffload::examples::FlagDef<Options>;

const std::vector<Flag>& OffloadTableFlags() {
  using pipeoffload::examples::IntFlag;
  using pipeoffload::examples::SwitchFlag;
  static const auto* const kFlags = new std::vector<Flag>{
      IntFlag("link-group", "N",
              "stages per host link (CostModel::host_link_group_size; default 2: pairs).",
              &Options::link_group, 1, 1 << 20),
      SwitchFlag("split", "split backward (separate W ops).", &Options::split),
      SwitchFlag("strict", "compile in strict mode (a shortfall is then an error, shown as such).",
                 &Options::strict),
      SwitchFlag("shared-links",
                 "the issue-15 sweep (shared_links_table.h): the same plan with pairs sharing a "
                 "host link and on a link each, against the interval-cover bound.",
                 &Options::shared_links),
      IntFlag("worst", "N",
              "with --shared-links: the summary and the N worst rows only (default: every row, "
              "then the summary).",
              &Options::worst, 0, 1 << 30),
      pipeoffload::examples::HelpFlag(&Options::help),
  };
  return *kFlags;
}

constexpr char kHelpHeader[] =
    "usage: offload_table [--link-group=N] [--split] [--strict]\n"
    "       offload_table --shared-links [--worst=N]\n"
    "\n"
    "Peaks and overheads of the offload policies po-f and po-h under unit costs, for p in\n"
    "{4, 8, 16, 32}, v in {1, 2, 4}, k in {0.25, 0.5, 1.0}: a markdown table for\n"
    "docs/benchmarks.md.\n";

std::string HelpText() {
  return pipeoffload::examples::FlagsHelpText(kHelpHeader, OffloadTableFlags());
}

// One row: compiles `spec` under `cost` and prints what the table shows.
void PrintRow(const PipelineSpec& spec, const CostModel& cost, double k) {
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const std::string order =
      spec.chunks_per_stage == 1
          ? "1f1b"
          : "gi v=" + std::to_string(spec.chunks_per_stage) + " g=" +
                std::to_string((spec.num_stages + 1) / 2);
  std::printf("| %2d | %-12s | %4.2f | %-4s |", spec.num_stages, order.c_str(), k,
              std::string(pipeoffload::OffloadPolicyName(spec.offload)).c_str());
  if (!schedule.ok()) {
    std::printf(" error: %s | | | | %.1f |\n", std::string(schedule.status().message()).c_str(),
                ms);
    return;
  }
  const pipeoffload::Predictions& predicted = *schedule->predictions;
  std::int64_t peak = 0, peak_without = 0, offloaded = 0, stage0 = 0;
  for (const pipeoffload::StagePrediction& s : predicted.stages) {
    peak = std::max(peak, s.peak_units);
    peak_without = std::max(peak_without, s.peak_units_without_offload);
    offloaded += s.offloaded_bytes;
  }
  stage0 = predicted.stages.front().peak_units;
  const double volume = static_cast<double>(spec.num_stages) * spec.num_microbatches *
                        spec.chunks_per_stage * static_cast<double>(cost.activation_bytes);
  const double overhead =
      predicted.step_time_without_offload > 0
          ? 100.0 * (predicted.step_time / predicted.step_time_without_offload - 1.0)
          : 0.0;
  std::printf(" %3lld | %3lld | %3lld | %5.1f%% | %5.2f%% | %zu | %7.1f |\n",
              static_cast<long long>(peak_without), static_cast<long long>(peak),
              static_cast<long long>(stage0), 100.0 * static_cast<double>(offloaded) / volume,
              overhead, predicted.warnings.size(), ms);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const absl::Status parsed = pipeoffload::examples::ParseFlags(
      pipeoffload::examples::FlagArgs(argc, argv), OffloadTableFlags(), options);
  if (const std::optional<int> exit = pipeoffload::examples::FlagsExitCode(
          "offload_table", parsed, options.help, HelpText)) {
    return *exit;  // --help, or a usage error (2)
  }
  if (options.shared_links) {
    pipeoffload::bench::PrintSharedLinksTable(options.worst);
    return 0;
  }
  std::printf("Unit costs, m = 4p, %s backward, %d stage(s) per host link%s.\n\n",
              options.split ? "split" : "unsplit", options.link_group,
              options.strict ? ", strict" : "");
  std::printf(
      "| p | order | k | policy | peak without | peak with | stage 0 | offloaded | overhead "
      "| warnings | compile ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const int p : {4, 8, 16, 32}) {
    for (const int v : {1, 2, 4}) {
      for (const double k : {0.25, 0.5, 1.0}) {
        for (const OffloadPolicy policy : {OffloadPolicy::kFull, OffloadPolicy::kHalf}) {
          PipelineSpec spec;
          spec.family = v == 1 ? Family::k1F1B : Family::kGroupInterleaved;
          spec.num_stages = p;
          spec.num_microbatches = 4 * p;
          spec.chunks_per_stage = v;
          spec.split_backward = options.split;
          spec.offload = policy;
          spec.strict = options.strict;
          CostModel cost = pipeoffload::UnitCostModel(k);
          cost.host_link_group_size = options.link_group;
          PrintRow(spec, cost, k);
        }
      }
    }
  }
  return 0;
}
