// Argument checks and Status mapping for the launchers of adam_kernel.h; the kernels are in
// adam_kernel.cu. Checks run before anything is enqueued, so a rejected call changes nothing.
#include "lib/optim/cuda/adam_kernel.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_status.h"
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
  if (absl::Status status = CheckCount("LaunchAdamUpdate", device_span.count); !status.ok()) {
    return status;
  }
  if (device_span.count == 0) return absl::OkStatus();
  const char* missing = device_span.param == nullptr        ? "param"
                        : device_span.exp_avg == nullptr    ? "exp_avg"
                        : device_span.exp_avg_sq == nullptr ? "exp_avg_sq"
                        : device_span.grad == nullptr       ? "grad"
                                                            : nullptr;
  if (missing != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("LaunchAdamUpdate: null ", missing, " pointer (", device_span.count,
                     " elements)"));
  }
  const std::int64_t n = device_span.count;
  const struct {
    const char* name;
    const void* ptr;
    std::int64_t bytes;
  } arrays[] = {{"param", device_span.param, n * 4},
                {"exp_avg", device_span.exp_avg, n * 4},
                {"exp_avg_sq", device_span.exp_avg_sq, n * 4},
                {"grad", device_span.grad, n * 4},
                {"param_bf16", device_span.param_bf16, n * 2}};
  for (int i = 0; i < 5; ++i) {
    for (int j = i + 1; j < 5; ++j) {
      if (Overlap(arrays[i].ptr, arrays[i].bytes, arrays[j].ptr, arrays[j].bytes)) {
        return absl::InvalidArgumentError(absl::StrCat("LaunchAdamUpdate: ", arrays[i].name,
                                                       " and ", arrays[j].name, " overlap (",
                                                       n, " elements)"));
      }
    }
  }
  const internal::AdamKernelArgs args{
      scalars.grad_scale,      scalars.weight_decay,   scalars.beta1,
      scalars.one_minus_beta1, scalars.beta2,          scalars.one_minus_beta2,
      scalars.decay_factor,    scalars.inv_sqrt_bias_correction2,
      scalars.epsilon,         scalars.step_size,      device_span.param,
      device_span.exp_avg,     device_span.exp_avg_sq, device_span.grad,
      device_span.param_bf16,  device_span.count};
  PO_CUDA_RETURN_IF_ERROR(internal::LaunchAdamKernel(args, stream));
  return absl::OkStatus();
}

absl::Status LaunchBf16ToFp32(const std::uint16_t* in, float* out, std::int64_t count,
                              cudaStream_t stream) {
  if (absl::Status status = CheckCount("LaunchBf16ToFp32", count); !status.ok()) return status;
  if (count == 0) return absl::OkStatus();
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("LaunchBf16ToFp32: null ",
                                                   in == nullptr ? "input" : "output",
                                                   " pointer (", count, " elements)"));
  }
  PO_CUDA_RETURN_IF_ERROR(internal::LaunchBf16ToFp32Kernel(in, out, count, stream));
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
