// Compile-time benchmark of the schedule compiler: every pass (order, comm lowering, offload
// planning, validation, simulation) for large pipelines. Prints one markdown row per case with
// the median of --repeats runs.
//   build/bench/schedule_bench [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"

namespace {

struct Case {
  const char* name;
  pipeoffload::PipelineSpec spec;
};

pipeoffload::PipelineSpec Spec(pipeoffload::Family family, int p, int m, int v,
                               pipeoffload::OffloadPolicy offload) {
  pipeoffload::PipelineSpec spec;
  spec.family = family;
  spec.num_stages = p;
  spec.num_microbatches = m;
  spec.chunks_per_stage = v;
  spec.offload = offload;
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: schedule_bench [--repeats N]\n");
      return 2;
    }
  }
  using pipeoffload::Family;
  using pipeoffload::OffloadPolicy;
  const std::vector<Case> cases = {
      {"1f1b p=64 m=512", Spec(Family::k1F1B, 64, 512, 1, OffloadPolicy::kNone)},
      {"interleaved p=64 m=512 v=4", Spec(Family::kInterleaved, 64, 512, 4, OffloadPolicy::kNone)},
      {"group-interleaved p=64 m=512 v=4",
       Spec(Family::kGroupInterleaved, 64, 512, 4, OffloadPolicy::kNone)},
      {"po-f group-interleaved p=64 m=512 v=4",
       Spec(Family::kGroupInterleaved, 64, 512, 4, OffloadPolicy::kFull)},
  };
  const pipeoffload::CostModel cost = pipeoffload::UnitCostModel(0.25);
  std::printf("| case | ops | compile (median of %d) |\n|---|---|---|\n", repeats);
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
    std::printf("| %s | %zu | %.3f s |\n", c.name, ops, seconds[seconds.size() / 2]);
    std::fflush(stdout);
  }
  return 0;
}
