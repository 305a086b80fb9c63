// PlanOffload and the checks before any allocation (offload_plan.h), plus the mode names of
// optimizer_offload.h.
#include "lib/optim/offload_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/base/host_memory_info.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/adam.h"

namespace pipeoffload {

std::string_view OffloadModeName(OffloadMode mode) {
  switch (mode) {
    case OffloadMode::kCpu:
      return "cpu";
    case OffloadMode::kInterleaved:
      return "interleaved";
    case OffloadMode::kStatic:
      return "static";
    case OffloadMode::kGpu:
      return "gpu";
  }
  return "?";
}

absl::StatusOr<OffloadMode> ParseOffloadMode(std::string_view name) {
  for (OffloadMode mode : {OffloadMode::kCpu, OffloadMode::kInterleaved, OffloadMode::kStatic,
                           OffloadMode::kGpu}) {
    if (name == OffloadModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer offload mode '", std::string(name),
      "' (expected cpu, interleaved, static or gpu)"));
}

namespace internal {
namespace {

constexpr std::int64_t kMaxBytes = std::numeric_limits<std::int64_t>::max() / 4;

bool InUnitInterval(double x) { return x >= 0.0 && x <= 1.0; }  // NaN fails

absl::Status Bad(const char* field, double value, const char* requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer offload: ", field, " = ", value, " ", requirement));
}

}  // namespace

absl::Status ValidateOffloadOptions(const OptimizerOffloadOptions& o) {
  if (o.num_params <= 0) return Bad("num_params", static_cast<double>(o.num_params), "must be > 0");
  if (o.subgroup_size <= 0) {
    return Bad("subgroup_size", static_cast<double>(o.subgroup_size), "must be > 0");
  }
  if (o.num_params > kMaxBytes / 32) {
    return Bad("num_params", static_cast<double>(o.num_params), "is too large to address");
  }
  if (!InUnitInterval(o.gpu_share)) return Bad("gpu_share", o.gpu_share, "must be in [0, 1]");
  if (o.mode == OffloadMode::kInterleaved && o.max_gpu_share >= 0.0 &&
      !(o.max_gpu_share >= o.gpu_share && o.max_gpu_share <= 1.0)) {
    return Bad("max_gpu_share", o.max_gpu_share, "must be in [gpu_share, 1] (or < 0: gpu_share)");
  }
  if (std::isnan(o.max_grad_norm) || std::isinf(o.max_grad_norm)) {
    return Bad("max_grad_norm", o.max_grad_norm, "must be finite (<= 0: no clipping)");
  }
  if (o.cpu.threads < 0) return Bad("cpu.threads", o.cpu.threads, "must be >= 0");
  if (o.host_memory_limit_bytes < 0) {
    return Bad("host_memory_limit_bytes", static_cast<double>(o.host_memory_limit_bytes),
               "must be >= 0 (0: the host's available memory)");
  }
  if (o.grad_chunk <= 0) return Bad("grad_chunk", static_cast<double>(o.grad_chunk), "must be > 0");
  if (!(o.timeout_seconds > 0.0) || std::isinf(o.timeout_seconds)) {
    return Bad("timeout_seconds", o.timeout_seconds, "must be finite and > 0");
  }
  // The Adam options are checked by the function that will use them every step.
  const absl::StatusOr<AdamStepScalars> scalars = MakeAdamStepScalars(o.adam, 1);
  if (!scalars.ok()) return Annotate(scalars.status(), "optimizer offload");
  return absl::OkStatus();
}

absl::StatusOr<OffloadPlan> PlanOffload(const OptimizerOffloadOptions& options) {
  PO_RETURN_IF_ERROR(ValidateOffloadOptions(options));
  OffloadPlan plan;
  plan.layout = SubgroupLayout{options.num_params, options.subgroup_size};
  const std::int64_t n = plan.layout.num_subgroups();
  const double share = options.mode == OffloadMode::kCpu   ? 0.0
                       : options.mode == OffloadMode::kGpu ? 1.0
                                                           : options.gpu_share;
  plan.places = PlaceSubgroups(options.mode, n, share);
  plan.host_offset.assign(static_cast<std::size_t>(n), -1);
  plan.resident_offset.assign(static_cast<std::size_t>(n), -1);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t size = plan.layout.size(i);
    if (plan.places[static_cast<std::size_t>(i)] == SubgroupPlace::kGpuResident) {
      plan.resident_offset[static_cast<std::size_t>(i)] = plan.resident_params;
      plan.resident_params += size;
    } else {
      plan.host_offset[static_cast<std::size_t>(i)] = plan.host_params;
      plan.host_params += size;
    }
  }
  if (options.mode == OffloadMode::kInterleaved) {
    const double max_share = options.max_gpu_share < 0.0 ? share : options.max_gpu_share;
    plan.staged_slots = SubgroupsForShare(n, max_share);
    plan.staging_sets = static_cast<int>(std::min<std::int64_t>(2, plan.staged_slots));
  }
  const std::int64_t s = options.subgroup_size < options.num_params ? options.subgroup_size
                                                                    : options.num_params;
  plan.pinned_state_bytes = 12 * plan.host_params;
  plan.pinned_grad_bytes = 4 * plan.host_params;
  if (plan.host_params > 0) {
    plan.pinned_upload_bytes = kUploadSlots * 2 * s;
    plan.upcast_chunk = std::min(options.grad_chunk, s);
  }
  plan.device_state_bytes = 12 * plan.resident_params + plan.staging_sets * 12 * s;
  plan.device_grad_bytes = 4 * plan.resident_params + plan.staged_slots * 4 * s;
  const std::int64_t partials = (options.num_params + kPlanSumBlock - 1) / kPlanSumBlock + 1;
  plan.device_scratch_bytes = 2 * 4 * plan.upcast_chunk + 8 * partials;
  if (plan.pinned_bytes() > kMaxBytes || plan.device_bytes() > kMaxBytes) {
    return absl::InvalidArgumentError("optimizer offload: byte counts overflow");
  }
  return plan;
}

absl::Status CheckHostMemory(const OffloadPlan& plan, std::int64_t limit_bytes) {
  std::int64_t limit = limit_bytes;
  const char* source = "host_memory_limit_bytes";
  if (limit == 0) {
    limit = AvailableHostMemoryBytes();
    source = "MemAvailable in /proc/meminfo";
    if (limit < 0) return absl::OkStatus();  // unknown: the allocation itself will tell
  }
  if (plan.pinned_bytes() <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "optimizer offload: the state needs ", plan.pinned_bytes(), " bytes (",
      FormatBytes(static_cast<double>(plan.pinned_bytes())),
      ") of pinned host memory (fp32 param, m, v: ", plan.pinned_state_bytes,
      "; fp32 gradients: ", plan.pinned_grad_bytes, "; bf16 upload slots: ",
      plan.pinned_upload_bytes, ") but only ", limit, " bytes (",
      FormatBytes(static_cast<double>(limit)), ") are available (", source,
      "); use fewer parameters, a larger GPU share (static mode), or more host memory"));
}

std::string FormatBytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.2f MB", bytes / 1e6);
  if (bytes >= 1e3) return absl::StrFormat("%.2f kB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

}  // namespace internal
}  // namespace pipeoffload
