// The CPU TrainStage: GptStageModel on the CPU backend (see train_stage.h), and the model FLOP
// count the reports share.
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/gpt_stage_model.h"
#include "examples/gpt/train_stage.h"
#include "absl/strings/str_format.h"
#include "lib/base/host_memory_info.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt {
namespace {

class CpuTrainStage final : public TrainStage {
 public:
  CpuTrainStage(std::unique_ptr<Backend> backend, std::unique_ptr<GptStageModel> model)
      : backend_(std::move(backend)), model_(std::move(model)) {}

  StageModel& model() override { return *model_; }
  Backend& backend() override { return *backend_; }

  absl::Status StartIteration(std::int64_t step) override {
    model_->StartIteration(step);
    return absl::OkStatus();
  }
  bool holds_loss() const override { return model_->holds_loss(); }
  absl::StatusOr<std::vector<double>> Losses() override { return model_->losses(); }

  // GptStageModel protocol step 3: stages 0 and p-1 swap their parts of wte's gradient.
  absl::Status ExchangeTiedGrad(RankGroup& group) override {
    if (!model_->NeedsTiedGradExchange()) return absl::OkStatus();
    const int peer = group.rank() == 0 ? group.size() - 1 : 0;
    const std::int64_t n = model_->TiedGradElements();
    const std::string mine(reinterpret_cast<const char*>(model_->TiedGradPart()),
                           static_cast<std::size_t>(n) * sizeof(float));
    PO_ASSIGN_OR_RETURN(const std::string theirs, group.Exchange(peer, mine));
    if (theirs.size() != mine.size()) {
      return absl::DataLossError(absl::StrCat("tied gradient from rank ", peer, " has ",
                                              theirs.size(), " bytes, expected ", mine.size()));
    }
    std::vector<float> part(static_cast<std::size_t>(n));
    std::memcpy(part.data(), theirs.data(), theirs.size());
    return model_->SetPeerTiedGradPart(part.data(), n);
  }

  absl::StatusOr<std::vector<TensorSquareSum>> GradSquareSums() override {
    return model_->GradSquareSums();
  }

  absl::Status OptimizerStep(float grad_scale) override {
    const double start = backend_->NowSeconds();
    absl::Status status = model_->OptimizerStep(grad_scale);
    last_optimizer_seconds_ = backend_->NowSeconds() - start;
    return status;
  }
  double last_optimizer_seconds() const override { return last_optimizer_seconds_; }

  absl::StatusOr<std::vector<TensorHash>> ParameterHashes() override {
    return model_->ParameterHashes();
  }
  int num_tensors() const override { return model_->num_tensors(); }
  // Parameters, gradients and the two AdamW moments, fp32 host vectors.
  std::int64_t ModelStateBytes() const override {
    std::int64_t floats = 0;
    for (int c = 0; c < model_->chunks_per_stage(); ++c) {
      floats += model_->chunk(c).params().numel();
    }
    return floats * 4 * std::int64_t{sizeof(float)};
  }
  std::string Describe() const override {
    return absl::StrCat(backend_->Name(), ", fp32 parameters, gradients and AdamW state in host ",
                        "memory (", ModelStateBytes(), " B)");
  }

 private:
  const std::unique_ptr<Backend> backend_;
  const std::unique_ptr<GptStageModel> model_;
  double last_optimizer_seconds_ = 0.0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainStage>> CreateCpuTrainStage(const TrainOptions& options,
                                                                const TrainStageSpec& spec) {
  PO_ASSIGN_OR_RETURN(std::unique_ptr<GptStageModel> model,
                      GptStageModel::Create(spec.config, spec.num_stages, spec.chunks_per_stage,
                                            spec.stage, spec.data, spec.placement));
  CpuBackendOptions backend_options;
  backend_options.queue_wait_timeout_seconds = options.watchdog_seconds;
  PO_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCpuBackend(backend_options));
  return std::unique_ptr<TrainStage>(new CpuTrainStage(std::move(backend), std::move(model)));
}

absl::Status CheckCpuHostMemory(const GptConfig& config, double share_of_model) {
  std::int64_t params = 0;
  for (const TensorSpec& tensor : GptTensorSpecs(config)) params += tensor.numel();
  // fp32 parameters, gradients and AdamW's m and v: 16 B per parameter, the bulk of the CPU
  // trainer's memory at any width where this check matters.
  const double needed = 16.0 * static_cast<double>(params) * share_of_model;
  const std::int64_t available = internal::AvailableHostMemoryBytes();
  if (available < 0 || needed <= static_cast<double>(available)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the CPU model needs %.2f GB of host memory here (%.4g parameters%s, 16 B each for the fp32 "
      "parameter, gradient and AdamW m, v) but %.2f GB are available (MemAvailable); use a "
      "smaller --embd or --layers, more hosts, or --backend cuda",
      needed / 1e9, static_cast<double>(params),
      share_of_model < 1.0 ? absl::StrFormat(", %.0f%% of them on this host", 100 * share_of_model)
                           : std::string(),
      static_cast<double>(available) / 1e9));
}

double ModelFlopsPerStep(const GptConfig& config) {
  const double c = config.n_embd;
  const double t = config.seq_len;
  const double v = config.vocab_size;
  const double per_sequence =
      config.n_layer * (72.0 * c * c * t + 12.0 * t * t * c) + 6.0 * t * c * v;
  return per_sequence * config.batch_size * config.num_microbatches;
}

}  // namespace pipeoffload::gpt
