// The GPT as a pipeoffload::StageModel: the chunks (virtual stages c * p + stage) of one pipeline
// stage, the stage's part of the optimizer, and the iteration protocol around the runtime's
// F / B / W calls. The runtime knows nothing of GPT; it only calls the StageModel methods.
//
// Iteration protocol, per training step s (the trainer drives it on each stage):
//   1. StartIteration(s): zeroes this stage's gradients and loss slots; F reads microbatch data
//      of step s from now on.
//   2. The runtime's F / B / W calls, in schedule order (per chunk, B and W in microbatch order;
//      that order is what makes gradients bitwise equal to the single-process reference).
//   3. Tied embeddings across stages only (NeedsTiedGradExchange()): send TiedGradPart() to the
//      peer stage (stage 0 <-> stage p-1) and SetPeerTiedGradPart() with what it sent.
//   4. With global-norm clipping: GradSquareSums() on every stage, combined across the stages
//      (CombineSquareSums, ClipScale: optimizer_schedule.h) into the step's scale.
//   5. OptimizerStep(scale): gradients times scale, then AdamW on this stage's parameters at
//      the schedule's rate (LearningRateAt).
//
// Tied embeddings: virtual stage 0 holds wte and virtual stage L-1 a mirror copy for the head;
// each accumulates its own part of wte's gradient (embedding part, head part). The step's
// gradient is always embedding part + head part, in that order, on both holders, so both copies
// take the same AdamW step and stay bitwise equal, for every split including L = 1.
//
// Saved entries start with a 32-byte header (magic, state, mb, virtual stage, step) that F
// writes and B / W check, so a stash entry handed to the wrong call is an error, not garbage.
//
// Thread safety: one stage's calls must not overlap (the runtime issues a stage's compute ops in
// order on one thread). Distinct GptStageModels may run on different threads; the shared
// GptData is read-only.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_GPT_STAGE_MODEL_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_GPT_STAGE_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_chunk.h"
#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/gpt_params.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::gpt {

class GptStageModel final : public StageModel {
 public:
  // Bytes of the header at the start of every saved entry.
  static constexpr std::int64_t kSavedHeaderBytes = 32;

  // The model of pipeline stage `stage` of `num_stages` with `chunks_per_stage` chunks each,
  // chunk c computing virtual stage VirtualStageMap{placement, p, v}.virtual_stage(stage, c)
  // (loop: c * p + stage; v: stage, then 2p - 1 - stage), the schedule's placement.
  // InvalidArgument for a bad config or pipeline shape (see ValidatePipelineShape), placement v
  // with v != 2, or a corpus the config cannot read (see GptData::CheckCompatible). `data` is
  // shared, read-only. p * v may exceed n_layer: the surplus virtual stages hold no layers
  // (VirtualStageLayers).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GptStageModel>> Create(
      const GptConfig& config, int num_stages, int chunks_per_stage, int stage,
      std::shared_ptr<const GptData> data, Placement placement = Placement::kLoop);

  // --- StageModel -----------------------------------------------------------------------------
  // 0 for a chunk outside [0, chunks_per_stage()) (Forward then fails with InvalidArgument).
  std::int64_t SavedBytes(int chunk, bool split_backward) const override;
  std::int64_t BoundaryBytes() const override;  // (B,T,C) fp32
  // InvalidArgument: mb or chunk out of range, a null pointer the call needs, a saved pointer
  // that is not 4-byte aligned. FailedPrecondition: no StartIteration yet; for B and W, a saved
  // entry whose header does not match (mb, chunk, step) or is not in the state the call needs
  // (F done for B; B without weight grad done for W).
  [[nodiscard]] absl::Status Forward(int mb, int chunk, const void* input, void* output,
                                     void* saved) override;
  [[nodiscard]] absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input,
                                      void* saved, bool with_weight_grad) override;
  [[nodiscard]] absl::Status BackwardWeight(int mb, int chunk, void* saved) override;
  // Recompute: both modes on every chunk (GptChunk::RetainedBytes says what each keeps), -1
  // for kNone or a chunk out of range. The retained block starts with the same header as a
  // saved entry (state "retained lean" / "retained full"), so RecomputeSaved refuses a block
  // of another (mb, chunk, step) or mode with FailedPrecondition; other errors as Forward.
  // ForwardRetaining runs Forward into a workspace of one saved entry that the model owns
  // (host memory, outside the runtime's arena) and keeps the retained part: this CPU model's
  // recompute saves arena memory, not host memory; it exists to prove the protocol bitwise.
  std::int64_t RetainedBytes(int chunk, Recompute mode, bool split_backward) const override;
  [[nodiscard]] absl::Status ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                              void* retained, Recompute mode) override;
  [[nodiscard]] absl::Status RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                                            Recompute mode) override;

  // --- Iteration protocol (see the file comment) ----------------------------------------------
  void StartIteration(std::int64_t step);
  bool NeedsTiedGradExchange() const;
  std::int64_t TiedGradElements() const;  // V * C
  // This stage's part of wte's gradient (V,C). REQUIRES: NeedsTiedGradExchange().
  const float* TiedGradPart() const;
  // The peer's part. InvalidArgument when this stage needs none or `elements` != V * C.
  [[nodiscard]] absl::Status SetPeerTiedGradPart(const float* part, std::int64_t elements);
  // Each non-mirror tensor's gradient sum of squares, once the step's gradients are final
  // (the tied parts summed). FailedPrecondition as OptimizerStep.
  [[nodiscard]] absl::StatusOr<std::vector<TensorSquareSum>> GradSquareSums();
  // Every gradient times `grad_scale` (clipping's coefficient; 1 leaves them alone), then
  // AdamW on this stage's parameters at LearningRateAt(config.optimizer, t), bias correction
  // t = number of steps so far + 1. FailedPrecondition when a needed tied-gradient part was
  // not set this iteration; InvalidArgument for a grad_scale not finite and > 0.
  [[nodiscard]] absl::Status OptimizerStep(float grad_scale = 1.0f);

  // --- Results --------------------------------------------------------------------------------
  // Whether this stage holds virtual stage L-1, whose Forward computes the loss.
  bool holds_loss() const;
  // Mean loss of each microbatch of the current iteration (NaN until its last-virtual-stage
  // Forward ran; all NaN on stages without the loss).
  const std::vector<double>& losses() const { return losses_; }
  // Hashes of this stage's parameter tensors (mirrors excluded); combine every stage's with
  // CombineTensorHashes(..., num_tensors()) for the model checksum.
  std::vector<TensorHash> ParameterHashes() const;
  int num_tensors() const { return num_tensors_; }

  const GptConfig& config() const { return config_; }
  int num_stages() const { return num_stages_; }
  int chunks_per_stage() const { return static_cast<int>(chunks_.size()); }
  int stage() const { return stage_; }
  // Chunk c (its virtual stage: the placement's map, see Create); for tests and tools.
  GptChunk& chunk(int c) { return *chunks_[static_cast<std::size_t>(c)]; }
  const GptChunk& chunk(int c) const { return *chunks_[static_cast<std::size_t>(c)]; }

 private:
  GptStageModel(const GptConfig& config, const VirtualStageMap& map, int stage,
                std::shared_ptr<const GptData> data);

  // `buffer` names `saved` in the messages ("saved" or "retained").
  absl::Status CheckCall(const char* op, int mb, int chunk, const void* saved,
                         const char* buffer = "saved") const;
  absl::Status CheckHeader(const char* op, int mb, int chunk, const void* saved,
                           std::uint32_t expected_state) const;
  void WriteHeader(int mb, int chunk, void* saved, std::uint32_t state) const;
  absl::Status CheckForwardBuffers(const char* op, int mb, int chunk, const void* input,
                                   const void* output) const;
  absl::Status CheckMode(const char* op, int mb, int chunk, Recompute mode) const;
  // Forward's math into `payload` (a saved region past its header); records the loss.
  void RunForward(int mb, int chunk, const void* input, void* output, std::byte* payload);
  // Gradients of the wte copies this stage holds when tied (wte on virtual stage 0, the mirror on
  // L-1), or null. Under either placement chunk 0 has the stage's lowest virtual stage and the
  // last chunk its highest, so only the front can be 0 and only the back L-1. Const: the chunks are owned through pointers, the gradients are scratch-like.
  float* EmbeddingPartGrad() const;
  float* HeadPartGrad() const;
  // Step 3's sum: both copies of tied wte get embedding part + head part, once per iteration.
  absl::Status FinishGradients();

  GptConfig config_;
  int num_stages_;
  int stage_;
  int num_tensors_;
  std::shared_ptr<const GptData> data_;
  std::vector<std::unique_ptr<GptChunk>> chunks_;

  std::int64_t step_ = -1;  // current iteration, -1 before the first StartIteration
  std::int64_t optimizer_steps_ = 0;
  std::vector<double> losses_;         // (m)
  std::vector<std::int32_t> tokens_;   // (B,T) scratch for one Forward
  std::vector<std::int32_t> targets_;  // (B,T)
  std::vector<float> workspace_;       // one chunk's saved entry, for ForwardRetaining
  std::vector<float> peer_tied_grad_;  // (V,C)
  bool peer_tied_grad_set_ = false;
  bool gradients_finished_ = false;  // FinishGradients ran this iteration
};

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_GPT_STAGE_MODEL_H_
