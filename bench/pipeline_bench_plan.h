// pipeline_bench's GPU-free half: its flags, the cost models it builds from measured chunk
// times and copy bandwidths, and the compiled schedule of each policy with its predictions.
// Kept apart from the CUDA code so --dry-run (and a reader, and the tests) can check the plans
// on a machine without a GPU.
//
// Stages that share one GPU. pipeline_bench runs p stages as threads on ONE GPU with ONE PCIe
// link, so its plans are the library's one-GPU plans (pipeoffload/planning.h derives them:
// compute x c, the link split p ways or, with ":shared", one link with BARRIER hand-overs, and
// the search of c judged by SimulateSharedGpu, pipeoffload/shared_gpu.h). What stays here is
// the bench's own part:
//  - The planner's step prediction is that of p GPUs each 1/p as fast: it counts the warm-up
//    and cool-down bubble, which on one GPU the other stages' work fills. The step to compare
//    with the measured one is SimulateSharedGpu's from the SOLO costs (SoloCostModel). After
//    the run, the bench also gives a CALIBRATED prediction (CalibrationScale below): the solo
//    costs miss the in-pipeline compute by -10..+5%, which the 1f1b baseline's measured step
//    measures.
//  - The policies by name (po-f@C pins c, :shared plans on one link), their layouts, the flags,
//    and the arena sizing of a benchmark that reports memory (BenchArenaSizing).
#ifndef PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_
#define PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/pipeline_bench_report.h"
#include "pipeoffload/calibrate.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/planning.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/shared_gpu.h"

namespace pipeoffload::bench {

// The --help text: a usage header, then every flag of the table that ParseBenchOptions reads.
std::string BenchHelpText();

struct BenchOptions {
  std::string model;  // "gemm" | "gpt"; empty = gpt when this build has it, else gemm
  // --saved=lean (gpt): layers save 20 h instead of 32 h bytes per token, recomputing their
  // LayerNorm outputs and GELU before the weight gradients (LayerStackShape::lean_saved).
  bool lean_saved = false;
  int hidden = 4096;
  int heads = 0;  // gpt: 0 = hidden / 128
  int sequence = 2048;
  int layers_per_chunk = 1;
  int microbatches = 0;  // 0 = 4 * stages
  int stages = 4;
  int chunks = 1;
  std::string family = "1f1b";
  // Each: 1f1b (1F1B, v = 1, no offload: the baseline), none (--family/--chunks, no offload),
  // po-h, po-f, selective, auto (on --family/--chunks; auto may pick another family); an
  // offload policy may end in @C to pin the planner's compute factor C and in :shared to plan
  // on the one shared link (see the top and PolicyName). recompute-full / recompute-lean: on
  // --family/--chunks, every entry recomputed before its B (StageModel::ForwardRetaining /
  // RecomputeSaved) with the chunk's input / the lean layout kept, no offload. auto may also
  // choose recompute, per entry, where the model offers it (ChunkCosts::retained_*).
  std::vector<std::string> policies = {"1f1b"};
  double offload_fraction = 0.5;   // selective
  double budget_gb = 0.0;          // auto: per-stage activation budget in GB ...
  double budget_fraction = 0.5;    // ... or, when budget_gb is 0, this share of 1f1b's peak
  int steps = 5;
  int warmup = 2;
  int reps = 5;
  double pcie_gbs = 0.0;    // 0 = measure (one direction alone)
  double duplex_gbs = 0.0;  // 0 = measure (each direction while both run)
  double forward_ms = 0.0;   // --dry-run: one chunk's F alone (0 = estimate at 600 TFLOP/s)
  double backward_ms = 0.0;  // --dry-run: one chunk's B alone (0 = twice F)
  double recompute_ms = 0.0;  // --dry-run: one chunk's full recompute (0 = its F)
  double lean_ms = 0.0;       // --dry-run: one chunk's lean recompute (0 = a quarter of its F)
  double planner_scale = 0.0;   // c above; 0 = search
  double sim_tolerance = 0.01;  // the search's bound on one-GPU slowdown vs no offload
  // How long a step's stage may wait for a copy, a message or the GPU before it stops with
  // the op it waits on (the executor's watchdog); the other stages then stop too.
  double wait_timeout_s = 120.0;
  // --release=wait: RELEASE host-waits its D2H copy and frees the block at once (the blocking
  // RELEASE of earlier runtimes; ActivationStashOptions::wait_for_copy_at_release), so a batch
  // can A/B it against the default, defer (the free waits for the copy, the thread does not;
  // a stash allocation that would take the stash past its predicted peak waits for the oldest
  // copy instead). --release=defer-uncapped: released blocks may hold any free arena memory
  // until their copies end (ExecutorOptions::stash_physical_slack_bytes = -1): no waits, more
  // memory.
  bool release_wait = false;
  bool release_uncapped = false;
  // --p2p-reserve=worst: each arena reserves every SEND/RECV buffer of the step (the reserve of
  // earlier runs) and the executor gets no P2P plan; the default, plan, reserves the peak of
  // AnalyzeP2P's lifetimes and has the executor hold to it.
  bool p2p_reserve_worst = false;
  std::string out;          // append the markdown here too
  std::string json;         // append one JSON line of results here
  std::string trace_dir;    // write each policy's last measured step as Chrome trace JSON here
  std::string summarize;    // no GPU: read these JSON lines, print the checklist
  std::string peer;         // with summarize: torch_peer.py's JSON lines
  bool dry_run = false;
  bool help = false;  // --help (-h): print BenchHelpText() and exit 0

  int Microbatches() const { return microbatches > 0 ? microbatches : 4 * stages; }
  int Heads() const { return heads > 0 ? heads : hidden / 128 > 0 ? hidden / 128 : 1; }
  int LayersPerStage() const { return layers_per_chunk * chunks; }
};

// A policy as given: "po-f@2" is po-f planned at compute factor 2 (scale 0: search; -1: a
// malformed factor or suffix). An offload policy plans on the link split p ways by default
// (host_link_group_size = 1, each stage 1/p of every bandwidth, no BARRIERs); "po-f:shared"
// plans it on one link shared by the p stages (host_link_group_size = p, full bandwidth,
// BARRIER hand-overs), the mode before the split became the default. ":split" names the
// default and changes nothing (old command lines keep working). Factor and suffix combine in
// that order: "po-f@3:shared".
struct PolicyName {
  std::string base;
  double scale = 0.0;
  bool shared_link = false;  // ":shared"
  bool link_suffix = false;  // ":shared" or ":split" was given (offload policies only)
};
PolicyName SplitPolicyName(const std::string& name);

// Parses argv[1..) with the programs' one flag parser (examples/common/flags.h): --name=VALUE
// or --name VALUE, switches bare. After --help it returns at once, unchecked. Errors:
// InvalidArgument naming the flag and what it accepts.
[[nodiscard]] absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, char** argv);

// How a policy cuts each stage's layers: `chunks` chunks of `layers_per_chunk` layers each,
// ordered by `family`. "1f1b" is 1F1B with one chunk of all the stage's layers; the others
// use --family and --chunks.
struct Layout {
  Family family = Family::k1F1B;
  int chunks = 1;
  int layers_per_chunk = 1;
  friend bool operator==(const Layout&, const Layout&) = default;
};
Layout PolicyLayout(const BenchOptions& options, const std::string& policy);
// "group-interleaved v=2, 1 layer(s)/chunk".
std::string LayoutName(const Layout& layout);

// What the cost model needs of a chunk of some layout, measured on the GPU (or estimated).
struct ChunkCosts {
  ChunkTimes times;                 // alone on the GPU
  std::int64_t saved_bytes = 0;     // one stash entry
  std::int64_t boundary_bytes = 0;  // one P2P message
  // StageModel::RetainedBytes(0, kFull / kLean): what F keeps of an entry recomputed that way;
  // <= 0: the model does not offer it (the planner never chooses it).
  std::int64_t retained_full_bytes = 0;
  std::int64_t retained_lean_bytes = 0;
  // What a RECOMPUTE_LEAN allocates (CostModel::lean_rebuild_bytes): 0 where the model's B
  // reads the lean block in place (StageModel::BackwardReadsRetained), -1 the whole entry.
  std::int64_t lean_rebuild_bytes = -1;
  // Seconds of the RECOMPUTE / RECOMPUTE_LEAN ops (MeasureRecompute); < 0: the cost model
  // derives them from the forward. 0 is a time like any other: a lean op whose B reads the
  // block in place runs nothing.
  double recompute_full_s = -1.0;
  double recompute_lean_s = -1.0;
};

// Whether some policy of `options` plans recompute (recompute-full, recompute-lean, auto): the
// models are then built to offer it (LayerStackShape::recompute).
bool PlansRecompute(const BenchOptions& options);

// `costs` of a chunk of `from` layers, rescaled to chunks of `to` layers (times and saved bytes
// are per layer times layers; the boundary stays).
ChunkCosts RescaleChunk(const ChunkCosts& costs, int from_layers, int to_layers);

// Costs as measured alone: F, B split evenly into B and W (the spec does not split W, so one B
// op costs both), each virtual stage's entry of `layout` at costs.saved_bytes (which holds auto
// to the layout's v), the link figures, and a fast P2P link (device-to-device on one GPU).
// host_link_group_size = p: one link.
CostModel SoloCostModel(const BenchOptions& options, const Layout& layout,
                        const ChunkCosts& costs, const LinkFigures& link);

struct PlannedPolicy {
  std::string name;  // as given: "1f1b", "po-h", ...
  Layout layout;     // the layout the schedule runs (auto: the family it picked)
  Schedule schedule;  // compiled under SharedGpuCostModel at planner_scale, with predictions
  CostModel solo;     // SoloCostModel of the layout
  SharedGpuPrediction shared;  // SimulateSharedGpu(schedule, solo)
  std::string auto_choice;     // auto: the compiler's "auto: chose ..." line
  double planner_scale = 0.0;  // c the schedule was planned at
  bool shared_link = false;    // planned on one link with BARRIER hand-overs (else split p ways)
  double base_step = 0.0;      // SimulateSharedGpu of the layout's order without offload
};

// Compiles `policy` on its layout with the library's one-GPU planner (PlanSchedule with every
// stage on one GPU), from `costs` measured for chunks of `costs_layers_per_chunk` layers
// (rescaled to the layout's chunks): the compute factor c searched for offload policies unless
// pinned (po-f@C, else --planner-scale), c = p for 1f1b and none. `auto_budget` is the
// per-stage budget in bytes for auto (ignored otherwise). Errors: PlanSchedule's, annotated
// with the policy.
[[nodiscard]] absl::StatusOr<PlannedPolicy> PlanPolicy(const BenchOptions& options,
                                                       const std::string& policy,
                                                       const ChunkCosts& costs,
                                                       int costs_layers_per_chunk,
                                                       const LinkFigures& link,
                                                       std::int64_t auto_budget);

// Plans every policy of `options` (in order) from costs of the --family/--chunks layout; the
// auto budget is --budget-gb, else --budget-fraction of the 1f1b plan's largest stage peak.
[[nodiscard]] absl::StatusOr<std::vector<PlannedPolicy>> PlanPolicies(const BenchOptions& options,
                                                                      const ChunkCosts& costs,
                                                                      const LinkFigures& link);

// The calibrated one-GPU prediction. SimulateSharedGpu fed the SOLO chunk costs (F and B of one
// chunk alone) misses the measured step by up to 15%, and by -10.5..+5% for 1f1b itself, where
// the GPU is never idle and the step is all compute: the solo times (a median of a few reps on
// one stage's model) vary between runs, and p stages' kernels interleaved on one GPU do not run
// at the solo serial rate. Both are errors in the compute cost, not in the schedule, and the
// 1f1b baseline measures them in the pipeline itself. So, once 1f1b has run,
//     scale = measured 1f1b step / SimulateSharedGpu(1f1b, solo costs) step,
// and a policy's calibrated prediction is SimulateSharedGpu with every compute cost x scale and
// the copies unchanged (the link figures are measured directly; P2P too). For 1f1b it gives
// back the measured step (a check, not a prediction); for the offload policies it isolates
// what the simulator predicts about copies and stalls.
// Errors: InvalidArgument unless both steps are positive and finite.
[[nodiscard]] absl::StatusOr<double> CalibrationScale(double measured_baseline_step,
                                                      double predicted_baseline_step);
// SimulateSharedGpu(plan.schedule, ScaleComputeTimes(plan.solo, scale)). Errors: its, and
// InvalidArgument for a scale that is not positive and finite.
[[nodiscard]] absl::StatusOr<SharedGpuPrediction> CalibratedPrediction(const PlannedPolicy& plan,
                                                                       double scale);

// Fills run.calibration_scale from the 1f1b policy of run.policies (when it ran) and each
// policy's calibrated_step, where plans[i] (the plan run.policies[i] ran) exists and that
// policy ran. Without a 1f1b run nothing changes (unavailable, not an error). Errors: the
// first of CalibrationScale's and CalibratedPrediction's (the other policies are still filled).
// REQUIRES: plans.size() == run.policies.size().
[[nodiscard]] absl::Status Calibrate(const std::vector<std::optional<PlannedPolicy>>& plans,
                                     BenchRun& run);

// Largest predicted stash peak over the stages. REQUIRES: schedule.predictions.
std::int64_t MaxPeakBytes(const Schedule& schedule);

// How the bench sizes each stage's arena (StageArenaNeed) for `schedule`: exactly the program's
// need (the aligned stash peak plus the P2P reserve), no headroom, since the device memory it
// reports is part of the result; but the library's headroom (ArenaSizing's defaults: a
// quarter more and one spare largest entry) where a program recomputes.
// There full entries, retained blocks (offloaded and reloaded too) and P2P buffers of several
// sizes share the arena, and the exact need left no contiguous room for a full entry on the
// GPU (h = 4096, 2026-12-07: 352 MB free in pieces, 269 MB asked). The stash's measured peak
// (logical and physical) does not depend on the arena's size.
ArenaSizing BenchArenaSizing(const Schedule& schedule);

// Model FLOP of one step by the convention of reference/hardware.md section 4 (and of
// scripts/torch_peer.py): per layer and microbatch of s tokens, F + B = 72 h^2 s + 12 s^2 h
// (the four GEMMs 24 h^2 s forward, attention scores and values 4 s^2 h forward counted as
// dense, backward twice the forward).
double ModelFlopsPerStep(const BenchOptions& options);

// Chunk times for --dry-run: --forward-ms / --backward-ms when given, else from model FLOP at
// an assumed 600 TFLOP/s (B = 2 F).
ChunkTimes EstimatedChunkTimes(const BenchOptions& options);

// The --dry-run report: per policy, planner and shared-GPU step, peaks, offloaded bytes,
// warnings.
std::string PlansToText(const BenchOptions& options, const ChunkCosts& costs,
                        const std::vector<PlannedPolicy>& plans);

}  // namespace pipeoffload::bench

#endif  // PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_
