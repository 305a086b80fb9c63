// The AVX2 Adam kernel and block sums of squares (simd_kernels.h), for fp32 or bf16 gradients and
// sums, fp32 or split masters: 8 fp32 lanes (bf16 inputs widened exactly: zero-extend, shift left
// by 16); the tail (fewer than 8 elements) is copied into zero-filled stack vectors, run through
// the same vector code and copied back, so every element goes through the same instructions.
// Built with -mavx2 -ffp-contract=off and called only where the CPU has AVX2 (cpu_isa.cc). This
// file must not use inline functions or templates shared with other files (the linker could keep
// this file's AVX2 copy for everyone) nor headers with static objects: intrinsics and plain loops
// only, and simd_kernels.h instead of adam.h (the optim_isa_objects test checks the object file).
#include <cstdint>

#include "lib/optim/simd_kernels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pipeoffload::internal {

#if defined(__AVX2__)
namespace {

constexpr int kLanes = 8;
// Elements per block of the two-pass bf16 path (2 KiB of p: stays in L1).
constexpr std::int64_t kBf16Block = 512;

struct Vectors {
  __m256 grad_scale, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, decay_factor,
      inv_sqrt_bias_correction2, epsilon, step_size;
};

// fp32 -> 8 bf16 bits, round to nearest even, NaN -> (bits >> 16) | 0x40 (FloatToBf16Bits).
__m128i ToBf16(__m256 p) {
  const __m256i bits = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb),
                        16);
  const __m256i quiet_nan =
      _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  const __m256i merged = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Every lane is <= 0xffff, so the unsigned-saturating pack is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(merged), _mm256_extracti128_si256(merged, 1));
}

// 8 elements as fp32: loaded as they are, or 8 bf16 bit patterns widened exactly (adam.h: the
// bits shifted left by 16).
inline __attribute__((always_inline)) __m256 Load8(const float* x) { return _mm256_loadu_ps(x); }
inline __attribute__((always_inline)) __m256 Load8(const std::uint16_t* x) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The contract's arithmetic on one vector (adam.h, in its order): p, m, v updated in place from
// the gradient `raw` as fp32, before grad_scale. Step and StepSplit both run exactly this.
template <bool kL2, bool kDecoupled>
inline __attribute__((always_inline)) void Contract(const Vectors& s, __m256& p, __m256& m,
                                                    __m256& v, __m256 raw) {
  __m256 g = _mm256_mul_ps(raw, s.grad_scale);
  if constexpr (kL2) g = _mm256_add_ps(g, _mm256_mul_ps(s.weight_decay, p));
  m = _mm256_add_ps(_mm256_mul_ps(s.beta1, m), _mm256_mul_ps(s.one_minus_beta1, g));
  v = _mm256_add_ps(_mm256_mul_ps(s.beta2, v),
                    _mm256_mul_ps(s.one_minus_beta2, _mm256_mul_ps(g, g)));
  if constexpr (kDecoupled) p = _mm256_mul_ps(p, s.decay_factor);
  const __m256 d =
      _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), s.inv_sqrt_bias_correction2), s.epsilon);
  p = _mm256_sub_ps(p, _mm256_mul_ps(s.step_size, _mm256_div_ps(m, d)));
}

// One vector of 8 elements of the contract, at the given pointers. `Grad`: float or
// std::uint16_t (bf16 bits).
template <bool kL2, bool kDecoupled, bool kBf16, typename Grad>
inline __attribute__((always_inline)) void Step(const Vectors& s, float* param, float* exp_avg,
                                                float* exp_avg_sq, const Grad* grad,
                                                std::uint16_t* param_bf16) {
  __m256 p = _mm256_loadu_ps(param);
  __m256 m = _mm256_loadu_ps(exp_avg);
  __m256 v = _mm256_loadu_ps(exp_avg_sq);
  Contract<kL2, kDecoupled>(s, p, m, v, Load8(grad));
  _mm256_storeu_ps(param, p);
  _mm256_storeu_ps(exp_avg, m);
  _mm256_storeu_ps(exp_avg_sq, v);
  if constexpr (kBf16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(param_bf16), ToBf16(p));
  }
}

// Software prefetch of the read streams' line `bytes` past element i. Address arithmetic on
// integers: the target may lie past the arrays' ends, where pointer arithmetic would be
// undefined (prefetches never fault). Called once per 16 elements (a line of fp32); a bf16
// gradient is prefetched as far ahead in elements (half the bytes), once per 32 (its line).
template <typename Grad>
inline __attribute__((always_inline)) void Prefetch(const float* param, const float* exp_avg,
                                                    const float* exp_avg_sq, const Grad* grad,
                                                    std::int64_t i, std::int64_t bytes) {
  const auto at = [&](const auto* base, std::int64_t ahead) {
    return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(base + i) +
                                         static_cast<std::uintptr_t>(ahead));
  };
  _mm_prefetch(at(param, bytes), _MM_HINT_T0);
  _mm_prefetch(at(exp_avg, bytes), _MM_HINT_T0);
  _mm_prefetch(at(exp_avg_sq, bytes), _MM_HINT_T0);
  if constexpr (sizeof(Grad) == sizeof(float)) {
    _mm_prefetch(at(grad, bytes), _MM_HINT_T0);
  } else if (i % 32 == 0) {
    _mm_prefetch(at(grad, bytes / 2), _MM_HINT_T0);
  }
}

// A split master (KernelSpan::param_lo): 8 fp32 bit patterns from their high and low halves,
// (hi << 16) + sign-extended lo, modulo 2^32.
inline __attribute__((always_inline)) __m256i Join8(const std::uint16_t* hi,
                                                    const std::uint16_t* lo) {
  const __m256i high =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)));
  const __m256i low = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo)));
  return _mm256_add_epi32(_mm256_slli_epi32(high, 16), low);
}
// And back: the high halves (bits + 0x8000) >> 16 (the addition wraps) in the low 128 bits, the
// low halves bits & 0xffff in the high 128 bits. Both are <= 0xffff, so the unsigned-saturating
// pack is exact; it packs within 128-bit lanes ([h0-3 l0-3 | h4-7 l4-7]), hence the permute.
inline __attribute__((always_inline)) __m256i Split8(__m256i bits) {
  const __m256i high = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x8000)), 16);
  const __m256i low = _mm256_and_si256(bits, _mm256_set1_epi32(0xffff));
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(high, low), _MM_SHUFFLE(3, 1, 2, 0));
}

// Software prefetch for the split master's streams: m, v and the gradient as Prefetch does, the
// high and low halves once per 32 elements (their line), as far ahead in elements. Called once
// per 16 elements.
template <typename Grad>
inline __attribute__((always_inline)) void PrefetchSplit(const float* exp_avg,
                                                         const float* exp_avg_sq,
                                                         const Grad* grad, const std::uint16_t* hi,
                                                         const std::uint16_t* lo, std::int64_t i,
                                                         std::int64_t bytes) {
  const auto at = [&](const auto* base, std::int64_t ahead) {
    return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(base + i) +
                                         static_cast<std::uintptr_t>(ahead));
  };
  _mm_prefetch(at(exp_avg, bytes), _MM_HINT_T0);
  _mm_prefetch(at(exp_avg_sq, bytes), _MM_HINT_T0);
  if constexpr (sizeof(Grad) == sizeof(float)) _mm_prefetch(at(grad, bytes), _MM_HINT_T0);
  if (i % 32 == 0) {
    if constexpr (sizeof(Grad) != sizeof(float)) _mm_prefetch(at(grad, bytes / 2), _MM_HINT_T0);
    _mm_prefetch(at(hi, bytes / 2), _MM_HINT_T0);
    _mm_prefetch(at(lo, bytes / 2), _MM_HINT_T0);
  }
}

// One vector of 8 elements of a split master (hi, lo: its halves): joined, the contract as Step
// runs it, split back.
template <bool kL2, bool kDecoupled, typename Grad>
inline __attribute__((always_inline)) void StepSplit(const Vectors& s, std::uint16_t* hi,
                                                     std::uint16_t* lo, float* exp_avg,
                                                     float* exp_avg_sq, const Grad* grad) {
  __m256 p = _mm256_castsi256_ps(Join8(hi, lo));
  __m256 m = _mm256_loadu_ps(exp_avg);
  __m256 v = _mm256_loadu_ps(exp_avg_sq);
  Contract<kL2, kDecoupled>(s, p, m, v, Load8(grad));
  _mm256_storeu_ps(exp_avg, m);
  _mm256_storeu_ps(exp_avg_sq, v);
  const __m256i halves = Split8(_mm256_castps_si256(p));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(hi), _mm256_castsi256_si128(halves));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lo), _mm256_extracti128_si256(halves, 1));
}

// The split master in one pass: join, update and split in the same iteration (unlike the bf16
// copy in Run); the tail (fewer than 8) through zero-filled stack vectors as in Run. Measured on
// the build machine (Intel Xeon, 2 vCPUs, cpu_adam_bench --isas=avx2 --master=split
// --threads=1): 2.5 G params/s in cache (2^16 params) against 2.0 for a two-pass variant that
// joined each 512-element block into an L1 stack buffer, ran Step on it and split it back; from
// DRAM (2^25 and 2^27 params, 1-2 threads) the two were within 4%. The high halves are stored
// normally, not non-temporally: their lines were just read, so a store costs no write-allocate
// read, and non-temporal stores to those cached lines ran ~3% slower from DRAM.
template <bool kL2, bool kDecoupled, typename Grad>
void RunSplit(const Vectors& s, const KernelSpan& span, const Grad* grad_in,
              std::int64_t prefetch_bytes) {
  float* __restrict exp_avg = span.exp_avg;
  float* __restrict exp_avg_sq = span.exp_avg_sq;
  const Grad* __restrict grad = grad_in;
  std::uint16_t* __restrict hi = span.param_bf16;
  std::uint16_t* __restrict lo = span.param_lo;
  const std::int64_t full = span.count - span.count % kLanes;
  for (std::int64_t i = 0; i < full; i += kLanes) {
    // One prefetch per 64-byte line of m and v: every other 8-float vector.
    if (prefetch_bytes > 0 && i % 16 == 0) {
      PrefetchSplit(exp_avg, exp_avg_sq, grad, hi, lo, i, prefetch_bytes);
    }
    StepSplit<kL2, kDecoupled>(s, hi + i, lo + i, exp_avg + i, exp_avg_sq + i, grad + i);
  }
  const std::int64_t left = span.count - full;
  if (left == 0) return;
  // Dead lanes join to +0 and compute harmlessly; they are never copied back.
  alignas(16) std::uint16_t h[kLanes] = {};
  alignas(16) std::uint16_t l[kLanes] = {};
  alignas(32) float m[kLanes] = {};
  alignas(32) float v[kLanes] = {};
  alignas(32) Grad g[kLanes] = {};
  for (std::int64_t j = 0; j < left; ++j) {
    h[j] = hi[full + j];
    l[j] = lo[full + j];
    m[j] = exp_avg[full + j];
    v[j] = exp_avg_sq[full + j];
    g[j] = grad[full + j];
  }
  StepSplit<kL2, kDecoupled>(s, h, l, m, v, g);
  for (std::int64_t j = 0; j < left; ++j) {
    hi[full + j] = h[j];
    lo[full + j] = l[j];
    exp_avg[full + j] = m[j];
    exp_avg_sq[full + j] = v[j];
  }
}

// `grad_in`: span.grad or span.grad_bf16 (the one that is set).
template <bool kL2, bool kDecoupled, bool kBf16, typename Grad>
void Run(const Vectors& s, const KernelSpan& span, const Grad* grad_in,
         std::int64_t prefetch_bytes) {
  // The pointers in locals: read through `span` they would be reloaded after every store (a
  // float store may alias the struct), serializing the loop on them.
  float* __restrict param = span.param;
  float* __restrict exp_avg = span.exp_avg;
  float* __restrict exp_avg_sq = span.exp_avg_sq;
  const Grad* __restrict grad = grad_in;
  std::uint16_t* __restrict param_bf16 = span.param_bf16;
  const std::int64_t full = span.count - span.count % kLanes;
  if constexpr (kBf16) {
    // The bf16 copy in a second pass over each L1-resident block: chained behind the sqrt and
    // the division in the same iteration, its integer ops clog the scheduler and cost ~40% of
    // the in-cache rate; reloading p from L1 is nearly free. Where the output is 16-byte
    // aligned it is written with non-temporal stores: it is written only, so a normal store
    // would first read each line from DRAM (2 more bytes per param), and it is next read by a
    // DMA engine, not by this CPU.
    const bool stream = reinterpret_cast<std::uintptr_t>(param_bf16) % 16 == 0;
    for (std::int64_t b = 0; b < full; b += kBf16Block) {
      const std::int64_t end = b + kBf16Block < full ? b + kBf16Block : full;
      for (std::int64_t i = b; i < end; i += kLanes) {
        // One prefetch per 64-byte line: every other 8-float vector.
        if (prefetch_bytes > 0 && i % 16 == 0) {
          Prefetch(param, exp_avg, exp_avg_sq, grad, i, prefetch_bytes);
        }
        Step<kL2, kDecoupled, false>(s, param + i, exp_avg + i, exp_avg_sq + i, grad + i,
                                     nullptr);
      }
      if (stream) {
        for (std::int64_t i = b; i < end; i += kLanes) {
          _mm_stream_si128(reinterpret_cast<__m128i*>(param_bf16 + i),
                           ToBf16(_mm256_loadu_ps(param + i)));
        }
      } else {
        for (std::int64_t i = b; i < end; i += kLanes) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(param_bf16 + i),
                           ToBf16(_mm256_loadu_ps(param + i)));
        }
      }
    }
    // Non-temporal stores are weakly ordered: make them visible before we return (the caller
    // may hand the buffer to another thread or a DMA engine).
    if (stream) _mm_sfence();
  } else {
    for (std::int64_t i = 0; i < full; i += kLanes) {
      if (prefetch_bytes > 0 && i % 16 == 0) {
        Prefetch(param, exp_avg, exp_avg_sq, grad, i, prefetch_bytes);
      }
      Step<kL2, kDecoupled, false>(s, param + i, exp_avg + i, exp_avg_sq + i, grad + i,
                                   nullptr);
    }
  }
  const std::int64_t left = span.count - full;
  if (left == 0) return;
  // Dead lanes hold zeros and compute harmlessly (0 / eps, or 0 / 0 when eps is 0); they are
  // never copied back.
  alignas(32) float p[kLanes] = {};
  alignas(32) float m[kLanes] = {};
  alignas(32) float v[kLanes] = {};
  alignas(32) Grad g[kLanes] = {};
  alignas(16) std::uint16_t b[kLanes] = {};
  for (std::int64_t j = 0; j < left; ++j) {
    p[j] = span.param[full + j];
    m[j] = span.exp_avg[full + j];
    v[j] = span.exp_avg_sq[full + j];
    g[j] = grad[full + j];
  }
  Step<kL2, kDecoupled, kBf16>(s, p, m, v, g, b);
  for (std::int64_t j = 0; j < left; ++j) {
    span.param[full + j] = p[j];
    span.exp_avg[full + j] = m[j];
    span.exp_avg_sq[full + j] = v[j];
    if constexpr (kBf16) span.param_bf16[full + j] = b[j];
  }
}

// The per-call choices of the master's form, the bf16 output and the gradient's type (never per
// element).
template <bool kL2, bool kDecoupled, typename Grad>
void RunBf16(const Vectors& s, const KernelSpan& span, const Grad* grad,
             std::int64_t prefetch_bytes) {
  if (span.param_lo != nullptr) {
    RunSplit<kL2, kDecoupled>(s, span, grad, prefetch_bytes);
  } else if (span.param_bf16 != nullptr) {
    Run<kL2, kDecoupled, true>(s, span, grad, prefetch_bytes);
  } else {
    Run<kL2, kDecoupled, false>(s, span, grad, prefetch_bytes);
  }
}

template <bool kL2, bool kDecoupled>
void RunVariant(const Vectors& s, const KernelSpan& span, std::int64_t prefetch_bytes) {
  if (span.grad_bf16 != nullptr) {
    RunBf16<kL2, kDecoupled>(s, span, span.grad_bf16, prefetch_bytes);
  } else {
    RunBf16<kL2, kDecoupled>(s, span, span.grad, prefetch_bytes);
  }
}

// Accumulates x[0..15] into the 16 lanes (simd_kernels.h): x[0..3] -> a0 ... x[12..15] -> a3.
template <typename T>
inline __attribute__((always_inline)) void Accumulate16(const T* x, __m256d* a) {
  const __m256 lo = Load8(x);
  const __m256 hi = Load8(x + 8);
  const __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(lo));
  const __m256d x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1));
  const __m256d x2 = _mm256_cvtps_pd(_mm256_castps256_ps128(hi));
  const __m256d x3 = _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1));
  a[0] = _mm256_add_pd(a[0], _mm256_mul_pd(x0, x0));
  a[1] = _mm256_add_pd(a[1], _mm256_mul_pd(x1, x1));
  a[2] = _mm256_add_pd(a[2], _mm256_mul_pd(x2, x2));
  a[3] = _mm256_add_pd(a[3], _mm256_mul_pd(x3, x3));
}

}  // namespace

void AdamUpdateAvx2(const KernelScalars& scalars, const KernelSpan& span,
                    std::int64_t prefetch_bytes) {
  const Vectors s = {
      _mm256_set1_ps(scalars.grad_scale),
      _mm256_set1_ps(scalars.weight_decay),
      _mm256_set1_ps(scalars.beta1),
      _mm256_set1_ps(scalars.one_minus_beta1),
      _mm256_set1_ps(scalars.beta2),
      _mm256_set1_ps(scalars.one_minus_beta2),
      _mm256_set1_ps(scalars.decay_factor),
      _mm256_set1_ps(scalars.inv_sqrt_bias_correction2),
      _mm256_set1_ps(scalars.epsilon),
      _mm256_set1_ps(scalars.step_size),
  };
  const bool l2 = scalars.weight_decay != 0.0f;
  const bool decoupled = scalars.decay_factor != 1.0f;
  if (l2 && decoupled) {
    RunVariant<true, true>(s, span, prefetch_bytes);
  } else if (l2) {
    RunVariant<true, false>(s, span, prefetch_bytes);
  } else if (decoupled) {
    RunVariant<false, true>(s, span, prefetch_bytes);
  } else {
    RunVariant<false, false>(s, span, prefetch_bytes);
  }
}

namespace {

// One block (simd_kernels.h's lanes and tree) of fp32 or bf16 values.
template <typename T>
double SumOfSquaresBlock(const T* x, std::int64_t count) {
  __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                  _mm256_setzero_pd()};
  const std::int64_t full = count - count % kSumLanes;
  for (std::int64_t i = 0; i < full; i += kSumLanes) Accumulate16(x + i, a);
  if (full < count) {
    // Zero padding adds +0 to sums of squares (>= +0): no change.
    alignas(32) T tail[kSumLanes] = {};
    for (std::int64_t j = 0; full + j < count; ++j) tail[j] = x[full + j];
    Accumulate16(tail, a);
  }
  // s8 = lanes j and j+8: (a0 + a2 | a1 + a3); s4 = its halves added; then s2, s.
  const __m256d s8_lo = _mm256_add_pd(a[0], a[2]);
  const __m256d s8_hi = _mm256_add_pd(a[1], a[3]);
  const __m256d s4 = _mm256_add_pd(s8_lo, s8_hi);
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

}  // namespace

double SumOfSquaresBlockAvx2(const float* x, std::int64_t count) {
  return SumOfSquaresBlock(x, count);
}

double SumOfSquaresBf16BlockAvx2(const std::uint16_t* x, std::int64_t count) {
  return SumOfSquaresBlock(x, count);
}

#else  // !__AVX2__: never called (CpuSupports(kAvx2) is false in such a build).

void AdamUpdateAvx2(const KernelScalars&, const KernelSpan&, std::int64_t) {
  __builtin_trap();
}
double SumOfSquaresBlockAvx2(const float*, std::int64_t) { __builtin_trap(); }
double SumOfSquaresBf16BlockAvx2(const std::uint16_t*, std::int64_t) { __builtin_trap(); }

#endif

}  // namespace pipeoffload::internal
