// One virtual stage of the GPT: saved layout and the per-microbatch math (see gpt_chunk.h).
//
// Saved region of a chunk (floats unless noted; N = B*T):
//   [first]  tokens (N) int32
//   per layer: x (N,C) | ln1 mean, rstd (N) | ln1_out (N,C) | qkv (N,3C) | att (B,NH,T,T) |
//              atty (N,C) | res2 (N,C) | ln2 mean, rstd (N) | ln2_out (N,C) | fch (N,4C) |
//              fch_gelu (N,4C)
//   [last]   lnf_in (N,C) | lnf mean, rstd (N) | lnf_out (N,C) | probs (N,V) | targets (N) int32
//   -- SavedBytes(false) ends here; the split-backward region follows --
//   [first]  d_x0 (N,C)
//   per layer: dout (N,C) | d_fch (N,4C) | d_ln2out (N,C) | dres2 (N,C) | d_qkv (N,3C) |
//              d_ln1out (N,C)
//   [last]   d_lnf_out (N,C); dlogits overwrite probs in place
// Retained blocks (Recompute, gpt_chunk.h) pack ranges of the forward part in this order: kLean
// all but ln1_out, ln2_out, fch_gelu and lnf_out; kFull the tokens or the chunk's input (the
// first layer's x, or lnf_in) and the targets.
// A layer's output is written straight into the next layer's x (or lnf_in, or the boundary
// output), and a layer's input gradient straight into the previous layer's dout, so a chunk
// holding k layers computes the same values as k chunks of one layer joined by copies.
#include "examples/gpt/gpt_chunk.h"

#include <cstring>

#include "examples/gpt/kernels_cpu.h"
#include "lib/base/check.h"

namespace pipeoffload::gpt {
namespace {

void Copy(float* dst, const float* src, std::int64_t n) {
  std::memcpy(dst, src, sizeof(float) * static_cast<std::size_t>(n));
}

}  // namespace

GptChunk::GptChunk(const GptConfig& config, int virtual_stage, int num_virtual_stages)
    : config_(config),
      virtual_stage_(virtual_stage),
      num_virtual_stages_(num_virtual_stages),
      layers_(VirtualStageLayers(config.n_layer, num_virtual_stages, virtual_stage)),
      B_(config.batch_size),
      T_(config.seq_len),
      C_(config.n_embd),
      NH_(config.n_head),
      V_(config.vocab_size),
      N_(config.batch_size * config.seq_len) {
  PO_CHECK(ValidateGptConfig(config).ok());

  // Parameters, in global-id order.
  const std::vector<TensorSpec> specs = GptTensorSpecs(config);
  if (is_first()) {
    params_.Add(kTokenEmbeddingId, specs[kTokenEmbeddingId], /*mirror=*/false);
    params_.Add(kPositionEmbeddingId, specs[kPositionEmbeddingId], /*mirror=*/false);
  }
  for (int l = layers_.begin; l < layers_.end; ++l) {
    const int first_id = LayerTensorId(l, TensorKind::kLn1Weight);
    for (int k = 0; k < kTensorsPerLayer; ++k)
      params_.Add(first_id + k, specs[first_id + k], false);
  }
  if (is_last()) {
    params_.Add(LnfWeightId(config), specs[LnfWeightId(config)], false);
    params_.Add(LnfBiasId(config), specs[LnfBiasId(config)], false);
    if (config.tied_embeddings) {
      params_.Add(kTokenEmbeddingId, specs[kTokenEmbeddingId], /*mirror=*/true);
    } else {
      params_.Add(HeadWeightId(config), specs[HeadWeightId(config)], false);
    }
  }
  params_.Allocate(config.seed);

  // Saved layout. Each range also records whether the lean and the full retained blocks keep
  // it (gpt_chunk.h, Recompute): the chunk's input is the first layer's x, or lnf_in on a last
  // virtual stage without layers; the first virtual stage's input is its tokens.
  const std::int64_t n = N_;
  const std::int64_t nc = n * C_;
  std::int64_t cursor = 0;
  auto take = [&cursor](std::int64_t floats) {
    const std::int64_t at = cursor;
    cursor += floats;
    return at;
  };
  auto slot = [&](std::int64_t floats, bool lean, bool full) {
    segments_.push_back(Segment{cursor, floats, lean, full});
    return take(floats);
  };
  const bool input_in_saved = !is_first();
  if (is_first()) tokens_ = slot(n, true, true);
  for (int l = layers_.begin; l < layers_.end; ++l) {
    LayerSlots s;
    s.x = slot(nc, true, input_in_saved && l == layers_.begin);
    s.ln1_mean = slot(n, true, false);
    s.ln1_rstd = slot(n, true, false);
    s.ln1_out = slot(nc, false, false);
    s.qkv = slot(3 * nc, true, false);
    s.att = slot(std::int64_t{B_} * NH_ * T_ * T_, true, false);
    s.atty = slot(nc, true, false);
    s.res2 = slot(nc, true, false);
    s.ln2_mean = slot(n, true, false);
    s.ln2_rstd = slot(n, true, false);
    s.ln2_out = slot(nc, false, false);
    s.fch = slot(4 * nc, true, false);
    s.fch_gelu = slot(4 * nc, false, false);
    slots_.push_back(s);
  }
  if (is_last()) {
    lnf_in_ = slot(nc, true, input_in_saved && layers_.size() == 0);
    lnf_mean_ = slot(n, true, false);
    lnf_rstd_ = slot(n, true, false);
    lnf_out_ = slot(nc, false, false);
    probs_ = slot(n * V_, true, false);
    targets_ = slot(n, true, true);
  }
  saved_floats_ = cursor;
  if (is_first()) d_x0_ = take(nc);
  for (int l = layers_.begin; l < layers_.end; ++l) layer_grads_.push_back(take(11 * nc));
  if (is_last()) d_lnf_out_ = take(nc);
  weight_grad_floats_ = cursor - saved_floats_;

  branch_.resize(static_cast<std::size_t>(nc));
  losses_.resize(static_cast<std::size_t>(n));
  d_fch_gelu_.resize(static_cast<std::size_t>(4 * nc));
  d_atty_.resize(static_cast<std::size_t>(nc));
  att_row_.resize(static_cast<std::size_t>(T_));
  unsplit_grads_.resize(static_cast<std::size_t>(12 * nc));
  if (is_last()) d_lnf_out_scratch_.resize(static_cast<std::size_t>(nc));
}

float* GptChunk::Tensor(int id, bool mirror, bool grad) {
  const int local = params_.Find(id, mirror);
  PO_CHECK(local >= 0);
  return grad ? params_.grad(local) : params_.param(local);
}

GptChunk::LayerTensors GptChunk::LayerParams(int local_layer, bool grads) {
  const int l = layers_.begin + local_layer;
  auto t = [&](TensorKind kind) { return Tensor(LayerTensorId(l, kind), false, grads); };
  return LayerTensors{
      t(TensorKind::kLn1Weight), t(TensorKind::kLn1Bias),        t(TensorKind::kQkvWeight),
      t(TensorKind::kQkvBias),   t(TensorKind::kAttnProjWeight), t(TensorKind::kAttnProjBias),
      t(TensorKind::kLn2Weight), t(TensorKind::kLn2Bias),        t(TensorKind::kFcWeight),
      t(TensorKind::kFcBias),    t(TensorKind::kFcProjWeight),   t(TensorKind::kFcProjBias)};
}

GptChunk::LayerGrads GptChunk::GradsOf(int local_layer, float* base, bool split) {
  const std::int64_t nc = std::int64_t{N_} * C_;
  float* dout;
  float* rest;  // d_fch | d_ln2out | dres2 | d_qkv | d_ln1out, 10 (N,C) units
  if (split) {
    dout = base + layer_grads_[local_layer];
    rest = dout + nc;
  } else {
    // Ping-pong: layer i's dout and layer i-1's dout (its input gradient) never coincide.
    dout = unsplit_grads_.data() + (local_layer & 1) * nc;
    rest = unsplit_grads_.data() + 2 * nc;
  }
  return LayerGrads{dout, rest, rest + 4 * nc, rest + 5 * nc, rest + 6 * nc, rest + 9 * nc};
}

float* GptChunk::EmbeddingGrad(float* base, bool split) {
  // Unsplit: the ping-pong slot of "layer -1", i.e. the one layer 0 writes its dinp into.
  return split ? base + d_x0_ : unsplit_grads_.data() + std::int64_t{N_} * C_;
}

float* GptChunk::LnfOutGrad(float* base, bool split) {
  return split ? base + d_lnf_out_ : d_lnf_out_scratch_.data();
}

void GptChunk::LayerForward(int local_layer, float* base, float* out) {
  const LayerSlots& s = slots_[local_layer];
  const LayerTensors w = LayerParams(local_layer, /*grads=*/false);
  const int B = B_, T = T_, C = C_, N = N_;
  float* x = base + s.x;  // (N,C)
  LayerNormForward(base + s.ln1_out, base + s.ln1_mean, base + s.ln1_rstd, x, w.ln1_w, w.ln1_b, N,
                   C);
  MatmulForward(base + s.qkv, base + s.ln1_out, w.qkv_w, w.qkv_b, N, C, 3 * C);
  AttentionForward(base + s.atty, base + s.att, base + s.qkv, B, T, C, NH_);
  MatmulForward(branch_.data(), base + s.atty, w.attn_proj_w, w.attn_proj_b, N, C, C);
  ResidualForward(base + s.res2, x, branch_.data(), std::int64_t{N} * C);
  LayerNormForward(base + s.ln2_out, base + s.ln2_mean, base + s.ln2_rstd, base + s.res2, w.ln2_w,
                   w.ln2_b, N, C);
  MatmulForward(base + s.fch, base + s.ln2_out, w.fc_w, w.fc_b, N, C, 4 * C);
  GeluForward(base + s.fch_gelu, base + s.fch, std::int64_t{N} * 4 * C);
  MatmulForward(branch_.data(), base + s.fch_gelu, w.fc_proj_w, w.fc_proj_b, N, 4 * C, C);
  ResidualForward(out, base + s.res2, branch_.data(), std::int64_t{N} * C);
}

float* GptChunk::InputSlot(float* base, float* output) const {
  if (layers_.size() > 0) return base + slots_[0].x;
  return is_last() ? base + lnf_in_ : output;
}

double GptChunk::Forward(const std::int32_t* tokens, const std::int32_t* targets,
                         const float* input, float* output, std::byte* saved) {
  float* base = reinterpret_cast<float*>(saved);
  if (is_first()) {
    std::memcpy(base + tokens_, tokens, sizeof(std::int32_t) * static_cast<std::size_t>(N_));
  } else {
    Copy(InputSlot(base, output), input, std::int64_t{N_} * C_);
  }
  if (is_last()) {
    std::memcpy(base + targets_, targets, sizeof(std::int32_t) * static_cast<std::size_t>(N_));
  }
  return ForwardFromSaved(base, output);
}

double GptChunk::ForwardFromSaved(float* base, float* output) {
  const int num_layers = layers_.size();
  if (is_first()) {
    EncoderForward(InputSlot(base, output), reinterpret_cast<const std::int32_t*>(base + tokens_),
                   Tensor(kTokenEmbeddingId, false, false),
                   Tensor(kPositionEmbeddingId, false, false), B_, T_, C_);
  }
  for (int i = 0; i < num_layers; ++i) {
    float* out = i + 1 < num_layers ? base + slots_[i + 1].x : is_last() ? base + lnf_in_ : output;
    LayerForward(i, base, out);
  }
  if (!is_last()) return 0.0;

  LayerNormForward(base + lnf_out_, base + lnf_mean_, base + lnf_rstd_, base + lnf_in_,
                   Tensor(LnfWeightId(config_), false, false),
                   Tensor(LnfBiasId(config_), false, false), N_, C_);
  const float* head = config_.tied_embeddings ? Tensor(kTokenEmbeddingId, true, false)
                                              : Tensor(HeadWeightId(config_), false, false);
  float* probs = base + probs_;  // (N,V): logits, then probabilities in place
  MatmulForward(probs, base + lnf_out_, head, nullptr, N_, C_, V_);
  SoftmaxCrossEntropyForward(probs, losses_.data(), probs,
                             reinterpret_cast<const std::int32_t*>(base + targets_), N_, V_);
  double sum = 0.0;
  for (float loss : losses_) sum += loss;
  return sum / N_;
}

std::int64_t GptChunk::RetainedBytes(Recompute mode) const {
  std::int64_t floats = 0;
  for (const Segment& segment : segments_) {
    if (segment.KeptBy(mode)) {
      floats += segment.floats;
    }
  }
  return 4 * floats;
}

void GptChunk::Retain(const std::byte* saved, std::byte* retained, Recompute mode) const {
  const float* base = reinterpret_cast<const float*>(saved);
  float* cursor = reinterpret_cast<float*>(retained);
  for (const Segment& segment : segments_) {
    if (segment.KeptBy(mode)) {
      Copy(cursor, base + segment.offset, segment.floats);
      cursor += segment.floats;
    }
  }
}

void GptChunk::Rebuild(const std::byte* retained, std::byte* saved, Recompute mode) {
  PO_CHECK(mode != Recompute::kNone);
  float* base = reinterpret_cast<float*>(saved);
  const float* cursor = reinterpret_cast<const float*>(retained);
  for (const Segment& segment : segments_) {
    if (segment.KeptBy(mode)) {
      Copy(base + segment.offset, cursor, segment.floats);
      cursor += segment.floats;
    }
  }
  if (mode == Recompute::kFull) {
    if (!is_last()) rebuild_output_.resize(static_cast<std::size_t>(N_) * C_);
    ForwardFromSaved(base, rebuild_output_.data());
    return;
  }
  // Lean: LayerNormForward rewrites the mean and rstd it kept with the same values.
  for (int i = 0; i < layers_.size(); ++i) {
    const LayerSlots& s = slots_[i];
    const LayerTensors w = LayerParams(i, /*grads=*/false);
    LayerNormForward(base + s.ln1_out, base + s.ln1_mean, base + s.ln1_rstd, base + s.x, w.ln1_w,
                     w.ln1_b, N_, C_);
    LayerNormForward(base + s.ln2_out, base + s.ln2_mean, base + s.ln2_rstd, base + s.res2, w.ln2_w,
                     w.ln2_b, N_, C_);
    GeluForward(base + s.fch_gelu, base + s.fch, std::int64_t{N_} * 4 * C_);
  }
  if (is_last()) {
    LayerNormForward(base + lnf_out_, base + lnf_mean_, base + lnf_rstd_, base + lnf_in_,
                     Tensor(LnfWeightId(config_), false, false),
                     Tensor(LnfBiasId(config_), false, false), N_, C_);
  }
}

void GptChunk::LayerBackwardInput(int local_layer, float* base, const LayerGrads& g, float* dinp) {
  const LayerSlots& s = slots_[local_layer];
  const LayerTensors w = LayerParams(local_layer, /*grads=*/false);
  const int B = B_, T = T_, C = C_, N = N_;
  const std::int64_t nc = std::int64_t{N} * C;
  // MLP branch: out = res2 + fc_proj(gelu(fc(ln2(res2)))).
  MatmulBackwardInput(d_fch_gelu_.data(), g.dout, w.fc_proj_w, N, 4 * C, C);
  GeluBackward(g.d_fch, base + s.fch, d_fch_gelu_.data(), 4 * nc);
  MatmulBackwardInput(g.d_ln2out, g.d_fch, w.fc_w, N, C, 4 * C);
  Copy(g.dres2, g.dout, nc);
  LayerNormBackwardInput(g.dres2, g.d_ln2out, base + s.res2, w.ln2_w, base + s.ln2_mean,
                         base + s.ln2_rstd, N, C);
  // Attention branch: res2 = x + attn_proj(attention(qkv(ln1(x)))).
  MatmulBackwardInput(d_atty_.data(), g.dres2, w.attn_proj_w, N, C, C);
  AttentionBackward(g.d_qkv, att_row_.data(), d_atty_.data(), base + s.qkv, base + s.att, B, T, C,
                    NH_);
  MatmulBackwardInput(g.d_ln1out, g.d_qkv, w.qkv_w, N, C, 3 * C);
  Copy(dinp, g.dres2, nc);
  LayerNormBackwardInput(dinp, g.d_ln1out, base + s.x, w.ln1_w, base + s.ln1_mean,
                         base + s.ln1_rstd, N, C);
}

void GptChunk::LayerBackwardWeight(int local_layer, float* base, const LayerGrads& g) {
  const LayerSlots& s = slots_[local_layer];
  const LayerTensors d = LayerParams(local_layer, /*grads=*/true);
  const int C = C_, N = N_;
  MatmulBackwardWeight(d.fc_proj_w, d.fc_proj_b, g.dout, base + s.fch_gelu, N, 4 * C, C);
  MatmulBackwardWeight(d.fc_w, d.fc_b, g.d_fch, base + s.ln2_out, N, C, 4 * C);
  LayerNormBackwardWeight(d.ln2_w, d.ln2_b, g.d_ln2out, base + s.res2, base + s.ln2_mean,
                          base + s.ln2_rstd, N, C);
  MatmulBackwardWeight(d.attn_proj_w, d.attn_proj_b, g.dres2, base + s.atty, N, C, C);
  MatmulBackwardWeight(d.qkv_w, d.qkv_b, g.d_qkv, base + s.ln1_out, N, C, 3 * C);
  LayerNormBackwardWeight(d.ln1_w, d.ln1_b, g.d_ln1out, base + s.x, base + s.ln1_mean,
                          base + s.ln1_rstd, N, C);
}

void GptChunk::HeadBackwardWeight(float* base, bool split) {
  float* dhead = config_.tied_embeddings ? Tensor(kTokenEmbeddingId, true, true)
                                         : Tensor(HeadWeightId(config_), false, true);
  MatmulBackwardWeight(dhead, nullptr, base + probs_, base + lnf_out_, N_, C_, V_);
  LayerNormBackwardWeight(Tensor(LnfWeightId(config_), false, true),
                          Tensor(LnfBiasId(config_), false, true), LnfOutGrad(base, split),
                          base + lnf_in_, base + lnf_mean_, base + lnf_rstd_, N_, C_);
}

void GptChunk::Backward(const float* grad_output, float* grad_input, std::byte* saved,
                        bool with_weight_grad, float dloss) {
  float* base = reinterpret_cast<float*>(saved);
  const bool split = !with_weight_grad;
  const std::int64_t nc = std::int64_t{N_} * C_;
  const int num_layers = layers_.size();
  // Gradient of the chunk's input; with no layers it is also the gradient of the chunk's output.
  float* input_grad = is_first() ? EmbeddingGrad(base, split) : grad_input;
  float* dout_last = num_layers > 0 ? GradsOf(num_layers - 1, base, split).dout : input_grad;
  if (is_last()) {
    // loss -> logits -> final LN; dlogits replace the probabilities in saved.
    float* dlogits = base + probs_;
    const auto* targets = reinterpret_cast<const std::int32_t*>(base + targets_);
    SoftmaxCrossEntropyBackward(dlogits, dlogits, targets, dloss, N_, V_);
    const float* head = config_.tied_embeddings ? Tensor(kTokenEmbeddingId, true, false)
                                                : Tensor(HeadWeightId(config_), false, false);
    float* d_lnf_out = LnfOutGrad(base, split);
    MatmulBackwardInput(d_lnf_out, dlogits, head, N_, C_, V_);
    std::memset(dout_last, 0, sizeof(float) * static_cast<std::size_t>(nc));
    LayerNormBackwardInput(dout_last, d_lnf_out, base + lnf_in_,
                           Tensor(LnfWeightId(config_), false, false), base + lnf_mean_,
                           base + lnf_rstd_, N_, C_);
    if (with_weight_grad) HeadBackwardWeight(base, split);
  } else {
    Copy(dout_last, grad_output, nc);
  }
  for (int i = num_layers - 1; i >= 0; --i) {
    const LayerGrads g = GradsOf(i, base, split);
    float* dinp = i > 0 ? GradsOf(i - 1, base, split).dout : input_grad;
    LayerBackwardInput(i, base, g, dinp);
    if (with_weight_grad) LayerBackwardWeight(i, base, g);
  }
  if (is_first() && with_weight_grad) {
    EncoderBackward(Tensor(kTokenEmbeddingId, false, true),
                    Tensor(kPositionEmbeddingId, false, true), EmbeddingGrad(base, split),
                    reinterpret_cast<const std::int32_t*>(base + tokens_), B_, T_, C_);
  }
}

void GptChunk::BackwardWeight(std::byte* saved) {
  float* base = reinterpret_cast<float*>(saved);
  if (is_last()) HeadBackwardWeight(base, /*split=*/true);
  for (int i = layers_.size() - 1; i >= 0; --i) {
    LayerBackwardWeight(i, base, GradsOf(i, base, /*split=*/true));
  }
  if (is_first()) {
    EncoderBackward(Tensor(kTokenEmbeddingId, false, true),
                    Tensor(kPositionEmbeddingId, false, true), EmbeddingGrad(base, true),
                    reinterpret_cast<const std::int32_t*>(base + tokens_), B_, T_, C_);
  }
}

}  // namespace pipeoffload::gpt
