// The Llama model's CPU kernels, fp32, forward and backward: the reference every CUDA kernel of
// examples/llama/cuda mirrors (llm.c style) and the arithmetic of the CPU model the layer-sliding
// engine is proven with in CI. The linear layers are the GPT example's (examples/gpt/
// kernels_cpu.h: MatmulForward / MatmulBackwardInput / MatmulBackwardWeight, weight (OC, IC)).
//
// Determinism contract, as the GPT's: every kernel is a fixed sequence of IEEE float operations
// that depends only on its arguments (never on addresses or threads); accumulating kernels
// (`+=`) add their contributions in a fixed order (rows n = 0..N-1 ascending). The target
// builds with -ffp-contract=off. Single-threaded.
//
// Shapes: B sequences of T tokens, N = B * T rows (row n = b * T + t, position t), H hidden,
// NH query heads, NKV key/value heads (NH % NKV == 0: query head h reads kv head h / (NH/NKV)),
// hd head dim (even), F the SwiGLU width, V vocab. A (N, heads, hd) tensor is row-major with
// head h of row n at [(n * heads + h) * hd, +hd).
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_KERNELS_CPU_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_KERNELS_CPU_H_

#include <cstdint>

namespace pipeoffload::llama {

// ---- RMSNorm (Zhang & Sennrich 2019), as Hugging Face's LlamaRMSNorm ----------------------
// Per row of inp (N, C): rstd = 1 / sqrt(mean(x^2) + eps) (mean in double, rounded to float),
// out = (x * rstd) * weight. rstd (N) is saved for the backward.
void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                    float eps);
// dinp (N,C) = d(out)/d(inp)^T dout (OVERWRITES dinp); dweight (C) += sum over rows of
// dout * x * rstd. `rstd` from the forward. Per row, with g = weight * dout:
// dinp = (g - x * ((float(mean(g * x)) * rstd) * rstd)) * rstd, the mean summed in double.
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int N, int C);

// ---- Rotary embeddings (Su et al. 2021), Hugging Face's rotate_half convention ---------------
// inv_freq (hd/2): theta^(-2i/hd), with Llama 3.1 scaling applied when the config asks
// (RopeInvFreq in llama_config.h's terms, computed in double then rounded).
// For each row n (position t = n % T), each head, each i < hd/2, with c = cos(t * inv_freq[i]),
// s = sin(t * inv_freq[i]) (the angle in double, cos/sin in double, rounded to float):
//   x'[i]        = x[i] * c - x[i + hd/2] * s
//   x'[i + hd/2] = x[i + hd/2] * c + x[i] * s
// In place on x (N, heads, hd).
void RopeForward(float* x, const float* inv_freq, int N, int T, int heads, int hd);
// The transposed rotation (angle -t * inv_freq), in place on the gradient dx (N, heads, hd).
void RopeBackward(float* dx, const float* inv_freq, int N, int T, int heads, int hd);

// ---- Causal grouped-query attention ---------------------------------------------------------
// q (N, NH, hd), k, v (N, NKV, hd); per sequence b, head h, query t: scores over keys j <= t,
// s_j = (q_t . k_j) * (1 / sqrt(hd)), p = softmax(s) (max-subtracted, sum in float:
// p_j = exp(s_j - max) * (1 / sum)), out_t = sum_j p_j v_j. lse (B, NH, T) = max + log(sum exp(s - max)) is saved.
// `scratch` holds T floats.
void AttentionForward(float* out, float* lse, float* scratch, const float* q, const float* k,
                      const float* v, int B, int T, int NH, int NKV, int hd);
// dq (N, NH, hd), dk, dv (N, NKV, hd) OVERWRITTEN from dout (N, NH, hd), recomputing p from
// q, k and lse (p_j = exp(s_j - lse)): dv_j += p_j dout_t; dp_j = dout_t . v_j; D_t = dout_t . out_t;
// ds_j = p_j (dp_j - D_t); dq_t += ds_j k_j / sqrt(hd); dk_j += ds_j q_t / sqrt(hd); query heads
// of one kv group accumulate into it in ascending head order (dk_j, dv_j: (h, t) ascending).
// `scratch` holds 2 T floats.
void AttentionBackward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                       const float* out, const float* lse, const float* q, const float* k,
                       const float* v, int B, int T, int NH, int NKV, int hd);

// ---- SwiGLU (Shazeer 2020) ------------------------------------------------------------------
// gate_up (N, 2F): gate = [:, 0:F), up = [:, F:2F); out (N, F) = silu(gate) * up,
// silu(x) = x / (1 + exp(-x)).
void SwiGluForward(float* out, const float* gate_up, std::int64_t N, int F);
// dgate_up (N, 2F) OVERWRITTEN: dgate = dout * up * silu'(gate), dup = dout * silu(gate).
void SwiGluBackward(float* dgate_up, const float* dout, const float* gate_up, std::int64_t N,
                    int F);

// ---- Embedding ------------------------------------------------------------------------------
// out (N, H) = table[tokens[n], :]. tokens in [0, V).
void EmbeddingForward(float* out, const std::int32_t* tokens, const float* table, int N, int H);
// dtable (V, H) += dout rows scattered by token, rows n ascending.
void EmbeddingBackward(float* dtable, const float* dout, const std::int32_t* tokens, int N,
                       int H);

// ---- Fused linear cross-entropy (Liger / Apple CCE; reference/offload-systems.md 3.7) -------
// For x (N, H), W (V, H), targets (N): logits = x W^T never exist as a whole: rows are taken
// `chunk_rows` at a time (the last chunk may be shorter); per chunk, logits (rows, V) in
// `scratch`, per row lse = max + log(sum exp(l - max)) (sum in double), loss_n = lse - l[target].
// Then, with g = (exp(l - float(lse)) - onehot(target)) * grad_scale (the row's gradient of
// grad_scale * loss_n), dx_n = g W (OVERWRITES dx), dW += g^T x (chunks ascending, rows
// ascending within a chunk). Returns the sum of loss_n over the N rows, in double, rows
// ascending. Every row's arithmetic is the same whatever the chunking and dW is added row by row
// in ascending n, so the results do not depend on chunk_rows. `scratch` holds chunk_rows * V
// floats.
double FusedLinearCrossEntropy(float* dx, float* dweight, float* scratch, const float* x,
                               const float* weight, const std::int32_t* targets, int N, int H,
                               int V, int chunk_rows, float grad_scale);

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_KERNELS_CPU_H_
