// SlideDeviceOps on a CUDA backend: lib/optim/cuda's kernels on the backend's compute stream.
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "lib/optim/cuda/adam_kernel.h"
#include "lib/slide/device_ops.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload::internal {
namespace {

class CudaSlideDeviceOps final : public SlideDeviceOps {
 public:
  CudaSlideDeviceOps(SlideDtype dtype, cudaStream_t stream, int device)
      : dtype_(dtype), stream_(stream), device_(device) {}

  absl::Status CastGrads(const float* accum, void* wire, std::int64_t count,
                         double* sum_of_squares, double* partials) override {
    PO_RETURN_IF_ERROR(Current());
    if (dtype_ == SlideDtype::kFp32) {
      if (wire != accum) {
        PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(wire, accum, static_cast<std::size_t>(count) * 4,
                                                cudaMemcpyDeviceToDevice, stream_));
      }
      return LaunchSumOfSquares(static_cast<const float*>(wire), count, partials, sum_of_squares,
                                SumMode::kOverwrite, stream_);
    }
    auto* out = static_cast<std::uint16_t*>(wire);
    PO_RETURN_IF_ERROR(LaunchFp32ToBf16(accum, out, count, stream_));
    return LaunchSumOfSquaresBf16(out, count, partials, sum_of_squares, SumMode::kOverwrite,
                                  stream_);
  }

  absl::Status Adam(const AdamStepScalars& scalars, const AdamSpan& span) override {
    PO_RETURN_IF_ERROR(Current());
    return LaunchAdamUpdate(scalars, span, stream_);
  }

 private:
  absl::Status Current() {
    PO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return absl::OkStatus();
  }

  const SlideDtype dtype_;
  const cudaStream_t stream_;
  const int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SlideDeviceOps>> CreateCudaSlideDeviceOps(Backend& backend,
                                                                         SlideDtype dtype) {
  absl::StatusOr<int> device = CudaBackendDevice(backend);
  if (!device.ok()) return std::unique_ptr<SlideDeviceOps>();  // not a CUDA backend
  PO_ASSIGN_OR_RETURN(cudaStream_t stream, CudaComputeStream(backend));
  return std::unique_ptr<SlideDeviceOps>(new CudaSlideDeviceOps(dtype, stream, *device));
}

}  // namespace pipeoffload::internal
