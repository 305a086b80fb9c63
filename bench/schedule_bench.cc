// Compile-time benchmark of the schedule compiler: every pass (order, comm lowering, offload
// planning, validation, simulation) at p=64 m=512 (v=4 where the family has chunks), one case
// per policy, unit costs with offload at k = 0.25. Prints one markdown row per case with the
// median and the best of --repeats runs, and the compiler's threads (PO_COMPILE_THREADS caps
// them; lib/base/parallel_for.h).
//   build/bench/schedule_bench [--repeats N] [--benchmarks=a,b,c]
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
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "lib/base/parallel_for.h"
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

// The cases named in `list` (comma-separated), or every case for an empty list; false (with a
// message on stderr) for an unknown name.
bool Select(std::string_view list, const std::vector<Case>& all, std::vector<Case>* out) {
  if (list.empty()) {
    *out = all;
    return true;
  }
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    const auto it = std::find_if(all.begin(), all.end(),
                                 [&](const Case& c) { return name == c.name; });
    if (it == all.end()) {
      std::fprintf(stderr, "schedule_bench: unknown benchmark '%.*s' (known:",
                   static_cast<int>(name.size()), name.data());
      for (const Case& c : all) std::fprintf(stderr, " %s", c.name);
      std::fprintf(stderr, ")\n");
      return false;
    }
    out->push_back(*it);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return true;
}

constexpr char kUsage[] =
    "usage: schedule_bench [--repeats N] [--benchmarks=a,b,c]\n"
    "  --repeats N          runs per case; the median is printed (default 5)\n"
    "  --benchmarks=LIST    cases to run: 1f1b, interleaved, group, po-h, po-f, selective,\n"
    "                       auto (default: all; p=64 m=512 v=4, unit costs, k = 0.25)\n";

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  std::string_view list;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg.starts_with("--benchmarks=")) {
      list = arg.substr(std::strlen("--benchmarks="));
    } else {
      std::fputs(kUsage, arg == "--help" ? stdout : stderr);
      return arg == "--help" ? 0 : 2;
    }
  }
  const pipeoffload::CostModel cost = pipeoffload::UnitCostModel(0.25);
  std::vector<Case> cases;
  if (!Select(list, AllCases(cost), &cases)) return 2;
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
