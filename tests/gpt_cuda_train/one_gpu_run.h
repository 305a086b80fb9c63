// gpt_train --backend cuda --transport local inside a test: every stage a thread on one GPU,
// through gpt_train's own driver (RunPipelineRank with the CUDA stage factory). Shared by the
// trainer tests of this directory.
#ifndef PIPEOFFLOAD_TESTS_GPT_CUDA_TRAIN_ONE_GPU_RUN_H_
#define PIPEOFFLOAD_TESTS_GPT_CUDA_TRAIN_ONE_GPU_RUN_H_

#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include "examples/gpt/gpt_data.h"
#include "examples/gpt/train_cuda/train_stage_cuda.h"
#include "examples/gpt/train_options.h"
#include "examples/gpt/train_pipeline.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::testing {

// Trains `options` on the embedded corpus with `stages` stages on GPU 0 and returns rank 0's
// result (every rank must succeed).
inline TrainResult TrainOnOneGpu(const TrainOptions& options, int stages) {
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  absl::StatusOr<std::vector<std::unique_ptr<RankGroup>>> groups =
      CreateLocalRankGroups(stages, 3 * options.watchdog_seconds + 30);
  REQUIRE(groups.ok());
  absl::StatusOr<CudaLocalRig> rig = CreateCudaLocalRig(stages, options.watchdog_seconds);
  INFO(rig.status().ToString());
  REQUIRE(rig.ok());
  const TrainStageFactory factory = [&](const TrainOptions& o, const TrainStageSpec& spec) {
    return CreateCudaTrainStage(o, spec, *rig->backends[static_cast<std::size_t>(spec.stage)],
                                /*cpu_threads=*/0);
  };
  std::vector<absl::StatusOr<TrainResult>> ranks(static_cast<std::size_t>(stages),
                                                 absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < stages; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      ranks[i] = RunPipelineRank(options, data, *(*groups)[i], *rig->transports[i],
                                 /*out=*/nullptr, factory);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& rank : ranks) {
    INFO(rank.status().ToString());
    REQUIRE(rank.ok());
  }
  return *ranks[0];
}

}  // namespace pipeoffload::gpt::testing

#endif  // PIPEOFFLOAD_TESTS_GPT_CUDA_TRAIN_ONE_GPU_RUN_H_
