// OffloadDeviceOps on a backend whose device memory is host memory (the CPU backend): the work
// runs on the calling thread, which is every compute queue of that backend. Each call checks
// that it was given a compute queue of that backend, so a lane mix-up fails here as it would
// on CUDA (where kernels go to streams) instead of running silently out of order.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/optim/adam_kernels.h"
#include "lib/optim/offload_device_ops.h"

namespace pipeoffload::internal {
namespace {

class CpuOffloadDeviceOps final : public OffloadDeviceOps {
 public:
  CpuOffloadDeviceOps(const Backend& backend, std::unique_ptr<CpuAdam> adam)
      : backend_(backend), adam_(std::move(adam)) {}

  absl::Status AccumulateSumOfSquaresBf16(Queue queue, const std::uint16_t* x, std::int64_t count,
                                          double* /*partials*/, double* accumulator) override {
    PO_RETURN_IF_ERROR(CheckCompute(queue, "AccumulateSumOfSquaresBf16"));
    // One rounding into the accumulator, as the GPU's SumOfBlocksKernel (result + total).
    *accumulator = *accumulator + adam_->SumOfSquaresBf16(x, count);
    return absl::OkStatus();
  }

  absl::Status Bf16ToFp32(Queue queue, const std::uint16_t* in, float* out,
                          std::int64_t count) override {
    PO_RETURN_IF_ERROR(CheckCompute(queue, "Bf16ToFp32"));
    for (std::int64_t i = 0; i < count; ++i) out[i] = Bf16BitsToFloat(in[i]);
    return absl::OkStatus();
  }

  absl::Status Adam(Queue queue, const AdamStepScalars& scalars, const AdamSpan& span) override {
    PO_RETURN_IF_ERROR(CheckCompute(queue, "Adam"));
    return adam_->Update(scalars, span);
  }

 private:
  absl::Status CheckCompute(Queue queue, const char* call) const {
    if (queue.owner() == &backend_ && queue.kind() == QueueKind::kCompute) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer offload ", call, ": the ", QueueName(queue),
        queue.owner() == &backend_ ? " queue is not a compute queue"
                                   : " queue belongs to another backend"));
  }

  const Backend& backend_;
  std::unique_ptr<CpuAdam> adam_;
};

}  // namespace

std::int64_t OffloadDeviceOps::PartialsFor(std::int64_t count) {
  return count <= 0 ? 1 : (count + kSumBlock - 1) / kSumBlock;
}

absl::StatusOr<std::unique_ptr<OffloadDeviceOps>> CreateOffloadDeviceOps(
    Backend& backend, const CpuAdamOptions& cpu) {
  PO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadDeviceOps> cuda,
                      CreateCudaOffloadDeviceOps(backend));
  if (cuda != nullptr) return cuda;
  if (!backend.DeviceMemoryIsHostAccessible()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "optimizer offload: backend ", backend.Name(),
        " is neither a CUDA backend nor one with host-accessible device memory"));
  }
  PO_ASSIGN_OR_RETURN(std::unique_ptr<CpuAdam> adam, CpuAdam::Create(cpu));
  return std::unique_ptr<OffloadDeviceOps>(new CpuOffloadDeviceOps(backend, std::move(adam)));
}

}  // namespace pipeoffload::internal
