// The GPT on the GPU as a pipeoffload::StageModel: the chunks (virtual stages by the placement)
// of one pipeline stage (gpt_cuda_chunk.h), the stage's AdamW on the GPU, and the iteration
// protocol around the runtime's F / B / W calls. The CUDA mirror of GptStageModel
// (examples/gpt/gpt_stage_model.h), same config, same data, same parameters at step 0.
//
// Iteration protocol, per training step s (the trainer drives it on each stage):
//   1. StartIteration(s): enqueues zeroing of the gradients and the upload of step s's tokens
//      (virtual stage 0) and targets (the last) for every microbatch.
//   2. The runtime's F / B / W calls, in schedule order (per chunk, B and W in microbatch
//      order, which fixes every gradient's accumulation order: bitwise reproducible).
//   3. With global-norm clipping, GradSquareSums() on every stage, combined by the trainer
//      (optimizer_schedule.h) into the step's scale; then OptimizerStep(scale): AdamW
//      (LaunchAdamUpdate) at the schedule's rate on every chunk's fp32 master, m and v, which
//      also rewrites the bf16 working copies.
// A model created without optimizer state (an optimizer-offload engine owns it) skips 3; its
// engines rewrite the bf16 copies (DeviceParameters::mutable_weights) instead.
// Everything is enqueued on the backend's compute stream; only the readers of results
// (Losses, ParameterHashes, DownloadMaster) and StartIteration's host-side token staging wait
// for it. Differences from the CPU model: bf16 activations (the loss agrees to a tolerance,
// not bitwise), untied embeddings only, and no saved-entry header (checking one would need a
// device-to-host read per B).
//
// Thread safety: one stage's calls must not overlap (the runtime issues them in order on one
// thread). Distinct stage models may run on different threads, on one GPU or several.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_STAGE_MODEL_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_STAGE_MODEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/cuda/gpt_cuda_chunk.h"
#include "examples/gpt/cuda/gpt_cuda_layer.h"
#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/gpt_params.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::gpt::cuda {

// How a stage model is built beyond its GptConfig.
struct GptCudaStageOptions {
  // false: no fp32 master, m or v on the GPU (an optimizer-offload engine owns them); see Create.
  bool with_optimizer_state = true;
  // true: every layer saves 20 C instead of 32 C bytes per token and recomputes its LayerNorm
  // outputs and GELU before the weight gradients (LayerDims::lean_saved, gpt_cuda_layer.h).
  bool lean_saved = false;
  // true: the model offers recompute (RetainedBytes >= 0 for kFull, and for kLean unless
  // lean_saved): Create allocates the full-recompute forward's workspace (about one layer's
  // entry plus the head's slots, GptCudaChunk::ForwardWorkspaceBytes), the lean scratch
  // (12 C bytes per token) and an (N,C) output and (N) losses the rebuild writes instead of the
  // real ones. false: RetainedBytes is -1, so the runtime refuses a program that recomputes.
  bool recompute = false;
  // The schedule's placement: chunk c computes VirtualStageMap{placement, p, v}.virtual_stage(
  // stage, c) (loop: c * p + stage; v, which needs v = 2: stage, then 2p - 1 - stage).
  Placement placement = Placement::kLoop;
};

class GptCudaStageModel final : public StageModel {
 public:
  // Stage `stage` of `num_stages` with `chunks_per_stage` chunks on `backend` (a CUDA backend,
  // which must outlive the model). Parameters, gradients, AdamW state, scratch and the step's
  // token buffers are cudaMalloc'd here (outside the runtime's arena), once.
  // With options.with_optimizer_state false the model keeps no fp32 master, m or v on the GPU: each
  // chunk's (which GptCudaChunk::CreateGpt allocates to upload the init) is copied to the host
  // and dropped as soon as the chunk exists, so creation holds at most one chunk's state and
  // the model none after; the host copies wait for TakeInitialMasters.
  // Errors: InvalidArgument for a bad config or pipeline shape, a corpus the config cannot
  // read, a non-CUDA backend, or sizes the CUDA kernels do not take (GptCudaChunk::CreateGpt);
  // Unimplemented for tied embeddings; allocation / CUDA / cuBLAS errors.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GptCudaStageModel>> Create(
      Backend& backend, const GptConfig& config, int num_stages, int chunks_per_stage, int stage,
      std::shared_ptr<const GptData> data, const GptCudaStageOptions& options = {});
  // Waits for the compute stream, then frees everything.
  ~GptCudaStageModel() override;

  // --- StageModel -----------------------------------------------------------------------------
  // 0 for a chunk outside [0, chunks_per_stage()).
  std::int64_t SavedBytes(int chunk, bool split_backward) const override;
  std::int64_t BoundaryBytes() const override;  // (B,T,C) bf16
  // InvalidArgument: mb or chunk out of range, a null pointer the call needs;
  // FailedPrecondition: no StartIteration yet. Then the kernels' errors.
  [[nodiscard]] absl::Status Forward(int mb, int chunk, const void* input, void* output,
                                     void* saved) override;
  [[nodiscard]] absl::Status Backward(int mb, int chunk, const void* grad_output,
                                      void* grad_input, void* saved,
                                      bool with_weight_grad) override;
  [[nodiscard]] absl::Status BackwardWeight(int mb, int chunk, void* saved) override;
  // Recompute (GptCudaChunk::RetainedBytes says what each mode keeps; -1 without
  // options.recompute). Errors as Forward; the chunk's for a mode it does not offer.
  std::int64_t RetainedBytes(int chunk, Recompute mode, bool split_backward) const override;
  [[nodiscard]] absl::Status ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                              void* retained, Recompute mode) override;
  [[nodiscard]] absl::Status RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                                            Recompute mode) override;
  // True for kLean with an unsplit backward on a chunk without the head when recompute is
  // offered (GptCudaChunk::BackwardReadsLean): B then reads the lean block in place, rebuilding
  // ln1, ln2 and g into the lean scratch layer by layer, bitwise as RecomputeSaved + B would.
  // The model remembers which entries ForwardRetaining(kLean) wrote (LeanRetainedEntries), so
  // Backward knows the layout of what it is given.
  bool BackwardReadsRetained(int chunk, Recompute mode, bool split_backward) const override;

  // --- Iteration protocol ---------------------------------------------------------------------
  [[nodiscard]] absl::Status StartIteration(std::int64_t step);
  // AdamW with bias correction t = steps so far + 1, at LearningRateAt(config.optimizer, t)
  // (optimizer_schedule.h), every gradient times `grad_scale` (global-norm clipping's
  // coefficient). Errors: FailedPrecondition when the build has no GPU Adam, or without
  // optimizer state (created without it, or dropped; the message says which); InvalidArgument
  // for a grad_scale not finite and > 0.
  [[nodiscard]] absl::Status OptimizerStep(float grad_scale = 1.0f);
  // Each of this stage's tensors' gradient sum of squares (DeviceParameters::GradSquareSums),
  // the step's gradients final (after its last B / W); waits for the compute stream.
  [[nodiscard]] absl::StatusOr<std::vector<TensorSquareSum>> GradSquareSums() const;

  // --- Optimizer state ------------------------------------------------------------------------
  bool has_optimizer_state() const;
  // Device bytes of the fp32 master, m and v the chunks hold now (12 per padded parameter, or
  // 0 without optimizer state).
  std::int64_t optimizer_state_bytes() const;
  // Waits for the compute stream, then frees every chunk's fp32 master, m and v for good (for
  // an optimizer-offload engine that took the masters: DownloadMasters first). Afterwards
  // OptimizerStep, DownloadMaster(s) and ParameterHashes fail with FailedPrecondition: "stage
  // s keeps no optimizer state on the GPU (dropped by DropOptimizerState | created without
  // it): an optimizer-offload engine owns ...". OK when already without. Errors: the wait's.
  [[nodiscard]] absl::Status DropOptimizerState();
  // Chunk `chunk`'s fp32 masters at creation, over its flat arrays (padded_elements() values,
  // padding zero): an engine's initial parameters. Only for a model created without optimizer
  // state, once per chunk (the host copy is released). Errors: InvalidArgument for a chunk out
  // of range; FailedPrecondition when the model was created with optimizer state (use
  // DownloadMasters) or the chunk's copy was already taken.
  [[nodiscard]] absl::StatusOr<std::vector<float>> TakeInitialMasters(int chunk);
  // Chunk `chunk`'s whole fp32 master array from the GPU (see TakeInitialMasters for the
  // layout). Errors: InvalidArgument for a chunk out of range; FailedPrecondition without
  // optimizer state.
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadMasters(int chunk) const;

  // --- Results (each waits for the compute stream) --------------------------------------------
  bool holds_loss() const;
  // Mean loss of each microbatch of the current iteration, summed in token order in double as
  // the CPU model does. FailedPrecondition on a stage without the loss.
  [[nodiscard]] absl::StatusOr<std::vector<double>> Losses() const;
  // FNV-1a hashes of the fp32 master of each tensor (CombineTensorHashes gives the checksum).
  // FailedPrecondition without optimizer state (an engine holds the masters then).
  [[nodiscard]] absl::StatusOr<std::vector<TensorHash>> ParameterHashes() const;
  // Tensor `id`'s fp32 master, bf16 copy (widened) or gradient, or NotFound on this stage.
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadMaster(int id) const;
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadWeight(int id) const;
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadGrad(int id) const;
  // Blocks until the compute stream is idle (bounded: DeadlineExceeded after the timeout).
  [[nodiscard]] absl::Status Synchronize(double timeout_seconds = 120.0) const;

  const GptConfig& config() const { return config_; }
  int num_tensors() const { return num_tensors_; }
  int chunks_per_stage() const { return static_cast<int>(chunks_.size()); }
  GptCudaChunk& chunk(int c) { return *chunks_[static_cast<std::size_t>(c)]; }
  // Device memory the model holds (cudaMalloc'd in Create): weights, gradients, scratch, token
  // buffers and the optimizer state (optimizer_state_bytes()).
  std::int64_t device_bytes() const;

 private:
  GptCudaStageModel(Backend& backend, const GptConfig& config, int num_stages, int stage,
                    std::shared_ptr<const GptData> data, int device, cudaStream_t stream);
  absl::Status CheckCall(const char* op, int mb, int chunk, const void* saved) const;
  absl::Status CheckChunk(const char* op, int chunk) const;
  bool holds_parameters() const;  // some chunk has tensors
  // FailedPrecondition for `op` on a model without GPU optimizer state, saying why.
  absl::Status NoOptimizerStateError(const char* op) const;
  // Chunk and local tensor index of global tensor `id`, or NotFound.
  absl::StatusOr<std::pair<const GptCudaChunk*, int>> FindTensor(int id) const;

  Backend& backend_;
  const GptConfig config_;
  const int num_stages_;
  const int stage_;
  const int num_tensors_;
  const std::shared_ptr<const GptData> data_;
  const int device_;
  const cudaStream_t stream_;
  std::unique_ptr<GptCudaContext> context_;  // before the chunks: they use its memory
  std::vector<std::unique_ptr<GptCudaChunk>> chunks_;

  // Created without optimizer state: each chunk's masters at creation (TakeInitialMasters),
  // and whether they were taken. Empty for a model created with it.
  std::vector<std::vector<float>> initial_masters_;
  std::vector<bool> masters_taken_;

  std::int64_t step_ = -1;
  std::int64_t optimizer_steps_ = 0;
  // The step's microbatches: (m, N) each, device and host staging.
  std::int32_t* tokens_ = nullptr;
  std::int32_t* targets_ = nullptr;
  float* losses_ = nullptr;
  std::vector<std::int32_t> host_tokens_;
  std::vector<std::int32_t> host_targets_;
  // options.recompute only (else null): ForwardRetaining(kFull)'s workspace, and where
  // RecomputeSaved's forward writes the output and losses nobody reads.
  std::byte* recompute_workspace_ = nullptr;
  bf16* recompute_output_ = nullptr;
  float* recompute_losses_ = nullptr;
  // The entries that hold a lean retained block (BackwardReadsRetained); cleared by
  // StartIteration.
  LeanRetainedEntries lean_entries_;
};

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_STAGE_MODEL_H_
