// The single-process reference: the whole GPT as one virtual stage, every microbatch run as
// F then full B in microbatch order 0..m-1, then AdamW. A pipeline of any shape that runs each
// chunk's B / W in microbatch order ends each step with bitwise the same parameters, because it
// calls the same kernels on the same values and accumulates every gradient in the same order
// (tests/gpt/pipeline_equality_test.cc proves it).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_REFERENCE_TRAINER_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_REFERENCE_TRAINER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/gpt_stage_model.h"

namespace pipeoffload::gpt {

class ReferenceTrainer {
 public:
  // InvalidArgument as GptStageModel::Create (p = v = 1).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(
      const GptConfig& config, std::shared_ptr<const GptData> data);

  // StartIteration(step) and F, B of microbatches 0..m-1: leaves the step's gradients
  // accumulated in the model (for tests that compare gradients). Returns the m losses.
  [[nodiscard]] absl::StatusOr<std::vector<double>> AccumulateGradients(std::int64_t step);
  // AccumulateGradients(steps_done()), then (clip_norm > 0) the global gradient norm and its
  // clipping scale, then OptimizerStep(scale). Returns the m losses.
  // Errors besides the model's: DataLoss for a non-finite norm with clipping on.
  [[nodiscard]] absl::StatusOr<std::vector<double>> TrainStep();
  // The last TrainStep's global gradient norm before clipping; NaN without clipping (not
  // computed) or before the first step.
  double last_grad_norm() const { return last_grad_norm_; }

  // The model checksum (CombineTensorHashes over every parameter tensor).
  [[nodiscard]] absl::StatusOr<std::uint64_t> Checksum() const;

  std::int64_t steps_done() const { return steps_done_; }
  GptStageModel& model() { return *model_; }
  const GptStageModel& model() const { return *model_; }

 private:
  explicit ReferenceTrainer(std::unique_ptr<GptStageModel> model);

  std::unique_ptr<GptStageModel> model_;
  std::vector<float> saved_;  // one stash entry, reused by every microbatch
  std::int64_t steps_done_ = 0;
  double last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_REFERENCE_TRAINER_H_
