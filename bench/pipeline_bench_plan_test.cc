// Tests of pipeline_bench's GPU-free half: the one-GPU simulation (hand-timed programs), the
// planner's cost scaling over generated configs, the flags, the link probe on the CPU backend,
// and the report's JSON round trip and checklist. Tag: [pipeline_bench].
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/pipeline_bench_link.h"
#include "bench/pipeline_bench_plan.h"
#include "bench/pipeline_bench_report.h"
#include "bench/pipeline_bench_shared_sim.h"
#include "pipeoffload/compiler.h"
#include "tests/testing/catch.h"

namespace pipeoffload::bench {
namespace {

using Catch::Approx;

Op MakeOp(OpKind kind, int mb, int peer = -1) { return Op{kind, mb, 0, peer}; }

// One stage, one microbatch: F, then its entry leaves and comes back before B.
Schedule OneStage(std::vector<Op> ops, int microbatches) {
  Schedule schedule;
  schedule.spec.num_stages = 1;
  schedule.spec.num_microbatches = microbatches;
  schedule.spec.chunks_per_stage = 1;
  schedule.stages.push_back(StageProgram{0, std::move(ops)});
  return schedule;
}

CostModel UnitCosts() {
  CostModel cost;
  cost.forward_time = 1.0;
  cost.backward_time = 0.5;  // unsplit: one B op takes backward + weight = 1
  cost.weight_time = 0.5;
  cost.activation_bytes = 10;
  cost.d2h_bandwidth = 10.0;
  cost.h2d_bandwidth = 10.0;
  cost.duplex_bandwidth = 5.0;
  cost.p2p_latency = 0.0;
  cost.p2p_bandwidth = 1e30;
  return cost;
}

ChunkCosts Chunk(double forward, double backward, std::int64_t saved) {
  ChunkCosts costs;
  costs.times = ChunkTimes{forward, backward};
  costs.saved_bytes = saved;
  costs.boundary_bytes = saved / 16;
  return costs;
}

TEST_CASE("shared GPU: copies hold the stage, compute waits for them", "[pipeline_bench]") {
  // F0 [0,1]; OFFLOAD0 [1,3] (10 B at 5 B/s); RELEASE0 at 3; RELOAD0 [3,5]; B0 [5,6].
  CostModel cost = UnitCosts();
  cost.d2h_bandwidth = cost.h2d_bandwidth = 5.0;
  const Schedule schedule =
      OneStage({MakeOp(OpKind::kForward, 0), MakeOp(OpKind::kOffload, 0),
                MakeOp(OpKind::kRelease, 0), MakeOp(OpKind::kReload, 0),
                MakeOp(OpKind::kBackward, 0)},
               1);
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(schedule, cost);
  REQUIRE(out.ok());
  CHECK(out->step_time == Approx(6.0));
  CHECK(out->compute_work == Approx(2.0));
  CHECK(out->gpu_idle == Approx(4.0));
  CHECK(out->copy_stall == Approx(4.0));
}

TEST_CASE("shared GPU: both directions at once run at the duplex rate", "[pipeline_bench]") {
  // F0 [0,1]; OFF0 [1,2] solo; REL0 2; F1 [2,3]; OFF1 and RELOAD0 from 3 at 5 B/s each: [3,5];
  // REL1 5; B0 [5,6]; RELOAD1 [5,6] solo at 10 B/s; B1 [6,7]. Idle: [1,2] and [3,5].
  const Schedule schedule = OneStage(
      {MakeOp(OpKind::kForward, 0), MakeOp(OpKind::kOffload, 0), MakeOp(OpKind::kRelease, 0),
       MakeOp(OpKind::kForward, 1), MakeOp(OpKind::kOffload, 1), MakeOp(OpKind::kReload, 0),
       MakeOp(OpKind::kRelease, 1), MakeOp(OpKind::kBackward, 0), MakeOp(OpKind::kReload, 1),
       MakeOp(OpKind::kBackward, 1)},
      2);
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(schedule, UnitCosts());
  REQUIRE(out.ok());
  CHECK(out->step_time == Approx(7.0));
  CHECK(out->compute_work == Approx(4.0));
  CHECK(out->gpu_idle == Approx(3.0));
  CHECK(out->copy_stall == Approx(3.0));
}

TEST_CASE("shared GPU: running stages split the GPU equally", "[pipeline_bench]") {
  // 1F1B p=2 m=2, F = 1, B = 3 (solo). Stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1.
  // [0,1] s0 F0 alone; [1,3] s0 F1 + s1 F0 at half speed; [3,6] s1 B0 alone; from 6 s1 F1
  // and s0 B0 share: s1 F1 ends at 8 with 2 of s0 B0 left; s1 B1 and s0 B0 share until 12
  // (s0 B0 done, 1 of s1 B1 left); s1 B1 alone to 13; s0 B1 [13,16].
  PipelineSpec spec;
  spec.num_stages = 2;
  spec.num_microbatches = 2;
  CostModel cost = UnitCosts();
  cost.backward_time = cost.weight_time = 1.5;
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  REQUIRE(schedule.ok());
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(*schedule, cost);
  REQUIRE(out.ok());
  CHECK(out->step_time == Approx(16.0));
  CHECK(out->compute_work == Approx(16.0));
  CHECK(out->gpu_idle == Approx(0.0).margin(1e-9));
  REQUIRE(out->stage_end.size() == 2);
  CHECK(out->stage_end[0] == Approx(16.0));
  CHECK(out->stage_end[1] == Approx(13.0));
}

TEST_CASE("shared GPU: bad input is an error, a stuck program a hang report", "[pipeline_bench]") {
  const Schedule stuck = OneStage({MakeOp(OpKind::kForward, 0), MakeOp(OpKind::kReload, 0),
                                   MakeOp(OpKind::kBackward, 0)},
                                  1);
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(stuck, UnitCosts());
  REQUIRE(out.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(out.status().message()).find("stage 0 at op 1 (RELOAD0.0)") !=
        std::string::npos);

  CostModel zero = UnitCosts();
  zero.forward_time = 0.0;
  out = SimulateSharedGpu(OneStage({MakeOp(OpKind::kForward, 0)}, 1), zero);
  CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
  CostModel no_link = UnitCosts();
  no_link.duplex_bandwidth = 0.0;
  out = SimulateSharedGpu(OneStage({MakeOp(OpKind::kForward, 0)}, 1), no_link);
  CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("planner costs: compute x p on one link; the one-GPU step fills the bubble",
          "[pipeline_bench]") {
  const int p = GENERATE(2, 4);
  const int v = GENERATE(1, 2);
  const std::string family = v == 1 ? "1f1b" : "group-interleaved";
  BenchOptions options;
  options.stages = p;
  options.chunks = v;
  options.family = family;
  options.layers_per_chunk = 2;
  options.policies = {"1f1b", "none", "po-h", "po-f"};
  // Entries that take a tenth of their chunk's compute to move: offload can hide.
  const ChunkCosts costs = Chunk(2e-3, 4e-3, 30'000'000);
  const LinkFigures link{50e9, 50e9, 45e9};
  CAPTURE(p, v);
  absl::StatusOr<std::vector<PlannedPolicy>> plans = PlanPolicies(options, costs, link);
  REQUIRE(plans.ok());
  REQUIRE(plans->size() == 4);
  for (const PlannedPolicy& plan : *plans) {
    CAPTURE(plan.name);
    const int layers = plan.layout.layers_per_chunk;
    CHECK(layers * plan.layout.chunks == options.LayersPerStage());
    // Solo costs are the measured chunk's, rescaled to the layout's chunk.
    CHECK(plan.solo.forward_time == Approx(2e-3 * layers / 2));
    CHECK(plan.solo.backward_time + plan.solo.weight_time == Approx(4e-3 * layers / 2));
    CHECK(plan.solo.activation_bytes == 30'000'000 / 2 * layers);
    CHECK(plan.solo.host_link_group_size == p);
    CHECK(plan.solo.d2h_bandwidth == 50e9);
    CHECK(plan.solo.duplex_bandwidth == 45e9);
    // The serial bound is every stage's compute once: p * m * layers-per-stage * (F + B)
    // per layer.
    const double serial = p * options.Microbatches() * options.LayersPerStage() * 3e-3;
    CHECK(plan.shared.compute_work == Approx(serial));
    CHECK(plan.shared.step_time >= plan.shared.compute_work * (1 - 1e-9));
    if (plan.name == "1f1b" || plan.name == "none") {
      // Without copies one GPU is never idle but for P2P latencies.
      CHECK(plan.shared.step_time == Approx(serial).epsilon(0.01));
      CHECK(plan.shared.copy_stall == 0.0);
      // The planner's p GPUs of 1/p speed pay the bubble, which one GPU fills.
      CHECK(plan.schedule.predictions->step_time > plan.shared.step_time * 1.05);
    }
  }
  // po-f lowers stage 0's peak wherever the order keeps more than two entries there (1F1B with
  // p = 2 holds two: one computing, one in flight), within the one-GPU bound.
  const PlannedPolicy& full = (*plans)[3];
  CHECK(full.shared.step_time <= full.base_step * (1 + options.sim_tolerance));
  if (p * v < 4) return;
  CHECK(full.schedule.predictions->stages[0].offloaded_bytes > 0);
  CHECK(full.schedule.predictions->stages[0].peak_bytes <
        full.schedule.predictions->stages[0].peak_bytes_without_offload);
}

TEST_CASE("the factor search keeps the smallest peak within the one-GPU bound",
          "[pipeline_bench]") {
  const int h_scale = GENERATE(1, 2, 4);  // entry size: from link-light to transfer-bound
  BenchOptions options;
  options.family = "group-interleaved";
  options.chunks = 4;
  const ChunkCosts costs = Chunk(2e-3, 4e-3, 100'000'000LL * h_scale);
  const LinkFigures link{55e9, 55e9, 46e9};
  for (const std::string policy : {"po-h", "po-f"}) {
    CAPTURE(h_scale, policy);
    absl::StatusOr<PlannedPolicy> searched = PlanPolicy(options, policy, costs, 1, link, 0);
    REQUIRE(searched.ok());
    const double bound = searched->base_step * (1 + options.sim_tolerance);
    bool any_fits = false;
    std::int64_t best_peak = 0;
    double fastest = 1e30;
    for (const double scale : {4.0, 3.0, 2.0, 1.0}) {
      BenchOptions pinned = options;
      pinned.planner_scale = scale;
      absl::StatusOr<PlannedPolicy> plan = PlanPolicy(pinned, policy, costs, 1, link, 0);
      REQUIRE(plan.ok());
      CHECK(plan->planner_scale == scale);
      absl::StatusOr<PlannedPolicy> suffixed = PlanPolicy(
          options, absl::StrCat(policy, "@", scale), costs, 1, link, 0);
      REQUIRE(suffixed.ok());
      CHECK(suffixed->schedule == plan->schedule);
      CHECK(plan->base_step == searched->base_step);
      fastest = std::min(fastest, plan->shared.step_time);
      if (plan->shared.step_time <= bound) {
        const std::int64_t peak = MaxPeakBytes(plan->schedule);
        best_peak = any_fits ? std::min(best_peak, peak) : peak;
        any_fits = true;
      }
    }
    if (any_fits) {
      CHECK(searched->shared.step_time <= bound);
      CHECK(MaxPeakBytes(searched->schedule) == best_peak);
    } else {
      CHECK(searched->shared.step_time == fastest);
    }
  }
}

TEST_CASE("a split link plans without BARRIERs", "[pipeline_bench]") {
  BenchOptions options;
  options.family = "group-interleaved";
  options.chunks = 4;
  const ChunkCosts costs = Chunk(2e-3, 4e-3, 50'000'000);
  const auto barriers = [](const Schedule& schedule) {
    int count = 0;
    for (const StageProgram& program : schedule.stages) {
      for (const Op& op : program.ops) count += op.kind == OpKind::kBarrier ? 1 : 0;
    }
    return count;
  };
  absl::StatusOr<PlannedPolicy> shared = PlanPolicy(options, "po-f@4", costs, 1, LinkFigures{}, 0);
  absl::StatusOr<PlannedPolicy> split =
      PlanPolicy(options, "po-f@4:split", costs, 1, LinkFigures{}, 0);
  REQUIRE(shared.ok());
  REQUIRE(split.ok());
  CHECK(barriers(shared->schedule) > 0);
  CHECK(barriers(split->schedule) == 0);
  CHECK(split->schedule.predictions->stages[0].offloaded_bytes > 0);
  // The one-GPU prediction still uses the real, shared link.
  CHECK(split->solo.host_link_group_size == 4);
  CHECK(split->solo.d2h_bandwidth == LinkFigures{}.d2h);
}

TEST_CASE("planner costs: scaling is exactly p on compute, none on the link", "[pipeline_bench]") {
  BenchOptions options;
  options.stages = 3;
  const CostModel solo = SoloCostModel(options, Chunk(1.0, 2.0, 64), LinkFigures{1.0, 2.0, 0.5});
  const CostModel planner = PlannerCostModel(solo, 3.0);
  CHECK(planner.forward_time == 3.0);
  CHECK(planner.backward_time == 3.0);
  CHECK(planner.weight_time == 3.0);
  CHECK(planner.d2h_bandwidth == 1.0);
  CHECK(planner.h2d_bandwidth == 2.0);
  CHECK(planner.duplex_bandwidth == 0.5);
  CHECK(planner.host_link_group_size == 3);
  CHECK(planner.activation_bytes == 64);
}

TEST_CASE("auto is held to the layout's v and reports its choice", "[pipeline_bench]") {
  BenchOptions options;
  options.family = "group-interleaved";
  options.chunks = 2;
  options.policies = {"auto"};
  options.budget_fraction = 0.9;
  absl::StatusOr<std::vector<PlannedPolicy>> plans =
      PlanPolicies(options, Chunk(2e-3, 4e-3, 100'000'000), LinkFigures{});
  REQUIRE(plans.ok());
  CHECK((*plans)[0].layout.chunks == 2);
  CHECK((*plans)[0].schedule.spec.chunks_per_stage == 2);
  CHECK((*plans)[0].auto_choice.rfind("auto: chose", 0) == 0);

  options.budget_gb = 1e-6;  // nothing fits a kilobyte
  plans = PlanPolicies(options, Chunk(2e-3, 4e-3, 100'000'000), LinkFigures{});
  REQUIRE(!plans.ok());
  CHECK(std::string(plans.status().message()).find("policy auto") != std::string::npos);
}

absl::StatusOr<BenchOptions> Parse(std::vector<std::string> args) {
  std::vector<char*> argv = {const_cast<char*>("pipeline_bench")};
  for (std::string& arg : args) argv.push_back(arg.data());
  return ParseBenchOptions(static_cast<int>(argv.size()), argv.data());
}

TEST_CASE("flags: values, defaults and errors naming the flag", "[pipeline_bench]") {
  absl::StatusOr<BenchOptions> options =
      Parse({"--model=gpt", "--hidden=2048", "--chunks=4", "--layers-per-chunk=3",
             "--policies=all", "--budget-fraction=0.6"});
  REQUIRE(options.ok());
  CHECK(options->model == "gpt");
  CHECK(options->Heads() == 16);
  CHECK(options->Microbatches() == 16);
  CHECK(options->policies ==
        std::vector<std::string>{"1f1b", "none", "po-h", "po-f", "selective", "auto"});
  const Layout base = PolicyLayout(*options, "1f1b");
  CHECK(base == Layout{Family::k1F1B, 1, 12});
  CHECK(PolicyLayout(*options, "po-f") == Layout{Family::k1F1B, 4, 3});
  CHECK(PolicyLayout(*options, "po-f@2") == Layout{Family::k1F1B, 4, 3});
  absl::StatusOr<BenchOptions> pinned = Parse({"--policies=po-f@2,po-h,po-f"});
  REQUIRE(pinned.ok());
  CHECK(pinned->policies == std::vector<std::string>{"po-f@2", "po-h", "po-f"});
  absl::StatusOr<BenchOptions> more = Parse({"--policies=all,po-h:split,po-f"});
  REQUIRE(more.ok());
  CHECK(more->policies.size() == 7);
  CHECK(more->policies.back() == "po-h:split");
  CHECK(SplitPolicyName("po-f@2").base == "po-f");
  CHECK(SplitPolicyName("po-f@2").scale == 2.0);
  CHECK(SplitPolicyName("auto").scale == 0.0);
  CHECK(SplitPolicyName("po-f@3:split").base == "po-f");
  CHECK(SplitPolicyName("po-f@3:split").scale == 3.0);
  CHECK(SplitPolicyName("po-f@3:split").split_link);
  CHECK(!SplitPolicyName("po-f@3").split_link);

  for (const auto& [arg, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--hidden=abc", "--hidden"},
           {"--model=bert", "--model"},
           {"--policies=1f1b,po-x", "--policies"},
           {"--budget-fraction=2", "--budget-fraction"},
           {"--heads=3", "--heads"},
           {"--bogus=1", "--bogus"},
           {"--peer=x.jsonl", "--peer"},
           {"--policies=po-f@0.5", "--policies"},
           {"--policies=1f1b@2", "--policies"},
           {"--policies=po-h@x", "--policies"},
           {"--policies=po-h:joined", "--policies"},
           {"--policies=none:split", "--policies"}}) {
    CAPTURE(arg);
    absl::StatusOr<BenchOptions> bad = Parse({arg});
    REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(bad.status().message()).find(flag) != std::string::npos);
  }
}

TEST_CASE("model FLOP: 72 h^2 s + 12 s^2 h per layer and microbatch", "[pipeline_bench]") {
  BenchOptions options;
  options.hidden = 64;
  options.sequence = 8;
  options.stages = 2;
  options.chunks = 2;
  options.layers_per_chunk = 3;
  options.microbatches = 5;
  const double per_layer = 72.0 * 64 * 64 * 8 + 12.0 * 8 * 8 * 64;
  CHECK(ModelFlopsPerStep(options) == Approx(per_layer * 12 * 5));
}

TEST_CASE("link probe: the CPU backend's copies give finite positive figures",
          "[pipeline_bench]") {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  absl::StatusOr<LinkFigures> link = MeasureLink(**backend, 1 << 20, 3);
  REQUIRE(link.ok());
  for (const double rate : {link->d2h, link->h2d, link->duplex}) {
    CHECK(std::isfinite(rate));
    CHECK(rate > 0.0);
  }
  CHECK(MeasureLink(**backend, 100, 3).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*backend)->Stats().bytes_d2h == 2 * 4 * (1 << 20));  // (1 + 3 reps) x (solo + duplex)
}

TEST_CASE("link use: busy time is a union; the ceiling is solo or duplex by overlap",
          "[pipeline_bench]") {
  // D2H [0,2] and [1,3] (100 B each) are busy over [0,3]; H2D [2,4] (50 B) over [2,4]; both
  // directions run in [2,3]. Capacity at 100 B/s alone, 50 each way together:
  // 100 * 2 + 100 * 1 + 2 * 50 * 1 = 400 B for 250 B moved.
  const std::vector<CopyInterval> copies = {
      {true, 0.0, 2.0, 100}, {true, 1.0, 3.0, 100}, {false, 2.0, 4.0, 50}, {false, 5.0, 5.0, 7}};
  const LinkUse use = SummarizeCopies(copies, 100.0, 100.0, 50.0);
  CHECK(use.d2h_gbs == Approx(200.0 / 3.0 / 1e9));
  CHECK(use.h2d_gbs == Approx(25.0 / 1e9));
  CHECK(use.efficiency == Approx(0.625));
  CHECK(SummarizeCopies({}, 1.0, 1.0, 1.0).efficiency == 0.0);
}

PolicyRun Policy(const std::string& name, std::vector<double> steps,
                 std::vector<std::int64_t> peaks, double offload_gbs, double predicted) {
  PolicyRun run;
  run.name = name;
  run.order = "1f1b";
  run.step_seconds = std::move(steps);
  run.stash_peak = peaks;
  run.predicted_peak = std::move(peaks);
  run.arena_bytes = {1, 2};
  run.model_bytes = {3, 4};
  run.wait_seconds = {0.5, 0.25};
  run.offload_gbs = offload_gbs;
  run.link_efficiency = offload_gbs / 55.0;
  run.predicted_step = predicted;
  return run;
}

BenchRun Run(int hidden, std::vector<PolicyRun> policies) {
  BenchRun run;
  run.model = "gpt";
  run.hidden = hidden;
  run.heads = hidden / 128;
  run.sequence = 2048;
  run.stages = 2;
  run.microbatches = 8;
  run.chunks = 2;
  run.layers_per_chunk = 1;
  run.family = "group-interleaved";
  run.gemm_flops = 800e12;
  run.d2h_gbs = 55.0;
  run.model_flops_per_step = 600e12;
  run.policies = std::move(policies);
  return run;
}

TEST_CASE("report: JSON lines round-trip; bad lines name the field", "[pipeline_bench]") {
  BenchRun run = Run(8192, {Policy("1f1b", {1.0, 1.1, 0.9}, {400, 300}, 0.0, 1.0),
                            Policy("po-f", {1.02}, {100, 100}, 50.0, 1.0)});
  run.policies[1].auto_choice = "auto: chose x";
  absl::StatusOr<std::vector<BenchRun>> parsed =
      ParseRuns(RunToJsonLine(run) + "\n" + RunToJsonLine(Run(2048, {})));
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 2);
  const BenchRun& back = (*parsed)[0];
  CHECK(back.hidden == 8192);
  CHECK(back.family == "group-interleaved");
  CHECK(back.gemm_flops == 800e12);
  REQUIRE(back.policies.size() == 2);
  CHECK(back.policies[0].step_seconds == std::vector<double>{1.0, 1.1, 0.9});
  CHECK(back.policies[0].MedianStep() == 1.0);
  CHECK(back.policies[1].stash_peak == std::vector<std::int64_t>{100, 100});
  CHECK(back.policies[1].auto_choice == "auto: chose x");
  CHECK(back.policies[1].StashTotal() == 200);
  CHECK(back.policies[1].wait_seconds == std::vector<double>{0.5, 0.25});
  CHECK(RunToJsonLine(back) == RunToJsonLine(run));  // every field survives

  absl::StatusOr<std::vector<BenchRun>> bad = ParseRuns("{\"model\": \"gpt\"}");
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("line 1: missing \"hidden\"") !=
        std::string::npos);
  bad = ParseRuns("\n{\"model\": 3}");
  CHECK(std::string(bad.status().message()).find("line 2: \"model\" has the wrong type") !=
        std::string::npos);
  bad = ParseRuns("not json");
  CHECK(std::string(bad.status().message()).find("not a JSON object") != std::string::npos);
  absl::StatusOr<std::vector<PeerRun>> peers = ParsePeers("{\"hidden\": 1}");
  CHECK(std::string(peers.status().message()).find("missing \"seq\"") != std::string::npos);
}

TEST_CASE("report: one markdown row per policy, failures say why", "[pipeline_bench]") {
  BenchRun run = Run(8192, {Policy("1f1b", {1.0}, {4'000'000'000, 3'000'000'000}, 0.0, 1.05),
                            Policy("po-f", {1.02}, {1'000'000'000, 1'000'000'000}, 44.0, 1.0)});
  run.policies.emplace_back();
  run.policies.back().name = "auto";
  run.policies.back().order = "gi";
  run.policies.back().error = "no plan fits";
  const std::string text = RunToMarkdown(run);
  INFO(text);
  // 600 TFLOP / 1.02 s; stage 0 4 -> 1 GB; 44 / 55 GB/s of the link; predicted 1.0 vs 1.02.
  CHECK(text.find("| po-f | 1f1b | 1.0200 | +2.0% | 588.2 | 1.00 (75%) | 1.00/1.00, 1.00/1.00 | "
                  "0.00 | 44.0 / 0.0 (80%) | 1.0000 | -2.0% |") != std::string::npos);
  CHECK(text.find("| 1f1b | 1f1b | 1.0000 | - | 600.0 | 4.00 | 4.00/4.00, 3.00/3.00 |") !=
        std::string::npos);
  CHECK(text.find("| auto | gi | failed: no plan fits |") != std::string::npos);
  CHECK(text.find("po-f: busy 0.000 of 1.020 s, waits 0.500 / 0.250;") != std::string::npos);
}

TEST_CASE("checklist: each target PASS or MISS with its numbers", "[pipeline_bench]") {
  const std::vector<BenchRun> runs = {
      Run(8192, {Policy("1f1b", {1.0}, {400, 300}, 0.0, 1.05),
                 Policy("po-f", {1.02}, {100, 100}, 50.0, 1.0)}),
      Run(4096, {Policy("1f1b", {1.0}, {400, 300}, 0.0, 1.0),
                 Policy("po-h", {1.05}, {200, 150}, 40.0, 1.0)}),
      Run(2048, {Policy("1f1b", {1.0}, {400, 300}, 0.0, 1.0),
                 Policy("po-f", {1.02}, {100, 100}, 50.0, 1.0),
                 Policy("po-f@4", {1.10}, {100, 100}, 50.0, 1.0),
                 Policy("auto", {1.01}, {300, 300}, 50.0, 1.0)})};
  std::vector<PeerRun> peers(2);
  peers[0].hidden = peers[1].hidden = 8192;
  peers[0].mode = "none";
  peers[0].step_s = 0.9;
  peers[1].mode = "save_on_cpu";
  peers[1].step_s = 5.0;
  peers[1].activation_bytes = 150;
  const std::string text = Checklist(runs, peers);
  INFO(text);
  // 600 of 800 TFLOP/s.
  CHECK(text.find("- PASS baseline (1f1b, no offload) at h=8192") != std::string::npos);
  CHECK(text.find("= 75%") != std::string::npos);
  // po-f: +2.0%, 400 -> 100 is a 75% cut.
  CHECK(text.find("- PASS po-f at h=8192") != std::string::npos);
  CHECK(text.find("+2.0%, cut 75%") != std::string::npos);
  // po-h: +5.0% misses the 3% bar.
  CHECK(text.find("- MISS po-h at h=4096") != std::string::npos);
  // 40 of 55 GB/s is 73%.
  CHECK(text.find("- MISS offload copies >= 85%") != std::string::npos);
  CHECK(text.find("73% (po-h at h=4096: D2H 40.0") != std::string::npos);
  // Worst simulator error: 1.0 predicted vs 1.10 measured (po-f@4 at 2048): 9.1%.
  CHECK(text.find("- PASS one-GPU simulation") != std::string::npos);
  CHECK(text.find("9.1%") != std::string::npos);
  // auto +1.0% and 700 -> 600 bytes; po-f +2%, po-f@4 +10%.
  CHECK(text.find("- PASS h=2048 (transfer-bound)") != std::string::npos);
  CHECK(text.find(", po-f +2.0%, po-f@4 +10.0%") != std::string::npos);
  // Peer: 1.02 / 0.9 = 1.13x; 100 bytes on the largest stage vs 150 of save_on_cpu: PASS.
  CHECK(text.find("- PASS h=8192: our po-f step") != std::string::npos);
  CHECK(text.find("1.13x") != std::string::npos);
  std::vector<PeerRun> tight = peers;
  tight[1].activation_bytes = 100;  // not less: MISS
  CHECK(Checklist(runs, tight).find("- MISS h=8192: our po-f step") != std::string::npos);
  // Nothing at all: every line n/a, no crash.
  const std::string empty = Checklist({}, {});
  CHECK(empty.find("PASS") == std::string::npos);
  CHECK(empty.find("MISS") == std::string::npos);
}

}  // namespace
}  // namespace pipeoffload::bench
