// Compile-time benchmark of the schedule compiler: every pass (order, comm lowering, offload
// planning, validation, simulation) at p=64 m=512 (v=4 where the family has chunks), one case
// per policy, unit costs with offload at k = 0.25. Prints one markdown row per case with the
// median and the best of --repeats runs, and the compiler's threads (PO_COMPILE_THREADS caps
// them; lib/base/parallel_for.h).
//   build/bench/schedule_bench [--repeats N] [--benchmarks=a,b,c]   (--help lists the flags)
// Benchmarks (all by default, in this order):
//   1f1b          1F1B, no offload
//   interleaved   Megatron-style interleaved, v=4, no offload
//   group         group-interleaved, v=4, g=32, no offload
//   po-h          group-interleaved v=4 with half offload
//   po-f          group-interleaved v=4 with full offload
//   selective     group-interleaved v=4, selective offload of 3 of the 4 chunks
//   auto          the auto policy (its own family, v, g and share) within a budget of 8 chunk
//                 units per stage
// Run one case at a time under /usr/bin/time -v to read its peak RSS.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "examples/common/flags.h"
#include "lib/base/parallel_for.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"

namespace {

using pipeoffload::Family;
using pipeoffload::OffloadPolicy;
using pipeoffload::PipelineSpec;

constexpr int kStages = 64;
constexpr int kMicrobatches = 512;
constexpr int kChunks = 4;

struct Case {
  const char* name;
  PipelineSpec spec;
};

PipelineSpec Spec(Family family, int v, OffloadPolicy offload) {
  PipelineSpec spec;
  spec.family = family;
  spec.num_stages = kStages;
  spec.num_microbatches = kMicrobatches;
  spec.chunks_per_stage = v;
  spec.offload = offload;
  return spec;
}

std::vector<Case> AllCases(const pipeoffload::CostModel& cost) {
  PipelineSpec selective = Spec(Family::kGroupInterleaved, kChunks, OffloadPolicy::kSelective);
  selective.offload_chunks = 3;
  PipelineSpec automatic = Spec(Family::kGroupInterleaved, kChunks, OffloadPolicy::kAuto);
  automatic.memory_budget_bytes = 8 * cost.ActivationBytes(0, 0, kStages);
  return {
      {"1f1b", Spec(Family::k1F1B, 1, OffloadPolicy::kNone)},
      {"interleaved", Spec(Family::kInterleaved, kChunks, OffloadPolicy::kNone)},
      {"group", Spec(Family::kGroupInterleaved, kChunks, OffloadPolicy::kNone)},
      {"po-h", Spec(Family::kGroupInterleaved, kChunks, OffloadPolicy::kHalf)},
      {"po-f", Spec(Family::kGroupInterleaved, kChunks, OffloadPolicy::kFull)},
      {"selective", selective},
      {"auto", automatic},
  };
}

struct Options {
  int repeats = 5;
  std::vector<int> cases;  // --benchmarks: indices into AllCases, in order; empty: every case
  bool help = false;
};

const pipeoffload::CostModel& Cost() {
  static const auto* const kCost = new pipeoffload::CostModel(pipeoffload::UnitCostModel(0.25));
  return *kCost;
}

using Flag = pipeoffload::examples::FlagDef<Options>;

const std::vector<Flag>& ScheduleBenchFlags() {
  static const auto* const kFlags = new std::vector<Flag>{
      pipeoffload::examples::IntFlag("repeats", "N",
                                     "runs per case; the median and the best are printed "
                                     "(default 5).",
                                     &Options::repeats, 1, 1000000),
      {"benchmarks", "LIST",
       "cases to run, in this order: 1f1b, interleaved, group, po-h, po-f, selective, auto "
       "(default: all; p=64 m=512 v=4, unit costs, k = 0.25).",
       [](Options& o, const std::string& value) -> absl::Status {
         std::vector<std::string_view> names;
         const std::vector<Case> all = AllCases(Cost());
         for (const Case& c : all) names.push_back(c.name);
         PO_ASSIGN_OR_RETURN(const std::vector<int> items,
                             pipeoffload::examples::ParseFlagChoices("benchmarks", value, names));
         o.cases = items;
         return absl::OkStatus();
       }},
      pipeoffload::examples::HelpFlag(&Options::help),
  };
  return *kFlags;
}

constexpr char kHelpHeader[] =
    "usage: schedule_bench [--repeats N] [--benchmarks=a,b,c]\n"
    "\n"
    "Compile time of the schedule compiler, every pass, at p=64 m=512 (v=4 where the family\n"
    "has chunks), one case per policy: a markdown row per case with its op count and the\n"
    "median and best compile time. PO_COMPILE_THREADS caps the compiler's threads.\n";

std::string HelpText() {
  return pipeoffload::examples::FlagsHelpText(kHelpHeader, ScheduleBenchFlags());
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  const absl::Status parsed = pipeoffload::examples::ParseFlags(
      pipeoffload::examples::FlagArgs(argc, argv), ScheduleBenchFlags(), options);
  if (const std::optional<int> exit = pipeoffload::examples::FlagsExitCode(
          "schedule_bench", parsed, options.help, HelpText)) {
    return *exit;  // --help, or bad flags (2)
  }
  const int repeats = options.repeats;
  const pipeoffload::CostModel& cost = Cost();
  const std::vector<Case> all = AllCases(cost);
  std::vector<Case> cases;
  for (const int i : options.cases) cases.push_back(all[static_cast<std::size_t>(i)]);
  if (cases.empty()) cases = all;
  std::printf("| case (p=%d m=%d, %d threads) | ops | compile (median of %d) | best |\n"
              "|---|---|---|---|\n",
              kStages, kMicrobatches, pipeoffload::internal::CompileThreads(), repeats);
  for (const Case& c : cases) {
    std::vector<double> seconds;
    std::size_t ops = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<pipeoffload::Schedule> schedule = pipeoffload::Compile(c.spec, cost);
      const auto end = std::chrono::steady_clock::now();
      if (!schedule.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name, std::string(schedule.status().message()).c_str());
        return 1;
      }
      ops = 0;
      for (const auto& program : schedule->stages) ops += program.ops.size();
      seconds.push_back(std::chrono::duration<double>(end - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    std::printf("| %s | %zu | %.3f s | %.3f s |\n", c.name, ops, seconds[seconds.size() / 2],
                seconds.front());
    std::fflush(stdout);
  }
  return 0;
}
