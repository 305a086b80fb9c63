// How a trainer uses the compiler from C++: describe the pipeline and the costs, compile, then
// walk the instruction stream of one stage (what a runtime would issue) and read the
// predictions. Run: build/examples/schedule_api_example
#include <cstdio>
#include <string>

#include "pipeoffload/compiler.h"

int main() {
  pipeoffload::PipelineSpec spec;
  spec.family = pipeoffload::Family::kGroupInterleaved;
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.chunks_per_stage = 2;
  spec.offload = pipeoffload::OffloadPolicy::kFull;

  // A GPT layer stack at h = 8192, 4096 tokens per microbatch, one layer per chunk.
  pipeoffload::GptShape shape;
  shape.layers_per_chunk = 1;
  const pipeoffload::CostModel cost = pipeoffload::EstimateGptCostModel(shape);

  absl::StatusOr<pipeoffload::Schedule> schedule = pipeoffload::Compile(spec, cost);
  if (!schedule.ok()) {
    std::fprintf(stderr, "compile failed: %s\n", std::string(schedule.status().message()).c_str());
    return 1;
  }
  std::printf("stage 0 issues %zu ops:", schedule->stages[0].ops.size());
  for (const pipeoffload::Op& op : schedule->stages[0].ops) {
    std::printf(" %s", pipeoffload::OpToString(op).c_str());
  }
  const pipeoffload::Predictions& predictions = *schedule->predictions;
  std::printf("\n\nstep %.1f ms (%.1f ms without offload), bubble %.1f%%\n",
              predictions.step_time * 1e3, predictions.step_time_without_offload * 1e3,
              predictions.bubble_ratio * 100);
  for (std::size_t d = 0; d < predictions.stages.size(); ++d) {
    const pipeoffload::StagePrediction& s = predictions.stages[d];
    std::printf("stage %zu: peak %.2f GiB (%.2f GiB without offload), host %.2f GiB\n", d,
                s.peak_bytes / 1073741824.0, s.peak_bytes_without_offload / 1073741824.0,
                s.host_bytes / 1073741824.0);
  }
  return 0;
}
