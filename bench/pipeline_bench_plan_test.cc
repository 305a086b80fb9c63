// Tests of pipeline_bench's GPU-free half: the one-GPU simulation (hand-timed programs), the
// planner's cost scaling over generated configs, the link modes, the calibration, the flags and
// the link probe on the CPU backend (the report's: pipeline_bench_report_test.cc).
// Tag: [pipeline_bench].
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/pipeline_bench_plan.h"
#include "pipeoffload/shared_gpu.h"
#include "pipeoffload/compiler.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload::bench {
namespace {

using Catch::Approx;

// One stage of `microbatches` microbatches running `ops`.
Schedule OneStage(std::vector<Op> ops, int microbatches) {
  return testing::Make(1, microbatches, 1, false, {std::move(ops)});
}

ChunkCosts Chunk(double forward, double backward, std::int64_t saved) {
  ChunkCosts costs;
  costs.times = ChunkTimes{forward, backward};
  costs.saved_bytes = saved;
  costs.boundary_bytes = saved / 16;
  return costs;
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

TEST_CASE("po-f@C and --planner-scale pin the library's compute factor; none searches it",
          "[pipeline_bench]") {
  BenchOptions options;
  options.family = "group-interleaved";
  options.chunks = 4;
  const ChunkCosts costs = Chunk(2e-3, 4e-3, 200'000'000);
  const LinkFigures link{55e9, 55e9, 46e9};
  absl::StatusOr<PlannedPolicy> searched = PlanPolicy(options, "po-f", costs, 1, link, 0);
  REQUIRE(searched.ok());
  CHECK(searched->shared.step_time > 0.0);
  CHECK(searched->base_step > 0.0);
  for (const double scale : {4.0, 2.0, 1.0}) {
    CAPTURE(scale);
    BenchOptions pinned = options;
    pinned.planner_scale = scale;
    absl::StatusOr<PlannedPolicy> plan = PlanPolicy(pinned, "po-f", costs, 1, link, 0);
    absl::StatusOr<PlannedPolicy> suffixed =
        PlanPolicy(options, absl::StrCat("po-f@", scale), costs, 1, link, 0);
    REQUIRE(plan.ok());
    REQUIRE(suffixed.ok());
    CHECK(plan->planner_scale == scale);
    CHECK(suffixed->schedule == plan->schedule);
    CHECK(plan->base_step == searched->base_step);
    // The search kept one of the factors it tried: none is both smaller in peak and in bound.
    const bool fits = plan->shared.step_time <= searched->base_step * (1 + options.sim_tolerance);
    if (fits && searched->shared.step_time <= searched->base_step * (1 + options.sim_tolerance)) {
      CHECK(MaxPeakBytes(searched->schedule) <= MaxPeakBytes(plan->schedule));
    }
  }
}

TEST_CASE("the split link is the default: no BARRIERs; :shared hands the link over",
          "[pipeline_bench]") {
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
  absl::StatusOr<PlannedPolicy> shared =
      PlanPolicy(options, "po-f@4:shared", costs, 1, LinkFigures{}, 0);
  absl::StatusOr<PlannedPolicy> split = PlanPolicy(options, "po-f@4", costs, 1, LinkFigures{}, 0);
  absl::StatusOr<PlannedPolicy> alias =
      PlanPolicy(options, "po-f@4:split", costs, 1, LinkFigures{}, 0);
  REQUIRE(shared.ok());
  REQUIRE(split.ok());
  REQUIRE(alias.ok());
  CHECK(barriers(shared->schedule) > 0);
  CHECK(barriers(split->schedule) == 0);
  CHECK(alias->schedule == split->schedule);  // ":split" is a no-op alias
  CHECK(split->schedule.predictions->stages[0].offloaded_bytes > 0);
  // The one-GPU prediction still uses the real, shared link.
  CHECK(split->solo.host_link_group_size == 4);
  CHECK(split->solo.d2h_bandwidth == LinkFigures{}.d2h);
  CHECK(shared->solo.host_link_group_size == 4);
  CHECK(shared->solo.d2h_bandwidth == LinkFigures{}.d2h);
  // The dry-run report says which link each plan saw.
  const std::string text = PlansToText(options, costs, {*split, *shared});
  INFO(text);
  CHECK(text.find("po-f@4 (group-interleaved v=4, 1 layer(s)/chunk, planned at 4x, link split "
                  "4 ways, 0 BARRIERs)") != std::string::npos);
  CHECK(text.find(absl::StrCat("po-f@4:shared (group-interleaved v=4, 1 layer(s)/chunk, planned "
                               "at 4x, link shared, ",
                               barriers(shared->schedule), " BARRIERs)")) != std::string::npos);
}

TEST_CASE("solo costs: the measured chunk's, per virtual stage, on one shared link",
          "[pipeline_bench]") {
  BenchOptions options;
  options.stages = 3;
  const Layout layout{Family::kGroupInterleaved, 2, 1};
  const CostModel solo =
      SoloCostModel(options, layout, Chunk(1.0, 2.0, 64), LinkFigures{1.0, 2.0, 0.5});
  CHECK(solo.forward_time == 1.0);
  CHECK(solo.backward_time == 1.0);
  CHECK(solo.weight_time == 1.0);
  CHECK(solo.d2h_bandwidth == 1.0);
  CHECK(solo.h2d_bandwidth == 2.0);
  CHECK(solo.duplex_bandwidth == 0.5);
  CHECK(solo.host_link_group_size == 3);
  CHECK(solo.activation_bytes == 64);
  CHECK(solo.activation_bytes_per_virtual_stage == std::vector<std::int64_t>(6, 64));
  CHECK(solo.boundary_bytes == 4);
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
  absl::StatusOr<BenchOptions> modes =
      Parse({"--policies=po-f:shared,po-f@3:shared,auto:split"});
  REQUIRE(modes.ok());
  CHECK(modes->policies ==
        std::vector<std::string>{"po-f:shared", "po-f@3:shared", "auto:split"});

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
           {"--policies=po-h:shared:split", "--policies"},
           {"--policies=po-h:shared@2", "--policies"},
           {"--policies=po-h:", "--policies"},
           {"--policies=none:split", "--policies"},
           {"--policies=1f1b:shared", "--policies"}}) {
    CAPTURE(arg);
    absl::StatusOr<BenchOptions> bad = Parse({arg});
    REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(bad.status().message()).find(flag) != std::string::npos);
  }
}

TEST_CASE("flags: --help, both value forms, and bad command lines pointing at --help",
          "[pipeline_bench]") {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"-h"}, {"--heads=3", "--help"}}) {
    CAPTURE(args);
    absl::StatusOr<BenchOptions> help = Parse(args);
    REQUIRE(help.ok());  // --help skips the cross-flag checks (--heads=3 of h = 4096)
    CHECK(help->help);
  }
  CHECK_FALSE(Parse({})->help);
  const std::string text = BenchHelpText();
  CHECK(text.rfind("usage: pipeline_bench", 0) == 0);
  for (const char* flag :
       {"--model gemm|gpt", "--hidden N", "--policies P,P,...", "--release", "--p2p-reserve",
        "--dry-run", "--forward-ms F", "--summarize JSONL", "--peer JSONL", "--help"}) {
    CAPTURE(flag);
    CHECK(text.find(flag) != std::string::npos);
  }

  absl::StatusOr<BenchOptions> spaced = Parse({"--hidden", "2048", "--policy", "po-f", "--dry-run"});
  REQUIRE(spaced.ok());
  CHECK(spaced->hidden == 2048);
  CHECK(spaced->policies == std::vector<std::string>{"po-f"});
  CHECK(spaced->dry_run);

  for (const auto& [args, message] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--bogus=1"}, "unknown flag --bogus (see --help)"},
           {{"-x"}, "unexpected argument '-x'"},
           {{"dry-run"}, "unexpected argument 'dry-run'"},
           {{"--dry-run=yes"}, "--dry-run takes no value"},
           {{"--hidden"}, "--hidden needs a value (N)"},
           {{"--hidden=32"}, "--hidden expects an integer in [64, 65536], got '32'"},
           {{"--budget-fraction=2"}, "--budget-fraction expects a number in [0.01, 1], got '2'"}}) {
    CAPTURE(args);
    absl::StatusOr<BenchOptions> bad = Parse(args);
    REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(bad.status().message()).find(message) != std::string::npos);
  }
}

TEST_CASE("arena budgets: the P2P plan's peak, far below every buffer of the step",
          "[pipeline_bench]") {
  BenchOptions options;
  options.family = "group-interleaved";
  options.chunks = 4;
  const ChunkCosts costs = Chunk(2e-3, 4e-3, 50'000'000);
  absl::StatusOr<PlannedPolicy> plan = PlanPolicy(options, "po-f@4", costs, 1, LinkFigures{}, 0);
  REQUIRE(plan.ok());
  absl::StatusOr<std::vector<P2PLifetimes>> p2p = AnalyzeP2P(plan->schedule);
  REQUIRE(p2p.ok());
  REQUIRE(p2p->size() == 4u);
  const ModelSizes sizes{plan->solo.activation_bytes_per_virtual_stage, 1'000'000};
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const StageProgram& program = plan->schedule.stages[static_cast<std::size_t>(d)];
    std::int64_t p2p_ops = 0;
    for (const Op& op : program.ops) p2p_ops += IsP2P(op.kind) ? 1 : 0;
    const P2PLifetimes& lifetimes = (*p2p)[static_cast<std::size_t>(d)];
    absl::StatusOr<ArenaNeed> planned = StageArenaNeed(plan->schedule, d, sizes,
                                                       P2PReserve::kPlanned, &lifetimes,
                                                       BenchArenaSizing(plan->schedule));
    absl::StatusOr<ArenaNeed> worst = StageArenaNeed(plan->schedule, d, sizes,
                                                     P2PReserve::kWorstCase, nullptr,
                                                     BenchArenaSizing(plan->schedule));
    REQUIRE(planned.ok());
    REQUIRE(worst.ok());
    // The bench's arenas are the exact need: nothing for fragmentation.
    CHECK(planned->budget_bytes == planned->exact());
    CHECK(planned->p2p_bytes == lifetimes.peak_blocks * 1000192);  // 256-byte aligned
    CHECK(worst->budget_bytes - planned->budget_bytes ==
          (worst->p2p_blocks - lifetimes.peak_blocks) * 1000192);
    CHECK(lifetimes.peak_blocks > 0);
    CHECK(lifetimes.peak_blocks * 4 <= p2p_ops);  // v = 4: many messages, few live at once
    CHECK(worst->p2p_blocks > 2 * lifetimes.peak_blocks);
  }
  // --p2p-reserve chooses between them.
  absl::StatusOr<BenchOptions> parsed = Parse({"--p2p-reserve=worst"});
  REQUIRE(parsed.ok());
  CHECK(parsed->p2p_reserve_worst);
  parsed = Parse({});
  REQUIRE(parsed.ok());
  CHECK_FALSE(parsed->p2p_reserve_worst);
  parsed = Parse({"--p2p-reserve=some"});
  REQUIRE_FALSE(parsed.ok());
  CHECK(std::string(parsed.status().message()).find("--p2p-reserve expects plan or worst, got 'some'") !=
        std::string::npos);
}

TEST_CASE("policy names: base, @C and the link suffix", "[pipeline_bench]") {
  struct Case {
    std::string name, base;
    double scale;
    bool shared, suffix;
  };
  for (const Case& c : std::vector<Case>{{"po-f", "po-f", 0.0, false, false},
                                         {"po-f@2", "po-f", 2.0, false, false},
                                         {"auto", "auto", 0.0, false, false},
                                         {"po-h:shared", "po-h", 0.0, true, true},
                                         {"po-h:split", "po-h", 0.0, false, true},
                                         {"po-f@3:shared", "po-f", 3.0, true, true},
                                         {"po-f@2.5:split", "po-f", 2.5, false, true},
                                         {"1f1b", "1f1b", 0.0, false, false}}) {
    CAPTURE(c.name);
    const PolicyName name = SplitPolicyName(c.name);
    CHECK(name.base == c.base);
    CHECK(name.scale == c.scale);
    CHECK(name.shared_link == c.shared);
    CHECK(name.link_suffix == c.suffix);
  }
  // Malformed: scale -1 (ParseBenchOptions rejects it).
  for (const std::string bad : {"po-f:joined", "po-f@x", "po-f@0", "po-f:shared@2", "po-f@-1",
                                "po-f@inf"}) {
    CAPTURE(bad);
    CHECK(SplitPolicyName(bad).scale == -1.0);
  }
}

TEST_CASE("recompute policies: no offload, no @C, the model's retained bytes in the costs",
          "[pipeline_bench]") {
  absl::StatusOr<BenchOptions> options = Parse({"--stages=3", "--chunks=2", "--family=interleaved",
                                                "--policies=recompute-full,recompute-lean"});
  REQUIRE(options.ok());
  CHECK(options->policies == std::vector<std::string>{"recompute-full", "recompute-lean"});
  CHECK(PlansRecompute(*options));
  CHECK(PolicyLayout(*options, "recompute-lean") == Layout{Family::kInterleaved, 2, 1});
  CHECK(PlansRecompute(*Parse({"--policies=1f1b,auto"})));
  CHECK(!PlansRecompute(*Parse({"--policies=1f1b,po-f,selective"})));
  for (const std::string bad : {"recompute-full@2", "recompute-lean:shared", "recompute"}) {
    CAPTURE(bad);
    CHECK(!Parse({"--policies=" + bad}).ok());
  }
  // Retained bytes per virtual stage as the model reports them; <= 0 is "not offered" (0).
  ChunkCosts costs = Chunk(1.0, 2.0, 64);
  costs.retained_full_bytes = 4;
  costs.retained_lean_bytes = -1;
  const Layout layout{Family::kInterleaved, 2, 1};
  const CostModel solo = SoloCostModel(*options, layout, costs, LinkFigures{1.0, 1.0, 1.0});
  CHECK(solo.retained_full_bytes_per_virtual_stage == std::vector<std::int64_t>(6, 4));
  CHECK(solo.retained_lean_bytes_per_virtual_stage == std::vector<std::int64_t>(6, 0));
  // Not measured: derived from the forward; whole-entry rebuilds (the default).
  CHECK(solo.recompute_lean_time < 0);
  CHECK(solo.lean_rebuild_bytes_per_virtual_stage == std::vector<std::int64_t>(6, -1));
  // A lean op whose B reads the block in place measures 0 and allocates nothing: both kept, not
  // mistaken for "not measured" (a quarter of F, which made auto avoid lean on the H100).
  ChunkCosts in_place = costs;
  in_place.recompute_lean_s = 0.0;
  in_place.lean_rebuild_bytes = 0;
  const CostModel read = SoloCostModel(*options, layout, in_place, LinkFigures{1.0, 1.0, 1.0});
  CHECK(read.recompute_lean_time == 0.0);
  CHECK(read.RecomputeTime(0, Recompute::kLean) == 0.0);
  CHECK(read.lean_rebuild_bytes_per_virtual_stage == std::vector<std::int64_t>(6, 0));
  // Rescaled to deeper chunks: full keeps the input whatever the depth, lean a part per layer.
  costs.retained_lean_bytes = 24;
  costs.recompute_full_s = 1.0;  // measured: the planner's RECOMPUTE durations, per layer
  costs.recompute_lean_s = 0.125;
  const CostModel timed = SoloCostModel(*options, layout, costs, LinkFigures{1.0, 1.0, 1.0});
  CHECK(timed.RecomputeTime(0, Recompute::kFull) == 1.0);
  CHECK(timed.RecomputeTime(0, Recompute::kLean) == 0.125);
  const ChunkCosts deeper = RescaleChunk(costs, 1, 3);
  CHECK(deeper.recompute_full_s == 3.0);
  CHECK(deeper.recompute_lean_s == 0.375);
  CHECK(deeper.saved_bytes == 192);
  CHECK(deeper.retained_full_bytes == 4);
  CHECK(deeper.retained_lean_bytes == 72);

  // Planned: every entry recomputed before its B, in that mode, and stage 0's peak lower.
  costs.retained_lean_bytes = 32;
  costs.recompute_full_s = costs.recompute_lean_s = -1.0;  // derived
  absl::StatusOr<PlannedPolicy> plain = PlanPolicy(*options, "none", costs, 1, LinkFigures{}, 0);
  REQUIRE(plain.ok());
  for (const auto& [policy, kind] : {std::pair{"recompute-full", OpKind::kRecompute},
                                     std::pair{"recompute-lean", OpKind::kRecomputeLean}}) {
    CAPTURE(policy);
    absl::StatusOr<PlannedPolicy> plan = PlanPolicy(*options, policy, costs, 1, LinkFigures{}, 0);
    REQUIRE(plan.ok());
    int forwards = 0, recomputes = 0;
    for (const StageProgram& program : plan->schedule.stages) {
      for (const Op& op : program.ops) {
        forwards += op.kind == OpKind::kForward ? 1 : 0;
        recomputes += op.kind == kind ? 1 : 0;
      }
    }
    CHECK(recomputes == forwards);
    CHECK(plan->schedule.predictions->stages[0].peak_bytes <
          plain->schedule.predictions->stages[0].peak_bytes);
  }
}

TEST_CASE("recompute-MODE+po-f: every entry recomputed, what F keeps offloaded",
          "[pipeline_bench]") {
  absl::StatusOr<BenchOptions> options =
      Parse({"--stages=4", "--chunks=2", "--family=interleaved", "--microbatches=8",
             "--policies=recompute-lean+po-f,recompute-full+po-f@2"});
  REQUIRE(options.ok());
  CHECK(PlansRecompute(*options));
  for (const std::string bad : {"recompute+po-f", "recompute-lean+po-h", "po-f+po-f"}) {
    CAPTURE(bad);
    CHECK(!Parse({"--policies=" + bad}).ok());
  }
  ChunkCosts costs = Chunk(1.0, 2.0, 64);
  costs.retained_full_bytes = 4;
  costs.retained_lean_bytes = 32;
  for (const auto& [policy, kind, retained] :
       {std::tuple{"recompute-lean+po-f", OpKind::kRecomputeLean, 32},
        std::tuple{"recompute-full+po-f@2", OpKind::kRecompute, 4}}) {
    CAPTURE(policy);
    absl::StatusOr<PlannedPolicy> alone = PlanPolicy(
        *options, std::string(policy).substr(0, std::string(policy).find('+')), costs, 1,
        LinkFigures{}, 0);
    absl::StatusOr<PlannedPolicy> plan = PlanPolicy(*options, policy, costs, 1, LinkFigures{}, 0);
    INFO(plan.status().ToString());
    REQUIRE(alone.ok());
    REQUIRE(plan.ok());
    int forwards = 0, recomputes = 0, offloads = 0;
    for (const StageProgram& program : plan->schedule.stages) {
      for (const Op& op : program.ops) {
        forwards += op.kind == OpKind::kForward ? 1 : 0;
        recomputes += op.kind == kind ? 1 : 0;
        offloads += op.kind == OpKind::kOffload ? 1 : 0;
      }
    }
    CHECK(recomputes == forwards);
    CHECK(offloads > 0);
    std::int64_t offloaded = 0;
    for (const StagePrediction& stage : plan->schedule.predictions->stages) {
      offloaded += stage.offloaded_bytes;
    }
    CHECK(offloaded == offloads * retained);  // every copy moves a retained block
    CHECK(plan->schedule.predictions->stages[0].peak_bytes <=
          alone->schedule.predictions->stages[0].peak_bytes);
  }
}

TEST_CASE("--release: defer by default, wait or uncapped on request, nothing else",
          "[pipeline_bench]") {
  absl::StatusOr<BenchOptions> options = Parse({});
  REQUIRE(options.ok());
  CHECK(!options->release_wait);
  options = Parse({"--release=wait"});
  REQUIRE(options.ok());
  CHECK(options->release_wait);
  options = Parse({"--release=wait", "--release=defer"});
  REQUIRE(options.ok());
  CHECK(!options->release_wait);
  options = Parse({"--release=later"});
  REQUIRE(options.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(options.status().message())
            .find("--release expects defer, wait or defer-uncapped, got 'later'") !=
        std::string::npos);
  CHECK(BenchHelpText().find("--release defer|wait|defer-uncapped") != std::string::npos);
  options = Parse({"--release=defer-uncapped"});
  REQUIRE(options.ok());
  CHECK(options->release_uncapped);
  CHECK(!options->release_wait);
}

TEST_CASE("calibration: scale = measured / simulated baseline; compute scales, copies do not",
          "[pipeline_bench]") {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  REQUIRE(CalibrationScale(2.0, 1.6).ok());
  CHECK(*CalibrationScale(2.0, 1.6) == Approx(1.25));
  CHECK(*CalibrationScale(0.9, 1.0) == Approx(0.9));
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (const auto& [measured, predicted] : std::vector<std::pair<double, double>>{
           {0.0, 1.0}, {1.0, 0.0}, {-1.0, 1.0}, {kNan, 1.0}, {1.0, kInf}}) {
    CAPTURE(measured, predicted);
    CHECK(CalibrationScale(measured, predicted).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }

  // Without copies (and with free P2P) the fluid model is homogeneous in time: the calibrated
  // step is the solo one times the scale, so the baseline's calibrated prediction gives back
  // its measured step.
  PipelineSpec spec;
  spec.num_stages = 2;
  spec.num_microbatches = 4;
  PlannedPolicy base;
  base.name = "1f1b";
  base.solo = testing::HandTimedCosts();
  absl::StatusOr<Schedule> compiled = Compile(spec, base.solo);
  REQUIRE(compiled.ok());
  base.schedule = *compiled;
  absl::StatusOr<SharedGpuPrediction> solo = SimulateSharedGpu(base.schedule, base.solo);
  REQUIRE(solo.ok());
  const double measured = solo->step_time * 1.08;
  absl::StatusOr<double> scale = CalibrationScale(measured, solo->step_time);
  REQUIRE(scale.ok());
  absl::StatusOr<SharedGpuPrediction> calibrated = CalibratedPrediction(base, *scale);
  REQUIRE(calibrated.ok());
  CHECK(calibrated->step_time == Approx(measured));
  CHECK(calibrated->compute_work == Approx(solo->compute_work * 1.08));

  // With copies: F0, OFFLOAD0, RELEASE0, RELOAD0, B0 at 5 B/s each way. Solo (F = B = 1):
  // 1 + 2 + 2 + 1 = 6 s; at scale 2 only compute doubles: 2 + 2 + 2 + 2 = 8 s (not 12).
  PlannedPolicy copies;
  copies.name = "po-f";
  copies.solo = testing::HandTimedCosts();
  copies.solo.d2h_bandwidth = copies.solo.h2d_bandwidth = 5.0;
  copies.schedule = OneStage({testing::F(0), testing::Offload(0),
                              testing::Release(0), testing::Reload(0),
                              testing::B(0)},
                             1);
  absl::StatusOr<SharedGpuPrediction> one = CalibratedPrediction(copies, 1.0);
  absl::StatusOr<SharedGpuPrediction> two = CalibratedPrediction(copies, 2.0);
  REQUIRE(one.ok());
  REQUIRE(two.ok());
  CHECK(one->step_time == Approx(6.0));
  CHECK(two->step_time == Approx(8.0));
  CHECK(two->copy_stall == Approx(4.0));
  CHECK(CalibratedPrediction(copies, 0.0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CalibratedPrediction(copies, kNan).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("calibration: filled from the 1f1b run, only for policies that ran",
          "[pipeline_bench]") {
  BenchOptions options;
  options.family = "group-interleaved";
  options.chunks = 2;
  options.policies = {"po-f", "1f1b", "po-h", "po-f:shared"};
  absl::StatusOr<std::vector<PlannedPolicy>> planned =
      PlanPolicies(options, Chunk(2e-3, 4e-3, 50'000'000), LinkFigures{});
  REQUIRE(planned.ok());
  std::vector<std::optional<PlannedPolicy>> plans(planned->begin(), planned->end());
  BenchRun run;
  for (const PlannedPolicy& plan : *planned) {
    PolicyRun result;
    result.name = plan.name;
    result.predicted_step = plan.shared.step_time;
    result.step_seconds = {plan.shared.step_time * 1.1};
    run.policies.push_back(result);
  }
  run.policies[2].error = "failed to run";  // po-h: no calibrated step
  run.policies[2].step_seconds.clear();
  plans[3].reset();                          // po-f:shared: no plan kept

  BenchRun without = run;
  without.policies[1].step_seconds.clear();  // 1f1b did not run: nothing to calibrate with
  without.policies[1].error = "out of memory";
  REQUIRE(Calibrate(plans, without).ok());
  CHECK(without.calibration_scale == 0.0);
  for (const PolicyRun& result : without.policies) CHECK(result.calibrated_step == 0.0);

  REQUIRE(Calibrate(plans, run).ok());
  CHECK(run.calibration_scale == Approx(1.1));
  CHECK(run.policies[1].calibrated_step == Approx(run.policies[1].MedianStep()));
  absl::StatusOr<SharedGpuPrediction> po_f = CalibratedPrediction(*plans[0], 1.1);
  REQUIRE(po_f.ok());
  CHECK(run.policies[0].calibrated_step == po_f->step_time);
  CHECK(run.policies[0].calibrated_step > run.policies[0].predicted_step);
  CHECK(run.policies[2].calibrated_step == 0.0);
  CHECK(run.policies[3].calibrated_step == 0.0);

  BenchRun broken = run;
  broken.policies[1].predicted_step = 0.0;  // a baseline without a prediction: an error
  broken.calibration_scale = 0.0;
  CHECK(Calibrate(plans, broken).code() == absl::StatusCode::kInvalidArgument);
  CHECK(broken.calibration_scale == 0.0);
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

}  // namespace
}  // namespace pipeoffload::bench
