// The GPT's fp32 CPU kernels. Loops keep the innermost index contiguous (axpy and dot forms) so
// they vectorize without reassociating any sum: reductions use a fixed 8-lane split, which the
// compiler may map to SIMD registers but never reorders. See kernels_cpu.h for the contract.
#include "examples/gpt/kernels_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace pipeoffload::gpt {
namespace {

// sum_i a[i] * b[i] in a fixed order: 8 interleaved partial sums, combined pairwise, plus the
// tail. The order is part of the kernels' definition (the CUDA reference need not match it
// bitwise, the CPU pipeline and the CPU single process must).
inline float Dot(const float* a, const float* b, int n) {
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return (((lane[0] + lane[4]) + (lane[1] + lane[5])) +
          ((lane[2] + lane[6]) + (lane[3] + lane[7]))) +
         tail;
}

// y[i] += alpha * x[i].
inline void Axpy(float* __restrict y, float alpha, const float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// y[i] = (((y[i] + a0 x0[i]) + a1 x1[i]) + a2 x2[i]) + a3 x3[i]: bit for bit the same as four
// Axpy calls in that order, with one load and store of y instead of four.
inline void Axpy4(float* __restrict y, float a0, const float* __restrict x0, float a1,
                  const float* __restrict x1, float a2, const float* __restrict x2, float a3,
                  const float* __restrict x3, int n) {
  for (int i = 0; i < n; ++i) y[i] = (((y[i] + a0 * x0[i]) + a1 * x1[i]) + a2 * x2[i]) + a3 * x3[i];
}

}  // namespace

void EncoderForward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                    int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t bt = std::int64_t{b} * T + t;
      float* o = out + bt * C;                              // (C)
      const float* e = wte + std::int64_t{tokens[bt]} * C;  // (C)
      const float* p = wpe + std::int64_t{t} * C;           // (C)
      for (int i = 0; i < C; ++i) o[i] = e[i] + p[i];
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, int B,
                     int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t bt = std::int64_t{b} * T + t;
      const float* d = dout + bt * C;
      float* de = dwte + std::int64_t{tokens[bt]} * C;
      float* dp = dwpe + std::int64_t{t} * C;
      for (int i = 0; i < C; ++i) {
        de[i] += d[i];
        dp[i] += d[i];
      }
    }
  }
}

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t{n} * C;
    float* y = out + std::int64_t{n} * C;
    float m = 0.0f;
    for (int i = 0; i < C; ++i) m += x[i];
    m /= static_cast<float>(C);
    float var = 0.0f;
    for (int i = 0; i < C; ++i) {
      const float d = x[i] - m;
      var += d * d;
    }
    var /= static_cast<float>(C);
    const float s = 1.0f / std::sqrt(var + kLayerNormEps);
    for (int i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

void LayerNormBackwardInput(float* dinp, const float* dout, const float* inp, const float* weight,
                            const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t{n} * C;
    const float* dy = dout + std::int64_t{n} * C;
    float* dx = dinp + std::int64_t{n} * C;
    const float m = mean[n];
    const float s = rstd[n];
    // dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = weight * dy.
    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
    for (int i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<float>(C);
    dnorm_norm_mean /= static_cast<float>(C);
    for (int i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * dy[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

void LayerNormBackwardWeight(float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t{n} * C;
    const float* dy = dout + std::int64_t{n} * C;
    const float m = mean[n];
    const float s = rstd[n];
    for (int i = 0; i < C; ++i) {
      dweight[i] += (x[i] - m) * s * dy[i];
      dbias[i] += dy[i];
    }
  }
}

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int IC, int OC) {
  // y[n,:] = b + sum_i x[n,i] * W[:,i], summed over i in order: an axpy over the rows of W^T,
  // so the inner loop runs along OC in contiguous memory. W^T is rebuilt per call (OC*IC moves
  // against N*OC*IC multiply-adds); thread_local because stages call kernels from their threads.
  thread_local std::vector<float> transposed;
  transposed.resize(static_cast<std::size_t>(std::int64_t{IC} * OC));
  for (int o = 0; o < OC; ++o) {
    for (int i = 0; i < IC; ++i) {
      transposed[static_cast<std::size_t>(std::int64_t{i} * OC + o)] =
          weight[std::int64_t{o} * IC + i];
    }
  }
  const float* wt = transposed.data();  // (IC, OC)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t{n} * IC;  // (IC)
    float* y = out + std::int64_t{n} * OC;        // (OC)
    if (bias != nullptr) {
      std::memcpy(y, bias, sizeof(float) * static_cast<std::size_t>(OC));
    } else {
      std::memset(y, 0, sizeof(float) * static_cast<std::size_t>(OC));
    }
    int i = 0;
    for (; i + 4 <= IC; i += 4) {
      const float* w = wt + std::int64_t{i} * OC;
      Axpy4(y, x[i], w, x[i + 1], w + OC, x[i + 2], w + 2 * OC, x[i + 3], w + 3 * OC, OC);
    }
    for (; i < IC; ++i) Axpy(y, x[i], wt + std::int64_t{i} * OC, OC);
  }
}

void MatmulBackwardInput(float* dinp, const float* dout, const float* weight, int N, int IC,
                         int OC) {
  for (int n = 0; n < N; ++n) {
    float* dx = dinp + std::int64_t{n} * IC;        // (IC)
    const float* dy = dout + std::int64_t{n} * OC;  // (OC)
    std::memset(dx, 0, sizeof(float) * static_cast<std::size_t>(IC));
    int o = 0;
    for (; o + 4 <= OC; o += 4) {
      const float* w = weight + std::int64_t{o} * IC;
      Axpy4(dx, dy[o], w, dy[o + 1], w + IC, dy[o + 2], w + 2 * IC, dy[o + 3], w + 3 * IC, IC);
    }
    for (; o < OC; ++o) Axpy(dx, dy[o], weight + std::int64_t{o} * IC, IC);
  }
}

void MatmulBackwardWeight(float* dweight, float* dbias, const float* dout, const float* inp, int N,
                          int IC, int OC) {
  // o outer, n inner: one row of dweight stays in L1 while the rows of inp stream past. Each
  // element still receives its N contributions in n order, as the contract requires.
  for (int o = 0; o < OC; ++o) {
    float* dw = dweight + std::int64_t{o} * IC;  // (IC)
    int n = 0;
    for (; n + 4 <= N; n += 4) {
      const float* d = dout + std::int64_t{n} * OC + o;
      const float* x = inp + std::int64_t{n} * IC;
      Axpy4(dw, d[0], x, d[OC], x + IC, d[2 * OC], x + 2 * IC, d[3 * OC], x + 3 * IC, IC);
    }
    for (; n < N; ++n) Axpy(dw, dout[std::int64_t{n} * OC + o], inp + std::int64_t{n} * IC, IC);
    if (dbias != nullptr) {
      float sum = dbias[o];
      for (int n = 0; n < N; ++n) sum += dout[std::int64_t{n} * OC + o];
      dbias[o] = sum;
    }
  }
}

void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::int64_t row3 = 3 * std::int64_t{C};
  for (int b = 0; b < B; ++b) {
    const float* qkv_b = qkv + std::int64_t{b} * T * row3;  // (T, 3C)
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < NH; ++h) {
        const float* q = qkv_b + t * row3 + std::int64_t{h} * hs;               // (hs)
        float* a = att + ((std::int64_t{b} * NH + h) * T + t) * T;              // (T)
        float* y = out + (std::int64_t{b} * T + t) * C + std::int64_t{h} * hs;  // (hs)
        float max_score = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv_b + t2 * row3 + C + std::int64_t{h} * hs;
          a[t2] = Dot(q, k, hs) * scale;
          if (a[t2] > max_score) max_score = a[t2];
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - max_score);
          sum += a[t2];
        }
        const float inv_sum = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv_sum;
        for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0.0f;  // masked: written, so saved is defined
        std::memset(y, 0, sizeof(float) * static_cast<std::size_t>(hs));
        for (int t2 = 0; t2 <= t; ++t2) {
          Axpy(y, a[t2], qkv_b + t2 * row3 + 2 * std::int64_t{C} + std::int64_t{h} * hs, hs);
        }
      }
    }
  }
}

void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                       const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::int64_t row3 = 3 * std::int64_t{C};
  std::memset(dqkv, 0, sizeof(float) * static_cast<std::size_t>(std::int64_t{B} * T * row3));
  float* datt = scratch;  // (T): gradient of this row's probabilities, then of its scores
  for (int b = 0; b < B; ++b) {
    const float* qkv_b = qkv + std::int64_t{b} * T * row3;
    float* dqkv_b = dqkv + std::int64_t{b} * T * row3;
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < NH; ++h) {
        const std::int64_t head = std::int64_t{h} * hs;
        const float* a = att + ((std::int64_t{b} * NH + h) * T + t) * T;  // (T)
        const float* dy = dout + (std::int64_t{b} * T + t) * C + head;    // (hs)
        const float* q = qkv_b + t * row3 + head;
        float* dq = dqkv_b + t * row3 + head;
        // y = sum_t2 a[t2] v[t2]:  da[t2] = dy . v[t2],  dv[t2] += a[t2] dy.
        for (int t2 = 0; t2 <= t; ++t2) {
          const std::int64_t off_v = t2 * row3 + 2 * std::int64_t{C} + head;
          datt[t2] = Dot(dy, qkv_b + off_v, hs);
          Axpy(dqkv_b + off_v, a[t2], dy, hs);
        }
        // Softmax backward: dscore[t2] = a[t2] * (da[t2] - sum_j a[j] da[j]).
        float weighted = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) weighted += a[t2] * datt[t2];
        for (int t2 = 0; t2 <= t; ++t2) datt[t2] = a[t2] * (datt[t2] - weighted);
        // score[t2] = scale * q . k[t2].
        for (int t2 = 0; t2 <= t; ++t2) {
          const std::int64_t off_k = t2 * row3 + C + head;
          const float g = datt[t2] * scale;
          Axpy(dq, g, qkv_b + off_k, hs);
          Axpy(dqkv_b + off_k, g, q, hs);
        }
      }
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// 0.5 * (1 + tanh(u)) written as the logistic function 1 / (1 + exp(-2u)): one expf instead of a
// tanhf (several times slower in glibc, and GELU is most of the non-matmul time otherwise).
inline float HalfOnePlusTanh(float u) { return 1.0f / (1.0f + std::exp(-2.0f * u)); }
}  // namespace

void GeluForward(float* out, const float* inp, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    // gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    out[i] = x * HalfOnePlusTanh(kGeluScale * (x + kGeluCubic * x * x * x));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float s = HalfOnePlusTanh(kGeluScale * (x + kGeluCubic * x * x * x));
    // d/dx: 0.5 (1 + tanh u) + 0.5 x sech^2(u) u'(x), with 0.5 (1 + tanh u) = s and
    // 0.5 sech^2(u) = 2 s (1 - s).
    const float local =
        s + x * (2.0f * s * (1.0f - s)) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = local * dout[i];
  }
}

void ResidualForward(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void SoftmaxCrossEntropyForward(float* probs, float* losses, const float* logits,
                                const std::int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const float* z = logits + std::int64_t{n} * V;  // (V)
    float* p = probs + std::int64_t{n} * V;         // (V), may be z
    const float target_logit = z[targets[n]];       // read before p overwrites z
    float max_logit = -INFINITY;
    for (int v = 0; v < V; ++v) max_logit = z[v] > max_logit ? z[v] : max_logit;
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) {
      p[v] = std::exp(z[v] - max_logit);
      sum += p[v];
    }
    const float inv_sum = 1.0f / sum;
    for (int v = 0; v < V; ++v) p[v] *= inv_sum;
    // -log p[target] from the logits, finite even when p[target] underflows.
    losses[n] = std::log(sum) - (target_logit - max_logit);
  }
}

void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const std::int32_t* targets,
                                 float dloss, int N, int V) {
  for (int n = 0; n < N; ++n) {
    const float* p = probs + std::int64_t{n} * V;
    float* d = dlogits + std::int64_t{n} * V;
    const int target = targets[n];
    for (int v = 0; v < V; ++v) {
      const float indicator = v == target ? 1.0f : 0.0f;
      d[v] = (p[v] - indicator) * dloss;
    }
  }
}

}  // namespace pipeoffload::gpt
