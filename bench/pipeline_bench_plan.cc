// pipeline_bench's flags and plans (see the header). No CUDA here.
#include "bench/pipeline_bench_plan.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload::bench {
namespace {

constexpr std::int64_t kArenaAlignment = 256;  // DeviceArenaOptions' default

std::int64_t AlignUp(std::int64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

absl::Status BadFlag(const std::string& flag, const std::string& value, const char* accepts) {
  return absl::InvalidArgumentError(
      absl::StrCat("bad ", flag, "=", value, ": expected ", accepts));
}

absl::Status ParseIntFlag(const std::string& flag, const std::string& value, int low, int high,
                          int* out) {
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < low || parsed > high) {
    return BadFlag(flag, value, absl::StrCat("an integer in [", low, ", ", high, "]").c_str());
  }
  *out = parsed;
  return absl::OkStatus();
}

absl::Status ParseDoubleFlag(const std::string& flag, const std::string& value, double low,
                             double* out) {
  double parsed = 0.0;
  if (!absl::SimpleAtod(value, &parsed) || !(parsed >= low)) {
    return BadFlag(flag, value, absl::StrCat("a number >= ", low).c_str());
  }
  *out = parsed;
  return absl::OkStatus();
}

bool KnownPolicy(const std::string& name) {
  return name == "1f1b" || name == "po-h" || name == "po-f" || name == "selective" ||
         name == "auto";
}

absl::StatusOr<Schedule> CompilePolicy(const BenchOptions& options, const CostModel& cost,
                                       const std::string& policy, std::int64_t budget_bytes) {
  PipelineSpec spec;
  spec.family = *FamilyFromName(options.family);
  spec.num_stages = options.stages;
  spec.num_microbatches = options.Microbatches();
  spec.chunks_per_stage = options.chunks;
  if (policy == "1f1b") {
    spec.offload = OffloadPolicy::kNone;
  } else {
    spec.offload = *OffloadPolicyFromName(policy);
  }
  spec.offload_fraction = options.offload_fraction;
  spec.memory_budget_bytes = budget_bytes;
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  if (!schedule.ok()) return Annotate(schedule.status(), absl::StrCat("policy ", policy));
  if (!schedule->predictions.has_value()) {
    return absl::InternalError(absl::StrCat("policy ", policy, ": Compile gave no predictions"));
  }
  return schedule;
}

// REQUIRES: schedule.predictions (CompilePolicy checks).
std::int64_t MaxPeakBytes(const Schedule& schedule) {
  std::int64_t peak = 0;
  const std::vector<StagePrediction>& stages = schedule.predictions.value().stages;
  for (std::size_t d = 0; d < stages.size(); ++d) peak = std::max(peak, stages[d].peak_bytes);
  return peak;
}

}  // namespace

const char kBenchUsage[] =
    "usage: pipeline_bench [--hidden=4096] [--seq=2048] [--layers-per-chunk=1] "
    "[--microbatches=4p] [--stages=4] [--family=1f1b|interleaved|group-interleaved] "
    "[--chunks=1] [--policy=P | --policies=P,P,...|all] (P: 1f1b|po-h|po-f|selective|auto) "
    "[--offload-fraction=0.5] [--budget-gb=G] [--steps=5] [--warmup=2] [--reps=5] "
    "[--pcie-gbs=55] [--duplex-gbs=46] [--out=PATH] [--dry-run]\n";

GemmShape BenchOptions::Shape() const {
  GemmShape shape;
  shape.hidden = hidden;
  shape.sequence = sequence;
  shape.layers_per_chunk = layers_per_chunk;
  shape.chunks_per_stage = chunks;
  return shape;
}

absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, char** argv) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dry-run") {
      options.dry_run = true;
      continue;
    }
    const std::size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown argument '", arg, "' (flags are --name=value)"));
    }
    const std::string flag = arg.substr(0, eq);
    const std::string value = arg.substr(eq + 1);
    if (flag == "--hidden") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 64, 65536, &options.hidden));
    } else if (flag == "--seq") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 8, 1 << 20, &options.sequence));
    } else if (flag == "--layers-per-chunk") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 1, 64, &options.layers_per_chunk));
    } else if (flag == "--microbatches") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 1, 4096, &options.microbatches));
    } else if (flag == "--stages") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 1, 64, &options.stages));
    } else if (flag == "--chunks") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 1, 64, &options.chunks));
    } else if (flag == "--family") {
      if (!FamilyFromName(value).has_value()) {
        return BadFlag(flag, value, "1f1b, interleaved or group-interleaved");
      }
      options.family = value;
    } else if (flag == "--policy" || flag == "--policies") {
      options.policies.clear();
      if (value == "all") {
        options.policies = {"1f1b", "po-h", "po-f"};
      } else {
        for (const absl::string_view name : absl::StrSplit(value, ',')) {
          if (!KnownPolicy(std::string(name))) {
            return BadFlag(flag, value, "1f1b, po-h, po-f, selective or auto (comma-separated), "
                                        "or all");
          }
          options.policies.emplace_back(name);
        }
      }
    } else if (flag == "--offload-fraction") {
      PO_RETURN_IF_ERROR(ParseDoubleFlag(flag, value, 0.0, &options.offload_fraction));
      if (options.offload_fraction > 1.0) return BadFlag(flag, value, "a number in [0, 1]");
    } else if (flag == "--budget-gb") {
      PO_RETURN_IF_ERROR(ParseDoubleFlag(flag, value, 0.0, &options.budget_gb));
    } else if (flag == "--steps") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 1, 10000, &options.steps));
    } else if (flag == "--warmup") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 0, 10000, &options.warmup));
    } else if (flag == "--reps") {
      PO_RETURN_IF_ERROR(ParseIntFlag(flag, value, 1, 1000, &options.reps));
    } else if (flag == "--pcie-gbs") {
      PO_RETURN_IF_ERROR(ParseDoubleFlag(flag, value, 0.001, &options.pcie_gbs));
    } else if (flag == "--duplex-gbs") {
      PO_RETURN_IF_ERROR(ParseDoubleFlag(flag, value, 0.001, &options.duplex_gbs));
    } else if (flag == "--out") {
      options.out = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    }
  }
  PO_RETURN_IF_ERROR(CheckGemmShape(options.Shape()));
  return options;
}

ChunkTimes EstimatedChunkTimes(const BenchOptions& options) {
  constexpr double kAssumedFlopsPerSecond = 600e12;
  const double forward = options.Shape().ForwardFlops() / kAssumedFlopsPerSecond;
  return ChunkTimes{forward, 2.0 * forward};
}

CostModel BenchCostModel(const BenchOptions& options, const ChunkTimes& times) {
  const GemmShape shape = options.Shape();
  CostModel cost;
  cost.forward_time = times.forward;
  cost.backward_time = times.backward / 2.0;
  cost.weight_time = times.backward / 2.0;
  cost.activation_bytes = shape.SavedBytes();
  cost.boundary_bytes = shape.BoundaryBytes();
  cost.d2h_bandwidth = options.pcie_gbs * 1e9;
  cost.h2d_bandwidth = options.pcie_gbs * 1e9;
  cost.duplex_bandwidth = options.duplex_gbs * 1e9;
  cost.p2p_bandwidth = 1e12;  // device-to-device on one GPU
  cost.p2p_latency = 10e-6;
  return cost;
}

absl::StatusOr<std::vector<PlannedPolicy>> PlanPolicies(const BenchOptions& options,
                                                        const ChunkTimes& times) {
  const CostModel cost = BenchCostModel(options, times);
  std::int64_t budget = static_cast<std::int64_t>(options.budget_gb * 1e9);
  if (budget == 0 && std::find(options.policies.begin(), options.policies.end(), "auto") !=
                         options.policies.end()) {
    absl::StatusOr<Schedule> base = CompilePolicy(options, cost, "1f1b", 0);
    if (!base.ok()) return base.status();
    budget = MaxPeakBytes(*base) / 2;
  }
  std::vector<PlannedPolicy> plans;
  for (const std::string& policy : options.policies) {
    PO_ASSIGN_OR_RETURN(Schedule schedule, CompilePolicy(options, cost, policy, budget));
    plans.push_back(PlannedPolicy{policy, std::move(schedule)});
  }
  return plans;
}

std::int64_t ArenaBudget(const Schedule& schedule, int stage, std::int64_t boundary_bytes) {
  const StagePrediction& predicted =
      schedule.predictions->stages[static_cast<std::size_t>(stage)];
  const StageProgram& program = schedule.stages[static_cast<std::size_t>(stage)];
  // Stash: the predicted peak, each entry rounded up to the alignment.
  const std::int64_t entry = predicted.peak_units > 0 ? predicted.peak_bytes / predicted.peak_units
                                                      : 0;
  const std::int64_t stash = predicted.peak_units * AlignUp(entry);
  // P2P: every block a SEND or RECV op uses could be live at once (a bound, not a prediction),
  // plus the outputs of the F/B ops that feed the sends.
  std::int64_t p2p_ops = 0;
  for (const Op& op : program.ops) p2p_ops += IsP2P(op.kind) ? 1 : 0;
  return stash + (p2p_ops + 2) * AlignUp(boundary_bytes) + kArenaAlignment;
}

std::string PlansToText(const BenchOptions& options, const ChunkTimes& times,
                        const std::vector<PlannedPolicy>& plans) {
  std::string out = absl::StrFormat(
      "pipeline_bench --dry-run: h=%d s=%d layers/chunk=%d p=%d m=%d v=%d family=%s, "
      "F %.3f ms B %.3f ms (estimated)\n",
      options.hidden, options.sequence, options.layers_per_chunk, options.stages,
      options.Microbatches(), options.chunks, options.family, times.forward * 1e3,
      times.backward * 1e3);
  for (const PlannedPolicy& plan : plans) {
    const Predictions& predicted = *plan.schedule.predictions;
    absl::StrAppendFormat(&out, "%s: step %.4f s (%.4f without offload)", plan.name,
                          predicted.step_time, predicted.step_time_without_offload);
    for (std::size_t d = 0; d < predicted.stages.size(); ++d) {
      const StagePrediction& stage = predicted.stages[d];
      absl::StrAppendFormat(&out,
                            " | stage %d peak %d entries %.2f GB, offload %.2f GB, arena %.2f GB",
                            static_cast<int>(d), stage.peak_units, stage.peak_bytes / 1e9,
                            stage.offloaded_bytes / 1e9,
                            ArenaBudget(plan.schedule, static_cast<int>(d),
                                        options.Shape().BoundaryBytes()) / 1e9);
    }
    for (const std::string& warning : predicted.warnings) {
      absl::StrAppend(&out, "\n  warning: ", warning);
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace pipeoffload::bench
