// Measures the rates of the update-phase model (update_model.h) on this machine: CpuAdam alone
// and under PCIe traffic, pinned copies each way alone and in duplex (and under CpuAdam's DRAM
// traffic), GPU Adam and the gradient upcast. Short (about three seconds with the defaults);
// allocates its own buffers and frees them before returning.
#ifndef PIPEOFFLOAD_LIB_OPTIM_CUDA_CALIBRATE_H_
#define PIPEOFFLOAD_LIB_OPTIM_CUDA_CALIBRATE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "lib/optim/update_model.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {

struct CalibrationOptions {
  // Params per measurement: far larger than the last-level cache so DRAM is what is measured,
  // and about one engine subgroup or more. Needs ~30 B/param of pinned host memory and
  // ~28 B/param of device memory. > 0.
  std::int64_t params = std::int64_t{1} << 26;
  int repeats = 5;     // the median is reported; > 0
  CpuAdamOptions cpu;  // as the engine will use it
  int device = 0;
};

// Errors: InvalidArgument for bad options; ResourceExhausted when the buffers do not fit;
// FailedPrecondition without the device; CUDA errors as Internal.
[[nodiscard]] absl::StatusOr<UpdateRates> CalibrateUpdateRates(
    const CalibrationOptions& options = {});

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_OPTIM_CUDA_CALIBRATE_H_
