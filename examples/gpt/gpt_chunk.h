// One virtual stage of the GPT (a "chunk" of some pipeline stage): its parameters, the layout of
// its saved activations, and its forward, backward-input and backward-weight math for one
// microbatch. It is the only place the model's math is composed; the single-process reference
// and every pipeline split run exactly these calls, which is why they agree bitwise.
//
// What a chunk must not do: keep anything from Forward for Backward outside `saved` (the runtime
// may move the stash entry to host and back to a different address in between). Its scratch
// buffers hold temporaries of one call only.
//
// Shapes: B, T, C, NH, V, N = B * T as in gpt_config.h; "layer l" is a global layer index.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_GPT_CHUNK_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_GPT_CHUNK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_params.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::gpt {

class GptChunk {
 public:
  // REQUIRES: ValidateGptConfig(config).ok(), 0 <= virtual_stage < num_virtual_stages.
  // Allocates and initializes the chunk's parameters from config.seed. A chunk may hold no layers
  // (more virtual stages than layers): it then only embeds, only runs the head, or passes the
  // residual stream (and its gradient) through unchanged.
  GptChunk(const GptConfig& config, int virtual_stage, int num_virtual_stages);

  GptChunk(const GptChunk&) = delete;
  GptChunk& operator=(const GptChunk&) = delete;

  int virtual_stage() const { return virtual_stage_; }
  bool is_first() const { return virtual_stage_ == 0; }
  bool is_last() const { return virtual_stage_ == num_virtual_stages_ - 1; }
  LayerRange layers() const { return layers_; }

  ParameterBlock& params() { return params_; }
  const ParameterBlock& params() const { return params_; }

  // Bytes of the saved region Forward fills (split = false) and, when split, the extra room
  // Backward(with_weight_grad = false) fills for BackwardWeight. Multiple of 4.
  std::int64_t SavedBytes(bool split) const {
    return 4 * (split ? saved_floats_ + weight_grad_floats_ : saved_floats_);
  }

  // Forward of one microbatch. tokens (B,T) on the first virtual stage, input (B,T,C) on the
  // others; targets (B,T) on the last, output (B,T,C) on the others. Writes every byte of
  // saved[0, SavedBytes(false)). Returns the mean loss over the N tokens on the last virtual
  // stage, 0 elsewhere. REQUIRES: tokens/targets in [0, V); saved 4-byte aligned.
  double Forward(const std::int32_t* tokens, const std::int32_t* targets, const float* input,
                 float* output, std::byte* saved);

  // Backward of one microbatch from its saved region. grad_output (B,T,C) on all but the last
  // virtual stage; writes grad_input (B,T,C) on all but the first. dloss = d(objective) /
  // d(each token's loss), used on the last virtual stage. With `with_weight_grad` it also
  // accumulates the parameter gradients; otherwise it writes what BackwardWeight needs into
  // saved[SavedBytes(false), SavedBytes(true)). Overwrites parts of saved either way.
  void Backward(const float* grad_output, float* grad_input, std::byte* saved,
                bool with_weight_grad, float dloss);

  // Accumulates the parameter gradients from a saved region left by Backward(..., false).
  void BackwardWeight(std::byte* saved);

  // --- Recompute (StageModel::RetainedBytes / ForwardRetaining / RecomputeSaved) -------------
  // kFull keeps the chunk's input: the token ids on the first virtual stage (the embedding is
  // recomputed from them), the (N,C) input elsewhere, and the targets on the last. kLean keeps
  // the saved region minus what one cheap kernel rebuilds from what stays: both LayerNorm
  // outputs of each layer, the GELU output, the final LayerNorm's output.
  // Bytes of the retained block, a multiple of 4; 0 for kNone.
  std::int64_t RetainedBytes(Recompute mode) const;
  // Copies the part of a full saved region (as Forward wrote it) that `mode` keeps into
  // retained[0, RetainedBytes(mode)).
  void Retain(const std::byte* saved, std::byte* retained, Recompute mode) const;
  // Writes every byte of saved[0, SavedBytes(false)) from a block Retain(mode) filled: the same
  // bytes Forward wrote, because the same kernels run on the same inputs. Touches only `saved`
  // and scratch (the loss of the last virtual stage is computed again and dropped).
  // REQUIRES: mode != kNone.
  void Rebuild(const std::byte* retained, std::byte* saved, Recompute mode);

 private:
  // Offsets, in floats from the start of the saved region, of a layer's forward activations.
  struct LayerSlots {
    std::int64_t x, ln1_mean, ln1_rstd, ln1_out, qkv, att, atty, res2, ln2_mean, ln2_rstd, ln2_out,
        fch, fch_gelu;
  };
  // Gradients a layer's BackwardWeight consumes (in saved when split, else in scratch).
  struct LayerGrads {
    float* dout;      // (N,C)   gradient of the layer's output
    float* d_fch;     // (N,4C)  gradient of the MLP pre-activation
    float* d_ln2out;  // (N,C)
    float* dres2;     // (N,C)   gradient of the residual after attention
    float* d_qkv;     // (N,3C)
    float* d_ln1out;  // (N,C)
  };
  // Pointers to one layer's 12 parameter (or gradient) tensors.
  struct LayerTensors {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attn_proj_w, *attn_proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b,
        *fc_proj_w, *fc_proj_b;
  };

  LayerTensors LayerParams(int local_layer, bool grads);
  float* Tensor(int id, bool mirror, bool grad);
  // The grads of local layer i: in the saved W region when `split`, else in scratch.
  LayerGrads GradsOf(int local_layer, float* base, bool split);
  float* EmbeddingGrad(float* base, bool split);  // (N,C) gradient of the embedding output
  float* LnfOutGrad(float* base, bool split);     // (N,C) gradient of the final LN output

  // One contiguous range of the saved layout and whether each retained block keeps it.
  struct Segment {
    std::int64_t offset, floats;
    bool lean, full;
    bool KeptBy(Recompute mode) const {
      return mode == Recompute::kLean ? lean : mode == Recompute::kFull && full;
    }
  };

  void LayerForward(int local_layer, float* base, float* out);
  // Forward from a saved region whose inputs (tokens or x0, targets) are in place; the last
  // layer writes `output` (or lnf_in). Returns the mean loss on the last virtual stage, else 0.
  double ForwardFromSaved(float* base, float* output);
  // Where the chunk's input lands in the saved region (or `output` for a chunk with no layers
  // that is not the last).
  float* InputSlot(float* base, float* output) const;
  void LayerBackwardInput(int local_layer, float* base, const LayerGrads& g, float* dinp);
  void LayerBackwardWeight(int local_layer, float* base, const LayerGrads& g);
  void HeadBackwardWeight(float* base, bool split);

  GptConfig config_;
  int virtual_stage_;
  int num_virtual_stages_;
  LayerRange layers_;
  int B_, T_, C_, NH_, V_, N_;
  ParameterBlock params_;

  // Saved layout (floats from the region's start).
  std::int64_t tokens_ = -1;  // (N) int32, first virtual stage
  std::vector<LayerSlots> slots_;
  std::int64_t lnf_in_ = -1, lnf_mean_ = -1, lnf_rstd_ = -1, lnf_out_ = -1;  // last
  std::int64_t probs_ = -1;    // (N,V), logits then probs; Backward turns them into dlogits
  std::int64_t targets_ = -1;  // (N) int32
  std::int64_t saved_floats_ = 0;
  std::vector<Segment> segments_;  // the forward part, in order, covering [0, saved_floats_)
  // Split-backward extra region, after the forward part.
  std::int64_t d_x0_ = -1;  // (N,C), first
  std::vector<std::int64_t>
      layer_grads_;              // each (N, 11C): dout, d_fch, d_ln2out, dres2, d_qkv, d_ln1out
  std::int64_t d_lnf_out_ = -1;  // (N,C), last
  std::int64_t weight_grad_floats_ = 0;

  // Scratch, for temporaries inside one call.
  std::vector<float> branch_;         // (N,C)   attention / MLP branch output before the residual
  std::vector<float> losses_;         // (N)
  std::vector<float> d_fch_gelu_;     // (N,4C)
  std::vector<float> d_atty_;         // (N,C)
  std::vector<float> att_row_;        // (T)
  std::vector<float> unsplit_grads_;  // (N, 11C) + 2 x (N,C): a LayerGrads and ping-pong douts
  std::vector<float> d_lnf_out_scratch_;  // (N,C)
  std::vector<float> rebuild_output_;     // (N,C) the output Rebuild(kFull) drops; not last
};

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_GPT_CHUNK_H_
