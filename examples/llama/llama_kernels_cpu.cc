// The Llama model's fp32 CPU kernels (llama_kernels_cpu.h has the contract). Plain loops with
// one fixed order of operations each, written to be read next to their CUDA mirrors; reductions
// are sequential (index ascending) unless a comment says otherwise. The matmuls are the GPT's.
#include "examples/llama/llama_kernels_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "examples/gpt/kernels_cpu.h"
#include "lib/base/check.h"

namespace pipeoffload::llama {
namespace {

// sum_i a[i] * b[i], i ascending, in float.
inline float Dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y[i] += alpha * x[i].
inline void Axpy(float* __restrict y, float alpha, const float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// cos and sin of t * inv_freq[i] for t < T, i < half: (T, half) each. The angle and the
// functions in double (glibc's are correctly rounded or within an ulp there), rounded once.
void RopeTables(std::vector<float>& cos_t, std::vector<float>& sin_t, const float* inv_freq, int T,
                int half) {
  cos_t.resize(static_cast<std::size_t>(T) * half);
  sin_t.resize(static_cast<std::size_t>(T) * half);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * static_cast<double>(inv_freq[i]);
      cos_t[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::cos(angle));
      sin_t[static_cast<std::size_t>(t) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

// Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1, the transpose).
void RopeApply(float* x, const float* inv_freq, int N, int T, int heads, int hd, float sign) {
  const int half = hd / 2;
  thread_local std::vector<float> cos_t, sin_t;
  RopeTables(cos_t, sin_t, inv_freq, T, half);
  for (int n = 0; n < N; ++n) {
    const int t = n % T;
    const float* c = cos_t.data() + static_cast<std::size_t>(t) * half;  // (half)
    const float* s = sin_t.data() + static_cast<std::size_t>(t) * half;  // (half)
    for (int h = 0; h < heads; ++h) {
      float* v = x + (std::int64_t{n} * heads + h) * hd;  // (hd)
      for (int i = 0; i < half; ++i) {
        const float si = sign * s[i];  // exact: a sign flip
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * c[i] - b * si;
        v[i + half] = b * c[i] + a * si;
      }
    }
  }
}

}  // namespace

void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                    float eps) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t{n} * C;  // (C)
    float* y = out + std::int64_t{n} * C;        // (C)
    double sum_sq = 0.0;
    for (int i = 0; i < C; ++i) sum_sq += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    const float mean_sq = static_cast<float>(sum_sq / C);
    const float r = 1.0f / std::sqrt(mean_sq + eps);
    for (int i = 0; i < C; ++i) y[i] = (x[i] * r) * weight[i];
    rstd[n] = r;
  }
}

void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int N, int C) {
  // y = w * x * r, r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / C:
  //   dx_j = r * (w_j dy_j - x_j * r^2 * mean_i(w_i dy_i x_i)).
  // The mean is summed in double and rounded once, as the forward's.
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t{n} * C;    // (C)
    const float* dy = dout + std::int64_t{n} * C;  // (C)
    float* dx = dinp + std::int64_t{n} * C;        // (C)
    const float r = rstd[n];
    double sum_gx = 0.0;
    for (int i = 0; i < C; ++i) {
      const float g = weight[i] * dy[i];
      sum_gx += static_cast<double>(g) * static_cast<double>(x[i]);
    }
    const float coef = (static_cast<float>(sum_gx / C) * r) * r;
    for (int i = 0; i < C; ++i) {
      const float g = weight[i] * dy[i];
      dweight[i] += dy[i] * (x[i] * r);
      dx[i] = (g - x[i] * coef) * r;
    }
  }
}

void RopeForward(float* x, const float* inv_freq, int N, int T, int heads, int hd) {
  RopeApply(x, inv_freq, N, T, heads, hd, 1.0f);
}

void RopeBackward(float* dx, const float* inv_freq, int N, int T, int heads, int hd) {
  RopeApply(dx, inv_freq, N, T, heads, hd, -1.0f);
}

void AttentionForward(float* out, float* lse, float* scratch, const float* q, const float* k,
                      const float* v, int B, int T, int NH, int NKV, int hd) {
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* s = scratch;  // (T): scores, then exp(s - max)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int kvh = h / group;
      for (int t = 0; t < T; ++t) {
        const std::int64_t row = std::int64_t{b} * T + t;
        const float* qt = q + (row * NH + h) * hd;  // (hd)
        float* o = out + (row * NH + h) * hd;       // (hd)
        float max_s = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* kj = k + ((std::int64_t{b} * T + j) * NKV + kvh) * hd;
          s[j] = Dot(qt, kj, hd) * scale;
          if (s[j] > max_s) max_s = s[j];
        }
        float sum = 0.0f;
        for (int j = 0; j <= t; ++j) {
          s[j] = std::exp(s[j] - max_s);
          sum += s[j];
        }
        const float inv_sum = 1.0f / sum;
        std::memset(o, 0, sizeof(float) * static_cast<std::size_t>(hd));
        for (int j = 0; j <= t; ++j) {
          Axpy(o, s[j] * inv_sum, v + ((std::int64_t{b} * T + j) * NKV + kvh) * hd, hd);
        }
        lse[(std::int64_t{b} * NH + h) * T + t] = max_s + std::log(sum);
      }
    }
  }
}

void AttentionBackward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                       const float* out, const float* lse, const float* q, const float* k,
                       const float* v, int B, int T, int NH, int NKV, int hd) {
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::int64_t N = std::int64_t{B} * T;
  std::memset(dq, 0, sizeof(float) * static_cast<std::size_t>(N * NH * hd));
  std::memset(dk, 0, sizeof(float) * static_cast<std::size_t>(N * NKV * hd));
  std::memset(dv, 0, sizeof(float) * static_cast<std::size_t>(N * NKV * hd));
  float* p = scratch;       // (T) probabilities, recomputed from lse
  float* dp = scratch + T;  // (T) their gradient, then the scores'
  // Loop order b, h, t, j: dk_j and dv_j receive their contributions in (h, t) ascending order.
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int kvh = h / group;
      for (int t = 0; t < T; ++t) {
        const std::int64_t row = std::int64_t{b} * T + t;
        const float* qt = q + (row * NH + h) * hd;      // (hd)
        const float* dot = dout + (row * NH + h) * hd;  // (hd)
        const float* ot = out + (row * NH + h) * hd;    // (hd)
        float* dqt = dq + (row * NH + h) * hd;          // (hd)
        const float l = lse[(std::int64_t{b} * NH + h) * T + t];
        const float d = Dot(dot, ot, hd);
        for (int j = 0; j <= t; ++j) {
          const std::int64_t kv = ((std::int64_t{b} * T + j) * NKV + kvh) * hd;
          p[j] = std::exp(Dot(qt, k + kv, hd) * scale - l);
          dp[j] = Dot(dot, v + kv, hd);
          Axpy(dv + kv, p[j], dot, hd);
        }
        for (int j = 0; j <= t; ++j) {
          const std::int64_t kv = ((std::int64_t{b} * T + j) * NKV + kvh) * hd;
          const float g = (p[j] * (dp[j] - d)) * scale;
          Axpy(dqt, g, k + kv, hd);
          Axpy(dk + kv, g, qt, hd);
        }
      }
    }
  }
}

void SwiGluForward(float* out, const float* gate_up, std::int64_t N, int F) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + n * 2 * F;  // (F)
    const float* u = g + F;                // (F)
    float* o = out + n * F;                // (F)
    for (int i = 0; i < F; ++i) o[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
  }
}

void SwiGluBackward(float* dgate_up, const float* dout, const float* gate_up, std::int64_t N,
                    int F) {
  // silu(x) = x * sig(x), silu'(x) = sig(x) * (1 + x * (1 - sig(x))).
  for (std::int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + n * 2 * F;  // (F)
    const float* u = g + F;                // (F)
    const float* dy = dout + n * F;        // (F)
    float* dg = dgate_up + n * 2 * F;      // (F)
    float* du = dg + F;                    // (F)
    for (int i = 0; i < F; ++i) {
      const float e = 1.0f + std::exp(-g[i]);
      const float sig = 1.0f / e;
      const float silu = g[i] / e;
      const float dsilu = sig * (1.0f + g[i] * (1.0f - sig));
      dg[i] = (dy[i] * u[i]) * dsilu;
      du[i] = dy[i] * silu;
    }
  }
}

void EmbeddingForward(float* out, const std::int32_t* tokens, const float* table, int N, int H) {
  for (int n = 0; n < N; ++n) {
    std::memcpy(out + std::int64_t{n} * H, table + std::int64_t{tokens[n]} * H,
                sizeof(float) * static_cast<std::size_t>(H));
  }
}

void EmbeddingBackward(float* dtable, const float* dout, const std::int32_t* tokens, int N, int H) {
  for (int n = 0; n < N; ++n) {
    float* d = dtable + std::int64_t{tokens[n]} * H;  // (H)
    const float* g = dout + std::int64_t{n} * H;      // (H)
    for (int i = 0; i < H; ++i) d[i] += g[i];
  }
}

double FusedLinearCrossEntropy(float* dx, float* dweight, float* scratch, const float* x,
                               const float* weight, const std::int32_t* targets, int N, int H,
                               int V, int chunk_rows, float grad_scale) {
  PO_CHECK(chunk_rows >= 1);
  double loss_sum = 0.0;
  for (int r0 = 0; r0 < N; r0 += chunk_rows) {
    const int rows = N - r0 < chunk_rows ? N - r0 : chunk_rows;
    const float* xc = x + std::int64_t{r0} * H;  // (rows, H)
    float* logits = scratch;                     // (rows, V), then their gradient
    gpt::MatmulForward(logits, xc, weight, nullptr, rows, H, V);
    for (int r = 0; r < rows; ++r) {
      float* l = logits + std::int64_t{r} * V;  // (V)
      const int target = targets[r0 + r];
      float max_l = -INFINITY;
      for (int i = 0; i < V; ++i) max_l = l[i] > max_l ? l[i] : max_l;
      double sum = 0.0;
      for (int i = 0; i < V; ++i) sum += static_cast<double>(std::exp(l[i] - max_l));
      const double lse = static_cast<double>(max_l) + std::log(sum);
      loss_sum += lse - static_cast<double>(l[target]);
      // softmax = exp(l - lse): exact up to rounding, and one pass with no division.
      const float lse_f = static_cast<float>(lse);
      for (int i = 0; i < V; ++i) {
        const float indicator = i == target ? 1.0f : 0.0f;
        l[i] = (std::exp(l[i] - lse_f) - indicator) * grad_scale;
      }
    }
    gpt::MatmulBackwardInput(dx + std::int64_t{r0} * H, logits, weight, rows, H, V);
    gpt::MatmulBackwardWeight(dweight, nullptr, logits, xc, rows, H, V);
  }
  return loss_sum;
}

}  // namespace pipeoffload::llama
