// One GPT layer (transformer block) on the GPU, bf16 activations with fp32 accumulation: the
// per-stage resources its kernels need, the byte layout of what its forward saves, and its
// forward, backward-input and backward-weight for one microbatch. The CUDA mirror of
// GptChunk::LayerForward / LayerBackwardInput / LayerBackwardWeight (examples/gpt/gpt_chunk.cc),
// shared by the full CUDA GPT (gpt_cuda_chunk.h) and the benchmark's layer stack.
//
// Layer math (pre-LN, llm.c layout), x the layer input (N,C):
//   ln1 = LN(x); qkv = ln1 W_qkv^T + b; y = attention(qkv); res2 = x + y W_proj^T + b
//   ln2 = LN(res2); fch = ln2 W_fc^T + b; g = gelu(fch); out = res2 + g W_fcproj^T + b
// The residual adds are fused into the projections' GEMMs (beta = 1, C = the residual), and
// the GELU into the fc GEMM's epilogue where cuBLASLt offers it (linear.h).
//
// Saved per layer (LayerSavedLayout, each slot 256-byte aligned), per token:
//   bf16: x C | ln1 C | qkv 3C | y C | res2 C | ln2 C | fch 4C | g 4C    = 32 C bytes
//   fp32: ln1 mean, rstd | ln2 mean, rstd | attention lse (NH per token) = 16 + 4 NH bytes
// Nothing of size T x T is saved (nor exists anywhere): the flash attention backward recomputes
// probabilities from qkv and lse and reads y (its dot(dout, y) per query) (kernels_cuda.h).
// Lean (LayerDims::lean_saved): ln1, ln2 and g are not saved (20 C bytes per token instead of
// 32 C). The input backward never reads them (the LayerNorm backward uses x / res2 with mean and
// rstd, the fc-proj input gradient the pre-activation fch); only the weight gradients do, so
// LayerBackwardWeight recomputes them first into the context's scratch: ln1 and ln2 bit for bit
// (LayerNormApply), g = GeluForward(fch). Forward fuses the GELU into the fc GEMM's epilogue
// where cuBLASLt offers it, computing it from the fp32 accumulator, while the recompute starts
// from the bf16 fch: the recomputed g may then differ from the forward's by the rounding of
// fch (one bf16 ulp for many elements, a few where gelu is flat, e.g. x < -2), so the fc-proj
// weight gradient of a lean layer differs from the full layer's in its last bits (~1e-3
// relative); every other output, gradient and weight gradient is bitwise equal
// (tests/gpt_cuda/gpt_cuda_lean_test.cc measures both). Without the fused epilogue, forward
// runs the same GeluForward and everything is bitwise equal.
// Forward is unchanged (it still writes ln1, ln2 and g, into the scratch), so forward outputs
// and input gradients are bitwise equal lean or not.
// Output gradients W needs (LayerGradLayout), bf16 per token: dout C | d_fch 4C | d_ln2 C |
//   dres2 C | d_qkv 3C | d_ln1 C = 22 C bytes; in the stash entry when the schedule splits W,
//   in the context's scratch otherwise.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_LAYER_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_LAYER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/gpt/cuda/linear.h"

namespace pipeoffload::gpt::cuda {

struct LayerDims {
  int B = 0;   // sequences per microbatch
  int T = 0;   // sequence length
  int C = 0;   // channels
  int NH = 0;  // heads
  // Save only what the input backward needs (see "Lean" above): MakeLayerSavedLayout omits
  // ln1_out, ln2_out and fch_gelu, GptCudaContext allocates scratch for them, and
  // LayerBackwardWeight recomputes them. Costs two LayerNorm applications and one GELU per
  // weight backward (memory-bound, ~1% of a layer at h >= 4096); saves 12 C bytes per token.
  bool lean_saved = false;
  // The lean scratch without the lean layout: for a full layout whose entries a program may
  // keep lean instead (Recompute::kLean: the forward writes ln1, ln2 and g there, the rebuild
  // recomputes them into the full entry). Implied by lean_saved.
  bool lean_scratch = false;
  int N() const { return B * T; }
  AttentionShape Attention() const { return AttentionShape{B, T, NH, NH > 0 ? C / NH : 0}; }
};

// InvalidArgument naming the field: non-positive sizes, C % NH != 0, a head size other than 64
// or 128, C not a multiple of 64, T above kMaxAttentionT, or N * 4C beyond 32-bit indexing.
[[nodiscard]] absl::Status CheckLayerDims(const LayerDims& dims);

// The offset of a slot a lean layout omits.
inline constexpr std::int64_t kNoSlot = -1;

// Byte offsets of one layer's saved activations, from the start of its region. With
// dims.lean_saved, ln1_out, ln2_out and fch_gelu are kNoSlot and the other slots are packed in
// the same order; without it the layout is the full one above.
struct LayerSavedLayout {
  std::int64_t x = 0, ln1_mean = 0, ln1_rstd = 0, ln1_out = 0, qkv = 0, atty = 0, lse = 0,
               res2 = 0, ln2_mean = 0, ln2_rstd = 0, ln2_out = 0, fch = 0, fch_gelu = 0;
  std::int64_t bytes = 0;  // the region's size, a multiple of kSlotAlignment
};
LayerSavedLayout MakeLayerSavedLayout(const LayerDims& dims);
// The bytes of each slot of the full layout (unaligned), in the fields of the same struct;
// `bytes` is the sum.
LayerSavedLayout LayerSlotBytes(const LayerDims& dims);
// The 13 slots in layout order, for code that walks them (copies between layouts).
inline constexpr std::int64_t LayerSavedLayout::*kLayerSlots[] = {
    &LayerSavedLayout::x,        &LayerSavedLayout::ln1_mean, &LayerSavedLayout::ln1_rstd,
    &LayerSavedLayout::ln1_out,  &LayerSavedLayout::qkv,      &LayerSavedLayout::atty,
    &LayerSavedLayout::lse,      &LayerSavedLayout::res2,     &LayerSavedLayout::ln2_mean,
    &LayerSavedLayout::ln2_rstd, &LayerSavedLayout::ln2_out,  &LayerSavedLayout::fch,
    &LayerSavedLayout::fch_gelu};

// Byte offsets of one layer's output gradients (what BackwardWeight consumes).
struct LayerGradLayout {
  std::int64_t dout = 0, d_fch = 0, d_ln2out = 0, dres2 = 0, d_qkv = 0, d_ln1out = 0;
  std::int64_t bytes = 0;
};
LayerGradLayout MakeLayerGradLayout(const LayerDims& dims);

// Device pointers of one layer's saved activations; null for a slot the layout omits (the layer
// functions below then use the context's scratch for it).
struct LayerActivations {
  bf16* x;
  float* ln1_mean;
  float* ln1_rstd;
  bf16* ln1_out;
  bf16* qkv;
  bf16* atty;
  float* lse;
  bf16* res2;
  float* ln2_mean;
  float* ln2_rstd;
  bf16* ln2_out;
  bf16* fch;
  bf16* fch_gelu;
};
LayerActivations LayerActivationsAt(std::byte* base, const LayerSavedLayout& layout);

// Device pointers of one layer's output gradients. `dout` is only read (it may be the
// boundary gradient the runtime passed in).
struct LayerGradBuffers {
  const bf16* dout;
  bf16* d_fch;
  bf16* d_ln2out;
  bf16* dres2;
  bf16* d_qkv;
  bf16* d_ln1out;
};
// The buffers at `base`, with `dout` at base + layout.dout unless `dout` is given.
LayerGradBuffers LayerGradBuffersAt(std::byte* base, const LayerGradLayout& layout,
                                    const bf16* dout = nullptr);

// The 12 tensors of one layer in canonical order (gpt_config.h TensorKind kLn1Weight ..
// kFcProjBias), as device pointers: bf16 weights for the math, fp32 for their gradients.
template <typename T>
struct LayerTensorSet {
  T* ln1_w;
  T* ln1_b;
  T* qkv_w;     // (3C, C)
  T* qkv_b;     // (3C)
  T* proj_w;    // (C, C)
  T* proj_b;    // (C)
  T* ln2_w;
  T* ln2_b;
  T* fc_w;      // (4C, C)
  T* fc_b;      // (4C)
  T* fcproj_w;  // (C, 4C)
  T* fcproj_b;  // (C)
};
using LayerWeights = LayerTensorSet<const bf16>;
using LayerWeightGrads = LayerTensorSet<float>;

// What every layer of one stage model shares: the cuBLASLt handle bound to the stage's compute
// stream, the attention workspace and the scratch buffers of one call. One per stage model; its layers
// run one at a time on one thread. Created once: nothing is allocated after Create.
class GptCudaContext {
 public:
  // For layers of `dims` (and, when max_linear_width > 4C, linear layers that wide, e.g. the
  // LM head's V) on `device` (made current during Create) launching on `stream`.
  // Errors: CheckLayerDims'; the CUDA / cuBLAS calls', named.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GptCudaContext>> Create(
      const LayerDims& dims, int device, cudaStream_t stream, int max_linear_width = 0);
  // Waits (bounded) for the stream, then frees everything.
  ~GptCudaContext();
  GptCudaContext(const GptCudaContext&) = delete;
  GptCudaContext& operator=(const GptCudaContext&) = delete;

  const LayerDims& dims() const { return dims_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  Linear& linear() { return *linear_; }
  // AttentionBackwardWorkspaceBytes(dims.Attention()), NaN-poisoned at Create.
  void* attention_workspace() const { return attention_workspace_; }
  float* norm_scratch() const { return norm_scratch_; }  // LayerNormWeightScratchFloats
  float* bias_scratch() const { return bias_scratch_; }  // BiasScratchFloats up to the width
  bf16* d_atty() const { return d_atty_; }               // (N,C)
  // Output gradients of an unsplit backward: a LayerGradLayout region whose `dout` slot is
  // one of two ping-pong (N,C) slots (layer i's dout and its input gradient never coincide).
  std::byte* unsplit_grads() const { return unsplit_grads_; }
  bf16* ping_pong(int i) const;  // (N,C), i = 0 or 1
  // Lean dims only (null otherwise): where forward writes the activations a lean layout does not
  // save, and LayerBackwardWeight recomputes them: (N,C), (N,C) and (N,4C) bf16.
  bf16* lean_ln1_out() const { return lean_ln1_out_; }
  bf16* lean_ln2_out() const { return lean_ln2_out_; }
  bf16* lean_fch_gelu() const { return lean_fch_gelu_; }
  DeviceAllocations& allocations() { return *allocations_; }
  // Device bytes this context holds (scratch, workspaces; not the cuBLASLt handle's own).
  std::int64_t bytes() const { return allocations_->total_bytes() + Linear::kWorkspaceBytes; }

 private:
  GptCudaContext(const LayerDims& dims, int device, cudaStream_t stream)
      : dims_(dims), device_(device), stream_(stream) {}

  const LayerDims dims_;
  const int device_;
  const cudaStream_t stream_;
  std::unique_ptr<DeviceAllocations> allocations_;
  std::unique_ptr<Linear> linear_;
  void* attention_workspace_ = nullptr;
  float* norm_scratch_ = nullptr;
  float* bias_scratch_ = nullptr;
  bf16* d_atty_ = nullptr;
  std::byte* unsplit_grads_ = nullptr;
  bf16* ping_pong_ = nullptr;
  bf16* lean_ln1_out_ = nullptr;
  bf16* lean_ln2_out_ = nullptr;
  bf16* lean_fch_gelu_ = nullptr;
};

// Forward of one layer: reads a.x (the caller has put the layer input there), writes every
// other slot of `a` and out (N,C). out must not alias the saved slots other than a.x: x is
// last read by the attention projection's residual add, before out is written (the
// full-recompute forward runs every layer of a chunk in one region that way). A null slot of
// `a` (a lean layout's) is written to the context's lean scratch instead: InvalidArgument if the
// context has none.
[[nodiscard]] absl::Status LayerForward(GptCudaContext& context, const LayerWeights& w,
                                        const LayerActivations& a, bf16* out);
// Backward for the input: from g.dout, writes g's other buffers and dinp (N,C) (which must not
// alias g.dout).
[[nodiscard]] absl::Status LayerBackwardInput(GptCudaContext& context, const LayerWeights& w,
                                              const LayerActivations& a,
                                              const LayerGradBuffers& g, bf16* dinp);
// Accumulates the 12 parameter gradients (+=) from the activations and the output gradients
// LayerBackwardInput left in g; first recomputes the slots `a` lacks (RecomputeLeanActivations:
// that is what it needs `w` for). Errors: RecomputeLeanActivations'; the kernels'.
[[nodiscard]] absl::Status LayerBackwardWeight(GptCudaContext& context, const LayerWeights& w,
                                               const LayerWeightGrads& dw,
                                               const LayerActivations& a,
                                               const LayerGradBuffers& g);

// `a` with each null slot of ln1_out, ln2_out, fch_gelu pointed at the context's lean scratch
// and recomputed there from the saved ones: ln1_out = LayerNormApply(x, ln1 mean, rstd, w.ln1)
// and ln2_out likewise from res2 (bitwise what forward wrote), fch_gelu = GeluForward(fch) (see
// "Lean" above). Slots that are present are left alone; with none missing nothing is launched.
// The result is valid until the next call that uses the scratch (any layer function of this
// context). Errors: InvalidArgument if a slot is missing and the context has no lean scratch;
// the kernels'.
[[nodiscard]] absl::StatusOr<LayerActivations> RecomputeLeanActivations(
    GptCudaContext& context, const LayerWeights& w, const LayerActivations& a);
// The same into a full layout's own slots: rewrites a.ln1_out, a.ln2_out and a.fch_gelu (all
// non-null) from the other slots, as RecomputeLeanActivations computes them. Rebuilds a full
// entry from a lean one (Recompute::kLean); InvalidArgument for a null slot.
[[nodiscard]] absl::Status RecomputeLeanSlots(GptCudaContext& context, const LayerWeights& w,
                                              const LayerActivations& a);

// FLOP of one layer's forward for `dims`, as LayerStackShape::ForwardFlops counts them: 24 C^2 N
// for the linear layers plus 4 T^2 C B for attention's two products over full T x T (the flash
// kernel computes the causal half).
double LayerForwardFlops(const LayerDims& dims);

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_LAYER_H_
