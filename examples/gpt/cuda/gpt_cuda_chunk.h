// One virtual stage of the GPT on the GPU (bf16 activations, fp32 accumulation): the CUDA
// mirror of GptChunk (examples/gpt/gpt_chunk.h). Embeddings on virtual stage 0, final LN + head
// + loss on the last, layers (gpt_cuda_layer.h) between; the same parameters as the CPU model
// (uploaded from the CPU's ParameterBlock: same seed, same tensors), or random ones for the
// benchmark's layer stack (a chunk of layers only).
//
// Saved region (byte offsets, each slot 256-byte aligned; N = B*T):
//   [first] tokens (N) int32
//   per layer: LayerSavedLayout (32 C + 16 + 4 NH bytes per token, gpt_cuda_layer.h; 20 C +
//              16 + 4 NH when the context's dims are lean_saved: then ln1, ln2 and gelu(fch)
//              live in the context's scratch and BackwardWeight recomputes them)
//   [last]  lnf_in (N,C) bf16 | lnf mean, rstd (N) fp32 | lnf_out (N,C) bf16 |
//           logits (N,V) bf16 (dlogits in place after Backward) | lse (N) fp32 | targets (N)
//   -- SavedBytes(false) ends here; the split-backward region follows --
//   [first] d_x0 (N,C) bf16
//   per layer: LayerGradLayout (22 C bytes per token)
//   [last]  d_lnf_out (N,C) bf16
// A layer's output is written straight into the next layer's x (or lnf_in, or the boundary
// output), as on the CPU. Unsplit backward keeps the output gradients in the context's
// scratch (its ping-pong slots, and its d_atty slot for d_lnf_out, which no layer needs before
// the head's weight gradient has consumed it).
//
// No state outside the saved region survives from Forward to Backward: the runtime may move
// the entry to host and back to a different address in between. Every call only enqueues work
// on the context's stream.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_CHUNK_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_CHUNK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/cuda/gpt_cuda_layer.h"
#include "examples/gpt/cuda/gpt_cuda_params.h"
#include "examples/gpt/gpt_config.h"

namespace pipeoffload::gpt::cuda {

class GptCudaChunk {
 public:
  // Virtual stage `virtual_stage` of `num_virtual_stages` of the GPT of `config` (untied
  // embeddings only), parameters uploaded from the CPU model's init for config.seed, with fp32
  // master and AdamW state. `context` (dims B, T, C, NH of the config) must outlive the chunk.
  // Errors: InvalidArgument for a config the CUDA kernels cannot run (head size not 64 / 128,
  // C not a multiple of 64, V not a multiple of 8) or tied embeddings (Unimplemented);
  // allocation and CUDA errors.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GptCudaChunk>> CreateGpt(
      const GptConfig& config, int virtual_stage, int num_virtual_stages, GptCudaContext& context);
  // A chunk of `num_layers` layers only (no embedding, head or loss), bf16 weights drawn on the
  // device from `seed` (layer l's tensors get ids as in a GPT of `total_layers` layers starting
  // at `first_layer`), fp32 gradients, no optimizer state.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GptCudaChunk>> CreateLayerStack(
      int first_layer, int num_layers, int total_layers, std::uint64_t seed,
      GptCudaContext& context);

  GptCudaChunk(const GptCudaChunk&) = delete;
  GptCudaChunk& operator=(const GptCudaChunk&) = delete;

  bool is_first() const { return first_; }
  bool is_last() const { return last_; }
  int num_layers() const { return static_cast<int>(layer_slots_.size()); }
  DeviceParameters& params() { return *params_; }
  const DeviceParameters& params() const { return *params_; }

  // Bytes of the saved region (split: including what BackwardWeight reads).
  std::int64_t SavedBytes(bool split) const {
    return split ? saved_bytes_ + split_bytes_ : saved_bytes_;
  }

  // Forward of one microbatch. tokens (N) on the first chunk, input (N,C) on the others;
  // targets (N) and losses (N, written) on the last, output (N,C) on the others. All device
  // pointers; saved has SavedBytes(false) bytes. Errors: InvalidArgument for a null pointer the
  // chunk needs; the kernels'.
  [[nodiscard]] absl::Status Forward(const std::int32_t* tokens, const std::int32_t* targets,
                                     const bf16* input, bf16* output, std::byte* saved,
                                     float* losses);
  // Backward of one microbatch: grad_output (N,C) on all but the last chunk, grad_input (N,C)
  // written on all but the first; dloss = d(objective)/d(each token's loss) on the last. With
  // `with_weight_grad` also accumulates the parameter gradients; otherwise leaves what
  // BackwardWeight needs in saved (SavedBytes(true) bytes).
  [[nodiscard]] absl::Status Backward(const bf16* grad_output, bf16* grad_input, std::byte* saved,
                                      bool with_weight_grad, float dloss);
  // Accumulates the parameter gradients from a region left by Backward(..., false).
  [[nodiscard]] absl::Status BackwardWeight(std::byte* saved);

 private:
  GptCudaChunk(GptCudaContext& context, bool first, bool last, int vocab)
      : context_(context), first_(first), last_(last), V_(vocab) {}

  void LayOut(int num_layers);
  LayerWeights Weights(int local_layer) const;
  LayerWeightGrads WeightGrads(int local_layer) const;
  LayerGradBuffers GradsOf(int local_layer, std::byte* saved, bool split,
                           const bf16* dout_override = nullptr) const;
  bf16* EmbeddingGrad(std::byte* saved, bool split) const;
  bf16* LnfOutGrad(std::byte* saved, bool split) const;
  absl::Status HeadBackwardWeight(std::byte* saved, bool split);
  absl::Status EncoderBackwardWeight(std::byte* saved, bool split);
  const bf16* W(int id) const { return params_->weight(params_->Find(id)); }
  float* G(int id) const { return params_->grad(params_->Find(id)); }

  GptCudaContext& context_;
  const bool first_;
  const bool last_;
  const int V_;  // vocabulary (last chunk only)
  int first_layer_ = 0;
  int lnf_w_id_ = -1, lnf_b_id_ = -1, head_id_ = -1;
  std::unique_ptr<DeviceParameters> params_;

  LayerSavedLayout layer_layout_;
  LayerGradLayout grad_layout_;
  // Saved layout, bytes from the region's start.
  std::int64_t tokens_ = -1;
  std::vector<std::int64_t> layer_slots_;  // start of each layer's LayerSavedLayout
  std::int64_t lnf_in_ = -1, lnf_mean_ = -1, lnf_rstd_ = -1, lnf_out_ = -1, logits_ = -1, lse_ = -1,
               targets_ = -1;
  std::int64_t saved_bytes_ = 0;
  std::int64_t d_x0_ = -1;
  std::vector<std::int64_t> grad_slots_;  // start of each layer's LayerGradLayout
  std::int64_t d_lnf_out_ = -1;
  std::int64_t split_bytes_ = 0;
};

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_CHUNK_H_
