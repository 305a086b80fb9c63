// gpt_train without a pipeline: the single-process ReferenceTrainer (F then full B per
// microbatch in order 0..m-1, then AdamW), printing the same lines as the pipeline ranks so the
// two compare from the command line.
#include <chrono>
#include <utility>

#include "examples/gpt/optimizer_schedule.h"
#include "examples/gpt/reference_trainer.h"
#include "examples/gpt/train_pipeline.h"
#include "examples/gpt/train_report.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt {

absl::StatusOr<TrainResult> RunReference(const TrainOptions& options,
                                         std::shared_ptr<const GptData> data, std::FILE* out) {
  const std::shared_ptr<const GptData> corpus = data;
  PO_ASSIGN_OR_RETURN(std::unique_ptr<ReferenceTrainer> trainer,
                      ReferenceTrainer::Create(options.config, std::move(data)));
  if (out != nullptr) {
    PrintDataAndModel(out, *corpus, options.config);
    std::fprintf(out, "pipeline: none (single-process reference: F then B per microbatch)\n");
  }
  TrainResult result;
  for (std::int64_t step = 0; step < options.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    PO_ASSIGN_OR_RETURN(const std::vector<double> losses, trainer->TrainStep());
    result.losses.push_back(MeanLoss(losses));
    result.step_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    result.grad_norms.push_back(trainer->last_grad_norm());
    if (out != nullptr) {
      PrintStep(out, step, result.losses.back(), result.step_seconds.back(), /*flops_per_gpu=*/0,
                LearningRateAt(options.config.optimizer, step + 1), result.grad_norms.back());
    }
  }
  PO_ASSIGN_OR_RETURN(result.checksum, trainer->Checksum());
  if (out != nullptr) {
    PrintStageTable(out, result);
    PrintChecksum(out, result.checksum);
  }
  return result;
}

}  // namespace pipeoffload::gpt
