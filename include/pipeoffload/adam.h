// Adam and AdamW on fp32 master parameters: the one definition of the update's arithmetic that
// the CPU (scalar, AVX2, AVX-512) and GPU kernels all implement, and the CPU kernels.
//
// Why one definition matters: the interleaved optimizer offload (optimizer_offload.h) updates
// some subgroups on the CPU and some on the GPU in the same step. When every implementation
// performs the same IEEE operations in the same order (no fused multiply-add, correctly rounded
// sqrt and division), a parameter gets the same bits wherever it was updated, and the tests can
// demand bitwise equality instead of an ulp bound.
//
// The update of element i, with the scalars of AdamStepScalars (all fp32, each line one rounded
// operation, in this order):
//   g  = grad[i] * grad_scale                      (unscale the loss scale, apply clipping)
//        or float(grad_bf16[i]) * grad_scale       when the gradient is given as bf16
//   g  = g + weight_decay * p          Adam only   (L2 penalty into the gradient)
//   m  = beta1 * m + one_minus_beta1 * g
//   v  = beta2 * v + one_minus_beta2 * (g * g)
//   p  = p * decay_factor              AdamW only  (decay_factor = 1 - lr * weight_decay)
//   d  = sqrt(v) * inv_sqrt_bias_correction2 + eps
//   p  = p - step_size * (m / d)                   (step_size = lr / (1 - beta1^t))
//   bf16[i] = p rounded to nearest even (NaN stays NaN)   when a bf16 output is given
// Every "a * b + c" above is a multiplication rounded to fp32, then an addition rounded to
// fp32 (never an FMA). float(bf16) is exact (Bf16BitsToFloat: the bits shifted left by 16, so
// bf16 subnormals, zeros of both signs, infinities and NaN payloads carry over unchanged): a bf16
// gradient gives exactly the bits of upcasting it to fp32 and running the fp32-gradient update.
// Which of the two weight-decay lines runs is read off the scalars, not a mode flag: the L2
// line runs exactly when weight_decay != 0 and the decoupled line exactly when
// decay_factor != 1 (MakeAdamStepScalars zeroes the other one). Skipping them otherwise is not
// just faster: "g + 0 * p" would turn g = -0 into +0 and an infinite p into a NaN gradient.
// Denormals are computed as IEEE says (no flush-to-zero); callers must not run the kernels with
// FTZ/DAZ set if they want the bits of another implementation.
#ifndef PIPEOFFLOAD_ADAM_H_
#define PIPEOFFLOAD_ADAM_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload {

struct AdamOptions {
  float learning_rate = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;
  // True: AdamW (decoupled decay, Loshchilov & Hutter). False: Adam with L2 in the gradient.
  bool decoupled_weight_decay = true;
};

// The per-step constants of the update, computed once on the host (in double, then rounded to
// fp32) and handed unchanged to every kernel, CPU or GPU.
struct AdamStepScalars {
  float grad_scale = 1.0f;
  float weight_decay = 0.0f;  // used by Adam only (0 for AdamW)
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float decay_factor = 1.0f;  // AdamW only (1 for Adam)
  float inv_sqrt_bias_correction2 = 1.0f;
  float epsilon = 1e-8f;
  float step_size = 1e-3f;
};

// Scalars of step `step` (1-based: the first update is step 1) with the gradient multiplied by
// `grad_scale` (1 / loss_scale times the clipping coefficient). Errors: InvalidArgument naming
// the field for step < 1, a non-finite or negative learning rate / epsilon / weight decay, betas
// outside [0, 1), a non-finite or non-positive grad_scale, or (AdamW) learning_rate *
// weight_decay >= 1, which would zero or flip every parameter.
[[nodiscard]] absl::StatusOr<AdamStepScalars> MakeAdamStepScalars(const AdamOptions& options,
                                                                  std::int64_t step,
                                                                  float grad_scale = 1.0f);

// The clipping coefficient for a global gradient norm: min(1, max_norm / (norm + 1e-6)), or 1
// when max_norm <= 0 (clipping off). Multiply it into grad_scale. A non-finite norm gives a
// coefficient MakeAdamStepScalars rejects (0 for +inf, NaN for NaN or a negative norm), so an
// overflowed step fails loudly instead of being applied unclipped.
float ClipCoefficient(double global_norm, double max_norm);

// One contiguous run of elements to update in place. The gradient is read from exactly one of
// `grad` (fp32) and `grad_bf16` (bf16 bit patterns, for gradients that arrive as bf16: 2 B read
// per param instead of 4); the other is null. The choice is made once per call, not per element.
// `param_bf16` may be null (no bf16 copy); param, exp_avg and exp_avg_sq must not be (with a
// split master: param null, param_bf16 and param_lo set). Arrays must not overlap.
// Performance: any alignment works, but arrays that start at the same offset within a 4 KiB
// page (e.g. each from its own page-aligned allocation) ran ~30% slower on the build machine
// (AMD Zen 4, cpu_adam_bench --skew=0,0,0,0,0; still ~15% with 64 bytes between them) and ~6%
// slower on the H200 host's Xeon: start them >= 512 bytes apart modulo 4 KiB (cpu_adam_bench
// uses 0, 832, 1664, 2496, 3328 bytes past a page boundary). Without a split master, a 32-byte
// aligned param_bf16 is written with non-temporal stores (no write-allocate read; its lines are
// not left in cache); a split master's halves were just read, so they are stored normally.
struct AdamSpan {
  float* param = nullptr;
  float* exp_avg = nullptr;     // m
  float* exp_avg_sq = nullptr;  // v
  const float* grad = nullptr;
  std::uint16_t* param_bf16 = nullptr;  // bf16 bit patterns
  std::int64_t count = 0;
  // bf16 bit patterns. Last, so the aggregate initializers {p, m, v, g, bf16, n} written before
  // it existed keep their meaning.
  const std::uint16_t* grad_bf16 = nullptr;
  // A split master (SplitMaster below): when set, `param` is null, `param_bf16` holds the high
  // halves and `param_lo` the low halves of the fp32 master, which is JoinSplitMaster(hi, lo);
  // the update reads both, computes exactly the fp32 contract on the joined master, and writes
  // SplitMaster of the result back (the same bits as the unsplit update on the joined values;
  // the bf16 copy is then the high half, rounded ties away from zero, not ties to even).
  std::uint16_t* param_lo = nullptr;
};

// A bf16 model's fp32 master kept as two 16-bit halves, so that its bf16 copy is part of it:
// hi = (bits + 0x8000) >> 16 (the bf16 nearest to the master, ties away from zero; modulo 2^32)
// and lo = the low 16 bits. JoinSplitMaster inverts it exactly for every bit pattern, NaN
// payloads included: bits = (hi << 16) + sign-extended lo. Host memory for a sliding unit is
// then 12 B per parameter (hi 2 + lo 2 + m 4 + v 4) instead of 14, and the update moves 26
// instead of 28 B per parameter. Caveat, NaN only: a NaN master whose payload lies in the low
// 16 bits has an infinite hi, and the NaNs 0x7fff8000-0x7fffffff / 0xffff8000-0xffffffff have a
// hi of -0 / +0 (the master, joined, is still that NaN). x86 arithmetic makes 0xffc00000 (a NaN
// hi); the GPU kernel stores its NaN results as 0x7fc00000 for this reason.
struct SplitBf16 {
  std::uint16_t hi = 0;
  std::uint16_t lo = 0;
};
SplitBf16 SplitMaster(float master);
float JoinSplitMaster(std::uint16_t hi, std::uint16_t lo);

// OK when `span` may be handed to a kernel: count >= 0 and small enough to address, and when
// count > 0: param, exp_avg and exp_avg_sq non-null (param null and param_bf16 non-null when
// param_lo is set), exactly one of grad and grad_bf16 non-null, and no two of the arrays
// (grad_bf16, param_bf16 and param_lo included) overlapping.
// Errors: InvalidArgument naming the offending field(s).
[[nodiscard]] absl::Status CheckAdamSpan(const AdamSpan& span);

// fp32 -> bf16 bits, round to nearest even (denormals rounded too, never flushed; values that
// round past the largest bf16 become infinity); NaN maps to a quiet NaN with the sign and the
// top 7 payload bits kept: (bits >> 16) | 0x0040.
std::uint16_t FloatToBf16Bits(float value);
// Exact: a bf16 is the top half of an fp32.
float Bf16BitsToFloat(std::uint16_t bits);

// The scalar reference: the contract above, one element at a time, on the calling thread.
// REQUIRES: CheckAdamSpan(span).ok(); an invalid span is left alone (nothing is written). Use
// CpuAdam::Update for a checked, threaded, vectorized update.
void AdamUpdateScalar(const AdamStepScalars& scalars, const AdamSpan& span);

// Instruction sets of the CPU kernels. Every one produces the same bits as the scalar one.
enum class CpuIsa : std::uint8_t { kScalar, kAvx2, kAvx512 };
std::string_view CpuIsaName(CpuIsa isa);  // "scalar", "avx2", "avx512"
// The widest instruction set this CPU (and this build) supports.
CpuIsa BestCpuIsa();
// Whether `isa` can run here.
bool CpuSupports(CpuIsa isa);

struct CpuAdamOptions {
  int threads = 0;             // 0: every CPU this process may run on (its affinity mask)
  CpuIsa isa = CpuIsa::kScalar;
  bool pick_best_isa = true;   // ignore `isa`, use BestCpuIsa()
  // Software prefetch of each read stream this many bytes ahead, in [0, 65536] (0: none, the
  // hardware prefetchers alone), or -1: pick by CPU vendor, 2048 on Intel and 0 elsewhere
  // (measured: +5-30% on the H200 host's Xeon at 16 threads, 10-20% slower on the AMD Zen 4
  // build machine; `cpu_adam_bench --prefetch=0,1024,...` measures a host). Never changes the
  // results.
  int prefetch_bytes = -1;
};

// The multi-threaded CPU Adam: splits a span into per-thread blocks (cache-line aligned
// boundaries of param, of param_bf16 for a split master) and runs the chosen instruction set's kernel on each; the bf16 copy is
// written in the same call, block by block while p is still in L1 (no second pass over DRAM).
// Spans under 64 Ki elements per thread use fewer threads (a wake-up costs more). The worker
// threads are created once, by Create, and adopt the caller's FTZ/DAZ mode for each call. One
// call at a time per object; separate objects are independent.
class CpuAdam {
 public:
  // Errors: InvalidArgument for threads outside [0, 1024] or prefetch_bytes outside
  // [-1, 65536]; FailedPrecondition when options.isa cannot run here (and pick_best_isa is
  // false).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CpuAdam>> Create(
      const CpuAdamOptions& options = {});
  virtual ~CpuAdam() = default;

  virtual CpuIsa isa() const = 0;
  virtual int threads() const = 0;
  virtual int prefetch_bytes() const = 0;  // the distance in use (-1 resolved)

  // Updates `span` in place, with the same bits as AdamUpdateScalar for any ISA and thread
  // count. Errors: those of CheckAdamSpan (nothing is written then).
  [[nodiscard]] virtual absl::Status Update(const AdamStepScalars& scalars,
                                            const AdamSpan& span) = 0;

  // Sum over i of double(x[i])^2, threaded, summed in a fixed block order so the value does not
  // depend on the thread count (nor on the ISA: every kernel sums a block by the same tree): the
  // CPU side of the global gradient norm. count <= 0 gives 0; a null x with count > 0 gives NaN
  // (which ClipCoefficient and MakeAdamStepScalars turn into an error).
  [[nodiscard]] virtual double SumOfSquares(const float* x, std::int64_t count) = 0;
  // The same over bf16 bit patterns: the same bits as SumOfSquares of their fp32 values (the
  // upcast is exact and each block is summed by the same tree), and as LaunchSumOfSquaresBf16
  // (lib/optim/cuda/adam_kernel.h) on the GPU. Reads 2 B per element. count <= 0 gives 0; a null
  // x with count > 0 gives NaN.
  [[nodiscard]] virtual double SumOfSquaresBf16(const std::uint16_t* x, std::int64_t count) = 0;
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_ADAM_H_
