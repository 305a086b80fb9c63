// The Llama units' math on the CPU: llama_kernels_cpu.h's kernels and the GPT's matmuls,
// composed in one fixed order per unit (llama_layer_cpu.h lists the formulas). The decoder's
// workspace holds its forward activations, then the backward's gradients after them.
#include "examples/llama/llama_layer_cpu.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "examples/gpt/kernels_cpu.h"
#include "examples/llama/llama_kernels_cpu.h"
#include "lib/base/check.h"

namespace pipeoffload::llama {
namespace {

// Splits rows of (N, Q + 2 KV) into q (N, Q), k (N, KV), v (N, KV).
void SplitQkv(const float* qkv, float* q, float* k, float* v, int N, int Q, int KV) {
  const std::int64_t width = std::int64_t{Q} + 2 * KV;
  for (int n = 0; n < N; ++n) {
    const float* row = qkv + n * width;
    std::memcpy(q + std::int64_t{n} * Q, row, sizeof(float) * static_cast<std::size_t>(Q));
    std::memcpy(k + std::int64_t{n} * KV, row + Q, sizeof(float) * static_cast<std::size_t>(KV));
    std::memcpy(v + std::int64_t{n} * KV, row + Q + KV,
                sizeof(float) * static_cast<std::size_t>(KV));
  }
}

// The inverse of SplitQkv.
void JoinQkv(float* qkv, const float* q, const float* k, const float* v, int N, int Q, int KV) {
  const std::int64_t width = std::int64_t{Q} + 2 * KV;
  for (int n = 0; n < N; ++n) {
    float* row = qkv + n * width;
    std::memcpy(row, q + std::int64_t{n} * Q, sizeof(float) * static_cast<std::size_t>(Q));
    std::memcpy(row + Q, k + std::int64_t{n} * KV, sizeof(float) * static_cast<std::size_t>(KV));
    std::memcpy(row + Q + KV, v + std::int64_t{n} * KV,
                sizeof(float) * static_cast<std::size_t>(KV));
  }
}

// a[i] = b[i] + a[i]: a residual connection written over the branch.
void AddInto(float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + a[i];
}

}  // namespace

DecoderLayout MakeDecoderLayout(const LlamaConfig& config) {
  const std::vector<LlamaTensor> tensors = UnitTensors(config, LayerUnit(0));
  DecoderLayout layout;
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const LlamaTensor& t : tensors) {
    const std::string& name = t.hf_name;
    if (ends_with(name, "input_layernorm.weight")) layout.input_norm = t.offset;
    if (ends_with(name, "q_proj.weight")) layout.qkv = t.offset;
    if (ends_with(name, "q_proj.bias")) layout.qkv_bias = t.offset;
    if (ends_with(name, "q_norm.weight")) layout.q_norm = t.offset;
    if (ends_with(name, "k_norm.weight")) layout.k_norm = t.offset;
    if (ends_with(name, "o_proj.weight")) layout.o_proj = t.offset;
    if (ends_with(name, "post_attention_layernorm.weight")) layout.post_norm = t.offset;
    if (ends_with(name, "gate_proj.weight")) layout.gate_up = t.offset;
    if (ends_with(name, "down_proj.weight")) layout.down = t.offset;
    layout.count = t.offset + t.numel();
  }
  // q | k | v and gate | up must be adjacent (one GEMM each): UnitTensors' documented order.
  const std::int64_t H = config.hidden_size;
  const std::int64_t qkv_rows =
      (std::int64_t{config.num_heads} + 2 * std::int64_t{config.num_kv_heads}) * config.head_dim;
  const std::int64_t after_qkv = layout.qkv + qkv_rows * H;
  PO_CHECK(layout.qkv_bias < 0 || layout.qkv_bias == after_qkv);
  PO_CHECK(layout.down == layout.gate_up + 2 * std::int64_t{config.intermediate_size} * H);
  return layout;
}

LlamaCpuUnits::LlamaCpuUnits(const LlamaConfig& config, int B, int T, int ce_chunk_rows)
    : config_(config),
      B_(B),
      T_(T),
      N_(B * T),
      ce_chunk_rows_(ce_chunk_rows),
      Q_(config.num_heads * config.head_dim),
      KV_(config.num_kv_heads * config.head_dim),
      layout_(MakeDecoderLayout(config)),
      inv_freq_(RopeInvFreq(config)) {
  PO_CHECK(B >= 1 && T >= 1 && ce_chunk_rows >= 1);
  // The kernels index rows with int: N * heads rows of the qk-norm, N * max(width) elements.
  PO_CHECK(std::int64_t{B} * T * std::max(config.num_heads, 1) <= std::numeric_limits<int>::max());
  const std::int64_t N = N_;
  const std::int64_t H = config.hidden_size;
  const std::int64_t F = config.intermediate_size;
  const std::int64_t NH = config.num_heads;
  const std::int64_t NKV = config.num_kv_heads;
  std::int64_t next = 0;
  auto take = [&next](std::int64_t floats) {
    const std::int64_t at = next;
    next += floats;
    return at;
  };
  DecoderSlots& s = slots_;
  s.rstd1 = take(N);
  s.xn1 = take(N * H);
  s.qkv = take(N * (Q_ + 2 * std::int64_t{KV_}));
  s.q_pre = config.qk_norm ? take(N * Q_) : -1;
  s.k_pre = config.qk_norm ? take(N * KV_) : -1;
  s.rstd_q = config.qk_norm ? take(N * NH) : -1;
  s.rstd_k = config.qk_norm ? take(N * NKV) : -1;
  s.q = take(N * Q_);
  s.k = take(N * KV_);
  s.v = take(N * KV_);
  s.att = take(N * Q_);
  s.lse = take(N * NH);
  s.h = take(N * H);
  s.rstd2 = take(N);
  s.xn2 = take(N * H);
  s.gate_up = take(N * 2 * F);
  s.act = take(N * F);
  s.att_scratch = take(2 * std::int64_t{T});
  s.dh = take(N * H);
  s.dtmp = take(N * H);
  s.dact = take(N * F);
  s.dgate_up = take(N * 2 * F);
  s.datt = take(N * Q_);
  s.dq = take(N * Q_);
  s.dk = take(N * KV_);
  s.dv = take(N * KV_);
  s.dq_pre = config.qk_norm ? take(N * Q_) : -1;
  s.dk_pre = config.qk_norm ? take(N * KV_) : -1;
  decoder_backward_floats_ = next;
  // Head: rstd (N), xn (N, H), dxn (N, H), one chunk of logits.
  const std::int64_t chunk = std::min(N, std::int64_t{ce_chunk_rows});
  head_floats_ = N + 2 * N * H + chunk * config.vocab_size;
}

void LlamaCpuUnits::EmbeddingForward(const float* params, const std::int32_t* tokens,
                                     float* out) const {
  llama::EmbeddingForward(out, tokens, params, N_, config_.hidden_size);
}

void LlamaCpuUnits::EmbeddingBackward(const std::int32_t* tokens, const float* dout,
                                      float* dparams) const {
  llama::EmbeddingBackward(dparams, dout, tokens, N_, config_.hidden_size);
}

void LlamaCpuUnits::DecoderForward(const float* params, const float* x, float* out,
                                   float* workspace) const {
  PO_CHECK(out != nullptr);
  DecoderForwardInto(params, x, out, workspace);
}

void LlamaCpuUnits::DecoderForwardInto(const float* params, const float* x, float* out,
                                       float* ws) const {
  const LlamaConfig& c = config_;
  const DecoderSlots& s = slots_;
  const DecoderLayout& p = layout_;
  const int N = N_, H = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int NH = c.num_heads, NKV = c.num_kv_heads, QKV = Q_ + 2 * KV_;
  const float eps = c.rms_norm_eps;
  float* q = ws + s.q;  // (N, NH, hd)
  float* k = ws + s.k;  // (N, NKV, hd)
  float* v = ws + s.v;  // (N, NKV, hd)
  float* h = ws + s.h;  // (N, H) the residual stream after attention

  RmsNormForward(ws + s.xn1, ws + s.rstd1, x, params + p.input_norm, N, H, eps);
  gpt::MatmulForward(ws + s.qkv, ws + s.xn1, params + p.qkv,
                     p.qkv_bias >= 0 ? params + p.qkv_bias : nullptr, N, H, QKV);
  if (c.qk_norm) {
    SplitQkv(ws + s.qkv, ws + s.q_pre, ws + s.k_pre, v, N, Q_, KV_);
    RmsNormForward(q, ws + s.rstd_q, ws + s.q_pre, params + p.q_norm, N * NH, hd, eps);
    RmsNormForward(k, ws + s.rstd_k, ws + s.k_pre, params + p.k_norm, N * NKV, hd, eps);
  } else {
    SplitQkv(ws + s.qkv, q, k, v, N, Q_, KV_);
  }
  RopeForward(q, inv_freq_.data(), N, T_, NH, hd);
  RopeForward(k, inv_freq_.data(), N, T_, NKV, hd);
  AttentionForward(ws + s.att, ws + s.lse, ws + s.att_scratch, q, k, v, B_, T_, NH, NKV, hd);
  gpt::MatmulForward(h, ws + s.att, params + p.o_proj, nullptr, N, Q_, H);
  AddInto(h, x, std::int64_t{N} * H);
  RmsNormForward(ws + s.xn2, ws + s.rstd2, h, params + p.post_norm, N, H, eps);
  gpt::MatmulForward(ws + s.gate_up, ws + s.xn2, params + p.gate_up, nullptr, N, H, 2 * F);
  SwiGluForward(ws + s.act, ws + s.gate_up, N, F);
  if (out != nullptr) {
    gpt::MatmulForward(out, ws + s.act, params + p.down, nullptr, N, F, H);
    AddInto(out, h, std::int64_t{N} * H);
  }
}

void LlamaCpuUnits::DecoderBackward(const float* params, const float* x, const float* dout,
                                    float* dx, float* dparams, float* ws) const {
  DecoderForwardInto(params, x, nullptr, ws);
  const LlamaConfig& c = config_;
  const DecoderSlots& s = slots_;
  const DecoderLayout& p = layout_;
  const int N = N_, H = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int NH = c.num_heads, NKV = c.num_kv_heads, QKV = Q_ + 2 * KV_;
  float* dh = ws + s.dh;      // (N, H) gradient of h
  float* dtmp = ws + s.dtmp;  // (N, H) gradient of xn2, then of xn1
  float* dq = ws + s.dq;      // (N, NH, hd)
  float* dk = ws + s.dk;      // (N, NKV, hd)
  float* dv = ws + s.dv;      // (N, NKV, hd)

  // MLP: out = h + act down^T.
  gpt::MatmulBackwardInput(ws + s.dact, dout, params + p.down, N, F, H);
  gpt::MatmulBackwardWeight(dparams + p.down, nullptr, dout, ws + s.act, N, F, H);
  SwiGluBackward(ws + s.dgate_up, ws + s.dact, ws + s.gate_up, N, F);
  gpt::MatmulBackwardInput(dtmp, ws + s.dgate_up, params + p.gate_up, N, H, 2 * F);
  gpt::MatmulBackwardWeight(dparams + p.gate_up, nullptr, ws + s.dgate_up, ws + s.xn2, N, H, 2 * F);
  RmsNormBackward(dh, dparams + p.post_norm, dtmp, ws + s.h, params + p.post_norm, ws + s.rstd2, N,
                  H);
  AddInto(dh, dout, std::int64_t{N} * H);  // the residual; dout is not read after this
  // Attention: h = x + att o_proj^T.
  gpt::MatmulBackwardInput(ws + s.datt, dh, params + p.o_proj, N, Q_, H);
  gpt::MatmulBackwardWeight(dparams + p.o_proj, nullptr, dh, ws + s.att, N, Q_, H);
  AttentionBackward(dq, dk, dv, ws + s.att_scratch, ws + s.datt, ws + s.att, ws + s.lse, ws + s.q,
                    ws + s.k, ws + s.v, B_, T_, NH, NKV, hd);
  RopeBackward(dq, inv_freq_.data(), N, T_, NH, hd);
  RopeBackward(dk, inv_freq_.data(), N, T_, NKV, hd);
  const float* dq_pre = dq;
  const float* dk_pre = dk;
  if (c.qk_norm) {
    RmsNormBackward(ws + s.dq_pre, dparams + p.q_norm, dq, ws + s.q_pre, params + p.q_norm,
                    ws + s.rstd_q, N * NH, hd);
    RmsNormBackward(ws + s.dk_pre, dparams + p.k_norm, dk, ws + s.k_pre, params + p.k_norm,
                    ws + s.rstd_k, N * NKV, hd);
    dq_pre = ws + s.dq_pre;
    dk_pre = ws + s.dk_pre;
  }
  float* dqkv = ws + s.qkv;  // (N, Q + 2 KV): the forward's projection output is dead now
  JoinQkv(dqkv, dq_pre, dk_pre, dv, N, Q_, KV_);
  gpt::MatmulBackwardInput(dtmp, dqkv, params + p.qkv, N, H, QKV);
  gpt::MatmulBackwardWeight(dparams + p.qkv, p.qkv_bias >= 0 ? dparams + p.qkv_bias : nullptr, dqkv,
                            ws + s.xn1, N, H, QKV);
  RmsNormBackward(dx, dparams + p.input_norm, dtmp, x, params + p.input_norm, ws + s.rstd1, N, H);
  AddInto(dx, dh, std::int64_t{N} * H);
}

double LlamaCpuUnits::HeadLossBackward(const float* params, const float* x,
                                       const std::int32_t* targets, float grad_scale, float* dx,
                                       float* dparams, float* ws) const {
  const int N = N_, H = config_.hidden_size, V = config_.vocab_size;
  float* rstd = ws;                           // (N)
  float* xn = ws + N;                         // (N, H)
  float* dxn = xn + std::int64_t{N} * H;      // (N, H)
  float* logits = dxn + std::int64_t{N} * H;  // (chunk, V)
  RmsNormForward(xn, rstd, x, params, N, H, config_.rms_norm_eps);
  const double loss = FusedLinearCrossEntropy(dxn, dparams + H, logits, xn, params + H, targets, N,
                                              H, V, ce_chunk_rows_, grad_scale);
  RmsNormBackward(dx, dparams, dxn, x, params, rstd, N, H);
  return loss;
}

}  // namespace pipeoffload::llama
