// ResolveSpec and BuildComputeOrder: the compiler's front door. Checks a PipelineSpec for its
// family (every bad spec is an InvalidArgument saying what is wrong and what is accepted), fills
// in the defaults, and dispatches to the family builders. Never aborts on user input.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/checked_math.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "schedules/families.h"

namespace pipeoffload {
namespace {

absl::Status CheckRange(const char* name, std::int64_t value, std::int64_t low,
                        std::int64_t high) {
  if (value < low || value > high) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be in [", low, ", ", high, "] (got ", value, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

int MinGroupSize(int num_stages) { return (num_stages + 1) / 2; }

absl::Status CheckSpecShape(const PipelineSpec& spec) {
  PO_RETURN_IF_ERROR(CheckRange("num_stages", spec.num_stages, 1, kMaxStages));
  PO_RETURN_IF_ERROR(CheckRange("num_microbatches", spec.num_microbatches, 1, kMaxMicrobatches));
  PO_RETURN_IF_ERROR(CheckRange("chunks_per_stage", spec.chunks_per_stage, 1, kMaxChunksPerStage));
  return CheckedProduct("num_stages * chunks_per_stage * num_microbatches",
                        {spec.num_stages, spec.chunks_per_stage, spec.num_microbatches},
                        kMaxEntries)
      .status();
}

}  // namespace internal

namespace {

// The offload fields belong to the planner, but their ranges are part of the spec's meaning
// (schedule.h), so a bad value is caught here before any pass runs.
absl::Status CheckOffloadFields(const PipelineSpec& spec) {
  if (OffloadPolicyName(spec.offload) == "?") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown offload policy ", static_cast<int>(spec.offload),
                     "; accepted: none, po-h, po-f, selective, auto"));
  }
  if (!std::isfinite(spec.offload_fraction) || spec.offload_fraction < 0.0 ||
      spec.offload_fraction > 1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offload_fraction must be in [0, 1] (got ", spec.offload_fraction, ")"));
  }
  if (spec.offload_chunks < 0 || spec.offload_chunks > spec.chunks_per_stage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offload_chunks must be in [0, chunks_per_stage=", spec.chunks_per_stage, "] (got ",
        spec.offload_chunks, ")"));
  }
  if (spec.memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory_budget_bytes must be >= 0 (got ", spec.memory_budget_bytes, ")"));
  }
  if (spec.offload != OffloadPolicy::kNone) {
    const absl::StatusOr<std::int64_t> work = CheckedProduct(
        absl::StrCat("offload planning work p*m*v * p*v for ",
                     std::string(OffloadPolicyName(spec.offload))),
        {spec.num_stages, spec.num_microbatches, spec.chunks_per_stage, spec.num_stages,
         spec.chunks_per_stage},
        internal::kMaxOffloadPlanWork);
    if (!work.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          work.status().message(),
          " (the planner's search grows with entries times virtual stages; use fewer stages, "
          "chunks or microbatches, or no offload)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveOneFOneB(PipelineSpec& spec) {
  if (spec.chunks_per_stage != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "1f1b needs chunks_per_stage == 1 (got v=", spec.chunks_per_stage,
        "); use interleaved or group-interleaved for more than one chunk per stage"));
  }
  if (spec.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "1f1b takes no group size: group_size must be 0 (got ", spec.group_size,
        "); group sizes apply to group-interleaved"));
  }
  return absl::OkStatus();
}

absl::Status ResolveInterleaved(PipelineSpec& spec) {
  const int p = spec.num_stages;
  const int m = spec.num_microbatches;
  if (spec.chunks_per_stage < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved needs chunks_per_stage >= 2 (got v=", spec.chunks_per_stage,
        "); use 1f1b for one chunk per stage"));
  }
  if (m % p != 0) {
    // Megatron's interleaved loop walks microbatches in groups of p (ecosystem.md section 2.1).
    const int lower = (m / p) * p;
    const int upper = lower + p;
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved needs num_microbatches % num_stages == 0 (m=", m, ", p=", p, "); use m=",
        lower > 0 ? absl::StrCat(lower, " or ") : std::string(), upper,
        ", or group-interleaved, which takes any m"));
  }
  if (spec.group_size != 0 && spec.group_size != p) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved always groups num_stages microbatches: group_size must be 0 or p=", p,
        " (got ", spec.group_size, "); use group-interleaved for other group sizes"));
  }
  spec.group_size = p;
  return absl::OkStatus();
}

absl::Status ResolveGroupInterleaved(PipelineSpec& spec) {
  const int p = spec.num_stages;
  const int g_min = internal::MinGroupSize(p);
  if (spec.group_size == 0) spec.group_size = g_min;
  if (spec.group_size < g_min || spec.group_size > p) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group-interleaved needs ceil(p/2) <= group_size <= p, i.e. ", g_min, " <= g <= ", p,
        " for p=", p, " (got g=", spec.group_size, "); 0 picks the default ", g_min));
  }
  return absl::OkStatus();
}

// zbv and dualpipev: torch's V schedules. The family fixes the placement (v) and the split
// backward (torch's orders place every W themselves; an unsplit variant would be another order).
absl::Status ResolveVShape(PipelineSpec& spec) {
  const std::string name(FamilyName(spec.family));
  if (spec.chunks_per_stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " needs chunks_per_stage == 2 (got v=", spec.chunks_per_stage,
        "): V placement puts virtual stages d and 2p - 1 - d on stage d"));
  }
  if (spec.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " takes no group size: group_size must be 0 (got ", spec.group_size, ")"));
  }
  if (spec.family == Family::kDualPipeV && spec.num_microbatches < 2 * spec.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dualpipev needs num_microbatches >= 2 * num_stages (m=", spec.num_microbatches,
        ", p=", spec.num_stages, ", so m >= ", 2 * spec.num_stages,
        "), as torch's ScheduleDualPipeV does"));
  }
  spec.placement = Placement::kV;
  spec.split_backward = true;
  return absl::OkStatus();
}

// The loop families build loop placement only.
absl::Status RequireLoopPlacement(const PipelineSpec& spec) {
  if (spec.placement == Placement::kLoop) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(FamilyName(spec.family)), " builds loop placement only (got placement ",
      std::string(PlacementName(spec.placement)),
      "); placement v comes with the zbv and dualpipev families"));
}

}  // namespace

absl::StatusOr<PipelineSpec> ResolveSpec(const PipelineSpec& spec) {
  PipelineSpec resolved = spec;
  PO_RETURN_IF_ERROR(internal::CheckSpecShape(resolved));
  PO_RETURN_IF_ERROR(CheckOffloadFields(resolved));
  if (resolved.family != Family::kZbv && resolved.family != Family::kDualPipeV) {
    PO_RETURN_IF_ERROR(RequireLoopPlacement(resolved));
  }
  switch (resolved.family) {
    case Family::kZbv:
    case Family::kDualPipeV:
      PO_RETURN_IF_ERROR(ResolveVShape(resolved));
      return resolved;
    case Family::k1F1B:
      PO_RETURN_IF_ERROR(ResolveOneFOneB(resolved));
      return resolved;
    case Family::kInterleaved:
      PO_RETURN_IF_ERROR(ResolveInterleaved(resolved));
      return resolved;
    case Family::kGroupInterleaved:
      PO_RETURN_IF_ERROR(ResolveGroupInterleaved(resolved));
      return resolved;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown family ", static_cast<int>(spec.family),
                   "; accepted: 1f1b, interleaved, group-interleaved, zbv, dualpipev"));
}

// The cost model does not shape the order: every family here is defined in unit slots, and the
// timing pass (Simulate) applies the real durations afterwards.
absl::StatusOr<Schedule> BuildComputeOrder(const PipelineSpec& spec, const CostModel& /*cost*/) {
  // Resolving again costs nothing and keeps a caller that skipped ResolveSpec from reaching a
  // builder with a spec it cannot handle.
  PO_ASSIGN_OR_RETURN(const PipelineSpec resolved, ResolveSpec(spec));
  Schedule schedule;
  schedule.spec = resolved;
  switch (resolved.family) {
    case Family::k1F1B:
      schedule.stages = internal::BuildOneFOneBOrder(resolved);
      break;
    case Family::kInterleaved:
      schedule.stages = internal::BuildInterleavedOrder(resolved);
      break;
    case Family::kGroupInterleaved: {
      PO_ASSIGN_OR_RETURN(schedule.stages, internal::BuildGroupInterleavedOrder(resolved));
      break;
    }
    case Family::kZbv:
      schedule.stages = internal::BuildZbvOrder(resolved);
      break;
    case Family::kDualPipeV:
      schedule.stages = internal::BuildDualPipeVOrder(resolved);
      break;
  }
  return schedule;
}

}  // namespace pipeoffload
