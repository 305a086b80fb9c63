// OffloadDeviceOps on a CUDA backend: adam_kernel.h's kernels on the stream of the queue each
// call is given (CudaQueueStream: the engine's own compute lane), with the backend's device
// current for the call.
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "lib/optim/cuda/adam_kernel.h"
#include "lib/optim/offload_device_ops.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload::internal {
namespace {

static_assert(kSumOfSquaresBlock == 8192, "OffloadDeviceOps::PartialsFor assumes 8192");

class CudaOffloadDeviceOps final : public OffloadDeviceOps {
 public:
  CudaOffloadDeviceOps(const Backend& backend, int device) : backend_(backend), device_(device) {}

  absl::Status AccumulateSumOfSquaresBf16(Queue queue, const std::uint16_t* x, std::int64_t count,
                                          double* partials, double* accumulator) override {
    ScopedDevice guard;
    PO_ASSIGN_OR_RETURN(const cudaStream_t stream, Enter(guard, queue));
    return LaunchSumOfSquaresBf16(x, count, partials, accumulator, SumMode::kAccumulate, stream);
  }

  absl::Status Bf16ToFp32(Queue queue, const std::uint16_t* in, float* out,
                          std::int64_t count) override {
    ScopedDevice guard;
    PO_ASSIGN_OR_RETURN(const cudaStream_t stream, Enter(guard, queue));
    return LaunchBf16ToFp32(in, out, count, stream);
  }

  absl::Status Adam(Queue queue, const AdamStepScalars& scalars, const AdamSpan& span) override {
    ScopedDevice guard;
    PO_ASSIGN_OR_RETURN(const cudaStream_t stream, Enter(guard, queue));
    return LaunchAdamUpdate(scalars, span, stream);
  }

 private:
  // The stream of `queue`, a compute queue of our backend, with its device entered.
  absl::StatusOr<cudaStream_t> Enter(ScopedDevice& guard, Queue queue) {
    if (queue.owner() != &backend_ || queue.kind() != QueueKind::kCompute) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer offload: the ", QueueName(queue), " queue is not a compute ",
                       "queue of ", backend_.Name()));
    }
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    return CudaQueueStream(queue);
  }

  const Backend& backend_;
  const int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OffloadDeviceOps>> CreateCudaOffloadDeviceOps(Backend& backend) {
  absl::StatusOr<int> device = CudaBackendDevice(backend);
  if (!device.ok()) return std::unique_ptr<OffloadDeviceOps>();  // not a CUDA backend
  return std::unique_ptr<OffloadDeviceOps>(new CudaOffloadDeviceOps(backend, *device));
}

}  // namespace pipeoffload::internal
