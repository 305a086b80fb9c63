// What an offload policy asks of one stage, and the planner's time budget: shared by the
// planner's pieces (offload_planner.cc, offload_choice.cc, warmup_gating.cc). Header-only;
// pure functions of the spec, no I/O.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_POLICY_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_POLICY_H_

#include <cstdint>
#include <limits>

#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// Relative slack when comparing step times: anything beyond rounding is a real difference.
inline constexpr double kStallTolerance = 1e-9;
// How much slower than the same order without offload a plan may be (a share of its step
// time). Plans that place every op where the lowered schedule had it cost nothing; gating a
// warm-up forward behind the RELEASE of the entry before it (GatedWarmup) may cost time, and
// is kept only within this budget (issue 3: "overhead <= 1%").
inline constexpr double kOverheadBudget = 0.01;

// What the policy asks of one stage whose entries hold `total_bytes`, in bytes (infinity:
// everything that saves memory). A policy's share caps each stage's offloaded bytes.
inline double RequestedBytes(const PipelineSpec& spec, std::int64_t total_bytes) {
  switch (spec.offload) {
    case OffloadPolicy::kHalf: return 0.5 * static_cast<double>(total_bytes);
    case OffloadPolicy::kSelective:
      if (spec.offload_chunks > 0) return std::numeric_limits<double>::infinity();
      return spec.offload_fraction * static_cast<double>(total_bytes);
    default: return std::numeric_limits<double>::infinity();
  }
}

// Whether the policy lets the entries of `chunk` go at all.
inline bool Candidate(const PipelineSpec& spec, int chunk) {
  return spec.offload != OffloadPolicy::kSelective || spec.offload_chunks == 0 ||
         chunk < spec.offload_chunks;
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_POLICY_H_
