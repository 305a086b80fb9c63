// PlanSchedule and ReplanSchedule (planning.h): Compile or Simulate under the job's costs, and
// for stages sharing one GPU the compute-factor search judged by SimulateSharedGpu.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/planning.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_planner.h"

namespace pipeoffload {
namespace {

bool OneGpu(const PlanOptions& options) { return options.shared_gpu.stages_per_device > 1; }

absl::Status CheckOptions(const PlanOptions& options, int num_stages) {
  const SharedGpu& shared = options.shared_gpu;
  if (shared.stages_per_device != 1 && shared.stages_per_device != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stages_per_device must be 1 (a device per stage) or the stage count ", num_stages,
        " (every stage on one GPU), got ", shared.stages_per_device));
  }
  if (shared.compute_factor != 0.0 &&
      !(shared.compute_factor >= 1.0 && std::isfinite(shared.compute_factor))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the compute factor must be 0 (searched) or at least 1, got ", shared.compute_factor));
  }
  if (!(options.auto_budget_share >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("auto_budget_share must be >= 0, got ", options.auto_budget_share));
  }
  return absl::OkStatus();
}

std::int64_t MaxPeakBytes(const Schedule& schedule) {
  std::int64_t peak = 0;
  for (const StagePrediction& stage : schedule.predictions->stages) {
    peak = std::max(peak, stage.peak_bytes);
  }
  return peak;
}

std::int64_t StashSum(const Schedule& schedule) {
  std::int64_t sum = 0;
  for (const StagePrediction& stage : schedule.predictions->stages) sum += stage.peak_bytes;
  return sum;
}

// `schedule` (planned from `spec`, perhaps with another v: auto) on one GPU, from the solo costs
// of its own chunks.
absl::StatusOr<SharedGpuPrediction> OnOneGpu(const Schedule& schedule, const PipelineSpec& spec,
                                             const CostModel& solo) {
  return SimulateSharedGpu(schedule, internal::RechunkedCost(solo, spec.chunks_per_stage,
                                                             schedule.spec.chunks_per_stage));
}

// `spec` planned at compute factor `c` (c = 1 and the solo costs with a device per stage). On
// one GPU auto ranks its candidates by the one-GPU step: the compiler's model gives each stage
// its own compute, where a recompute that fills a bubble costs nothing.
absl::StatusOr<Plan> PlanAt(const PipelineSpec& spec, const CostModel& solo,
                            const PlanOptions& options, double c) {
  Plan plan;
  plan.compute_factor = c;
  plan.planned_with =
      OneGpu(options) ? SharedGpuCostModel(solo, options.shared_gpu, spec.num_stages, c) : solo;
  CompileOptions compile_options;
  if (OneGpu(options)) {
    compile_options.auto_step = [&](const Schedule& candidate) -> absl::StatusOr<double> {
      PO_ASSIGN_OR_RETURN(const SharedGpuPrediction shared, OnOneGpu(candidate, spec, solo));
      return shared.step_time;
    };
  }
  PO_ASSIGN_OR_RETURN(plan.schedule, Compile(spec, plan.planned_with, compile_options));
  if (!plan.schedule.predictions.has_value()) {
    return absl::InternalError("Compile gave no predictions");
  }
  if (OneGpu(options)) {
    PO_ASSIGN_OR_RETURN(plan.shared, OnOneGpu(plan.schedule, spec, solo));
  }
  return plan;
}

// The spec with auto's budget resolved from auto_budget_share.
absl::StatusOr<PipelineSpec> Budgeted(const PipelineSpec& spec, const CostModel& solo,
                                      const PlanOptions& options) {
  if (spec.offload != OffloadPolicy::kAuto || options.auto_budget_share <= 0) return spec;
  PipelineSpec plain = spec;  // every entry kept: a share of recompute's peak would be tiny
  plain.offload = OffloadPolicy::kNone;
  plain.recompute = Recompute::kNone;
  absl::StatusOr<Plan> baseline =
      PlanAt(plain, solo, options, OneGpu(options) ? spec.num_stages : 1.0);
  if (!baseline.ok()) return Annotate(baseline.status(), "auto: the plan without offload");
  PipelineSpec budgeted = spec;
  budgeted.memory_budget_bytes = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(options.auto_budget_share *
                                   static_cast<double>(MaxPeakBytes(baseline->schedule))));
  return budgeted;
}

// The compute factors to try for an offload plan on one GPU, largest first.
std::vector<double> SearchFactors(int num_stages) {
  std::vector<double> factors;
  for (const double share : {1.0, 0.75, 0.5, 0.25, 0.0}) {
    const double factor = std::max(1.0, num_stages * share);
    if (factors.empty() || factor < factors.back()) factors.push_back(factor);
  }
  return factors;
}

// Whether `candidate` beats `best` (see the top of planning.h): plans within the bound beat
// those over it; among those within, the smaller largest stash peak, then the smaller sum of
// peaks, then the faster one-GPU step; among those over it, the faster step.
bool Better(const Plan& candidate, const std::optional<Plan>& best, double bound) {
  if (!best.has_value()) return true;
  const bool fits = candidate.shared->step_time <= bound;
  const bool best_fits = best->shared->step_time <= bound;
  if (fits != best_fits) return fits;
  const auto key = [](const Plan& plan) {
    return std::make_tuple(MaxPeakBytes(plan.schedule), StashSum(plan.schedule),
                           plan.shared->step_time);
  };
  if (fits) return key(candidate) < key(*best);
  return std::make_pair(candidate.shared->step_time, MaxPeakBytes(candidate.schedule)) <
         std::make_pair(best->shared->step_time, MaxPeakBytes(best->schedule));
}

}  // namespace

absl::StatusOr<Plan> PlanSchedule(const PipelineSpec& spec, const CostModel& solo,
                                  const PlanOptions& options) {
  PO_RETURN_IF_ERROR(CheckOptions(options, spec.num_stages));
  PO_ASSIGN_OR_RETURN(const PipelineSpec budgeted, Budgeted(spec, solo, options));
  if (!OneGpu(options)) return PlanAt(budgeted, solo, options, 1.0);
  const double p = spec.num_stages;
  // The order without offload: the search's bound, and the plan itself when nothing moves (the
  // factor only places copies, so such plans are made at c = p). Its baseline, like every
  // plan's, keeps every entry: recompute (spec.recompute) is what the plan is compared with.
  PipelineSpec plain = budgeted;
  plain.offload = OffloadPolicy::kNone;
  if (budgeted.offload == OffloadPolicy::kNone) {
    PO_ASSIGN_OR_RETURN(Plan plan, PlanAt(plain, solo, options, p));
    plan.shared_baseline = plan.shared;
    if (plain.recompute != Recompute::kNone) {
      plain.recompute = Recompute::kNone;
      PO_ASSIGN_OR_RETURN(const Plan kept, PlanAt(plain, solo, options, p));
      plan.shared_baseline = kept.shared;
    }
    return plan;
  }
  // auto's spec.recompute is the most it may use per entry, not a choice made: the bound is the
  // step with every entry kept. Any other policy's recompute is chosen (recompute beside
  // offload): the bound is the same recompute without copies.
  if (budgeted.offload == OffloadPolicy::kAuto) plain.recompute = Recompute::kNone;
  PO_ASSIGN_OR_RETURN(Plan baseline, PlanAt(plain, solo, options, p));
  // What the plan is reported against is every entry kept, as for the recompute-only plans.
  std::optional<Plan> all_kept;
  if (plain.recompute != Recompute::kNone) {
    plain.recompute = Recompute::kNone;
    PO_ASSIGN_OR_RETURN(all_kept, PlanAt(plain, solo, options, p));
  }
  const double pinned = options.shared_gpu.compute_factor;
  const std::vector<double> factors =
      pinned > 0 ? std::vector<double>{pinned} : SearchFactors(spec.num_stages);
  // auto also weighs the other link model (SharedGpu::search_link).
  std::vector<bool> links = {options.shared_gpu.shared_link};
  if (budgeted.offload == OffloadPolicy::kAuto && options.shared_gpu.search_link) {
    links.push_back(!options.shared_gpu.shared_link);
  }
  const double bound = baseline.shared->step_time * (1.0 + options.shared_gpu.search_tolerance);
  std::optional<Plan> best;
  absl::Status first_error = absl::OkStatus();
  for (const bool shared_link : links) {
    PlanOptions at = options;
    at.shared_gpu.shared_link = shared_link;
    for (const double c : factors) {
      absl::StatusOr<Plan> plan = PlanAt(budgeted, solo, at, c);
      if (!plan.ok()) {
        if (first_error.ok()) {
          first_error = Annotate(plan.status(), absl::StrCat("at c = ", c, shared_link
                                                                        ? " (link shared)"
                                                                        : " (link split)"));
        }
        continue;
      }
      if (Better(*plan, best, bound)) best = *std::move(plan);
    }
  }
  if (!best.has_value()) return first_error;
  best->shared_baseline = all_kept.has_value() ? all_kept->shared : baseline.shared;
  return *std::move(best);
}

absl::StatusOr<Plan> ReplanSchedule(Schedule schedule, const CostModel& solo,
                                    const PlanOptions& options) {
  PO_RETURN_IF_ERROR(CheckOptions(options, schedule.spec.num_stages));
  PO_RETURN_IF_ERROR(Validate(schedule));
  Plan plan;
  const double pinned = options.shared_gpu.compute_factor;
  plan.compute_factor = !OneGpu(options) ? 1.0 : pinned > 0 ? pinned : schedule.spec.num_stages;
  plan.planned_with = OneGpu(options) ? SharedGpuCostModel(solo, options.shared_gpu,
                                                           schedule.spec.num_stages,
                                                           plan.compute_factor)
                                      : solo;
  absl::StatusOr<Timeline> timeline = Simulate(schedule, plan.planned_with);
  if (!timeline.ok()) return Annotate(timeline.status(), "simulating the given schedule");
  schedule.predictions = std::move(timeline->predictions);
  plan.schedule = std::move(schedule);
  if (OneGpu(options)) {
    PO_ASSIGN_OR_RETURN(plan.shared, SimulateSharedGpu(plan.schedule, solo));
  }
  return plan;
}

}  // namespace pipeoffload
