// pipeline_bench's GPU-free half: its flags, the cost models it builds from measured chunk
// times and copy bandwidths, and the compiled schedule of each policy with its predictions.
// Kept apart from the CUDA code so --dry-run (and a reader, and the tests) can check the plans
// on a machine without a GPU.
//
// Stages that share one GPU (the scaling, derived). pipeline_bench runs p stages as threads on
// ONE GPU with ONE PCIe link. Let F, B be a chunk's forward / backward measured alone, S an
// entry's bytes and W the link's bandwidth. On p GPUs of their own, a stage computes at full
// speed and owns its link, so an entry's transfer over its lifetime costs (S / W) / (F + B).
// Here, while all p stages have work (the steady state, where offload must hide), each gets a
// 1/p share of the GPU, so its ops take p F and p B, and all p stages' copies take turns on one
// link. The planner is therefore given
//     forward_time = c F, backward_time + weight_time = c B   (PlannerCostModel, c = p)
//     host_link_group_size = p, bandwidths as measured        (one link, shared by all stages)
// which keeps each stage's ratio of compute to PCIe time what it would be on its own GPU (the
// point of running "the local transport on one GPU", issue 5), and lets the planner stagger
// the p stages' copies on the one link.
// Two consequences:
//  - The planner's step prediction is that of p GPUs each 1/p as fast: it counts the warm-up
//    and cool-down bubble, which on one GPU the other stages' work fills. The step to compare
//    with the measured one comes from SimulateSharedGpu (pipeline_bench_shared_sim.h) fed the
//    SOLO costs (SoloCostModel): the same programs with compute shared by the stages running
//    at each instant and copies shared on the one link.
//  - Outside the steady state fewer than p stages run, so their ops take less than c = p times
//    the solo time, and a copy the planner fitted into an op's p-fold duration (a warm-up
//    forward gated behind its predecessor's offload, a reload before a cool-down backward)
//    arrives late. The compiler has no notion of a shared compute engine, so PlanPolicy searches
//    the factor: it plans each offload policy at c = p, 3p/4, p/2, p/4 and 1 (at least 1),
//    predicts each plan with SimulateSharedGpu, and keeps the one with the smallest stash peak
//    whose one-GPU step stays within --sim-tolerance of the same order without offload (else
//    the fastest). Smaller c plans shorter lifespans against a busier link: fewer, safer
//    copies. --planner-scale=c pins the factor.
#ifndef PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_
#define PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/pipeline_bench_shared_sim.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::bench {

extern const char kBenchUsage[];

// Seconds of one chunk's Forward and full Backward (with weight gradients) alone on the GPU.
struct ChunkTimes {
  double forward = 0.0;
  double backward = 0.0;
};

// Pinned PCIe bandwidths in bytes per second: each direction alone, and each direction while
// both run.
struct LinkFigures {
  double d2h = 55.3e9;
  double h2d = 55.3e9;
  double duplex = 46.0e9;
};

struct BenchOptions {
  std::string model;  // "gemm" | "gpt"; empty = gpt when this build has it, else gemm
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
  // offload policy may end in @C to pin the planner's compute factor C (see the top).
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
  double planner_scale = 0.0;   // c above; 0 = search
  double sim_tolerance = 0.01;  // the search's bound on one-GPU slowdown vs no offload
  std::string out;          // append the markdown here too
  std::string json;         // append one JSON line of results here
  std::string trace_dir;    // write each policy's last measured step as Chrome trace JSON here
  std::string summarize;    // no GPU: read these JSON lines, print the checklist
  std::string peer;         // with summarize: torch_peer.py's JSON lines
  bool dry_run = false;

  int Microbatches() const { return microbatches > 0 ? microbatches : 4 * stages; }
  int Heads() const { return heads > 0 ? heads : hidden / 128 > 0 ? hidden / 128 : 1; }
  int LayersPerStage() const { return layers_per_chunk * chunks; }
};

// A policy as given: "po-f@2" is po-f planned at compute factor 2 (scale 0: search; -1: a
// malformed factor).
// "po-f:split" plans po-f with the link split instead of shared: host_link_group_size = 1 and
// each stage 1/p of every bandwidth (the same per-stage share of the link, but no BARRIERs
// coupling the stages' threads; the copies share the real link as they come). The two may be
// combined: "po-f@3:split".
struct PolicyName {
  std::string base;
  double scale = 0.0;
  bool split_link = false;
};
PolicyName SplitPolicyName(const std::string& name);

// Parses argv[1..). Errors: InvalidArgument naming the flag and what it accepts.
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
};

// `costs` of a chunk of `from` layers, rescaled to chunks of `to` layers (times and saved bytes
// are per layer times layers; the boundary stays).
ChunkCosts RescaleChunk(const ChunkCosts& costs, int from_layers, int to_layers);

// Costs as measured alone: F, B split evenly into B and W (the spec does not split W, so one B
// op costs both), bytes, the link figures, and a fast P2P link (device-to-device on one GPU).
// host_link_group_size = p: one link.
CostModel SoloCostModel(const BenchOptions& options, const ChunkCosts& costs,
                        const LinkFigures& link);
// What the planner is given: the solo model with compute times scaled by `scale` (c at the top).
CostModel PlannerCostModel(const CostModel& solo, double scale);

struct PlannedPolicy {
  std::string name;  // as given: "1f1b", "po-h", ...
  Layout layout;     // the layout the schedule runs (auto: the family it picked)
  Schedule schedule;  // compiled under PlannerCostModel, with its predictions
  CostModel solo;     // SoloCostModel of the layout
  SharedGpuPrediction shared;  // SimulateSharedGpu(schedule, solo)
  std::string auto_choice;     // auto: the compiler's "auto: chose ..." line
  double planner_scale = 0.0;  // c the schedule was planned at
  double base_step = 0.0;      // SimulateSharedGpu of the layout's order without offload
};

// Compiles `policy` on its layout, with `costs` measured for chunks of
// `costs_layers_per_chunk` layers (rescaled to the layout's chunks), searching the planner's
// compute factor c as the top says (offload policies only; 1f1b and none plan at c = p).
// `auto_budget` is the per-stage budget in bytes for auto (ignored otherwise). The auto search
// is held to the layout's v (the bench builds its model for one chunking). Errors: Compile's
// (at c = p, when no factor compiles) and SimulateSharedGpu's, annotated with the policy.
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

// Largest predicted stash peak over the stages. REQUIRES: schedule.predictions.
std::int64_t MaxPeakBytes(const Schedule& schedule);

// Device arena budget for `stage` of `schedule`: its predicted stash peak with the arena's
// 256-byte alignment per entry, plus room for the P2P buffers that can be live at once.
std::int64_t ArenaBudget(const Schedule& schedule, int stage, std::int64_t boundary_bytes);

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
