// The CPU consumer of an installed pipeoffload (run by tests/package/run_package_test.cmake):
// compiles a 1F1B schedule and checks its predicted peaks, checks that layer sliding links, runs
// one optimizer-offload step on a CPU backend (pipeoffload::optim_offload), then runs a pipeline
// on CPU backends through pipeline.h and checks it against the predictions (relay_pipeline.h).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "pipeoffload/backend.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/layer_sliding.h"
#include "pipeoffload/optimizer_offload.h"
#include "relay_pipeline.h"

int main() {
  pipeoffload::PipelineSpec spec;
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  auto schedule = pipeoffload::Compile(spec, pipeoffload::UnitCostModel(0.25));
  if (!schedule.ok()) return relay::Report("consumer", "compile: " + schedule.status().ToString());
  // 1F1B holds p - d microbatches on stage d (reference/pipeoffload.md section 1.2).
  const auto& stages = schedule->predictions->stages;
  for (int d = 0; d < 4; ++d) {
    if (stages[d].peak_units != 4 - d) {
      return relay::Report("consumer", "stage " + std::to_string(d) + ": peak " +
                                           std::to_string(stages[d].peak_units) + ", expected " +
                                           std::to_string(4 - d));
    }
  }
  std::printf("consumer: compiled %zu stage programs\n", schedule->stages.size());
  // Layer sliding links too (with its liburing): an empty model shape is refused.
  if (pipeoffload::ValidateSlidingModelShape({}).ok()) {
    return relay::Report("consumer", "ValidateSlidingModelShape accepted an empty shape");
  }

  {
    // One step of the offload engine on a CPU backend: "device" memory is host memory there.
    auto backend = pipeoffload::CreateCpuBackend();
    if (!backend.ok()) return relay::Report("consumer", backend.status().ToString());
    pipeoffload::OptimizerOffloadOptions options;
    options.num_params = 1000;
    options.subgroup_size = 300;
    options.cpu.threads = 1;
    // A rate whose first step moves 1.0 by more than bf16's spacing there (2^-8): with the
    // default 1e-3 the bf16 parameters would round back to 1.0.
    options.adam.learning_rate = 0.1f;
    const std::vector<float> initial(1000, 1.0f);
    std::vector<std::uint16_t> params(1000), grads(1000, 0x3F80);  // bf16 1.0
    auto engine = pipeoffload::OptimizerOffload::Create(**backend, options, initial, params);
    if (!engine.ok()) return relay::Report("consumer", engine.status().ToString());
    if (absl::Status added = (*engine)->AddGradients(grads.data(), 0, 1000); !added.ok()) {
      return relay::Report("consumer", added.ToString());
    }
    auto step = (*engine)->Step();
    if (!step.ok() || !step->applied || step->step != 1 || params[0] == 0x3F80) {
      return relay::Report("consumer", "the optimizer-offload step did not update the bf16 "
                                       "parameters: " + step.status().ToString());
    }
    std::printf("consumer: optimizer offload step 1, gradient norm %.3f\n", step->grad_norm);
  }

  std::vector<std::unique_ptr<pipeoffload::Backend>> owned;
  std::vector<pipeoffload::Backend*> backends;
  for (int d = 0; d < 2; ++d) {
    auto backend = pipeoffload::CreateCpuBackend();
    if (!backend.ok()) return relay::Report("consumer", backend.status().ToString());
    owned.push_back(std::move(*backend));
    backends.push_back(owned.back().get());
  }
  return relay::RunRelayPipeline("consumer", backends);
}
