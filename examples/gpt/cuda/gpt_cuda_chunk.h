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
// Recompute (StageModel::ForwardRetaining / RecomputeSaved): the lean retained block is the
// saved region's forward part with each layer in its lean layout and without lnf_out; the full
// one holds the tokens (first) or the chunk's input, then the targets (last).
// An unsplit Backward of a chunk without the head can read the lean block as it is
// (EntryLayout::kLeanRetained, BackwardReadsLean): the input backward never reads ln1, ln2 or g,
// and the weight backward recomputes them into the context's lean scratch, as it does for a
// lean_saved layout, so no full entry is rebuilt and nothing is copied.
//
// No state outside the saved region survives from Forward to Backward: the runtime may move
// the entry to host and back to a different address in between. Every call only enqueues work
// on the context's stream.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_CHUNK_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_CHUNK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/cuda/gpt_cuda_layer.h"
#include "examples/gpt/cuda/gpt_cuda_params.h"
#include "examples/gpt/gpt_config.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::gpt::cuda {

// What the region passed to GptCudaChunk::Backward holds.
enum class EntryLayout : std::uint8_t {
  kSaved,         // the saved region Forward or RecomputeSaved wrote
  kLeanRetained,  // the lean retained block ForwardRetaining(kLean) wrote (BackwardReadsLean)
};

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
  int num_layers() const { return static_cast<int>(saved_.layers.size()); }
  DeviceParameters& params() { return *params_; }
  const DeviceParameters& params() const { return *params_; }

  // Bytes of the saved region (split: including what BackwardWeight reads).
  std::int64_t SavedBytes(bool split) const {
    return split ? saved_.bytes + split_bytes_ : saved_.bytes;
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
  // `layout` kLeanRetained: `saved` is a lean retained block (RetainedBytes(kLean) bytes, only
  // read), on a chunk where BackwardReadsLean() and with `with_weight_grad`; the results are
  // bitwise those of RecomputeSaved(kLean) followed by a kSaved Backward of the rebuilt entry.
  // Both compute ln1 and ln2 with LayerNormApply from the same x / res2 and statistics and g
  // with GeluForward from the same bf16 fch (the rebuild into the entry's slots, this into the
  // scratch, all 256-byte aligned, so cuBLASLt's alignment-keyed heuristic picks the same GEMMs);
  // the input backward reads none of the three, and the forward's fused-epilogue g never
  // reaches either. Errors: InvalidArgument for a null pointer the chunk needs, or a lean block
  // the chunk cannot read, naming why; the kernels'.
  [[nodiscard]] absl::Status Backward(const bf16* grad_output, bf16* grad_input, std::byte* saved,
                                      bool with_weight_grad, float dloss, EntryLayout layout);
  // Accumulates the parameter gradients from a region left by Backward(..., false).
  [[nodiscard]] absl::Status BackwardWeight(std::byte* saved);

  // --- Recompute ------------------------------------------------------------------------------
  // Bytes of the retained block of `mode` (see the file comment); -1 for kNone, and for kLean
  // when the context's dims are lean_saved (the saved region is lean already).
  std::int64_t RetainedBytes(Recompute mode) const;
  // Bytes of the region ForwardRetaining(kFull) runs the forward in: the tokens, one layer's
  // saved region (every layer in turn: layer i's output overwrites its input) and the head's
  // slots, so about one layer's entry whatever the chunk's depth.
  std::int64_t ForwardWorkspaceBytes() const { return workspace_.bytes; }
  // Forward with Forward's arguments and the same output and losses (bitwise: the same
  // kernels on the same values), writing RetainedBytes(mode) bytes of `retained` instead of a
  // saved region. kFull runs in `workspace` (ForwardWorkspaceBytes() bytes; unused by kLean);
  // kLean writes ln1, ln2, g and lnf_out to the context's lean scratch (LayerDims::
  // lean_scratch). Errors: InvalidArgument for a null pointer the call needs, a mode
  // RetainedBytes refuses, or kLean without the lean scratch; the kernels'.
  [[nodiscard]] absl::Status ForwardRetaining(const std::int32_t* tokens,
                                              const std::int32_t* targets, const bf16* input,
                                              bf16* output, std::byte* retained, float* losses,
                                              Recompute mode, std::byte* workspace);
  // Writes the saved region's forward part (SavedBytes(false)) from a block that
  // ForwardRetaining(mode) wrote. kFull runs the forward again into `saved`, its output into
  // `scratch_output` ((N,C); not the last chunk) and the per-token losses into
  // `scratch_losses` ((N); the last chunk): every byte Forward would have written, bitwise.
  // kLean copies what it kept and recomputes ln1, ln2 and lnf_out (LayerNormApply: bitwise) and
  // g = GeluForward(fch), which differs from a forward that fused the GELU into the fc GEMM by
  // fch's bf16 rounding (gpt_cuda_layer.h "Lean"). Touches nothing else: no loss is recorded.
  // Errors: as ForwardRetaining.
  [[nodiscard]] absl::Status RecomputeSaved(const std::byte* retained, std::byte* saved,
                                            Recompute mode, bf16* scratch_output,
                                            float* scratch_losses);
  // Whether an unsplit Backward takes EntryLayout::kLeanRetained: the chunk has no head (the
  // head's weight gradient reads lnf_out, which the lean block does not keep), the saved layout
  // is not lean_saved already (no lean block then), and the context has the lean scratch.
  // A split backward never does: W's output gradients live after SavedBytes(false) bytes of
  // the saved layout, which a lean block does not have.
  bool BackwardReadsLean() const { return WhyNotLean() == nullptr; }

 private:
  GptCudaChunk(GptCudaContext& context, bool first, bool last, int vocab)
      : context_(context), first_(first), last_(last), V_(vocab) {}

  // Byte offsets of a region a forward writes: the saved entry's forward part, the lean
  // retained block, or the full-recompute workspace. kNoSlot: not in the region.
  struct Region {
    std::int64_t tokens = kNoSlot;
    std::vector<std::int64_t> layers;  // start of each layer's LayerSavedLayout
    LayerSavedLayout layer;
    std::int64_t lnf_in = kNoSlot, lnf_mean = kNoSlot, lnf_rstd = kNoSlot, lnf_out = kNoSlot,
                 logits = kNoSlot, lse = kNoSlot, targets = kNoSlot;
    std::int64_t bytes = 0;
  };
  // One cudaMemcpyAsync of RecomputeSaved(kLean): a run of slots the lean block and the saved
  // region both hold, contiguous in each.
  struct SlotCopy {
    std::int64_t from, to, bytes;
  };

  void LayOut(int num_layers);
  // The region of `num_layers` layers of `layer` each; `shared_layers`: all at one offset (the
  // workspace); `lean`: without lnf_out.
  Region MakeRegion(int num_layers, const LayerSavedLayout& layer, bool shared_layers,
                    bool lean) const;
  // Where the chunk's input lands in region `r` at `base`: the first layer's x, lnf_in, or
  // `output` (no layers, not the last chunk).
  bf16* InputOf(const Region& r, std::byte* base, bf16* output) const;
  // Forward's null checks; `region` is the buffer the call writes, named `region_name`.
  absl::Status CheckForward(const char* op, const char* region_name, const std::int32_t* tokens,
                            const std::int32_t* targets, const bf16* input, const bf16* output,
                            const void* region, const float* losses) const;
  // Copies the tokens or the input, and the targets, into region `r` at `base`.
  absl::Status PlaceInputs(const Region& r, std::byte* base, const std::int32_t* tokens,
                           const std::int32_t* targets, const bf16* input, bf16* output);
  // The forward from inputs PlaceInputs put in place; the last layer writes `output`.
  absl::Status ForwardPlaced(const Region& r, std::byte* base, bf16* output, float* losses);
  LayerWeights Weights(int local_layer) const;
  LayerWeightGrads WeightGrads(int local_layer) const;
  LayerGradBuffers GradsOf(int local_layer, std::byte* saved, bool split,
                           const bf16* dout_override = nullptr) const;
  bf16* EmbeddingGrad(std::byte* saved, bool split) const;
  bf16* LnfOutGrad(std::byte* saved, bool split) const;
  // Why BackwardReadsLean() is false, or null when it is true.
  const char* WhyNotLean() const;
  absl::Status HeadBackwardWeight(std::byte* saved, bool split);
  // `r`: the layout of `saved` (saved_, or lean_ for a lean block), for the tokens.
  absl::Status EncoderBackwardWeight(const Region& r, std::byte* saved, bool split);
  const bf16* W(int id) const { return params_->weight(params_->Find(id)); }
  float* G(int id) const { return params_->grad(params_->Find(id)); }

  GptCudaContext& context_;
  const bool first_;
  const bool last_;
  const int V_;  // vocabulary (last chunk only)
  int first_layer_ = 0;
  int lnf_w_id_ = -1, lnf_b_id_ = -1, head_id_ = -1;
  std::unique_ptr<DeviceParameters> params_;

  LayerGradLayout grad_layout_;
  Region saved_;      // the saved entry's forward part
  Region lean_;       // the lean retained block; bytes = -1 when the saved entry is lean
  Region workspace_;  // ForwardRetaining(kFull)'s
  std::vector<SlotCopy> lean_copies_;
  // The full retained block: the tokens (first) or the input, then the targets (last).
  std::int64_t full_input_ = kNoSlot, full_targets_ = kNoSlot, full_bytes_ = 0;
  std::int64_t d_x0_ = -1;
  std::vector<std::int64_t> grad_slots_;  // start of each layer's LayerGradLayout
  std::int64_t d_lnf_out_ = -1;
  std::int64_t split_bytes_ = 0;
};

// Which stash entries (mb, chunk) of a stage model hold a lean retained block rather than a
// saved region, for the models whose StageModel::BackwardReadsRetained says true for kLean:
// the runtime then hands B the block ForwardRetaining(kLean) wrote, and only the model saw
// which call wrote an entry. An entry is lean from that ForwardRetaining until a call rewrites
// it in the full layout (RecomputeSaved; a Forward of a fresh entry) or ends it (the unsplit
// Backward that reads it, a BackwardWeight). A few entries per chunk are in flight at once.
class LeanRetainedEntries {
 public:
  // A forward wrote (mb, chunk) anew: a lean retained block iff `lean`.
  void Wrote(int mb, int chunk, bool lean) {
    if (lean) {
      entries_.insert({mb, chunk});
    } else {
      entries_.erase({mb, chunk});
    }
  }
  // (mb, chunk) is in the full layout now, or ended.
  void Forget(int mb, int chunk) { entries_.erase({mb, chunk}); }
  // For the Backward that ends (mb, chunk): whether it holds a lean block; forgets it.
  EntryLayout Take(int mb, int chunk) {
    return entries_.erase({mb, chunk}) > 0 ? EntryLayout::kLeanRetained : EntryLayout::kSaved;
  }
  // A new iteration: whatever a failed one left is gone (its forwards rewrite every entry).
  void Clear() { entries_.clear(); }

 private:
  std::set<std::pair<int, int>> entries_;
};

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_CHUNK_H_
