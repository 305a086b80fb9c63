// Argument checks and Status mapping for the launchers of adam_kernel.h; the kernels are in
// adam_kernel.cu. Checks run before anything is enqueued, so a rejected call changes nothing.
#include "lib/optim/cuda/adam_kernel.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "lib/optim/adam_kernels.h"
#include "lib/optim/cuda/adam_kernel_internal.h"

namespace pipeoffload {
namespace {

static_assert(kSumOfSquaresBlock == internal::kSumBlock,
              "the GPU sum of squares must use CpuAdam's block to give the same bits");
static_assert(internal::kSumLanes == 16, "adam_kernel.cu's sum of squares assumes 16 lanes");

// Whether [a, a + a_bytes) and [b, b + b_bytes) intersect.
bool Overlap(const void* a, std::int64_t a_bytes, const void* b, std::int64_t b_bytes) {
  if (a == nullptr || b == nullptr) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a0 < b0 + static_cast<std::uintptr_t>(b_bytes) &&
         b0 < a0 + static_cast<std::uintptr_t>(a_bytes);
}

absl::Status CheckCount(const char* what, std::int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": count must be >= 0, got ", count));
  }
  return absl::OkStatus();
}

// The conversions' checks: count >= 0, and for count > 0 non-null, non-overlapping arrays of
// `in_size`- and `out_size`-byte elements.
absl::Status CheckConversion(const char* what, const void* in, std::int64_t in_size,
                             const void* out, std::int64_t out_size, std::int64_t count) {
  if (absl::Status status = CheckCount(what, count); !status.ok()) return status;
  if (count == 0) return absl::OkStatus();
  if (count > std::numeric_limits<std::int64_t>::max() / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": count = ", count, " is too large to address"));
  }
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null ",
                                                   in == nullptr ? "input" : "output",
                                                   " pointer (", count, " elements)"));
  }
  if (Overlap(in, count * in_size, out, count * out_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": input and output overlap (", count, " elements)"));
  }
  return absl::OkStatus();
}

absl::Status SumOfSquares(const void* x, bool bf16, std::int64_t count, double* partials,
                          double* result, SumMode mode, cudaStream_t stream) {
  const char* what = bf16 ? "LaunchSumOfSquaresBf16" : "LaunchSumOfSquares";
  if (absl::Status status = CheckCount(what, count); !status.ok()) return status;
  if (result == nullptr || (count > 0 && (x == nullptr || partials == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": null ", result == nullptr ? "result" : (x == nullptr ? "x" : "partials"),
        " pointer"));
  }
  if (count == 0) {
    if (mode == SumMode::kOverwrite) {
      PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(result, 0, sizeof(double), stream));
    }
    return absl::OkStatus();
  }
  PO_CUDA_RETURN_IF_ERROR(internal::LaunchSumOfSquaresKernels(
      x, bf16, count, kSumOfSquaresBlock, partials, result, mode == SumMode::kAccumulate,
      stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchAdamUpdate(const AdamStepScalars& scalars, const AdamSpan& device_span,
                              cudaStream_t stream) {
  // The host's checks are pointer arithmetic only, so they hold for device pointers too.
  PO_RETURN_IF_ERROR(Annotate(CheckAdamSpan(device_span), "LaunchAdamUpdate"));
  if (device_span.count == 0) return absl::OkStatus();
  const internal::AdamKernelArgs args{
      scalars.grad_scale,      scalars.weight_decay,   scalars.beta1,
      scalars.one_minus_beta1, scalars.beta2,          scalars.one_minus_beta2,
      scalars.decay_factor,    scalars.inv_sqrt_bias_correction2,
      scalars.epsilon,         scalars.step_size,      device_span.param,
      device_span.exp_avg,     device_span.exp_avg_sq, device_span.grad,
      device_span.param_bf16,  device_span.count,      device_span.grad_bf16,
      device_span.param_lo};
  PO_CUDA_RETURN_IF_ERROR(internal::LaunchAdamKernel(args, stream));
  return absl::OkStatus();
}

absl::Status LaunchBf16ToFp32(const std::uint16_t* in, float* out, std::int64_t count,
                              cudaStream_t stream) {
  PO_RETURN_IF_ERROR(CheckConversion("LaunchBf16ToFp32", in, 2, out, 4, count));
  if (count == 0) return absl::OkStatus();
  PO_CUDA_RETURN_IF_ERROR(internal::LaunchBf16ToFp32Kernel(in, out, count, stream));
  return absl::OkStatus();
}

absl::Status LaunchFp32ToBf16(const float* in, std::uint16_t* out, std::int64_t count,
                              cudaStream_t stream) {
  PO_RETURN_IF_ERROR(CheckConversion("LaunchFp32ToBf16", in, 4, out, 2, count));
  if (count == 0) return absl::OkStatus();
  PO_CUDA_RETURN_IF_ERROR(internal::LaunchFp32ToBf16Kernel(in, out, count, stream));
  return absl::OkStatus();
}

std::int64_t SumOfSquaresPartialCount(std::int64_t count) {
  return count <= 0 ? 1 : (count + kSumOfSquaresBlock - 1) / kSumOfSquaresBlock;
}

absl::Status LaunchSumOfSquares(const float* x, std::int64_t count, double* partials,
                                double* result, SumMode mode, cudaStream_t stream) {
  return SumOfSquares(x, /*bf16=*/false, count, partials, result, mode, stream);
}

absl::Status LaunchSumOfSquaresBf16(const std::uint16_t* x, std::int64_t count,
                                    double* partials, double* result, SumMode mode,
                                    cudaStream_t stream) {
  return SumOfSquares(x, /*bf16=*/true, count, partials, result, mode, stream);
}

}  // namespace pipeoffload
