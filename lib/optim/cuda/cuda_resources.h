// Owners of the CUDA resources the update-rate calibration (calibrate.cc) allocates for its
// probes (pinned host arrays, device arrays, streams) and the bounded event wait it uses. The
// engine itself runs on the Backend interface (lib/optim/optimizer_offload.cc) and uses none of
// this. Destructors use the log-and-continue flavour: they run in teardown, maybe after an error.
#ifndef PIPEOFFLOAD_LIB_OPTIM_CUDA_CUDA_RESOURCES_H_
#define PIPEOFFLOAD_LIB_OPTIM_CUDA_CUDA_RESOURCES_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/optim/offload_plan.h"

namespace pipeoffload::internal {

// Pinned host memory (cudaHostAlloc) or device memory (cudaMalloc) of `count` T.
template <typename T, bool kPinned>
class CudaArray {
 public:
  CudaArray() = default;
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;
  ~CudaArray() {
    if (data_ == nullptr) return;
    if (kPinned) {
      PO_CUDA_LOG_IF_ERROR(cudaFreeHost(data_));
    } else {
      PO_CUDA_LOG_IF_ERROR(cudaFree(data_));
    }
  }

  // Errors: ResourceExhausted naming `what` and the bytes when the allocation fails.
  [[nodiscard]] absl::Status Allocate(std::int64_t count, const char* what) {
    if (count <= 0) return absl::OkStatus();
    const std::int64_t bytes = count * static_cast<std::int64_t>(sizeof(T));
    void* ptr = nullptr;
    const cudaError_t error =
        kPinned ? cudaHostAlloc(&ptr, static_cast<std::size_t>(bytes), cudaHostAllocPortable)
                : cudaMalloc(&ptr, static_cast<std::size_t>(bytes));
    if (error != cudaSuccess) {
      const absl::Status status =
          CudaStatus(error, kPinned ? "cudaHostAlloc" : "cudaMalloc", __FILE__, __LINE__);
      return absl::Status(
          error == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                                             : status.code(),
          absl::StrCat("calibration: cannot allocate ", bytes, " bytes (",
                       FormatBytes(static_cast<double>(bytes)), ") of ",
                       kPinned ? "pinned host" : "device", " memory for ", what, ": ",
                       status.message()));
    }
    data_ = static_cast<T*>(ptr);
    count_ = count;
    return absl::OkStatus();
  }

  T* get() const { return data_; }
  std::int64_t count() const { return count_; }

 private:
  T* data_ = nullptr;
  std::int64_t count_ = 0;
};

template <typename T>
using PinnedArray = CudaArray<T, true>;
template <typename T>
using DeviceArray = CudaArray<T, false>;

class UniqueStream {
 public:
  UniqueStream() = default;
  UniqueStream(const UniqueStream&) = delete;
  UniqueStream& operator=(const UniqueStream&) = delete;
  ~UniqueStream() {
    if (stream_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaStreamDestroy(stream_));
  }
  // Non-blocking: never ordered with the legacy default stream.
  [[nodiscard]] absl::Status Create() {
    PO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Polls `event` until it completes (never the unbounded cudaEventSynchronize).
// Errors: DeadlineExceeded naming `what` after `timeout_seconds`; the query's CUDA error.
[[nodiscard]] inline absl::Status WaitForEvent(cudaEvent_t event, double timeout_seconds,
                                               const std::string& what) {
  absl::StatusOr<bool> done = PollUntil(
      [event]() -> absl::StatusOr<bool> {
        const cudaError_t query = cudaEventQuery(event);
        if (query == cudaSuccess) return true;
        if (query == cudaErrorNotReady) return false;
        return CudaStatus(query, "cudaEventQuery", __FILE__, __LINE__);
      },
      timeout_seconds);
  if (!done.ok()) return done.status();
  if (!*done) {
    return absl::DeadlineExceededError(
        absl::StrCat("calibration: ", what, " not done after ", timeout_seconds, " s"));
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_CUDA_CUDA_RESOURCES_H_
