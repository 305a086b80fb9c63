// The Status flavour of the CUDA checks (for .cc files; cuda_check.h is the Abseil-free one),
// the device guard every entry point of the CUDA backend and the NCCL transport takes, and the
// bounded polling loop behind every wait (nothing here ever blocks in cudaEventSynchronize or
// cudaStreamSynchronize, which cannot time out).
#ifndef PIPEOFFLOAD_LIB_BACKEND_CUDA_CUDA_STATUS_H_
#define PIPEOFFLOAD_LIB_BACKEND_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/backend/clock.h"

namespace pipeoffload::internal {

// The Status of a failed CUDA call: ResourceExhausted for cudaErrorMemoryAllocation, Internal
// for anything else, with the statement, the location, the current device and CUDA's name and
// text of the error. Clears the calling thread's last-error state (as NCCL does), so a
// non-sticky error does not resurface at the next unrelated call. REQUIRES: error != cudaSuccess.
[[nodiscard]] absl::Status CudaStatus(cudaError_t error, const char* statement, const char* file,
                                      int line);

// Makes `device` current on the calling thread for the guard's lifetime and restores the
// previous one after. Threads of the runtime may drive several devices (local transport), and
// stream, event and allocation calls act on the current device.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice();
  // Errors: the Status of a failing cudaGetDevice / cudaSetDevice.
  [[nodiscard]] absl::Status Enter(int device);

 private:
  int previous_ = -1;  // restored by the destructor when >= 0
};

// Seconds a poll spins (yielding) before it starts sleeping between calls: copies and short
// kernels often finish within it, and one sleep costs tens of microseconds of latency.
inline constexpr double kPollSpinSeconds = 200e-6;
inline constexpr double kPollSleepSeconds = 20e-6;

// Calls `ready` (returning absl::StatusOr<bool>) until it yields true or an error, or until
// `timeout_seconds` have passed; it is called at least once, also with a zero timeout.
// Returns true when ready, false on timeout, or ready's error.
template <typename Ready>
absl::StatusOr<bool> PollUntil(Ready&& ready, double timeout_seconds) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = DeadlineAfter(timeout_seconds);
  const auto spin_until = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(kPollSpinSeconds));
  while (true) {
    absl::StatusOr<bool> done = ready();
    if (!done.ok() || *done) return done;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSleepSeconds));
    }
  }
}

}  // namespace pipeoffload::internal

// Returns the Status of a failed CUDA call from the enclosing function (see CudaStatus).
#define PO_CUDA_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                    \
    const cudaError_t po_cuda_status_error_ = (call);                                     \
    if (po_cuda_status_error_ != cudaSuccess) {                                           \
      return ::pipeoffload::internal::CudaStatus(po_cuda_status_error_, #call, __FILE__,  \
                                                 __LINE__);                               \
    }                                                                                     \
  } while (0)

#endif  // PIPEOFFLOAD_LIB_BACKEND_CUDA_CUDA_STATUS_H_
