// The single-process reference trainer (see reference_trainer.h).
#include "examples/gpt/reference_trainer.h"

#include <utility>

#include "examples/gpt/gpt_params.h"
#include "examples/gpt/optimizer_schedule.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt {

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(
    const GptConfig& config, std::shared_ptr<const GptData> data) {
  PO_ASSIGN_OR_RETURN(std::unique_ptr<GptStageModel> model,
                      GptStageModel::Create(config, /*num_stages=*/1, /*chunks_per_stage=*/1,
                                            /*stage=*/0, std::move(data)));
  return std::unique_ptr<ReferenceTrainer>(new ReferenceTrainer(std::move(model)));
}

ReferenceTrainer::ReferenceTrainer(std::unique_ptr<GptStageModel> model)
    : model_(std::move(model)) {
  const std::int64_t bytes = model_->SavedBytes(0, /*split_backward=*/false);
  saved_.resize(static_cast<std::size_t>((bytes + 3) / 4));
}

absl::StatusOr<std::vector<double>> ReferenceTrainer::AccumulateGradients(std::int64_t step) {
  model_->StartIteration(step);
  for (int mb = 0; mb < model_->config().num_microbatches; ++mb) {
    PO_RETURN_IF_ERROR(model_->Forward(mb, 0, nullptr, nullptr, saved_.data()));
    PO_RETURN_IF_ERROR(model_->Backward(mb, 0, nullptr, nullptr, saved_.data(),
                                        /*with_weight_grad=*/true));
  }
  return model_->losses();
}

absl::StatusOr<std::vector<double>> ReferenceTrainer::TrainStep() {
  PO_ASSIGN_OR_RETURN(std::vector<double> losses, AccumulateGradients(steps_done_));
  float scale = 1.0f;
  const float clip_norm = model_->config().optimizer.clip_norm;
  if (clip_norm > 0.0f) {
    PO_ASSIGN_OR_RETURN(std::vector<TensorSquareSum> sums, model_->GradSquareSums());
    PO_ASSIGN_OR_RETURN(const GlobalClip clip,
                        ClipGlobalNorm(std::move(sums), model_->num_tensors(), clip_norm));
    last_grad_norm_ = clip.norm;
    scale = clip.scale;
  }
  PO_RETURN_IF_ERROR(model_->OptimizerStep(scale));
  ++steps_done_;
  return losses;
}

absl::StatusOr<std::uint64_t> ReferenceTrainer::Checksum() const {
  return CombineTensorHashes(model_->ParameterHashes(), model_->num_tensors());
}

}  // namespace pipeoffload::gpt
