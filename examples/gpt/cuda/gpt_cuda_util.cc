// Shared helpers of the CUDA GPT (see gpt_cuda_util.h).
#include "examples/gpt/cuda/gpt_cuda_util.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/cuda_status.h"

namespace pipeoffload::gpt::cuda {

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, " failed with cuBLAS status ", static_cast<int>(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

DeviceAllocations::~DeviceAllocations() {
  if (buffers_.empty()) return;
  internal::ScopedDevice guard;
  if (!guard.Enter(device_).ok()) return;
  for (void* buffer : buffers_) PO_CUDA_LOG_IF_ERROR(cudaFree(buffer));
}

absl::StatusOr<void*> DeviceAllocations::Allocate(std::int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device allocation of ", bytes, " bytes: the size must be positive"));
  }
  void* buffer = nullptr;
  const cudaError_t error = cudaMalloc(&buffer, static_cast<std::size_t>(bytes));
  if (error != cudaSuccess) {
    return Annotate(internal::CudaStatus(error, "cudaMalloc", __FILE__, __LINE__),
                    absl::StrCat("allocating ", bytes, " bytes (", total_bytes_,
                                 " already allocated by this model)"));
  }
  buffers_.push_back(buffer);
  total_bytes_ += bytes;
  return buffer;
}

absl::Status WaitForStream(cudaStream_t stream, double timeout_seconds, const char* what) {
  PO_ASSIGN_OR_RETURN(const bool idle, internal::PollUntil(
                                           [stream]() -> absl::StatusOr<bool> {
                                             const cudaError_t error = cudaStreamQuery(stream);
                                             if (error == cudaErrorNotReady) return false;
                                             PO_CUDA_RETURN_IF_ERROR(error);
                                             return true;
                                           },
                                           timeout_seconds));
  if (!idle) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the compute stream was still busy after ", timeout_seconds, " s"));
  }
  return absl::OkStatus();
}

std::uint16_t RoundToBf16Bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
  const std::uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7FFFu + lsb;
  return static_cast<std::uint16_t>(bits >> 16);
}

float Bf16BitsToFloat(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value = 0.0f;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

}  // namespace pipeoffload::gpt::cuda
