// The schedule compiler: PipelineSpec + CostModel -> a validated Schedule with predictions.
//
// Passes (DESIGN.md section 4), each usable alone:
//   BuildComputeOrder  - the family's compute order (F/B/W only), per stage
//   LowerCommunication - SEND_*/RECV_* pairs in a deadlock-free, sender-driven order
//   PlanOffload        - OFFLOAD/RELEASE/RELOAD/BARRIER placement for the spec's policy
//   AddRecompute       - RECOMPUTE/RECOMPUTE_LEAN before B of the entries spec.recompute picks
//   Compile            - all of the above, then Validate and Simulate
#ifndef PIPEOFFLOAD_COMPILER_H_
#define PIPEOFFLOAD_COMPILER_H_

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload {

// Checks the spec for its family and resolves defaults (group_size 0 -> the family's default).
// Errors: InvalidArgument saying what is wrong and what would be accepted, e.g.
// "interleaved needs num_microbatches % num_stages == 0 (m=6, p=4)".
[[nodiscard]] absl::StatusOr<PipelineSpec> ResolveSpec(const PipelineSpec& spec);

// The compute order of the spec's family: per stage, F/B(/W) ops only, no comm, no offload.
// REQUIRES: spec came from ResolveSpec.
[[nodiscard]] absl::StatusOr<Schedule> BuildComputeOrder(const PipelineSpec& spec,
                                                         const CostModel& cost);

// Inserts SEND_*/RECV_* for every cross-stage dependency, sender-driven (each RECV is placed on
// the receiver when its SEND is placed on the sender), which keeps every pair of stages in one
// consistent order and makes the result deadlock-free under blocking rendezvous.
// Errors: FailedPrecondition ("malformed compute order") when the order cannot make progress.
[[nodiscard]] absl::StatusOr<Schedule> LowerCommunication(const Schedule& compute_order);

// Places OFFLOAD/RELEASE/RELOAD (and BARRIERs between paired stages) into a lowered schedule
// according to spec.offload (kNone returns the input unchanged). Never fails for lack of
// bandwidth: it plans as much as fits and records a warning with the numbers in the result's
// predictions, unless spec.strict, when that shortfall is FailedPrecondition.
[[nodiscard]] absl::StatusOr<Schedule> PlanOffload(const Schedule& lowered, const CostModel& cost);

// Recomputation (issue 15). A choice per (stage, mb, chunk) entry; absent or kNone: kept.
using RecomputeChoice = std::map<std::tuple<int, int, int>, Recompute>;
// Errors: InvalidArgument for an unknown mode, recompute_fraction outside (0, 1] or
// recompute_chunks outside [0, v]. Any offload policy may stand beside it: the planner then
// treats a recomputed entry's retained block as that entry's offload candidate.
[[nodiscard]] absl::Status CheckRecomputeSpec(const PipelineSpec& spec);
// The entries spec.recompute picks in a lowered schedule (semantics: PipelineSpec).
RecomputeChoice ChooseRecompute(const Schedule& lowered);
// Inserts RECOMPUTE (kFull) or RECOMPUTE_LEAN (kLean) right before B of each chosen entry.
// Errors: FailedPrecondition when `lowered` already has recompute ops.
[[nodiscard]] absl::StatusOr<Schedule> AddRecompute(const Schedule& lowered,
                                                    const RecomputeChoice& choice);

// The step time `auto` ranks a candidate by (`candidate` is compiled, valid, with predictions
// under the cost model it was planned with). An error rules the candidate out. auto calls it
// for one candidate at a time, on the same candidates in the same order whatever the number of
// compiler threads, but not always on the thread that called Compile.
using StepJudge = std::function<absl::StatusOr<double>(const Schedule& candidate)>;

struct CompileOptions {
  // Empty: each candidate's own predicted step_time, which gives every stage a compute engine
  // of its own. Stages that time-share one GPU judge by SimulateSharedGpu (PlanSchedule does):
  // there a recompute adds its time to the step however well it fills a stage's bubble.
  StepJudge auto_step;
};

// Full pipeline of passes. The result passes Validate and carries predictions.
[[nodiscard]] absl::StatusOr<Schedule> Compile(const PipelineSpec& spec, const CostModel& cost,
                                               const CompileOptions& options = {});

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_COMPILER_H_
