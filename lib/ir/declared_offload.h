// CheckDeclaredOffload: a loaded schedule file's spec must name the offload policy its ops
// carry out. Used where a file becomes a schedule to run or report on (po-schedule validate,
// LoadScheduleFile, the C ABI's loaders); not by ParseScheduleJson itself, which reads any
// document of the right shape, nor by Validate, which checks programs built in memory too (tests
// hand-build offload ops under a default spec). Header-only; no state.
#ifndef PIPEOFFLOAD_LIB_IR_DECLARED_OFFLOAD_H_
#define PIPEOFFLOAD_LIB_IR_DECLARED_OFFLOAD_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// OK unless spec.offload is "none" while some op moves activations (OFFLOAD, RELEASE, RELOAD,
// or a BARRIER that stages them). The spec's policy is what the runtime and every report go
// by ("offload=none"), so such a file would run transfers while saying it runs none. Another
// policy without transfer ops is fine: a planner may find nothing worth moving.
// Errors: InvalidArgument 'spec.offload: is "none" but stages[0].ops[3] is OFFLOAD0.0; ...'.
inline absl::Status CheckDeclaredOffload(const Schedule& schedule) {
  if (schedule.spec.offload != OffloadPolicy::kNone) return absl::OkStatus();
  for (std::size_t d = 0; d < schedule.stages.size(); ++d) {
    const std::vector<Op>& ops = schedule.stages[d].ops;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (!IsOffload(ops[i].kind) && ops[i].kind != OpKind::kBarrier) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.offload: is \"none\" but stages[", d, "].ops[", i, "] is ", OpToString(ops[i]),
          "; a schedule that moves activations names the policy that planned it (po-h, po-f, "
          "selective or auto)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_IR_DECLARED_OFFLOAD_H_
