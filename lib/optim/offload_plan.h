// The optimizer-offload engine's plan: option checks, where each subgroup's state lives, and
// the bytes of every buffer, all computed before anything is allocated (so bad input and a host
// that is too small fail cleanly and on any machine). Plain C++ (no CUDA): part of
// po_optim_model and tested without a GPU.
#ifndef PIPEOFFLOAD_LIB_OPTIM_OFFLOAD_PLAN_H_
#define PIPEOFFLOAD_LIB_OPTIM_OFFLOAD_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lib/base/host_memory_info.h"
#include "absl/status/statusor.h"
#include "lib/optim/update_model.h"
#include "pipeoffload/optimizer_offload.h"

namespace pipeoffload::internal {

// Pinned bf16 slots the CPU lane cycles through for uploads (a slot is reused once its upload
// has finished; an upload is ~7x faster than the CPU Adam that fills the next slot).
inline constexpr int kUploadSlots = 3;
// The engine's sum of squares needs one double per 8192 gradients (adam_kernel.h).
inline constexpr std::int64_t kPlanSumBlock = 8192;

struct OffloadPlan {
  SubgroupLayout layout;
  std::vector<SubgroupPlace> places;  // at Create
  // Per subgroup: element offset of its state in the host arrays (p, m, v and fp32 grads), or
  // -1 when it has none; and in the device-resident arrays (p, m, v and grads), or -1.
  std::vector<std::int64_t> host_offset;
  std::vector<std::int64_t> resident_offset;
  std::int64_t host_params = 0;
  std::int64_t resident_params = 0;
  int staging_sets = 0;                 // kInterleaved: min(2, staged_slots)
  std::int64_t staged_slots = 0;        // device fp32 grad slots of subgroup_size for staged
  std::int64_t upcast_chunk = 0;        // elements per upcast staging buffer (two of them)

  std::int64_t pinned_state_bytes = 0;   // host fp32 p, m, v
  std::int64_t pinned_grad_bytes = 0;    // host fp32 grads
  std::int64_t pinned_upload_bytes = 0;  // bf16 upload slots
  std::int64_t device_state_bytes = 0;   // staging sets or resident p, m, v
  std::int64_t device_grad_bytes = 0;    // fp32 grads of GPU-updated subgroups
  std::int64_t device_scratch_bytes = 0; // upcast staging, sum-of-squares partials

  std::int64_t pinned_bytes() const {
    return pinned_state_bytes + pinned_grad_bytes + pinned_upload_bytes;
  }
  std::int64_t device_bytes() const {
    return device_state_bytes + device_grad_bytes + device_scratch_bytes;
  }
};

// Errors: InvalidArgument naming the first bad field of `options` (Adam options included).
[[nodiscard]] absl::Status ValidateOffloadOptions(const OptimizerOffloadOptions& options);

// Errors: those of ValidateOffloadOptions; InvalidArgument when a byte count overflows.
[[nodiscard]] absl::StatusOr<OffloadPlan> PlanOffload(const OptimizerOffloadOptions& options);

// OK when the plan's pinned bytes fit `limit_bytes` (0: AvailableHostMemoryBytes(); no check
// when that is unknown). Errors: ResourceExhausted naming the bytes needed, each buffer's
// share, and the limit.
[[nodiscard]] absl::Status CheckHostMemory(const OffloadPlan& plan, std::int64_t limit_bytes);

// "1.23 GB" (decimal units, as PCIe and DRAM figures are quoted).
std::string FormatBytes(double bytes);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_OFFLOAD_PLAN_H_
