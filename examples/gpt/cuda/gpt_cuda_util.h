// Small pieces the CUDA GPT's files share: cuBLAS status checks, an owner for the device
// buffers a stage model allocates once at creation, and bf16 rounding on the host (so tests and
// parameter upload round exactly as the device does).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_UTIL_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_UTIL_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt::cuda {

// The Status of a cuBLAS / cuBLASLt call: OK, ResourceExhausted for CUBLAS_STATUS_ALLOC_FAILED,
// InvalidArgument for CUBLAS_STATUS_INVALID_VALUE / NOT_SUPPORTED (a shape or layout the
// library rejects), Internal otherwise; the message names `what` and the status.
[[nodiscard]] absl::Status CublasStatus(cublasStatus_t status, const char* what);

// Every slot of a saved region, scratch buffer or parameter array starts at a multiple of this,
// so cuBLASLt's heuristics (which assume 256-byte alignment unless told otherwise) and the
// kernels' 16-byte vector paths see aligned pointers wherever the region itself is aligned
// (the runtime's arena aligns every block to 256 bytes).
inline constexpr std::int64_t kSlotAlignment = 256;
inline std::int64_t AlignSlot(std::int64_t bytes) {
  return (bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
}

// Device buffers from cudaMalloc, freed together by the destructor (on `device`). The owner
// must make sure no queued work still uses them before destroying this (stage models
// synchronize their stream first). Not thread-safe.
class DeviceAllocations {
 public:
  explicit DeviceAllocations(int device) : device_(device) {}
  ~DeviceAllocations();
  DeviceAllocations(const DeviceAllocations&) = delete;
  DeviceAllocations& operator=(const DeviceAllocations&) = delete;

  // `bytes` > 0 of device memory on `device` (which must be current). Errors: InvalidArgument
  // for bytes <= 0; ResourceExhausted naming the size when cudaMalloc fails for lack of memory.
  [[nodiscard]] absl::StatusOr<void*> Allocate(std::int64_t bytes);
  template <typename T>
  [[nodiscard]] absl::StatusOr<T*> AllocateArray(std::int64_t count) {
    PO_ASSIGN_OR_RETURN(void* raw, Allocate(count * static_cast<std::int64_t>(sizeof(T))));
    return static_cast<T*>(raw);
  }
  std::int64_t total_bytes() const { return total_bytes_; }

 private:
  int device_;
  std::vector<void*> buffers_;
  std::int64_t total_bytes_ = 0;
};

// Blocks until `stream` is idle, polling cudaStreamQuery (cudaStreamSynchronize cannot time
// out). Errors: DeadlineExceeded after `timeout_seconds`, naming `what`; the stream's error.
[[nodiscard]] absl::Status WaitForStream(cudaStream_t stream, double timeout_seconds,
                                         const char* what);

// fp32 -> bf16 bit pattern, round to nearest even (NaN stays a quiet NaN): the same bits as
// __float2bfloat16_rn on the device.
std::uint16_t RoundToBf16Bits(float value);
float Bf16BitsToFloat(std::uint16_t bits);
// value rounded to bf16 and widened back to fp32.
inline float RoundToBf16(float value) { return Bf16BitsToFloat(RoundToBf16Bits(value)); }

}  // namespace pipeoffload::gpt::cuda

#define PO_CUBLAS_RETURN_IF_ERROR(call) \
  PO_RETURN_IF_ERROR(::pipeoffload::gpt::cuda::CublasStatus((call), #call))

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_UTIL_H_
