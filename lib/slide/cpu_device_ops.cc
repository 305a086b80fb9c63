// SlideDeviceOps on a backend whose device memory is host memory (the CPU backend): the work
// runs on the calling thread, which is that backend's compute queue.
#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/slide/device_ops.h"

namespace pipeoffload::internal {
namespace {

class CpuSlideDeviceOps final : public SlideDeviceOps {
 public:
  CpuSlideDeviceOps(SlideDtype dtype, std::unique_ptr<CpuAdam> adam)
      : dtype_(dtype), adam_(std::move(adam)) {}

  absl::Status CastGrads(const float* accum, void* wire, std::int64_t count,
                         double* sum_of_squares, double* /*partials*/) override {
    if (dtype_ == SlideDtype::kFp32) {
      float* out = static_cast<float*>(wire);
      if (out != accum) std::copy(accum, accum + count, out);
      *sum_of_squares = adam_->SumOfSquares(out, count);
      return absl::OkStatus();
    }
    std::uint16_t* out = static_cast<std::uint16_t*>(wire);
    for (std::int64_t i = 0; i < count; ++i) out[i] = FloatToBf16Bits(accum[i]);
    *sum_of_squares = adam_->SumOfSquaresBf16(out, count);
    return absl::OkStatus();
  }

  absl::Status Adam(const AdamStepScalars& scalars, const AdamSpan& span) override {
    return adam_->Update(scalars, span);
  }

 private:
  const SlideDtype dtype_;
  std::unique_ptr<CpuAdam> adam_;
};

}  // namespace

std::int64_t SlideDeviceOps::PartialsFor(std::int64_t count) {
  constexpr std::int64_t kSumBlock = 8192;  // lib/optim's block (kSumOfSquaresBlock)
  return count / kSumBlock + 2;
}

absl::StatusOr<std::unique_ptr<SlideDeviceOps>> CreateSlideDeviceOps(Backend& backend,
                                                                     SlideDtype dtype) {
  PO_ASSIGN_OR_RETURN(std::unique_ptr<SlideDeviceOps> cuda, CreateCudaSlideDeviceOps(backend, dtype));
  if (cuda != nullptr) return cuda;
  if (!backend.DeviceMemoryIsHostAccessible()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layer sliding: backend ", backend.Name(),
        " is neither a CUDA backend nor one with host-accessible device memory"));
  }
  CpuAdamOptions options;
  options.threads = 2;  // resident units of the CPU backend's tests are small
  PO_ASSIGN_OR_RETURN(std::unique_ptr<CpuAdam> adam, CpuAdam::Create(options));
  return std::unique_ptr<SlideDeviceOps>(new CpuSlideDeviceOps(dtype, std::move(adam)));
}

}  // namespace pipeoffload::internal
