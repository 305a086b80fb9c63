// The AVX-512F Adam kernel and block sums of squares (simd_kernels.h), for fp32 or bf16 gradients
// and sums, fp32 or split masters: 16 fp32 lanes (bf16 inputs widened exactly: zero-extend, shift
// left by 16), the tail done by the same vector code under a lane mask, so every element goes
// through the same instructions. Built with -mavx512f -ffp-contract=off and called only where
// the CPU has AVX-512F (cpu_isa.cc). This file must not use inline functions or templates shared
// with other files (the linker could keep this file's AVX-512 copy for everyone) nor headers
// with static objects: intrinsics only, and simd_kernels.h instead of adam.h (the
// optim_isa_objects test checks the object file).
#include <cstdint>

#include "lib/optim/simd_kernels.h"

#if defined(__AVX512F__)
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() (self-initialized on purpose) as the
// merge source of unmasked builtins, which -Wmaybe-uninitialized reports inside the header
// (GCC bug 105593, fixed in GCC 13). The diagnostics are located in the header's lines, so
// silencing them around the include is enough.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace pipeoffload::internal {

#if defined(__AVX512F__)
namespace {

constexpr int kLanes = 16;
// Elements per block of the two-pass bf16 path (2 KiB of p: stays in L1).
constexpr std::int64_t kBf16Block = 512;

struct Vectors {
  __m512 grad_scale, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, decay_factor,
      inv_sqrt_bias_correction2, epsilon, step_size;
};

// fp32 -> bf16 bits, round to nearest even, NaN -> (bits >> 16) | 0x40 (FloatToBf16Bits).
// Integer arithmetic rather than VCVTNEPS2BF16, which flushes denormal inputs to zero. Returns
// the 16-bit results in the low halves of the 32-bit lanes.
__m512i ToBf16(__m512 p) {
  const __m512i bits = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb),
                        16);
  const __m512i quiet_nan =
      _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
}

// The span's pointers in locals: read through `const KernelSpan&` they would be reloaded after
// every store (a float store may alias the struct), serializing the loop on them. `Grad`: float
// or std::uint16_t (bf16 bits), whichever gradient the span has.
template <typename Grad>
struct Pointers {
  float* __restrict param;
  float* __restrict exp_avg;
  float* __restrict exp_avg_sq;
  const Grad* __restrict grad;
  std::uint16_t* __restrict param_bf16;  // a split master's high halves when param_lo is set
  std::uint16_t* __restrict param_lo;
};

// x[i, i + 16) under `mask` as fp32, dead lanes 0.
inline __attribute__((always_inline)) __m512 Load16(const float* x, std::int64_t i,
                                                    __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, x + i);
}
// x[i, i + 16) of 16-bit values under `mask`, dead lanes 0. AVX-512F has no masked 16-bit load
// (that is AVX-512BW), so a partial vector goes through a zero-filled stack copy; `mask` is a
// constant 0xffff in the main loops, where this folds to one 256-bit load.
inline __attribute__((always_inline)) __m256i Load16Halves(const std::uint16_t* x, std::int64_t i,
                                                           __mmask16 mask) {
  if (mask == 0xffff) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
  alignas(32) std::uint16_t tail[kLanes] = {};
  for (int j = 0; j < kLanes; ++j) {
    if ((mask >> j) & 1) tail[j] = x[i + j];
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
}
// The same for bf16 bits, widened exactly.
inline __attribute__((always_inline)) __m512 Load16(const std::uint16_t* x, std::int64_t i,
                                                    __mmask16 mask) {
  const __m256i half = Load16Halves(x, i, mask);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// The contract's arithmetic on one vector (adam.h, in its order): p, m, v updated in place from
// the gradient `raw` as fp32, before grad_scale. Step and StepSplit both run exactly this.
template <bool kL2, bool kDecoupled>
inline __attribute__((always_inline)) void Contract(const Vectors& s, __m512& p, __m512& m,
                                                    __m512& v, __m512 raw) {
  __m512 g = _mm512_mul_ps(raw, s.grad_scale);
  if constexpr (kL2) g = _mm512_add_ps(g, _mm512_mul_ps(s.weight_decay, p));
  m = _mm512_add_ps(_mm512_mul_ps(s.beta1, m), _mm512_mul_ps(s.one_minus_beta1, g));
  v = _mm512_add_ps(_mm512_mul_ps(s.beta2, v),
                    _mm512_mul_ps(s.one_minus_beta2, _mm512_mul_ps(g, g)));
  if constexpr (kDecoupled) p = _mm512_mul_ps(p, s.decay_factor);
  const __m512 d =
      _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), s.inv_sqrt_bias_correction2), s.epsilon);
  p = _mm512_sub_ps(p, _mm512_mul_ps(s.step_size, _mm512_div_ps(m, d)));
}

// One vector of the contract at element i; `mask` selects the live lanes (all 16 but in the
// tail). Dead lanes load zeros and compute harmlessly (0 / eps, or 0 / 0 = NaN when eps is 0;
// never stored).
template <bool kL2, bool kDecoupled, bool kBf16, typename Grad>
inline __attribute__((always_inline)) void Step(const Vectors& s, const Pointers<Grad>& a,
                                                std::int64_t i, __mmask16 mask) {
  __m512 p = _mm512_maskz_loadu_ps(mask, a.param + i);
  __m512 m = _mm512_maskz_loadu_ps(mask, a.exp_avg + i);
  __m512 v = _mm512_maskz_loadu_ps(mask, a.exp_avg_sq + i);
  Contract<kL2, kDecoupled>(s, p, m, v, Load16(a.grad, i, mask));
  _mm512_mask_storeu_ps(a.param + i, mask, p);
  _mm512_mask_storeu_ps(a.exp_avg + i, mask, m);
  _mm512_mask_storeu_ps(a.exp_avg_sq + i, mask, v);
  if constexpr (kBf16) _mm512_mask_cvtepi32_storeu_epi16(a.param_bf16 + i, mask, ToBf16(p));
}

// The bf16 copy of p[b, end) (full vectors), from p just written (in L1). The register form of
// VPMOVDW and a plain or non-temporal store: the store-to-memory form is microcoded on some
// CPUs.
// Takes the Pointers (one instance per gradient type, though it reads no gradient): passing
// param and param_bf16 instead let GCC 12 inline it, and that ran 3-4% slower in cache on the
// build machine (Xeon, cpu_adam_bench-like loop over 2^14 params).
template <bool kStream, typename Grad>
void StoreBf16(const Pointers<Grad>& a, std::int64_t b, std::int64_t end) {
  for (std::int64_t i = b; i < end; i += kLanes) {
    const __m256i bf16 = _mm512_cvtepi32_epi16(ToBf16(_mm512_loadu_ps(a.param + i)));
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(a.param_bf16 + i), bf16);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.param_bf16 + i), bf16);
    }
  }
}

// Software prefetch of the read streams' line `bytes` past element i. Address arithmetic on
// integers: the target may lie past the arrays' ends, where pointer arithmetic would be
// undefined (prefetches never fault). Called once per 16 elements (a line of fp32); a bf16
// gradient is prefetched as far ahead in elements (half the bytes), once per 32 (its line).
template <typename Grad>
inline __attribute__((always_inline)) void Prefetch(const Pointers<Grad>& a, std::int64_t i,
                                                    std::int64_t bytes) {
  const auto at = [&](const auto* base, std::int64_t ahead) {
    return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(base + i) +
                                         static_cast<std::uintptr_t>(ahead));
  };
  _mm_prefetch(at(a.param, bytes), _MM_HINT_T0);
  _mm_prefetch(at(a.exp_avg, bytes), _MM_HINT_T0);
  _mm_prefetch(at(a.exp_avg_sq, bytes), _MM_HINT_T0);
  if constexpr (sizeof(Grad) == sizeof(float)) {
    _mm_prefetch(at(a.grad, bytes), _MM_HINT_T0);
  } else if (i % 32 == 0) {
    _mm_prefetch(at(a.grad, bytes / 2), _MM_HINT_T0);
  }
}

// A split master (KernelSpan::param_lo): 16 fp32 bit patterns from their high and low halves,
// (hi << 16) + sign-extended lo, modulo 2^32.
inline __attribute__((always_inline)) __m512i Join16(__m256i hi, __m256i lo) {
  return _mm512_add_epi32(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16),
                          _mm512_cvtepi16_epi32(lo));
}
// And back: the high halves (bits + 0x8000) >> 16 (the addition wraps) in the low 16 bits of the
// lanes; the low halves are the low 16 bits as they are (VPMOVDW truncates either exactly).
inline __attribute__((always_inline)) __m512i SplitHi16(__m512i bits) {
  return _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x8000)), 16);
}

// Software prefetch for the split master's streams: m, v and the gradient as Prefetch does, the
// high and low halves once per 32 elements (their line), as far ahead in elements.
template <typename Grad>
inline __attribute__((always_inline)) void PrefetchSplit(const Pointers<Grad>& a, std::int64_t i,
                                                         std::int64_t bytes) {
  const auto at = [&](const auto* base, std::int64_t ahead) {
    return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(base + i) +
                                         static_cast<std::uintptr_t>(ahead));
  };
  _mm_prefetch(at(a.exp_avg, bytes), _MM_HINT_T0);
  _mm_prefetch(at(a.exp_avg_sq, bytes), _MM_HINT_T0);
  if constexpr (sizeof(Grad) == sizeof(float)) _mm_prefetch(at(a.grad, bytes), _MM_HINT_T0);
  if (i % 32 == 0) {
    if constexpr (sizeof(Grad) != sizeof(float)) _mm_prefetch(at(a.grad, bytes / 2), _MM_HINT_T0);
    _mm_prefetch(at(a.param_bf16, bytes / 2), _MM_HINT_T0);
    _mm_prefetch(at(a.param_lo, bytes / 2), _MM_HINT_T0);
  }
}

// One vector of a split master at element i (a.param_bf16 its high halves, a.param_lo its low
// ones; a.param unused): joined, the contract as Step runs it, split back. `mask` as in Step.
// The halves are stored with the register form of VPMOVDW and plain stores in full vectors (see
// StoreBf16), with the masked store-to-memory form in the tail only.
template <bool kL2, bool kDecoupled, typename Grad>
inline __attribute__((always_inline)) void StepSplit(const Vectors& s, const Pointers<Grad>& a,
                                                     std::int64_t i, __mmask16 mask) {
  __m512 p = _mm512_castsi512_ps(
      Join16(Load16Halves(a.param_bf16, i, mask), Load16Halves(a.param_lo, i, mask)));
  __m512 m = _mm512_maskz_loadu_ps(mask, a.exp_avg + i);
  __m512 v = _mm512_maskz_loadu_ps(mask, a.exp_avg_sq + i);
  Contract<kL2, kDecoupled>(s, p, m, v, Load16(a.grad, i, mask));
  _mm512_mask_storeu_ps(a.exp_avg + i, mask, m);
  _mm512_mask_storeu_ps(a.exp_avg_sq + i, mask, v);
  const __m512i bits = _mm512_castps_si512(p);
  if (mask == 0xffff) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.param_bf16 + i),
                        _mm512_cvtepi32_epi16(SplitHi16(bits)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.param_lo + i), _mm512_cvtepi32_epi16(bits));
  } else {
    _mm512_mask_cvtepi32_storeu_epi16(a.param_bf16 + i, mask, SplitHi16(bits));
    _mm512_mask_cvtepi32_storeu_epi16(a.param_lo + i, mask, bits);
  }
}

// The split master in one pass: join, update and split in the same iteration (unlike the bf16
// copy in Run). Measured on the build machine (Intel Xeon, 2 vCPUs, cpu_adam_bench
// --master=split --threads=1): 2.5 G params/s in cache (2^16 params) against 2.1 for a two-pass
// variant that joined each 512-element block into an L1 stack buffer, ran Step on it and split
// it back; from DRAM (2^25 and 2^27 params, 1-2 threads) the two were within 4%. The high
// halves are stored normally, not non-temporally: their lines were just read, so a store costs
// no write-allocate read, and non-temporal stores to those cached lines ran ~3% slower from
// DRAM.
template <bool kL2, bool kDecoupled, typename Grad>
void RunSplit(const Vectors& s, const KernelSpan& span, const Grad* grad,
              std::int64_t prefetch_bytes) {
  const Pointers<Grad> a = {nullptr, span.exp_avg, span.exp_avg_sq, grad, span.param_bf16,
                            span.param_lo};
  const std::int64_t count = span.count;
  const std::int64_t full = count - count % kLanes;
  for (std::int64_t i = 0; i < full; i += kLanes) {
    if (prefetch_bytes > 0) PrefetchSplit(a, i, prefetch_bytes);
    StepSplit<kL2, kDecoupled>(s, a, i, 0xffff);
  }
  if (full < count) {
    const auto live = static_cast<unsigned>(count - full);
    StepSplit<kL2, kDecoupled>(s, a, full, static_cast<__mmask16>((1u << live) - 1u));
  }
}

// `grad`: span.grad or span.grad_bf16 (the one that is set).
template <bool kL2, bool kDecoupled, bool kBf16, typename Grad>
void Run(const Vectors& s, const KernelSpan& span, const Grad* grad,
         std::int64_t prefetch_bytes) {
  const Pointers<Grad> a = {span.param, span.exp_avg, span.exp_avg_sq, grad, span.param_bf16,
                            nullptr};
  const std::int64_t count = span.count;
  const std::int64_t full = count - count % kLanes;
  std::int64_t i = 0;
  if constexpr (kBf16) {
    // The bf16 copy in a second pass over each L1-resident block: chained behind the sqrt and
    // the division in the same iteration, its integer ops clog the scheduler; reloading p from
    // L1 is nearly free. Where the output is 32-byte aligned it is written with non-temporal
    // stores: it is written only, so a normal store would first read each line from DRAM (2
    // more bytes per param), and it is next read by a DMA engine, not by this CPU.
    const bool stream = reinterpret_cast<std::uintptr_t>(a.param_bf16) % 32 == 0;
    for (; i < full; i += kBf16Block) {
      const std::int64_t end = i + kBf16Block < full ? i + kBf16Block : full;
      for (std::int64_t j = i; j < end; j += kLanes) {
        if (prefetch_bytes > 0) Prefetch(a, j, prefetch_bytes);
        Step<kL2, kDecoupled, false>(s, a, j, 0xffff);
      }
      if (stream) {
        StoreBf16<true>(a, i, end);
      } else {
        StoreBf16<false>(a, i, end);
      }
    }
    i = full;
    // Non-temporal stores are weakly ordered: make them visible before we return (the caller
    // may hand the buffer to another thread or a DMA engine).
    if (stream) _mm_sfence();
  } else {
    for (; i < full; i += kLanes) {
      if (prefetch_bytes > 0) Prefetch(a, i, prefetch_bytes);
      Step<kL2, kDecoupled, false>(s, a, i, 0xffff);
    }
  }
  if (i < count) {
    const auto live = static_cast<unsigned>(count - i);
    Step<kL2, kDecoupled, kBf16>(s, a, i, static_cast<__mmask16>((1u << live) - 1u));
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

// 8 elements as fp32 (an exact bf16 widening for bf16 bits), for the sums of squares.
inline __attribute__((always_inline)) __m256 Load8(const float* x) { return _mm256_loadu_ps(x); }
inline __attribute__((always_inline)) __m256 Load8(const std::uint16_t* x) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// One block (simd_kernels.h's lanes and tree) of fp32 or bf16 values.
template <typename T>
double SumOfSquaresBlock(const T* x, std::int64_t count) {
  // Lanes 0-7 in lo, 8-15 in hi (simd_kernels.h): x[i..i+7] -> lo, x[i+8..i+15] -> hi. Halves
  // are loaded as 256-bit vectors: GCC 12's 512->256 cast and extract intrinsics trip
  // -Wuninitialized inside its own headers.
  __m512d lo = _mm512_setzero_pd();
  __m512d hi = _mm512_setzero_pd();
  const std::int64_t full = count - count % kSumLanes;
  for (std::int64_t i = 0; i < full; i += kSumLanes) {
    const __m512d a = _mm512_cvtps_pd(Load8(x + i));
    const __m512d b = _mm512_cvtps_pd(Load8(x + i + 8));
    lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
  }
  if (full < count) {
    // Zero padding adds +0 to sums of squares (>= +0): no change.
    alignas(64) T tail[kSumLanes] = {};
    for (std::int64_t j = 0; full + j < count; ++j) tail[j] = x[full + j];
    const __m512d a = _mm512_cvtps_pd(Load8(tail));
    const __m512d b = _mm512_cvtps_pd(Load8(tail + 8));
    lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
  }
  // s8[j] = a[j] + a[j+8] in a vector, then the rest of the tree on its 8 values.
  alignas(64) double s8[8];
  _mm512_store_pd(s8, _mm512_add_pd(lo, hi));
  const double s4[4] = {s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]};
  const double s2[2] = {s4[0] + s4[2], s4[1] + s4[3]};
  return s2[0] + s2[1];
}

}  // namespace

void AdamUpdateAvx512(const KernelScalars& scalars, const KernelSpan& span,
                      std::int64_t prefetch_bytes) {
  const Vectors s = {
      _mm512_set1_ps(scalars.grad_scale),
      _mm512_set1_ps(scalars.weight_decay),
      _mm512_set1_ps(scalars.beta1),
      _mm512_set1_ps(scalars.one_minus_beta1),
      _mm512_set1_ps(scalars.beta2),
      _mm512_set1_ps(scalars.one_minus_beta2),
      _mm512_set1_ps(scalars.decay_factor),
      _mm512_set1_ps(scalars.inv_sqrt_bias_correction2),
      _mm512_set1_ps(scalars.epsilon),
      _mm512_set1_ps(scalars.step_size),
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

double SumOfSquaresBlockAvx512(const float* x, std::int64_t count) {
  return SumOfSquaresBlock(x, count);
}

double SumOfSquaresBf16BlockAvx512(const std::uint16_t* x, std::int64_t count) {
  return SumOfSquaresBlock(x, count);
}

#else  // !__AVX512F__: never called (CpuSupports(kAvx512) is false in such a build).

void AdamUpdateAvx512(const KernelScalars&, const KernelSpan&, std::int64_t) {
  __builtin_trap();
}
double SumOfSquaresBlockAvx512(const float*, std::int64_t) { __builtin_trap(); }
double SumOfSquaresBf16BlockAvx512(const std::uint16_t*, std::int64_t) { __builtin_trap(); }

#endif

}  // namespace pipeoffload::internal
