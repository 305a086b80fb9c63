// One GPT layer on the GPU (see gpt_cuda_layer.h). Every launch goes to the context's stream;
// nothing here synchronizes or allocates after GptCudaContext::Create.
#include "examples/gpt/cuda/gpt_cuda_layer.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt::cuda {
namespace {

constexpr std::int64_t kBf16 = 2;
constexpr std::int64_t kF32 = 4;

// Hands out 256-byte aligned offsets from a cursor.
class SlotCursor {
 public:
  std::int64_t Take(std::int64_t bytes) {
    const std::int64_t at = cursor_;
    cursor_ += AlignSlot(bytes);
    return at;
  }
  // Take(bytes), or kNoSlot (taking nothing) when the slot is left out.
  std::int64_t TakeUnless(bool omit, std::int64_t bytes) { return omit ? kNoSlot : Take(bytes); }
  std::int64_t size() const { return cursor_; }

 private:
  std::int64_t cursor_ = 0;
};

absl::Status Copy(void* dst, const void* src, std::int64_t bytes, cudaStream_t stream) {
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes),
                                          cudaMemcpyDeviceToDevice, stream));
  return absl::OkStatus();
}

// `a` with its missing slots (null: a lean layout's) pointed at the context's lean scratch.
absl::StatusOr<LayerActivations> WithLeanScratch(const GptCudaContext& context,
                                                 LayerActivations a) {
  if (a.ln1_out != nullptr && a.ln2_out != nullptr && a.fch_gelu != nullptr) return a;
  if (context.lean_ln1_out() == nullptr) {
    return absl::InvalidArgumentError(
        "layer activations lack ln1_out / ln2_out / fch_gelu (a lean layout) but the context "
        "was not created with LayerDims::lean_saved, so it has no scratch for them");
  }
  if (a.ln1_out == nullptr) a.ln1_out = context.lean_ln1_out();
  if (a.ln2_out == nullptr) a.ln2_out = context.lean_ln2_out();
  if (a.fch_gelu == nullptr) a.fch_gelu = context.lean_fch_gelu();
  return a;
}

}  // namespace

absl::Status CheckLayerDims(const LayerDims& dims) {
  if (dims.B <= 0 || dims.T <= 0 || dims.C <= 0 || dims.NH <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("layer sizes must be positive: B=", dims.B,
                                                   " T=", dims.T, " C=", dims.C, " NH=", dims.NH));
  }
  if (dims.C % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("channels C=", dims.C, " must be a multiple of 64"));
  }
  if (dims.C % dims.NH != 0 || (dims.C / dims.NH != 64 && dims.C / dims.NH != 128)) {
    return absl::InvalidArgumentError(
        absl::StrCat("head size C/NH must be 64 or 128 (the flash attention's head sizes; the "
                     "trainers' --heads: C/64 or C/128), got C=",
                     dims.C, " NH=", dims.NH));
  }
  if (dims.T > kMaxAttentionT) {
    return absl::InvalidArgumentError(absl::StrCat("sequence length T=", dims.T,
                                                   " exceeds the attention kernels' limit ",
                                                   kMaxAttentionT));
  }
  if (std::int64_t{dims.B} * dims.T * 4 * dims.C > std::numeric_limits<std::int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("B*T*4C = ", std::int64_t{dims.B} * dims.T *
                                                                    4 * dims.C,
                                                   " elements exceed 32-bit indexing"));
  }
  return absl::OkStatus();
}

LayerSavedLayout MakeLayerSavedLayout(const LayerDims& dims) {
  const std::int64_t n = dims.N();
  const std::int64_t nc = n * dims.C;
  SlotCursor slots;
  LayerSavedLayout l;
  l.x = slots.Take(nc * kBf16);
  l.ln1_mean = slots.Take(n * kF32);
  l.ln1_rstd = slots.Take(n * kF32);
  const bool lean = dims.lean_saved;
  l.ln1_out = slots.TakeUnless(lean, nc * kBf16);
  l.qkv = slots.Take(3 * nc * kBf16);
  l.atty = slots.Take(nc * kBf16);
  l.lse = slots.Take(std::int64_t{dims.B} * dims.NH * dims.T * kF32);
  l.res2 = slots.Take(nc * kBf16);
  l.ln2_mean = slots.Take(n * kF32);
  l.ln2_rstd = slots.Take(n * kF32);
  l.ln2_out = slots.TakeUnless(lean, nc * kBf16);
  l.fch = slots.Take(4 * nc * kBf16);
  l.fch_gelu = slots.TakeUnless(lean, 4 * nc * kBf16);
  l.bytes = slots.size();
  return l;
}

LayerSavedLayout LayerSlotBytes(const LayerDims& dims) {
  const std::int64_t n = dims.N();
  const std::int64_t nc = n * dims.C;
  LayerSavedLayout l;
  l.x = l.ln1_out = l.atty = l.res2 = l.ln2_out = nc * kBf16;
  l.ln1_mean = l.ln1_rstd = l.ln2_mean = l.ln2_rstd = n * kF32;
  l.qkv = 3 * nc * kBf16;
  l.lse = std::int64_t{dims.B} * dims.NH * dims.T * kF32;
  l.fch = l.fch_gelu = 4 * nc * kBf16;
  l.bytes = 0;
  for (const auto slot : kLayerSlots) l.bytes += l.*slot;
  return l;
}

LayerGradLayout MakeLayerGradLayout(const LayerDims& dims) {
  const std::int64_t nc = std::int64_t{dims.N()} * dims.C;
  SlotCursor slots;
  LayerGradLayout l;
  l.dout = slots.Take(nc * kBf16);
  l.d_fch = slots.Take(4 * nc * kBf16);
  l.d_ln2out = slots.Take(nc * kBf16);
  l.dres2 = slots.Take(nc * kBf16);
  l.d_qkv = slots.Take(3 * nc * kBf16);
  l.d_ln1out = slots.Take(nc * kBf16);
  l.bytes = slots.size();
  return l;
}

LayerActivations LayerActivationsAt(std::byte* base, const LayerSavedLayout& l) {
  auto bf = [base](std::int64_t offset) {
    return offset == kNoSlot ? nullptr : reinterpret_cast<bf16*>(base + offset);
  };
  auto f32 = [base](std::int64_t offset) { return reinterpret_cast<float*>(base + offset); };
  return LayerActivations{bf(l.x),       f32(l.ln1_mean), f32(l.ln1_rstd), bf(l.ln1_out),
                          bf(l.qkv),     bf(l.atty),      f32(l.lse),      bf(l.res2),
                          f32(l.ln2_mean), f32(l.ln2_rstd), bf(l.ln2_out), bf(l.fch),
                          bf(l.fch_gelu)};
}

LayerGradBuffers LayerGradBuffersAt(std::byte* base, const LayerGradLayout& l, const bf16* dout) {
  auto bf = [base](std::int64_t offset) { return reinterpret_cast<bf16*>(base + offset); };
  return LayerGradBuffers{dout != nullptr ? dout : bf(l.dout), bf(l.d_fch), bf(l.d_ln2out),
                          bf(l.dres2), bf(l.d_qkv), bf(l.d_ln1out)};
}

absl::StatusOr<std::unique_ptr<GptCudaContext>> GptCudaContext::Create(const LayerDims& dims,
                                                                       int device,
                                                                       cudaStream_t stream,
                                                                       int max_linear_width) {
  PO_RETURN_IF_ERROR(CheckLayerDims(dims));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device));
  std::unique_ptr<GptCudaContext> context(new GptCudaContext(dims, device, stream));
  context->allocations_ = std::make_unique<DeviceAllocations>(device);
  DeviceAllocations& memory = *context->allocations_;
  const int n = dims.N();
  const std::int64_t nc = std::int64_t{n} * dims.C;
  PO_ASSIGN_OR_RETURN(context->linear_, Linear::Create(stream));

  // The flash attention backward's dot(dout, out) per query (B * NH * T fp32). Poisoned once
  // (every bit set: NaN): the backward writes all of it before reading it, so any other read
  // shows as a NaN loss instead of passing on whatever cudaMalloc left.
  const std::int64_t attention = AttentionBackwardWorkspaceBytes(dims.Attention());
  if (attention <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("no attention workspace for B=", dims.B,
                                                   " T=", dims.T, " NH=", dims.NH));
  }
  PO_ASSIGN_OR_RETURN(context->attention_workspace_, memory.Allocate(attention));
  PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(context->attention_workspace_, 0xFF,
                                          static_cast<std::size_t>(attention), stream));

  PO_ASSIGN_OR_RETURN(context->norm_scratch_,
                      memory.AllocateArray<float>(LayerNormWeightScratchFloats(n, dims.C)));
  std::int64_t bias_floats = 0;
  for (int width : {dims.C, 3 * dims.C, 4 * dims.C, max_linear_width}) {
    if (width > 0) bias_floats = std::max(bias_floats, BiasScratchFloats(n, width));
  }
  PO_ASSIGN_OR_RETURN(context->bias_scratch_, memory.AllocateArray<float>(bias_floats));
  PO_ASSIGN_OR_RETURN(context->d_atty_, memory.AllocateArray<bf16>(nc));
  PO_ASSIGN_OR_RETURN(void* grads, memory.Allocate(MakeLayerGradLayout(dims).bytes));
  context->unsplit_grads_ = static_cast<std::byte*>(grads);
  PO_ASSIGN_OR_RETURN(context->ping_pong_, memory.AllocateArray<bf16>(2 * nc));
  if (dims.lean_saved || dims.lean_scratch) {
    PO_ASSIGN_OR_RETURN(context->lean_ln1_out_, memory.AllocateArray<bf16>(nc));
    PO_ASSIGN_OR_RETURN(context->lean_ln2_out_, memory.AllocateArray<bf16>(nc));
    PO_ASSIGN_OR_RETURN(context->lean_fch_gelu_, memory.AllocateArray<bf16>(4 * nc));
  }
  return context;
}

GptCudaContext::~GptCudaContext() {
  internal::ScopedDevice guard;
  if (!guard.Enter(device_).ok()) return;
  // Teardown: work queued by our owner may still use the scratch (bounded wait).
  static_cast<void>(WaitForStream(stream_, 120.0, "~GptCudaContext"));
  linear_.reset();
}

bf16* GptCudaContext::ping_pong(int i) const {
  return ping_pong_ + static_cast<std::int64_t>(i & 1) * dims_.N() * dims_.C;
}

absl::Status LayerForward(GptCudaContext& context, const LayerWeights& w,
                          const LayerActivations& saved, bf16* out) {
  PO_ASSIGN_OR_RETURN(const LayerActivations a, WithLeanScratch(context, saved));
  const LayerDims& d = context.dims();
  const int N = d.N();
  const int C = d.C;
  cudaStream_t s = context.stream();
  Linear& linear = context.linear();
  // Attention branch: res2 = x + proj(attention(qkv(ln1(x)))).
  PO_RETURN_IF_ERROR(LayerNormForward(a.ln1_out, a.ln1_mean, a.ln1_rstd, a.x, w.ln1_w, w.ln1_b,
                                      N, C, s));
  PO_RETURN_IF_ERROR(linear.Forward(a.qkv, a.ln1_out, w.qkv_w, w.qkv_b, nullptr, nullptr,
                                    {N, C, 3 * C}));
  PO_RETURN_IF_ERROR(AttentionForward(a.atty, a.lse, a.qkv, d.Attention(), s));
  PO_RETURN_IF_ERROR(linear.Forward(a.res2, a.atty, w.proj_w, w.proj_b, /*residual=*/a.x,
                                    nullptr, {N, C, C}));
  // MLP branch: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  PO_RETURN_IF_ERROR(LayerNormForward(a.ln2_out, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2_w,
                                      w.ln2_b, N, C, s));
  PO_RETURN_IF_ERROR(linear.Forward(a.fch_gelu, a.ln2_out, w.fc_w, w.fc_b, nullptr,
                                    /*pre_gelu=*/a.fch, {N, C, 4 * C}));
  return linear.Forward(out, a.fch_gelu, w.fcproj_w, w.fcproj_b, /*residual=*/a.res2, nullptr,
                        {N, 4 * C, C});
}

absl::Status LayerBackwardInput(GptCudaContext& context, const LayerWeights& w,
                                const LayerActivations& a, const LayerGradBuffers& g,
                                bf16* dinp) {
  const LayerDims& d = context.dims();
  const int N = d.N();
  const int C = d.C;
  const std::int64_t nc_bytes = std::int64_t{N} * C * 2;
  cudaStream_t s = context.stream();
  Linear& linear = context.linear();
  // MLP branch: d_fch = gelu'(fch) * (dout fcproj_w), GELU gradient fused where possible.
  PO_RETURN_IF_ERROR(linear.BackwardInput(g.d_fch, g.dout, w.fcproj_w, /*pre_gelu=*/a.fch,
                                          {N, 4 * C, C}));
  PO_RETURN_IF_ERROR(linear.BackwardInput(g.d_ln2out, g.d_fch, w.fc_w, nullptr, {N, C, 4 * C}));
  PO_RETURN_IF_ERROR(Copy(g.dres2, g.dout, nc_bytes, s));  // the residual path
  PO_RETURN_IF_ERROR(LayerNormBackwardInput(g.dres2, g.d_ln2out, a.res2, w.ln2_w, a.ln2_mean,
                                            a.ln2_rstd, N, C, s));
  // Attention branch.
  bf16* d_atty = context.d_atty();
  PO_RETURN_IF_ERROR(linear.BackwardInput(d_atty, g.dres2, w.proj_w, nullptr, {N, C, C}));
  PO_RETURN_IF_ERROR(AttentionBackward(g.d_qkv, d_atty, a.qkv, a.atty, a.lse,
                                       context.attention_workspace(), d.Attention(), s));
  PO_RETURN_IF_ERROR(linear.BackwardInput(g.d_ln1out, g.d_qkv, w.qkv_w, nullptr, {N, C, 3 * C}));
  PO_RETURN_IF_ERROR(Copy(dinp, g.dres2, nc_bytes, s));
  return LayerNormBackwardInput(dinp, g.d_ln1out, a.x, w.ln1_w, a.ln1_mean, a.ln1_rstd, N, C, s);
}

namespace {

// Rewrites those of ln1_out, ln2_out and fch_gelu that `which` names, in place in `a`.
absl::Status ApplyLean(GptCudaContext& context, const LayerWeights& w, const LayerActivations& a,
                       const LayerActivations& which) {
  const LayerDims& d = context.dims();
  const int N = d.N();
  const int C = d.C;
  cudaStream_t s = context.stream();
  if (which.ln1_out == nullptr) {
    PO_RETURN_IF_ERROR(
        LayerNormApply(a.ln1_out, a.x, w.ln1_w, w.ln1_b, a.ln1_mean, a.ln1_rstd, N, C, s));
  }
  if (which.ln2_out == nullptr) {
    PO_RETURN_IF_ERROR(
        LayerNormApply(a.ln2_out, a.res2, w.ln2_w, w.ln2_b, a.ln2_mean, a.ln2_rstd, N, C, s));
  }
  if (which.fch_gelu == nullptr) {
    PO_RETURN_IF_ERROR(GeluForward(a.fch_gelu, a.fch, std::int64_t{N} * 4 * C, s));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LayerActivations> RecomputeLeanActivations(GptCudaContext& context,
                                                          const LayerWeights& w,
                                                          const LayerActivations& saved) {
  PO_ASSIGN_OR_RETURN(const LayerActivations a, WithLeanScratch(context, saved));
  PO_RETURN_IF_ERROR(ApplyLean(context, w, a, /*which=*/saved));
  return a;
}

absl::Status RecomputeLeanSlots(GptCudaContext& context, const LayerWeights& w,
                                const LayerActivations& a) {
  if (a.ln1_out == nullptr || a.ln2_out == nullptr || a.fch_gelu == nullptr) {
    return absl::InvalidArgumentError(
        "RecomputeLeanSlots: ln1_out, ln2_out and fch_gelu must be slots of a full layout");
  }
  LayerActivations all = a;  // every slot "missing": rewrite all three
  all.ln1_out = all.ln2_out = all.fch_gelu = nullptr;
  return ApplyLean(context, w, a, all);
}

absl::Status LayerBackwardWeight(GptCudaContext& context, const LayerWeights& w,
                                 const LayerWeightGrads& dw, const LayerActivations& saved,
                                 const LayerGradBuffers& g) {
  PO_ASSIGN_OR_RETURN(const LayerActivations a, RecomputeLeanActivations(context, w, saved));
  const LayerDims& d = context.dims();
  const int N = d.N();
  const int C = d.C;
  cudaStream_t s = context.stream();
  Linear& linear = context.linear();
  float* bias_scratch = context.bias_scratch();
  // The order matches GptChunk::LayerBackwardWeight (not needed for determinism, which only
  // needs one fixed order, but it keeps the two readable side by side).
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dw.fcproj_w, g.dout, a.fch_gelu, {N, 4 * C, C}));
  PO_RETURN_IF_ERROR(BiasBackward(dw.fcproj_b, bias_scratch, g.dout, N, C, s));
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dw.fc_w, g.d_fch, a.ln2_out, {N, C, 4 * C}));
  PO_RETURN_IF_ERROR(BiasBackward(dw.fc_b, bias_scratch, g.d_fch, N, 4 * C, s));
  PO_RETURN_IF_ERROR(LayerNormBackwardWeight(dw.ln2_w, dw.ln2_b, context.norm_scratch(),
                                             g.d_ln2out, a.res2, a.ln2_mean, a.ln2_rstd, N, C, s));
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dw.proj_w, g.dres2, a.atty, {N, C, C}));
  PO_RETURN_IF_ERROR(BiasBackward(dw.proj_b, bias_scratch, g.dres2, N, C, s));
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dw.qkv_w, g.d_qkv, a.ln1_out, {N, C, 3 * C}));
  PO_RETURN_IF_ERROR(BiasBackward(dw.qkv_b, bias_scratch, g.d_qkv, N, 3 * C, s));
  return LayerNormBackwardWeight(dw.ln1_w, dw.ln1_b, context.norm_scratch(), g.d_ln1out, a.x,
                                 a.ln1_mean, a.ln1_rstd, N, C, s);
}

double LayerForwardFlops(const LayerDims& dims) {
  const double n = static_cast<double>(dims.N());
  const double c = static_cast<double>(dims.C);
  const double t = static_cast<double>(dims.T);
  return 24.0 * c * c * n + 4.0 * t * t * c * static_cast<double>(dims.B);
}

}  // namespace pipeoffload::gpt::cuda
