// The performance model of the optimizer-offload update phase (optimizer_offload.h): from
// measured rates it predicts the time of one Step for any mode and GPU share, and picks the
// share with the least predicted time. Plain C++ (no CUDA), so it is tested on any machine.
//
// Reference section 1.7 sketches a per-period lane model (max of CPU, H2D, D2H and GPU lanes).
// Ours replays the engine's actual pipeline instead: one task per subgroup and lane with the
// engine's dependencies, run by a fluid simulation where transfers that run at once share a
// link's bandwidth, so start-up (the first prefetch), drain (the last write-back and upload),
// the uneven last subgroup and the two staging sets' back-pressure are all in the prediction:
//   CPU lane      C_i  CpuAdam on host subgroup i                 after C_prev
//   upload lane   U_i  bf16 of subgroup i, 2 B/param, H2D         after C_i, U_prev
//   prefetch lane P_j  p, m, v of staged subgroup j, 12 B/param   after P_{j-1}, W_{j-2}
//   GPU lane      K_j  GPU Adam of staged or resident subgroup j  after P_j (staged), K_prev
//   write-back    W_j  p, m, v of staged subgroup j, 12 B/param   after K_j, W_{j-1}
// Rates at each instant: the H2D link gives h2d (alone) or h2d_duplex (while a D2H runs) split
// evenly among the H2D transfers in flight, likewise D2H; both are scaled by
// pcie_factor_with_cpu while CPU Adam runs (DRAM is shared); CPU Adam runs at cpu_adam, or
// cpu_adam_with_pcie while any transfer is in flight.
#ifndef PIPEOFFLOAD_LIB_OPTIM_UPDATE_MODEL_H_
#define PIPEOFFLOAD_LIB_OPTIM_UPDATE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/optimizer_offload.h"

namespace pipeoffload {

// Measured rates (calibrate.h measures them on the machine). All > 0 and finite, except
// gpu_adam and upcast, which may be +infinity (free).
struct UpdateRates {
  double cpu_adam = 0.0;            // CpuAdam params/s, alone (all its threads)
  double cpu_adam_with_pcie = 0.0;  // CpuAdam params/s while copies run both ways
  double gpu_adam = 0.0;            // GPU Adam params/s on device-resident data
  double h2d = 0.0;                 // pinned H2D bytes/s, alone
  double d2h = 0.0;                 // pinned D2H bytes/s, alone
  double h2d_duplex = 0.0;          // H2D bytes/s while D2H runs
  double d2h_duplex = 0.0;          // D2H bytes/s while H2D runs
  double pcie_factor_with_cpu = 1.0;  // in (0, 1]: PCIe rates while CpuAdam runs, as a fraction
  double upcast = 0.0;              // gradient path on the GPU: bf16 -> fp32 + sum, params/s
};
// Errors: InvalidArgument naming the first bad field.
[[nodiscard]] absl::Status CheckUpdateRates(const UpdateRates& rates);
// One line, "cpu_adam=5.2e9/s ...", for benchmark output.
std::string FormatUpdateRates(const UpdateRates& rates);

// Bytes per parameter the update moves (reference section 4.3).
inline constexpr double kStateBytesPerParam = 12.0;  // fp32 p, m, v, each way
inline constexpr double kBf16BytesPerParam = 2.0;    // bf16 upload of a host subgroup
inline constexpr double kGradBytesPerParam = 4.0;    // fp32 gradient D2H of a host subgroup

// Subgroups of a parameter set: ceil(num_params / subgroup_size); the last holds the rest.
struct SubgroupLayout {
  std::int64_t num_params = 0;     // > 0
  std::int64_t subgroup_size = 0;  // > 0
  std::int64_t num_subgroups() const;
  std::int64_t offset(std::int64_t subgroup) const { return subgroup * subgroup_size; }
  std::int64_t size(std::int64_t subgroup) const;
};
// Errors: InvalidArgument for num_params <= 0 or subgroup_size <= 0.
[[nodiscard]] absl::Status CheckSubgroupLayout(const SubgroupLayout& layout);

// Whole subgroups for a share: round(share * num_subgroups), halves away from zero.
// REQUIRES share in [0, 1].
std::int64_t SubgroupsForShare(std::int64_t num_subgroups, double share);

// Bresenham spacing: entry i is true iff floor((i + 1) * k / n) > floor(i * k / n), which marks
// exactly k of n entries, evenly spread, the last one included when k > 0 (so a test can make
// the last subgroup a GPU one). REQUIRES 0 <= k <= n.
std::vector<bool> SpreadEvenly(std::int64_t n, std::int64_t k);

// The engine's placement for `mode` and `share` (kInterleaved: SpreadEvenly; kStatic: the last
// round(share * n) subgroups resident; kCpu: none on the GPU; kGpu: all resident).
std::vector<SubgroupPlace> PlaceSubgroups(OffloadMode mode, std::int64_t num_subgroups,
                                          double share);

struct UpdatePrediction {
  OffloadMode mode = OffloadMode::kCpu;
  double share = 0.0;                 // GPU subgroups / subgroups
  std::int64_t gpu_subgroups = 0;     // staged or resident
  double seconds = 0.0;               // the update phase
  double cpu_busy_seconds = 0.0;      // time the CPU lane runs
  double gpu_busy_seconds = 0.0;      // time a GPU Adam kernel runs
  double h2d_busy_seconds = 0.0;      // time some H2D transfer is in flight
  double d2h_busy_seconds = 0.0;
  double h2d_bytes = 0.0;
  double d2h_bytes = 0.0;
  double grad_path_seconds = 0.0;     // backward side: upcast, D2H of host subgroups' grads
  double gpu_state_bytes = 0.0;       // fp32 p, m, v on the GPU (staging or resident)
  double gpu_grad_bytes = 0.0;        // fp32 gradients kept on the GPU
};

// The predicted update phase of `layout` in `mode` with `share` (see PlaceSubgroups).
// Errors: InvalidArgument for bad rates, layout, or a share outside [0, 1].
[[nodiscard]] absl::StatusOr<UpdatePrediction> PredictUpdate(const UpdateRates& rates,
                                                             const SubgroupLayout& layout,
                                                             OffloadMode mode, double share);

// The kInterleaved share with the least predicted time, over every whole number of GPU
// subgroups 0..n (which covers every share, since the share is rounded to subgroups); ties go
// to fewer GPU subgroups (less PCIe traffic). Errors as PredictUpdate.
[[nodiscard]] absl::StatusOr<UpdatePrediction> BestInterleavedShare(const UpdateRates& rates,
                                                                    const SubgroupLayout& layout);

// A measured kInterleaved update phase of the engine (OptimizerStepStats::update_seconds).
struct MeasuredStep {
  double share = 0.0;
  double seconds = 0.0;
};

// Fits the rates to measured update phases of the engine itself. Short micro-benchmarks
// (calibrate.h) miss part of what the engine's lanes see (working sets of tens of GB, how the
// memory controller splits DRAM between CpuAdam and the copy engines over seconds), so:
//  1. the four PCIe rates are scaled by one factor so the model's all-staged time (share 1,
//     which involves no CPU Adam) equals `all_staged_seconds`;
//  2. the two CpuAdam rates are scaled by one factor so the cpu-only time (share 0) equals
//     `cpu_only_seconds`;
//  3. with `mixed` (a share strictly inside (0, 1)), pcie_factor_with_cpu, the contention term
//     only mixed shares exercise, is set in [0.05, 1] so that share's time matches too (steps 1
//     and 2 are redone for each candidate; the closest end when no factor matches).
// The ratios duplex vs alone and CpuAdam with vs without PCIe stay the micro-benchmarks'.
// Steps 1 and 2 are exact to a relative 1e-9 when the answer lies within a factor 64 of the
// given rates. Errors: InvalidArgument for bad input or times outside that range.
[[nodiscard]] absl::StatusOr<UpdateRates> FitRatesToSteps(
    const UpdateRates& rates, const SubgroupLayout& layout, double cpu_only_seconds,
    double all_staged_seconds, const MeasuredStep* mixed = nullptr);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_OPTIM_UPDATE_MODEL_H_
