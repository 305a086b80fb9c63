// Compile: the compiler's passes end to end (DESIGN.md section 4). Owns no policy of its own.
//
// Validation and simulation run once per schedule: the offload planner validates and simulates
// every plan it emits (its check, offload_planner.cc step 4) and hands back that simulation's
// predictions (PlanOffloadOfLowered), so only a schedule without offload is validated and
// simulated here (predictions only: nothing reads the memory samples of a compile). Debug builds
// validate the planner's result again.
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"
#include "lib/sim/simulate_parts.h"
#include "lib/sim/sim_cost_check.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_planner.h"

namespace pipeoffload {

namespace {

// Every entry `choice` recomputes has its mode offered by the cost model (the runtime refuses
// what the model does not offer; the cost model is where the planner learns it).
absl::Status CheckRecomputeOffered(const Schedule& lowered, const RecomputeChoice& choice,
                                   const CostModel& cost) {
  for (const auto& [key, mode] : choice) {
    const auto& [stage, mb, chunk] = key;
    if (!cost.RecomputeOffered(stage, chunk, lowered.spec.stage_map(), mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recompute ", RecomputeName(mode), ": the cost model offers it for no entry of chunk ",
          chunk, " on stage ", stage, " (retained_", RecomputeName(mode),
          "_bytes is 0 there); give the retained bytes or choose another mode"));
    }
  }
  return absl::OkStatus();
}

// Compile for a spec that is not auto: `given` is the recompute choice to carry out, or null
// for the one spec.recompute makes.
absl::StatusOr<Schedule> CompileOrder(const PipelineSpec& spec, const CostModel& cost,
                                      const RecomputeChoice* given) {
  PO_ASSIGN_OR_RETURN(const PipelineSpec resolved, ResolveSpec(spec));
  // Before anything is planned: the planner adds up bytes and times of this cost model too.
  PO_RETURN_IF_ERROR(internal::CheckCostModel(cost, resolved));
  PO_ASSIGN_OR_RETURN(const Schedule order, BuildComputeOrder(resolved, cost));
  PO_ASSIGN_OR_RETURN(Schedule lowered, LowerCommunication(order));
  const RecomputeChoice choice = given != nullptr ? *given : ChooseRecompute(lowered);
  if (!choice.empty()) {
    PO_RETURN_IF_ERROR(CheckRecomputeOffered(lowered, choice, cost));
    PO_ASSIGN_OR_RETURN(lowered, AddRecompute(lowered, choice));
  }

  if (resolved.offload == OffloadPolicy::kNone) {
    // A schedule we emit that fails validation is our bug, not the user's: say so.
    if (absl::Status valid = Validate(lowered); !valid.ok()) {
      return absl::InternalError(absl::StrCat("compiler emitted an invalid schedule: ",
                                              std::string(valid.message())));
    }
    // Only the predictions are kept: no memory samples (Simulate's kFull builds one per op,
    // for a million ops, to be thrown away). Without transfer ops (no offload here, and
    // recompute adds none) Simulate's second run does not happen, so the predictions are
    // Simulate's.
    PO_ASSIGN_OR_RETURN(
        Timeline timeline,
        internal::SimulateOnce(lowered, cost, internal::SimulateDetail::kPredictions));
    PO_DCHECK(!internal::HasTransfers(lowered));
    lowered.predictions = std::move(timeline.predictions);
    return lowered;
  }
  // The planner may offload a recomputed entry's retained block (its candidate is that block).
  PO_ASSIGN_OR_RETURN(Schedule planned, internal::PlanOffloadOfLowered(lowered, cost));
  PO_DCHECK(planned.predictions.has_value() && Validate(planned).ok());
  return planned;
}

}  // namespace

absl::StatusOr<Schedule> Compile(const PipelineSpec& spec, const CostModel& cost,
                                 const CompileOptions& options) {
  PO_RETURN_IF_ERROR(CheckRecomputeSpec(spec));
  if (spec.offload == OffloadPolicy::kAuto) {
    return internal::PlanAuto(spec, cost, /*alternatives=*/nullptr, options.auto_step);
  }
  return CompileOrder(spec, cost, /*given=*/nullptr);
}

namespace internal {

namespace {

// LowerOrder's and CompileLowered's spec, resolved and checked as Compile checks it; they take
// a concrete offload policy and no recompute (auto and recompute change the order's ops).
absl::StatusOr<PipelineSpec> ResolveForLowering(const char* caller, const PipelineSpec& spec,
                                                const CostModel& cost) {
  if (spec.offload == OffloadPolicy::kAuto || spec.recompute != Recompute::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        caller, ": the spec names a concrete offload policy and recompute none"));
  }
  PO_RETURN_IF_ERROR(CheckRecomputeSpec(spec));
  PO_ASSIGN_OR_RETURN(PipelineSpec resolved, ResolveSpec(spec));
  PO_RETURN_IF_ERROR(internal::CheckCostModel(cost, resolved));
  return resolved;
}

}  // namespace

absl::StatusOr<LoweredOrder> LowerOrder(const PipelineSpec& spec, const CostModel& cost) {
  PO_ASSIGN_OR_RETURN(const PipelineSpec resolved, ResolveForLowering("LowerOrder", spec, cost));
  PO_ASSIGN_OR_RETURN(const Schedule order, BuildComputeOrder(resolved, cost));
  PO_ASSIGN_OR_RETURN(Schedule lowered, LowerCommunication(order));
  return MakeLoweredOrder(std::move(lowered), cost);
}

absl::StatusOr<Schedule> CompileLowered(const PipelineSpec& spec, const CostModel& cost,
                                        LoweredOrder* order) {
  // As CompileOrder, up to the passes the order has made already.
  PO_ASSIGN_OR_RETURN(const PipelineSpec resolved,
                      ResolveForLowering("CompileLowered", spec, cost));
  PipelineSpec as_ordered = order->lowered.spec;
  as_ordered.offload = resolved.offload;
  as_ordered.offload_fraction = resolved.offload_fraction;
  as_ordered.offload_chunks = resolved.offload_chunks;
  if (!(as_ordered == resolved)) {
    return absl::InvalidArgumentError(
        "CompileLowered: the spec differs from the lowered order's in more than its offload "
        "fields");
  }
  if (resolved.offload == OffloadPolicy::kNone) {
    // CompileOrder's plan without offload: the lowering, validated, with its predictions.
    Schedule lowered = order->lowered;
    lowered.spec = resolved;
    if (absl::Status valid = Validate(lowered); !valid.ok()) {
      return absl::InternalError(absl::StrCat("compiler emitted an invalid schedule: ",
                                              std::string(valid.message())));
    }
    lowered.predictions = order->baseline;
    return lowered;
  }
  PO_ASSIGN_OR_RETURN(Schedule planned, PlanOffloadOfLoweredOrder(order, resolved, cost));
  PO_DCHECK(planned.predictions.has_value() && Validate(planned).ok());
  return planned;
}

absl::StatusOr<Schedule> CompileWithRecompute(const PipelineSpec& spec, const CostModel& cost,
                                              const RecomputeChoice& choice) {
  if (spec.offload == OffloadPolicy::kAuto || spec.recompute != Recompute::kNone) {
    return absl::InvalidArgumentError(
        "CompileWithRecompute: the choice is given, so the spec names a concrete offload "
        "policy and recompute none");
  }
  PO_RETURN_IF_ERROR(CheckRecomputeSpec(spec));
  return CompileOrder(spec, cost, &choice);
}

}  // namespace internal

}  // namespace pipeoffload
