// The fp32 Llama model on the CPU as a layer-sliding SlidingModel (layer_sliding.h): units
// "embed", "layer.<i>", "head" (llama_config.h's NumUnits), the math of llama_layer_cpu.h, the
// step's microbatches drawn from a TokenData. What CI drives the sliding engine with on the CPU
// backend (device memory is host memory there), and what PlainTrainer drives directly: both
// must produce the same bits. Also the units' shape, which the CUDA model shares.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CPU_MODEL_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CPU_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/llama/llama_config.h"
#include "examples/llama/llama_data.h"
#include "examples/llama/llama_layer_cpu.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::llama {

// The units of `config` as the engine sees them, workspace_bytes left 0 (backend-specific):
// names "embed", "layer.<i>", "head"; param_count = UnitParamCount; decay = the tensors with
// weight_decay, adjacent ones merged into one range; the head borrows unit 0 when
// tie_word_embeddings. REQUIRES: ValidateLlamaConfig(config).ok().
std::vector<SlidingUnitShape> LlamaUnitShapes(const LlamaConfig& config);

struct LlamaCpuModelOptions {
  int batch_size = 1;           // B sequences per microbatch, >= 1
  int seq_len = 64;             // T tokens per sequence, >= 1
  int max_microbatches = 1;     // the most BeginStep accepts (its tokens are preallocated)
  std::uint64_t data_seed = 0;  // TokenData::Microbatch's seed
  int ce_chunk_rows = 0;        // fused cross-entropy rows per chunk; 0: all N at once
};

class LlamaCpuModel : public SlidingModel {
 public:
  // `data` must outlive the model. Errors: InvalidArgument for a bad config
  // (ValidateLlamaConfig's message), options out of range (naming the field), or data that
  // cannot feed it (TokenData::CheckCompatible's message).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlamaCpuModel>> Create(
      const LlamaConfig& config, const TokenData& data, const LlamaCpuModelOptions& options);

  // param_dtype kFp32, activation_bytes N * H * 4, workspace_bytes the units' (LlamaCpuUnits),
  // model_device_bytes the token, target and loss buffers of max_microbatches.
  const SlidingModelShape& Shape() const override { return shape_; }

  // Draws microbatch mb = 0..num_microbatches-1 of `step` (TokenData::Microbatch(data_seed,
  // step, mb, B, T, ...)) and forgets the previous step's losses. Errors: InvalidArgument for
  // step < 0 or num_microbatches outside [1, max_microbatches].
  [[nodiscard]] absl::Status BeginStep(std::int64_t step, int num_microbatches) override;
  // Units 0 .. last-1: embedding (from the microbatch's tokens) or decoder forward into
  // call.output. Synchronous. Errors: FailedPrecondition before BeginStep; InvalidArgument
  // naming the field for a unit out of range or the last unit, mb outside [0, M) or
  // num_microbatches != M, and a null params / input (units > 0) / output / workspace.
  [[nodiscard]] absl::Status Forward(const UnitCall& call) override;
  // Every unit: ADDS the microbatch's parameter gradients (of the step's mean loss) into
  // call.grad_accum and OVERWRITES call.grad_input (units > 0). The head computes the loss of
  // its targets, its gradient scaled by grad_scale = float(1 / (M * N)), and records the
  // microbatch's loss sum; a decoder recomputes its forward from call.input. Errors as Forward's
  // (grad_output must be non-null below the last unit, grad_input above unit 0, grad_accum
  // always).
  [[nodiscard]] absl::Status Backward(const UnitCall& call) override;
  // sum over mb ascending of the head's loss sums (double) / (M * N). Errors:
  // FailedPrecondition naming the first microbatch whose head Backward has not run this step.
  [[nodiscard]] absl::StatusOr<double> StepLoss() override;

  const LlamaConfig& config() const { return config_; }
  const LlamaCpuUnits& units() const { return units_; }
  // Tokens and targets (N each) of microbatch mb of the current step (tests).
  const std::int32_t* tokens(int mb) const { return tokens_.data() + std::int64_t{mb} * N_; }
  const std::int32_t* targets(int mb) const { return targets_.data() + std::int64_t{mb} * N_; }

 private:
  LlamaCpuModel(const LlamaConfig& config, const TokenData& data,
                const LlamaCpuModelOptions& options);
  // The checks Forward and Backward share; `backward` selects which pointers must be set.
  [[nodiscard]] absl::Status CheckCall(const UnitCall& call, bool backward) const;

  LlamaConfig config_;
  const TokenData* data_;
  LlamaCpuModelOptions options_;
  int N_;
  LlamaCpuUnits units_;
  SlidingModelShape shape_;
  int num_microbatches_ = 0;             // of the current step; 0 before BeginStep
  std::vector<std::int32_t> tokens_;     // (max_microbatches, N)
  std::vector<std::int32_t> targets_;    // (max_microbatches, N)
  std::vector<double> loss_sums_;        // (max_microbatches) the head's sum of token losses
  std::vector<unsigned char> has_loss_;  // (max_microbatches)
};

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CPU_MODEL_H_
