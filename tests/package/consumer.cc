// Compiles a 1F1B schedule through the installed package and checks its predicted peak.
#include <cstdio>

#include "pipeoffload/compiler.h"
#include "pipeoffload/runtime.h"

int main() {
  pipeoffload::PipelineSpec spec;
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  auto schedule = pipeoffload::Compile(spec, pipeoffload::UnitCostModel(0.25));
  if (!schedule.ok()) {
    std::fprintf(stderr, "compile failed: %s\n", std::string(schedule.status().message()).c_str());
    return 1;
  }
  // 1F1B holds p - d microbatches on stage d (reference/pipeoffload.md section 1.2).
  const auto& stages = schedule->predictions->stages;
  for (int d = 0; d < 4; ++d) {
    if (stages[d].peak_units != 4 - d) {
      std::fprintf(stderr, "stage %d: peak %lld, expected %d\n", d,
                   static_cast<long long>(stages[d].peak_units), 4 - d);
      return 1;
    }
  }
  // The runtime's library links too: the executor's measured-timeline helper rejects empty input.
  if (pipeoffload::MeasuredTimeline({}).ok()) {
    std::fprintf(stderr, "MeasuredTimeline accepted no stages\n");
    return 1;
  }
  std::printf("consumer: compiled %zu stage programs\n", schedule->stages.size());
  return 0;
}
