// The GPU side of the Adam update (include/pipeoffload/adam.h) and the helpers the optimizer
// offloads need around it: bf16 <-> fp32 conversions and a deterministic sum of squares.
// Launchers only enqueue work on the given stream; none of them synchronizes or allocates.
// Host-only header (the kernels live in adam_kernel.cu behind adam_kernel_internal.h), so .cc
// files and the CUDA GPT can include it.
#ifndef PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_H_
#define PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {

// Enqueues the fused Adam/AdamW update of `device_span` (every pointer a device pointer; the
// gradient in grad (fp32) or grad_bf16 (bf16 bits), param_bf16 may be null) on `stream` and
// returns at once. Produces the same bits as AdamUpdateScalar on the same inputs wherever the
// results are not NaN: every multiply and add is rounded on its own (no FMA), sqrt and division
// are correctly rounded, bf16 is round-to-nearest-even with NaN kept. A NaN result (from a NaN
// or infinite gradient) is NaN on both, but its bits may differ: x86 propagates an operand's
// NaN payload, GPU arithmetic produces a canonical NaN.
// A split master (param_lo set, adam.h) is joined, updated and split again in the same pass;
// a NaN result is stored as 0x7fc00000 there, so that its high half stays a NaN.
// Any alignment works; when param, m, v and grad are 16-byte aligned (grad_bf16, param_bf16 and
// param_lo 8-byte aligned) the kernel moves four elements per load.
// REQUIRES: the arrays stay allocated until the work on `stream` is done.
// Errors: those of CheckAdamSpan, prefixed "LaunchAdamUpdate" (nothing enqueued); Internal for a
// failed launch. count == 0 enqueues nothing.
[[nodiscard]] absl::Status LaunchAdamUpdate(const AdamStepScalars& scalars,
                                            const AdamSpan& device_span, cudaStream_t stream);

// Enqueues out[i] = float(bf16 in[i]) for i < count (exact: a bf16 is a truncated fp32).
// REQUIRES: device pointers. Errors: InvalidArgument for a negative count, a null pointer or
// overlapping arrays (nothing enqueued); Internal for a failed launch.
[[nodiscard]] absl::Status LaunchBf16ToFp32(const std::uint16_t* in, float* out,
                                            std::int64_t count, cudaStream_t stream);

// Enqueues out[i] = FloatToBf16Bits(in[i]) for i < count: round to nearest even (denormals
// rounded, never flushed; values past the largest bf16 become infinity), NaN -> (bits >> 16) |
// 0x0040 with sign and top payload bits kept. Any alignment works; with `in` 16-byte and `out`
// 8-byte aligned it moves four elements per load. REQUIRES: device pointers that stay allocated
// until the work on `stream` is done. Errors as LaunchBf16ToFp32.
[[nodiscard]] absl::Status LaunchFp32ToBf16(const float* in, std::uint16_t* out,
                                            std::int64_t count, cudaStream_t stream);

// Elements summed into one partial by LaunchSumOfSquares: CpuAdam's block (lib/optim/
// adam_kernels.h kSumBlock), so both devices give the same bits.
inline constexpr std::int64_t kSumOfSquaresBlock = 8192;

// Doubles of scratch LaunchSumOfSquares needs for `count` elements (at least 1).
std::int64_t SumOfSquaresPartialCount(std::int64_t count);

// Whether LaunchSumOfSquares overwrites *result or adds the sum to it.
enum class SumMode : std::uint8_t { kOverwrite, kAccumulate };

// Enqueues the sum over i < count of double(x[i])^2 into *result (kOverwrite) or adds it to
// *result (kAccumulate), deterministically and with the same bits as CpuAdam::SumOfSquares on
// the same data: block b of kSumOfSquaresBlock elements is summed by 16 strided lanes and a
// fixed tree into partials[b], then the partials are added in block order. The value depends
// only on the data and count, never on timing. The bf16 flavour reads bf16 bit patterns (the
// raw gradients) and gives the sum of their fp32 values.
// `partials` (device, SumOfSquaresPartialCount(count) doubles) is scratch that must not be used
// by other work on other streams meanwhile; `result` is one device double.
// count == 0 writes 0 (kOverwrite) or leaves *result alone (kAccumulate).
// Errors: InvalidArgument for a negative count or a null pointer; Internal for a failed launch.
[[nodiscard]] absl::Status LaunchSumOfSquares(const float* x, std::int64_t count,
                                              double* partials, double* result, SumMode mode,
                                              cudaStream_t stream);
[[nodiscard]] absl::Status LaunchSumOfSquaresBf16(const std::uint16_t* x, std::int64_t count,
                                                  double* partials, double* result, SumMode mode,
                                                  cudaStream_t stream);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_OPTIM_CUDA_ADAM_KERNEL_H_
