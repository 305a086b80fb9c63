// The math of the Llama model's layer-sliding units on the CPU, fp32, on flat parameter arrays
// in UnitTensors' layout (llama_config.h): the embedding, a decoder layer (forward, and a
// backward that recomputes its forward first) and the head (final norm, LM head and loss in one
// pass). The composition of llama_kernels_cpu.h's kernels that the CPU model, the plain trainer
// and the CUDA model's tests all share; it holds no parameters and keeps nothing between calls.
//
// Shapes: N = B * T rows (row n = b * T + t), H, F, NH, NKV, hd, V as in llama_config.h;
// Q = NH * hd, KV = NKV * hd.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_LAYER_CPU_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_LAYER_CPU_H_

#include <cstdint>
#include <vector>

#include "examples/llama/llama_config.h"

namespace pipeoffload::llama {

// Element offsets of a decoder unit's tensors in its flat array (the same for every layer);
// -1 for tensors the config does not have.
struct DecoderLayout {
  std::int64_t input_norm = 0;  // (H)
  std::int64_t qkv = 0;         // (Q + 2 KV, H): q_proj | k_proj | v_proj
  std::int64_t qkv_bias = -1;   // (Q + 2 KV): attention_bias
  std::int64_t q_norm = -1;     // (hd): qk_norm
  std::int64_t k_norm = -1;     // (hd): qk_norm
  std::int64_t o_proj = 0;      // (H, Q)
  std::int64_t post_norm = 0;   // (H)
  std::int64_t gate_up = 0;     // (2F, H): gate_proj | up_proj
  std::int64_t down = 0;        // (H, F)
  std::int64_t count = 0;       // UnitParamCount of a decoder unit
};
// REQUIRES: ValidateLlamaConfig(config).ok().
DecoderLayout MakeDecoderLayout(const LlamaConfig& config);

// The units' math for microbatches of B sequences of T tokens. Thread-compatible: const calls
// may run concurrently on different workspaces. Every call is a fixed sequence of the kernels'
// operations (bitwise reproducible, independent of the workspace's address and contents).
class LlamaCpuUnits {
 public:
  // REQUIRES: ValidateLlamaConfig(config).ok(), B >= 1, T >= 1, ce_chunk_rows >= 1 (rows of
  // logits the head materializes at a time; the results do not depend on it).
  LlamaCpuUnits(const LlamaConfig& config, int B, int T, int ce_chunk_rows);

  const LlamaConfig& config() const { return config_; }
  int rows() const { return N_; }  // N
  const DecoderLayout& decoder_layout() const { return layout_; }

  // Workspace (floats) one call of each unit needs; the embedding needs none.
  std::int64_t DecoderWorkspaceFloats() const { return decoder_backward_floats_; }
  std::int64_t HeadWorkspaceFloats() const { return head_floats_; }

  // ---- Embedding unit: params = embed_tokens (V, H) -------------------------------------
  // out (N, H) = params[tokens[n], :]. REQUIRES: tokens (N) in [0, V).
  void EmbeddingForward(const float* params, const std::int32_t* tokens, float* out) const;
  // dparams (V, H) += dout (N, H) scattered by token, rows ascending.
  void EmbeddingBackward(const std::int32_t* tokens, const float* dout, float* dparams) const;

  // ---- Decoder unit: params in DecoderLayout --------------------------------------------
  //   xn1 = RMSNorm(x) * input_norm
  //   qkv = xn1 [q; k; v]^T (+ qkv_bias)
  //   q, k = RMSNorm_hd(q) * q_norm, RMSNorm_hd(k) * k_norm     (qk_norm, per head)
  //   q, k = RoPE(q), RoPE(k)
  //   h = x + Attention(q, k, v) o_proj^T
  //   xn2 = RMSNorm(h) * post_norm
  //   out = h + SwiGLU(xn2 [gate; up]^T) down^T
  // x, out (N, H); workspace DecoderWorkspaceFloats() (its forward part holds the
  // activations). out must not alias x.
  void DecoderForward(const float* params, const float* x, float* out, float* workspace) const;
  // Recomputes the forward from x in the workspace, then back-propagates dout (N, H):
  // OVERWRITES dx (N, H) with the gradient of x and ADDS the parameter gradients into dparams
  // (DecoderLayout, same layout as params; every element of every tensor receives its rows'
  // contributions in ascending order). dx may alias dout (dout is consumed before dx is
  // written); neither may alias x, params or the workspace.
  void DecoderBackward(const float* params, const float* x, const float* dout, float* dx,
                       float* dparams, float* workspace) const;

  // ---- Head unit: params = norm (H) | lm_head (V, H) --------------------------------------
  // Untied, lm_head is the unit's own; tied, it is the embedding unit's table, borrowed (the
  // unit's view is [own | borrowed]): either way the matrix sits at params + H, and its
  // gradient at dparams + H.
  // xn = RMSNorm(x) * norm; loss_n = cross-entropy of xn lm_head^T against targets[n]
  // (FusedLinearCrossEntropy, ce_chunk_rows at a time). OVERWRITES dx (N, H) with the gradient
  // of grad_scale * sum_n loss_n and ADDS that objective's parameter gradients into dparams
  // (H + V * H floats). Returns sum_n loss_n (double, rows ascending). x (N, H); targets (N) in
  // [0, V); workspace HeadWorkspaceFloats(). dx must not alias x.
  double HeadLossBackward(const float* params, const float* x, const std::int32_t* targets,
                          float grad_scale, float* dx, float* dparams, float* workspace) const;

 private:
  // Float offsets of the decoder's activations in the workspace (-1: absent for this config).
  struct DecoderSlots {
    // Forward: what the backward reads.
    // qkv is the projection's output, split into q_pre, k_pre (qk_norm) or q, k, and v; the
    // backward reuses it for the gradient of qkv.
    std::int64_t rstd1, xn1, qkv, q_pre, k_pre, rstd_q, rstd_k, q, k, v, att, lse, h, rstd2, xn2,
        gate_up, act, att_scratch;
    // Backward only.
    std::int64_t dh, dtmp, dact, dgate_up, datt, dq, dk, dv, dq_pre, dk_pre;
  };
  // The forward into the workspace, then out (N, H) unless out is null (the backward's
  // recompute needs no output).
  void DecoderForwardInto(const float* params, const float* x, float* out, float* ws) const;

  LlamaConfig config_;
  int B_, T_, N_, ce_chunk_rows_;
  int Q_, KV_;
  DecoderLayout layout_;
  std::vector<float> inv_freq_;  // (hd / 2) RopeInvFreq(config)
  DecoderSlots slots_;
  std::int64_t decoder_backward_floats_ = 0;
  std::int64_t head_floats_ = 0;
};

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_LAYER_CPU_H_
