// pipeline_bench's flags and plans (see the header). No CUDA here.
#include "bench/pipeline_bench_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "examples/common/flags.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/planning.h"

namespace pipeoffload::bench {
namespace {

constexpr double kDryRunFlopsPerSecond = 600e12;

// recompute-MODE and recompute-MODE+po-f: every entry recomputed, and with +po-f what F
// keeps offloaded where the link carries it (issue 16).
constexpr char kWithPoF[] = "+po-f";

bool IsRecomputePolicy(const std::string& base) {
  return absl::StartsWith(base, "recompute-full") || absl::StartsWith(base, "recompute-lean");
}

// The recompute part of a recompute policy: "recompute-lean+po-f" -> "recompute-lean".
std::string RecomputePart(const std::string& base) {
  return std::string(absl::StripSuffix(base, kWithPoF));
}

bool KnownBase(const std::string& name) {
  const std::string recompute = RecomputePart(name);
  return name == "1f1b" || name == "none" || name == "po-h" || name == "po-f" ||
         name == "selective" || name == "auto" || recompute == "recompute-full" ||
         recompute == "recompute-lean";
}

bool KnownPolicy(const std::string& name) {
  const PolicyName split = SplitPolicyName(name);
  if (!KnownBase(split.base)) return false;
  const bool offloads = split.base != "1f1b" && split.base != "none" &&
                        (!IsRecomputePolicy(split.base) || absl::EndsWith(split.base, kWithPoF));
  if (split.scale < 0.0 || (!offloads && (split.scale != 0.0 || split.link_suffix))) return false;
  return split.scale == 0.0 || split.scale >= 1.0;
}

PipelineSpec PolicySpec(const BenchOptions& options, const std::string& name,
                        const Layout& layout, std::int64_t budget_bytes) {
  const std::string policy = SplitPolicyName(name).base;
  PipelineSpec spec;
  spec.family = layout.family;
  spec.num_stages = options.stages;
  spec.num_microbatches = options.Microbatches();
  spec.chunks_per_stage = layout.chunks;
  if (policy == "1f1b" || policy == "none" || IsRecomputePolicy(policy)) {
    spec.offload = absl::EndsWith(policy, kWithPoF) ? OffloadPolicy::kFull : OffloadPolicy::kNone;
    if (RecomputePart(policy) == "recompute-full") spec.recompute = Recompute::kFull;
    if (RecomputePart(policy) == "recompute-lean") spec.recompute = Recompute::kLean;
  } else {
    spec.offload = *OffloadPolicyFromName(policy);
  }
  spec.offload_fraction = policy == "selective" ? options.offload_fraction : 0.0;
  spec.memory_budget_bytes = policy == "auto" ? budget_bytes : 0;
  return spec;
}

}  // namespace

PolicyName SplitPolicyName(const std::string& name) {
  PolicyName out;
  std::string rest = name;
  if (const std::size_t colon = rest.find(':'); colon != std::string::npos) {
    const std::string suffix = rest.substr(colon);
    if (suffix != ":shared" && suffix != ":split") return PolicyName{name, -1.0, false, false};
    out.shared_link = suffix == ":shared";
    out.link_suffix = true;
    rest = rest.substr(0, colon);
  }
  const std::size_t at = rest.find('@');
  out.base = rest.substr(0, at);
  if (at == std::string::npos) return out;
  if (!absl::SimpleAtod(rest.substr(at + 1), &out.scale) || !(out.scale > 0.0) ||
      !std::isfinite(out.scale)) {
    return PolicyName{name, -1.0, false, false};  // KnownPolicy rejects it
  }
  return out;
}

namespace {

using Flag = examples::FlagDef<BenchOptions>;

// --name=VALUE: one of `names`, stored by `set`.
Flag ChoiceFlag(std::string_view name, std::string_view value_name, std::string_view help,
                std::vector<std::string_view> names,
                std::function<void(BenchOptions&, int)> set) {
  return {name, value_name, help,
          [=](BenchOptions& o, const std::string& value) -> absl::Status {
            PO_ASSIGN_OR_RETURN(const int index, examples::ParseFlagChoice(name, value, names));
            set(o, index);
            return absl::OkStatus();
          }};
}

absl::Status SetPolicies(BenchOptions& o, const std::string& value) {
  o.policies.clear();
  for (const absl::string_view name : absl::StrSplit(value, ',')) {
    std::vector<std::string> names = {std::string(name)};
    if (name == "all") names = {"1f1b", "none", "po-h", "po-f", "selective", "auto"};
    for (const std::string& one : names) {
      if (!KnownPolicy(one)) {
        return examples::BadFlagValue(
            "policies",
            "1f1b, none, po-h, po-f, selective, auto, recompute-full, recompute-lean (each "
            "optionally +po-f) or all (comma-separated; an offload policy may end in @C, C >= 1, "
            "and in :shared or :split)",
            value);
      }
      if (std::find(o.policies.begin(), o.policies.end(), one) == o.policies.end()) {
        o.policies.push_back(one);
      }
    }
  }
  return absl::OkStatus();
}

const std::vector<Flag>& BenchFlags() {
  using examples::IntFlag;
  using examples::RealFlag;
  using examples::TextFlag;
  using O = BenchOptions;
  static const auto* const kFlags = new std::vector<Flag>{
      // --- the model ---
      ChoiceFlag("model", "gemm|gpt",
                 "each stage's model: a GPT layer's four GEMMs, or the CUDA GPT layer stack "
                 "(default: gpt when this build has it, else gemm).",
                 {"gemm", "gpt"},
                 [](O& o, int i) { o.model = i == 0 ? "gemm" : "gpt"; }),
      ChoiceFlag("saved", "full|lean",
                 "gpt: lean layers save 20 h bytes per token instead of 32 h and recompute "
                 "their LayerNorm outputs and GELU before the weight gradients (default full).",
                 {"full", "lean"}, [](O& o, int i) { o.lean_saved = i == 1; }),
      IntFlag("hidden", "N", "model width h (default 4096).", &O::hidden, 64, 65536),
      IntFlag("heads", "N", "gpt: attention heads (default h / 128); must divide --hidden.",
              &O::heads, 1, 1024),
      IntFlag("seq", "N", "tokens per microbatch (default 2048).", &O::sequence, 8, 1 << 20),
      // --- the pipeline ---
      IntFlag("layers-per-chunk", "N", "layers in each chunk (default 1).", &O::layers_per_chunk,
              1, 64),
      IntFlag("microbatches", "N", "microbatches per step (default 4 p).", &O::microbatches, 1,
              4096),
      IntFlag("stages", "P", "pipeline stages p, threads on the one GPU (default 4).", &O::stages,
              1, 64),
      {"family", "NAME",
       "1f1b, interleaved or group-interleaved: the order of every policy but 1f1b (default "
       "1f1b).",
       [](O& o, const std::string& value) -> absl::Status {
         if (!FamilyFromName(value).has_value()) {
           return examples::BadFlagValue("family", "1f1b, interleaved or group-interleaved",
                                         value);
         }
         o.family = value;
         return absl::OkStatus();
       }},
      IntFlag("chunks", "V", "chunks per stage of every policy but 1f1b (default 1).", &O::chunks,
              1, 64),
      {"policies", "P,P,...",
       "the policies to run, in order (--policy is the same flag; default 1f1b). P: 1f1b (1F1B, "
       "one chunk per stage, no offload: the baseline), none (--family / --chunks, no offload), "
       "po-h, po-f, selective, auto (auto may recompute too where the model offers it), "
       "recompute-full or recompute-lean (every entry recomputed before its B from the chunk's "
       "input / the lean layout), recompute-full+po-f or recompute-lean+po-f (the same, what F "
       "keeps offloaded); all = 1f1b,none,po-h,po-f,selective,auto. An offload policy may end in "
       "@C to plan it at compute factor C, and in :shared to plan it on one link shared by the p "
       "stages (BARRIER hand-overs) instead of the default link split p ways (:split).",
       SetPolicies},
      RealFlag("offload-fraction", "X", "selective: the share of entries offloaded (default 0.5).",
               &O::offload_fraction, 0.0, 1.0),
      RealFlag("budget-gb", "G",
               "auto: the per-stage activation budget in GB (default 0: use --budget-fraction).",
               &O::budget_gb, 0.0, 1e6),
      RealFlag("budget-fraction", "X",
               "auto: the budget as this share of 1f1b's peak, when --budget-gb is 0 (default "
               "0.5).",
               &O::budget_fraction, 0.01, 1.0),
      RealFlag("planner-scale", "C",
               "the planner's compute factor for every offload policy (default 0: search 1..p).",
               &O::planner_scale, 0.0, 1024.0),
      RealFlag("sim-tolerance", "X",
               "the search's bound on the one-GPU slowdown vs no offload (default 0.01).",
               &O::sim_tolerance, 0.0, 1.0),
      // --- the run ---
      IntFlag("steps", "N", "timed steps per policy (default 5).", &O::steps, 1, 10000),
      IntFlag("warmup", "N", "untimed steps before them (default 2).", &O::warmup, 0, 10000),
      IntFlag("reps", "N", "runs of each solo chunk timing, the median kept (default 5).",
              &O::reps, 1, 1000),
      RealFlag("pcie-gbs", "G",
               "pinned PCIe GB/s, one direction alone (default 0: measure; --dry-run: the H200's "
               "55.3).",
               &O::pcie_gbs, 0.0, 1e5),
      RealFlag("duplex-gbs", "G",
               "pinned PCIe GB/s of each direction while both run (default 0: measure; --dry-run: "
               "46).",
               &O::duplex_gbs, 0.0, 1e5),
      RealFlag("wait-timeout", "S",
               "seconds a stage waits on a copy, a message or the GPU before it stops, naming the "
               "op (default 120).",
               &O::wait_timeout_s, 0.1, 3600.0),
      ChoiceFlag("release", "defer|wait|defer-uncapped",
                 "defer (default): RELEASE frees its device block once the D2H copy ends without "
                 "blocking the stage, an allocation past the predicted stash peak waiting "
                 "instead; wait: host-waits the copy first (the blocking RELEASE, to A/B); "
                 "defer-uncapped: defers without the cap, released blocks may use any free arena "
                 "memory meanwhile.",
                 {"defer", "wait", "defer-uncapped"},
                 [](O& o, int i) {
                   o.release_wait = i == 1;
                   o.release_uncapped = i == 2;
                 }),
      ChoiceFlag("p2p-reserve", "plan|worst",
                 "each arena's room for P2P buffers: the peak of their lifetimes across stages, "
                 "which the executor then holds to (plan, default), or every buffer of the step.",
                 {"plan", "worst"}, [](O& o, int i) { o.p2p_reserve_worst = i == 1; }),
      // --- output ---
      TextFlag("out", "MD", "append the markdown table to this file too.", &O::out),
      TextFlag("json", "JSONL", "append one JSON line of results to this file.", &O::json),
      TextFlag("trace-dir", "DIR",
               "write each policy's last measured step here as Chrome trace JSON.",
               &O::trace_dir),
      // --- without a GPU ---
      examples::SwitchFlag("dry-run",
                           "no GPU: estimated costs, plans and predictions only (--forward-ms "
                           "and the rest give one chunk's times alone, as a run measures them).",
                           &O::dry_run),
      RealFlag("forward-ms", "F",
               "--dry-run: one chunk's F alone (default 0: estimate at 600 TFLOP/s).",
               &O::forward_ms, 0.0, 1e6),
      RealFlag("backward-ms", "B", "--dry-run: one chunk's B alone (default 0: twice F).",
               &O::backward_ms, 0.0, 1e6),
      RealFlag("recompute-ms", "R", "--dry-run: one chunk's full recompute (default 0: F).",
               &O::recompute_ms, 0.0, 1e6),
      RealFlag("lean-ms", "L", "--dry-run: one chunk's lean recompute (default 0: F / 4).",
               &O::lean_ms, 0.0, 1e6),
      TextFlag("summarize", "JSONL",
               "no GPU: print issue 5's checklist over these earlier runs' --json lines.",
               &O::summarize),
      TextFlag("peer", "JSONL", "with --summarize: scripts/torch_peer.py's JSON lines.",
               &O::peer),
      examples::HelpFlag(&O::help),
  };
  return *kFlags;
}

}  // namespace

std::string BenchHelpText() {
  return examples::FlagsHelpText(
      "usage: pipeline_bench [flags]\n"
      "       pipeline_bench --dry-run [flags]\n"
      "       pipeline_bench --summarize=JSONL [--peer=TORCH_JSONL] [--out=MD]\n"
      "\n"
      "Runs p pipeline stages as threads on one GPU under each policy and prints, per policy,\n"
      "the measured step beside the predicted one, stash peaks, offloaded bytes and memory\n"
      "(a markdown table and, with --json, a JSON line). Flags take --name=VALUE or --name VALUE.\n"
      "Exit status: 0 ok, 1 a failure, 2 bad flags, 77 no usable GPU.\n",
      BenchFlags());
}

absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, char** argv) {
  BenchOptions options;
  PO_RETURN_IF_ERROR(examples::ParseFlags(examples::FlagArgs(argc, argv), BenchFlags(), options,
                                          {{"policy", "policies"}}));
  if (options.help) return options;
  if (!options.peer.empty() && options.summarize.empty()) {
    return absl::InvalidArgumentError("--peer needs --summarize (the checklist reads both)");
  }
  if (options.hidden % options.Heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--heads=", options.Heads(),
                                                   " must divide --hidden=", options.hidden));
  }
  return options;
}

Layout PolicyLayout(const BenchOptions& options, const std::string& name) {
  if (SplitPolicyName(name).base == "1f1b") {
    return Layout{Family::k1F1B, 1, options.LayersPerStage()};
  }
  return Layout{*FamilyFromName(options.family), options.chunks, options.layers_per_chunk};
}

std::string LayoutName(const Layout& layout) {
  std::string name(FamilyName(layout.family));
  if (layout.family != Family::k1F1B || layout.chunks > 1) {
    absl::StrAppend(&name, " v=", layout.chunks);
  }
  absl::StrAppend(&name, ", ", layout.layers_per_chunk, " layer(s)/chunk");
  return name;
}

ChunkCosts RescaleChunk(const ChunkCosts& costs, int from_layers, int to_layers) {
  if (from_layers == to_layers) return costs;
  const double factor = static_cast<double>(to_layers) / from_layers;
  ChunkCosts out = costs;
  out.times.forward *= factor;
  out.times.backward *= factor;
  out.saved_bytes = costs.saved_bytes / from_layers * to_layers;
  out.recompute_full_s *= factor;
  out.recompute_lean_s *= factor;
  // Full recompute keeps the chunk's input whatever its depth; lean keeps a part of each layer.
  if (costs.retained_lean_bytes > 0) {
    out.retained_lean_bytes = costs.retained_lean_bytes / from_layers * to_layers;
  }
  return out;
}

bool PlansRecompute(const BenchOptions& options) {
  for (const std::string& name : options.policies) {
    const std::string base = SplitPolicyName(name).base;
    if (IsRecomputePolicy(base) || base == "auto") return true;
  }
  return false;
}

CostModel SoloCostModel(const BenchOptions& options, const Layout& layout,
                        const ChunkCosts& costs, const LinkFigures& link) {
  CostModel cost;
  cost.forward_time = costs.times.forward;
  cost.backward_time = costs.times.backward / 2.0;
  cost.weight_time = costs.times.backward / 2.0;
  cost.d2h_bandwidth = link.d2h;
  cost.h2d_bandwidth = link.h2d;
  cost.duplex_bandwidth = link.duplex;
  cost.p2p_bandwidth = 1e12;  // device-to-device on one GPU (~2 TB/s read + write)
  cost.p2p_latency = 10e-6;   // the copier's launch and host poll
  cost.host_link_group_size = options.stages;
  if (costs.recompute_full_s >= 0) cost.recompute_full_time = costs.recompute_full_s;
  if (costs.recompute_lean_s >= 0) cost.recompute_lean_time = costs.recompute_lean_s;
  // Per-virtual-stage bytes also hold auto to this layout's v: the models are built for one
  // chunking, and auto would otherwise re-cut the layers into v' chunks.
  // Retained bytes <= 0: the model does not offer that recompute (WithModelSizes: 0 bytes).
  const auto per_virtual_stage = [&](std::int64_t bytes) {
    return std::vector<std::int64_t>(static_cast<std::size_t>(options.stages * layout.chunks),
                                     bytes);
  };
  return WithModelSizes(cost, ModelSizes{per_virtual_stage(costs.saved_bytes), costs.boundary_bytes,
                                         per_virtual_stage(costs.retained_full_bytes),
                                         per_virtual_stage(costs.retained_lean_bytes),
                                         per_virtual_stage(costs.lean_rebuild_bytes)});
}

std::int64_t MaxPeakBytes(const Schedule& schedule) {
  std::int64_t peak = 0;
  for (const StagePrediction& stage : schedule.predictions.value().stages) {
    peak = std::max(peak, stage.peak_bytes);
  }
  return peak;
}

absl::StatusOr<PlannedPolicy> PlanPolicy(const BenchOptions& options, const std::string& policy,
                                         const ChunkCosts& costs, int costs_layers_per_chunk,
                                         const LinkFigures& link, std::int64_t auto_budget) {
  const Layout layout = PolicyLayout(options, policy);
  const ChunkCosts chunk = RescaleChunk(costs, costs_layers_per_chunk, layout.layers_per_chunk);
  const PolicyName name = SplitPolicyName(policy);
  PlannedPolicy plan;
  plan.name = policy;
  plan.solo = SoloCostModel(options, layout, chunk, link);
  PlanOptions plan_options;
  plan_options.shared_gpu.stages_per_device = options.stages;
  plan_options.shared_gpu.compute_factor = name.scale > 0 ? name.scale : options.planner_scale;
  plan_options.shared_gpu.shared_link = name.shared_link;
  plan_options.shared_gpu.search_link = !name.link_suffix;  // auto:split / auto:shared pin it
  plan_options.shared_gpu.search_tolerance = options.sim_tolerance;
  PipelineSpec spec = PolicySpec(options, policy, layout, auto_budget);
  // auto's most per entry: keep, offload, lean or full, as far as the model offers them.
  if (name.base == "auto" && (chunk.retained_full_bytes > 0 || chunk.retained_lean_bytes > 0)) {
    spec.recompute = chunk.retained_full_bytes > 0 ? Recompute::kFull : Recompute::kLean;
  }
  absl::StatusOr<Plan> planned = PlanSchedule(spec, plan.solo, plan_options);
  if (!planned.ok()) return Annotate(planned.status(), absl::StrCat("policy ", policy));
  plan.schedule = std::move(planned->schedule);
  plan.shared = *planned->shared;
  plan.base_step = planned->shared_baseline->step_time;
  plan.planner_scale = planned->compute_factor;
  plan.shared_link = planned->planned_with.host_link_group_size > 1;
  plan.layout = layout;
  plan.layout.family = plan.schedule.spec.family;  // auto's choice
  plan.layout.chunks = plan.schedule.spec.chunks_per_stage;
  for (const std::string& warning : plan.schedule.predictions->warnings) {
    if (warning.rfind("auto: chose", 0) == 0) plan.auto_choice = warning;
  }
  return plan;
}

absl::StatusOr<std::vector<PlannedPolicy>> PlanPolicies(const BenchOptions& options,
                                                        const ChunkCosts& costs,
                                                        const LinkFigures& link) {
  std::int64_t budget = static_cast<std::int64_t>(options.budget_gb * 1e9);
  const bool has_auto =
      std::any_of(options.policies.begin(), options.policies.end(),
                  [](const std::string& name) { return SplitPolicyName(name).base == "auto"; });
  if (budget == 0 && has_auto) {
    PO_ASSIGN_OR_RETURN(const PlannedPolicy base,
                        PlanPolicy(options, "1f1b", costs, options.layers_per_chunk, link, 0));
    budget = static_cast<std::int64_t>(static_cast<double>(MaxPeakBytes(base.schedule)) *
                                       options.budget_fraction);
  }
  std::vector<PlannedPolicy> plans;
  for (const std::string& policy : options.policies) {
    PO_ASSIGN_OR_RETURN(PlannedPolicy plan,
                        PlanPolicy(options, policy, costs, options.layers_per_chunk, link, budget));
    plans.push_back(std::move(plan));
  }
  return plans;
}

absl::StatusOr<double> CalibrationScale(double measured_baseline_step,
                                        double predicted_baseline_step) {
  for (const double step : {measured_baseline_step, predicted_baseline_step}) {
    if (!(step > 0.0) || !std::isfinite(step)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration needs positive finite baseline steps; measured ", measured_baseline_step,
          " s, predicted ", predicted_baseline_step, " s"));
    }
  }
  return measured_baseline_step / predicted_baseline_step;
}

absl::StatusOr<SharedGpuPrediction> CalibratedPrediction(const PlannedPolicy& plan,
                                                         double scale) {
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration scale ", scale, " is not positive and finite"));
  }
  // Compute only: the copies' bandwidths are measured on the link, not derived from F and B.
  absl::StatusOr<SharedGpuPrediction> out =
      SimulateSharedGpu(plan.schedule, ScaleComputeTimes(plan.solo, scale));
  if (!out.ok()) return Annotate(out.status(), absl::StrCat("policy ", plan.name, " calibrated"));
  return out;
}

absl::Status Calibrate(const std::vector<std::optional<PlannedPolicy>>& plans, BenchRun& run) {
  PO_CHECK(plans.size() == run.policies.size());
  const auto ran = [](const PolicyRun& result) {
    return result.error.empty() && !result.step_seconds.empty();
  };
  const PolicyRun* base = run.Find("1f1b");
  if (base == nullptr || !ran(*base)) return absl::OkStatus();
  PO_ASSIGN_OR_RETURN(const double scale,
                      CalibrationScale(base->MedianStep(), base->predicted_step));
  run.calibration_scale = scale;
  absl::Status first_error = absl::OkStatus();
  for (std::size_t i = 0; i < plans.size(); ++i) {
    PolicyRun& result = run.policies[i];
    if (!plans[i].has_value() || !ran(result)) continue;
    absl::StatusOr<SharedGpuPrediction> calibrated = CalibratedPrediction(*plans[i], scale);
    if (!calibrated.ok()) {
      if (first_error.ok()) first_error = calibrated.status();
      continue;
    }
    result.calibrated_step = calibrated->step_time;
  }
  return first_error;
}

ArenaSizing BenchArenaSizing(const Schedule& schedule) {
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) {
      if (IsRecompute(op.kind)) return ArenaSizing{};  // the library's headroom
    }
  }
  ArenaSizing sizing;
  sizing.fragmentation_share = 0.0;
  sizing.spare_largest_entry = false;
  return sizing;
}

double ModelFlopsPerStep(const BenchOptions& options) {
  const double h = options.hidden;
  const double s = options.sequence;
  const double layers = static_cast<double>(options.stages) * options.LayersPerStage();
  return (72.0 * h * h * s + 12.0 * s * s * h) * layers * options.Microbatches();
}

ChunkTimes EstimatedChunkTimes(const BenchOptions& options) {
  const double h = options.hidden;
  const double s = options.sequence;
  const double forward =
      options.forward_ms > 0
          ? options.forward_ms / 1e3
          : (24.0 * h * h * s + 4.0 * s * s * h) * options.layers_per_chunk / kDryRunFlopsPerSecond;
  return ChunkTimes{forward, options.backward_ms > 0 ? options.backward_ms / 1e3 : 2.0 * forward};
}

namespace {

// How `plan` saw the link: "link split 4 ways, 0 BARRIERs" / "link shared, 12 BARRIERs" (no
// copies: "no copies").
std::string LinkModeName(const PlannedPolicy& plan, const BenchOptions& options) {
  int barriers = 0;
  for (const StageProgram& program : plan.schedule.stages) {
    for (const Op& op : program.ops) barriers += op.kind == OpKind::kBarrier ? 1 : 0;
  }
  const PolicyName name = SplitPolicyName(plan.name);
  if (name.base == "1f1b" || name.base == "none") return "no copies";
  if (plan.shared_link) return absl::StrCat("link shared, ", barriers, " BARRIERs");
  return absl::StrCat("link split ", options.stages, " ways, ", barriers, " BARRIERs");
}

}  // namespace

std::string PlansToText(const BenchOptions& options, const ChunkCosts& costs,
                        const std::vector<PlannedPolicy>& plans) {
  std::string out = absl::StrFormat(
      "pipeline_bench plans: h=%d s=%d layers/chunk=%d p=%d m=%d v=%d family=%s; chunk F %.3f "
      "ms, B %.3f ms alone, entry %.3f GB; planner sees compute x c (c <= %d) and each stage "
      "1/%d of the link (:shared: one link, BARRIER hand-overs)\n",
      options.hidden, options.sequence, options.layers_per_chunk, options.stages,
      options.Microbatches(), options.chunks, options.family, costs.times.forward * 1e3,
      costs.times.backward * 1e3, static_cast<double>(costs.saved_bytes) / 1e9, options.stages,
      options.stages);
  for (const PlannedPolicy& plan : plans) {
    const Predictions& predicted = *plan.schedule.predictions;
    absl::StrAppendFormat(
        &out,
        "%s (%s, planned at %gx, %s): one-GPU step %.4f s (%+.1f%% vs no offload; serial "
        "%.4f, idle %.4f, copy stalls %.4f); planner step %.4f s (%.4f without offload)",
        plan.name, LayoutName(plan.layout), plan.planner_scale, LinkModeName(plan, options),
        plan.shared.step_time,
        plan.base_step > 0 ? (plan.shared.step_time / plan.base_step - 1) * 100 : 0.0,
        plan.shared.compute_work, plan.shared.gpu_idle, plan.shared.copy_stall,
        predicted.step_time, predicted.step_time_without_offload);
    // The arenas as a run sizes them (P2P room from the lifetimes unless --p2p-reserve=worst).
    const P2PReserve reserve = options.p2p_reserve_worst ? P2PReserve::kWorstCase
                                                         : P2PReserve::kPlanned;
    const absl::StatusOr<std::vector<P2PLifetimes>> p2p = AnalyzeP2P(plan.schedule);
    // The retained bytes back in the model's terms: the cost model's 0 is "not offered", -1.
    const auto offered = [](std::vector<std::int64_t> bytes) {
      for (std::int64_t& b : bytes) b = b > 0 ? b : -1;
      return bytes;
    };
    const ModelSizes sizes{plan.solo.activation_bytes_per_virtual_stage, plan.solo.boundary_bytes,
                           offered(plan.solo.retained_full_bytes_per_virtual_stage),
                           offered(plan.solo.retained_lean_bytes_per_virtual_stage),
                           plan.solo.lean_rebuild_bytes_per_virtual_stage};
    for (std::size_t d = 0; d < predicted.stages.size(); ++d) {
      const StagePrediction& stage = predicted.stages[d];
      const absl::StatusOr<ArenaNeed> arena = StageArenaNeed(
          plan.schedule, static_cast<int>(d), sizes, reserve, p2p.ok() ? &(*p2p)[d] : nullptr,
          BenchArenaSizing(plan.schedule));
      absl::StrAppendFormat(&out,
                            "\n  stage %d: peak %d entries %.3f GB (%d / %.3f GB without "
                            "offload), offload %.3f GB, arena %s",
                            static_cast<int>(d), stage.peak_units, stage.peak_bytes / 1e9,
                            stage.peak_units_without_offload,
                            stage.peak_bytes_without_offload / 1e9, stage.offloaded_bytes / 1e9,
                            arena.ok() ? absl::StrFormat("%.3f GB", arena->budget_bytes / 1e9)
                                       : arena.status().ToString());
    }
    for (const std::string& warning : predicted.warnings) {
      absl::StrAppend(&out, "\n  warning: ", warning);
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace pipeoffload::bench
