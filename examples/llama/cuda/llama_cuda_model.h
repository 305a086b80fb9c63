// The bf16 Llama model on the GPU as a layer-sliding SlidingModel (layer_sliding.h): the units
// of LlamaUnitShapes ("embed", "layer.<i>", "head"), the math of llama_cuda_layer.h, the step's
// microbatches drawn from a TokenData with the CPU model's seeds (so LlamaCpuModel and this
// model see the same tokens). The CUDA mirror of llama_cpu_model.h's LlamaCpuModel.
//
// Invariants:
//  - Device memory is allocated once, in Create (one backend block for the tokens, targets,
//    embedding-gradient row indexes and loss sums of max_microbatches; the units' Linear
//    workspace and RoPE table): model_device_bytes counts all of it.
//  - Every call enqueues on CudaComputeStream(backend) and returns; only StepLoss waits (for the
//    copy of the loss sums, polled, bounded). BeginStep writes the pinned staging only after the
//    previous step's upload from it has finished (an event, long past by then).
//  - Microbatch mb's head Backward overwrites loss_sums[mb]; StepLoss sums them in mb order.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_MODEL_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_MODEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/llama/cuda/llama_cuda_layer.h"
#include "examples/llama/llama_config.h"
#include "examples/llama/llama_data.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::llama::cuda {

struct LlamaCudaModelOptions {
  int batch_size = 1;           // B sequences per microbatch, >= 1
  int seq_len = 64;             // T tokens per sequence, >= 1
  int max_microbatches = 1;     // the most BeginStep accepts (its buffers are preallocated)
  std::uint64_t data_seed = 0;  // TokenData::Microbatch's seed, as LlamaCpuModelOptions'
  // Fused cross-entropy rows per chunk; 0: automatic (LlamaCudaUnits::Create), B * T: the
  // materialised logits.
  int ce_chunk_rows = 0;
  double timeout_seconds = 600.0;  // bound on StepLoss's and BeginStep's waits
};

class LlamaCudaModel : public SlidingModel {
 public:
  // On `backend` (a CUDA backend; it and `data` must outlive the model). Errors:
  // InvalidArgument for a non-CUDA backend, a bad config or one the CUDA units do not take
  // (LlamaCudaUnits::Create's message), options out of range (naming the field), or data that
  // cannot feed it (TokenData::CheckCompatible's message); ResourceExhausted / Internal from
  // the allocations and CUDA calls.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlamaCudaModel>> Create(
      Backend& backend, const LlamaConfig& config, const TokenData& data,
      const LlamaCudaModelOptions& options);
  // The shape Create gives a model of `config` and `options`, without a device (--dry-run).
  // Errors: Create's argument errors.
  [[nodiscard]] static absl::StatusOr<SlidingModelShape> PlanShape(
      const LlamaConfig& config, const LlamaCudaModelOptions& options);
  // Waits (bounded) for the compute stream, then frees everything.
  ~LlamaCudaModel() override;
  LlamaCudaModel(const LlamaCudaModel&) = delete;
  LlamaCudaModel& operator=(const LlamaCudaModel&) = delete;

  // param_dtype kBf16, activation_bytes N * H * 2, workspace_bytes the units' (exact, from
  // their layouts; the embedding needs none), model_device_bytes as the invariants say.
  const SlidingModelShape& Shape() const override { return shape_; }

  // Draws microbatch mb = 0..num_microbatches-1 of `step` (TokenData::Microbatch(data_seed,
  // step, mb, B, T, ...)) on the host, builds each one's embedding-gradient row index, and
  // enqueues one upload of them all. Errors: InvalidArgument for step < 0 or num_microbatches
  // outside [1, max_microbatches]; DeadlineExceeded if the previous upload does not finish.
  [[nodiscard]] absl::Status BeginStep(std::int64_t step, int num_microbatches) override;
  // Units 0 .. last-1: embedding (from the microbatch's tokens) or decoder forward into
  // call.output. Errors: FailedPrecondition before BeginStep; InvalidArgument naming the field
  // for a unit out of range or the last unit, mb outside [0, M) or num_microbatches != M, and a
  // null params / input (units > 0) / output / workspace (units that need one); then the
  // kernels'.
  [[nodiscard]] absl::Status Forward(const UnitCall& call) override;
  // Every unit: ADDS the microbatch's parameter gradients (of the step's mean loss) into
  // call.grad_accum and OVERWRITES call.grad_input (units > 0). The head computes the loss of
  // its targets with grad_scale = float(1 / (M * N)) and writes the microbatch's loss sum on
  // the device; a decoder recomputes its forward from call.input. Errors as Forward's
  // (grad_output non-null below the last unit, grad_input above unit 0, grad_accum always).
  [[nodiscard]] absl::Status Backward(const UnitCall& call) override;
  // sum over mb ascending of the head's loss sums / (M * N): copies them D2H and waits for that
  // copy (the one synchronizing call). Errors: FailedPrecondition before BeginStep or naming
  // the first microbatch whose head Backward has not run this step; DeadlineExceeded.
  [[nodiscard]] absl::StatusOr<double> StepLoss() override;

  const LlamaConfig& config() const { return config_; }
  LlamaCudaUnits& units() { return *units_; }
  // Host copies of microbatch mb's tokens and targets (N each) of the current step (tests).
  const std::int32_t* tokens(int mb) const { return host_ints_ + std::int64_t{mb} * mb_ints_; }
  const std::int32_t* targets(int mb) const { return tokens(mb) + N_; }

 private:
  LlamaCudaModel(Backend& backend, const LlamaConfig& config, const TokenData& data,
                 const LlamaCudaModelOptions& options, cudaStream_t stream, int device);
  [[nodiscard]] absl::Status Allocate();
  [[nodiscard]] absl::Status CheckCall(const UnitCall& call, bool backward) const;
  // Polls `event` until it has completed; DeadlineExceeded naming `what` after the timeout.
  [[nodiscard]] absl::Status WaitEvent(cudaEvent_t event, const char* what) const;

  Backend& backend_;
  const LlamaConfig config_;
  const TokenData* data_;
  const LlamaCudaModelOptions options_;
  const cudaStream_t stream_;
  const int device_;
  const int N_;
  // Per microbatch, ints: tokens (N) | targets (N) | embedding row index (3N + 1), padded to
  // 64 ints (256 bytes), so one copy uploads a step's microbatches.
  const std::int64_t mb_ints_;
  std::unique_ptr<LlamaCudaUnits> units_;
  SlidingModelShape shape_;
  // Device block: (max_microbatches, mb_ints_) ints, then (max_microbatches) loss sums (double).
  void* device_block_ = nullptr;
  std::int64_t device_block_bytes_ = 0;
  std::int32_t* device_ints_ = nullptr;
  double* device_losses_ = nullptr;
  // Pinned host staging of the same shape.
  void* host_block_ = nullptr;
  std::int32_t* host_ints_ = nullptr;
  double* host_losses_ = nullptr;
  cudaEvent_t uploaded_ = nullptr;       // after BeginStep's upload
  cudaEvent_t losses_ready_ = nullptr;   // after StepLoss's download
  int num_microbatches_ = 0;             // of the current step; 0 before BeginStep
  std::vector<int> segments_;            // (max_microbatches) distinct tokens per microbatch
  std::vector<unsigned char> has_loss_;  // (max_microbatches) head Backward enqueued
};

}  // namespace pipeoffload::llama::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_MODEL_H_
