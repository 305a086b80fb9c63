// Measures the rates of the update-phase model (update_model.h) on a backend, through the
// Backend interface as the engine (optimizer_offload.h) runs: CpuAdam alone and under PCIe
// traffic, the backend's host-memory copies each way alone and in duplex (and under CpuAdam's
// DRAM traffic), the device Adam and the gradient upcast (offload_device_ops.h). Short (about
// three seconds with the defaults on an H200). On the CPU backend the "device" figures are its
// host threads' (memcpy copy engines, CpuAdam on the caller's thread), which is what lets the
// calibration itself be tested without a GPU.
#ifndef PIPEOFFLOAD_LIB_OPTIM_UPDATE_CALIBRATION_H_
#define PIPEOFFLOAD_LIB_OPTIM_UPDATE_CALIBRATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "lib/optim/update_model.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {

// The most params a calibration takes: its largest buffer's bytes (4 B/param) and their sum
// over every buffer must fit in int64 with room to spare.
inline constexpr std::int64_t kMaxCalibrationParams = std::int64_t{1} << 40;

struct CalibrationOptions {
  // Params per measurement: far larger than the last-level cache so DRAM is what is measured,
  // and about one engine subgroup or more. Takes 26 B/param of host memory (AllocateHost:
  // pinned on CUDA) and 26 B/param of device memory. In (0, kMaxCalibrationParams].
  std::int64_t params = std::int64_t{1} << 26;
  int repeats = 5;     // the median is reported; > 0
  CpuAdamOptions cpu;  // as the engine will use it
};

// Each rate is the median of `repeats` timings; the copy rates time two copies of 4 B/param
// (one fp32 buffer) per queue, between events recorded on that queue (EventTime).
// Runs on `backend`'s built-in compute, H2D and D2H queues, so call it at set-up with those
// idle (other work there would be timed too). Allocates its buffers and events from the
// backend and gives every one back before returning, on every path, after its queues drained.
// Errors: InvalidArgument for bad options; ResourceExhausted (naming the buffer) when the
// buffers do not fit; FailedPrecondition for a backend the engine cannot run on
// (CreateOffloadDeviceOps); DeadlineExceeded when a timed operation does not finish within two
// minutes; the backend's and CpuAdam's errors.
[[nodiscard]] absl::StatusOr<UpdateRates> CalibrateUpdateRates(
    Backend& backend, const CalibrationOptions& options = {});

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_OPTIM_UPDATE_CALIBRATION_H_
