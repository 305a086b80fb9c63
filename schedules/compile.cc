// Compile: the compiler's passes end to end (DESIGN.md section 4). Owns no policy of its own.
#include <utility>

#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_planner.h"

namespace pipeoffload {

absl::StatusOr<Schedule> Compile(const PipelineSpec& spec, const CostModel& cost) {
  if (spec.offload == OffloadPolicy::kAuto) {
    return internal::PlanAuto(spec, cost, /*alternatives=*/nullptr);
  }
  PO_ASSIGN_OR_RETURN(const PipelineSpec resolved, ResolveSpec(spec));
  PO_ASSIGN_OR_RETURN(const Schedule order, BuildComputeOrder(resolved, cost));
  PO_ASSIGN_OR_RETURN(const Schedule lowered, LowerCommunication(order));
  PO_ASSIGN_OR_RETURN(Schedule planned, PlanOffload(lowered, cost));

  // A schedule we emit that fails validation is our bug, not the user's: say so.
  if (absl::Status valid = Validate(planned); !valid.ok()) {
    return absl::InternalError(absl::StrCat("compiler emitted an invalid schedule: ",
                                            std::string(valid.message())));
  }
  PO_ASSIGN_OR_RETURN(Timeline timeline, Simulate(planned, cost));
  std::vector<std::string> warnings;
  if (planned.predictions.has_value()) warnings = std::move(planned.predictions->warnings);
  planned.predictions = std::move(timeline.predictions);
  for (std::string& warning : warnings) planned.predictions->warnings.push_back(std::move(warning));
  return planned;
}

}  // namespace pipeoffload
