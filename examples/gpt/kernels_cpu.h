// The GPT's CPU kernels, fp32, forward and backward: the reference the CUDA kernels will mirror
// (llm.c style). Each kernel is a small single-threaded function with shape comments; stages
// already run on their own threads, so kernels never spawn any.
//
// Determinism contract (what the pipeline's bitwise equality rests on): every kernel is a fixed
// sequence of IEEE float operations that depends only on its arguments, never on addresses,
// alignment or on how the model is split. Every accumulating kernel (`+=`) adds its
// contributions in a fixed order (rows n = 0..N-1, and for embeddings b, t ascending), so a
// gradient accumulated over microbatches 0..m-1 is the same bit pattern no matter which
// virtual stage or process computes it. The target builds with -ffp-contract=off so the compiler
// never fuses a multiply-add in one call site and not in another.
//
// Shapes: B batch, T time, C channels, NH heads, hs = C / NH, V vocab, N = B * T rows.
// Weights use llm.c's layout, (OC, IC): out = inp @ W^T + b.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_KERNELS_CPU_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_KERNELS_CPU_H_

#include <cstdint>

namespace pipeoffload::gpt {

// LayerNorm epsilon, as in GPT-2.
inline constexpr float kLayerNormEps = 1e-5f;

// out (B,T,C) = wte[tokens[b,t], :] + wpe[t, :].  tokens (B,T) in [0, V).
void EncoderForward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                    int B, int T, int C);
// dwte (V,C) += scatter of dout (B,T,C) by token; dwpe (T,C) += dout summed over b.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B,
                     int T, int C);

// Per row of inp (N,C): out = (inp - mean) * rstd * weight + bias; mean, rstd (N) are saved.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C);
// dinp (N,C) += d(out)/d(inp)^T dout.  Accumulates (the residual gradient is already there).
void LayerNormBackwardInput(float* dinp, const float* dout, const float* inp, const float* weight,
                            const float* mean, const float* rstd, int N, int C);
// dweight, dbias (C) += the parameter gradients of the same LayerNorm.
void LayerNormBackwardWeight(float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* mean, const float* rstd, int N, int C);

// out (N,OC) = inp (N,IC) @ weight^T + bias;  weight (OC,IC), bias (OC) or null.
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int IC, int OC);
// dinp (N,IC) = dout (N,OC) @ weight (OC,IC).  Overwrites dinp.
void MatmulBackwardInput(float* dinp, const float* dout, const float* weight, int N, int IC,
                         int OC);
// dweight (OC,IC) += dout^T @ inp;  dbias (OC) += column sums of dout (skipped when null).
void MatmulBackwardWeight(float* dweight, float* dbias, const float* dout, const float* inp, int N,
                          int IC, int OC);

// Causal self-attention. qkv (B,T,3C) holds q | k | v, head h at channels [h*hs, (h+1)*hs) of
// each. att (B,NH,T,T) receives the softmax probabilities, zero above the diagonal (every element
// is written). out (B,T,C) = att @ v per head.
void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv (B,T,3C) = gradient of qkv; overwrites. scratch holds T floats.
void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                       const float* att, int B, int T, int C, int NH);

// GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. in section 2), elementwise over n.
void GeluForward(float* out, const float* inp, std::int64_t n);
// dinp = gelu'(inp) * dout.  Overwrites dinp (may alias dout).
void GeluBackward(float* dinp, const float* inp, const float* dout, std::int64_t n);

// out = a + b elementwise (the residual connection).
void ResidualForward(float* out, const float* a, const float* b, std::int64_t n);

// Row-wise softmax of logits (N,V) into probs (may alias logits), and the per-row cross-entropy
// losses (N) = -log softmax(logits)[target].  targets (N) in [0, V).
void SoftmaxCrossEntropyForward(float* probs, float* losses, const float* logits,
                                const std::int32_t* targets, int N, int V);
// dlogits (N,V) = (probs - onehot(target)) * dloss, where dloss is d(total loss)/d(each row's
// loss). dlogits may alias probs.
void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const std::int32_t* targets,
                                 float dloss, int N, int V);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_KERNELS_CPU_H_
