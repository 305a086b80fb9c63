// Executor on schedules from the real compiler (Compile): every family and offload policy runs
// the toy model on 4 stages over the local transport, bitwise equal to the single-process
// reference and to each other, with each stage's measured stash high-water mark equal to the
// compiler's predicted peak_bytes exactly, and a measured trace in the simulator's layout.
// Each stage's measured P2P high-water mark stays within AnalyzeP2P's bound, and with the P2P
// plan the executor runs every case in an arena of exactly the aligned stash peak plus the
// aligned P2P bound, over a transport whose sends lag (the receiver copies, late).
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lib/base/check.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/p2p_lifetimes.h"
#include "lib/runtime/program_check.h"

#include "pipeoffload/compiler.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/trace.h"
#include "tests/runtime/toy_model.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::GradsByVirtualStage;
using testing::HarnessOptions;
using testing::RunToyPipeline;
using testing::StageOutcome;
using testing::ToyConfig;
using testing::ToyReference;
using testing::ToyStageModel;

constexpr int kWidth = 64;
constexpr int kExtraWords = 8;  // chunk c saves 8 * (c + 1) extra words: chunks differ in size
constexpr std::int64_t kBoundaryBytes = 4 * kWidth;  // ToyStageModel::BoundaryBytes
constexpr std::int64_t kAlignment = 256;             // DeviceArenaOptions' default

struct Case {
  Family family;
  int chunks;
  OffloadPolicy policy;
  bool split;
};

std::string Name(const Case& c) {
  return std::string(FamilyName(c.family)) + " v=" + std::to_string(c.chunks) + " " +
         std::string(OffloadPolicyName(c.policy)) + (c.split ? " split" : "");
}

// Compiles `c` for p = 4, m = 8 with activation bytes equal to the toy model's SavedBytes.
absl::StatusOr<Schedule> CompileCase(const Case& c) {
  PipelineSpec spec;
  spec.family = c.family;
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.chunks_per_stage = c.chunks;
  spec.split_backward = c.split;
  spec.offload = c.policy;
  spec.offload_fraction = 0.5;
  CostModel cost = UnitCostModel(/*offload_ratio_k=*/0.5);
  // auto: room for three of the largest entries, fewer than every V stage holds without offload.
  if (c.policy == OffloadPolicy::kAuto) {
    spec.memory_budget_bytes =
        3 * ToyStageModel(ToyConfig{4, c.chunks, 8, kWidth, kExtraWords}, 0)
                .SavedBytes(c.chunks - 1, c.split);
  }
  const ToyConfig config{4, c.chunks, 8, kWidth, kExtraWords};
  for (int chunk = 0; chunk < c.chunks; ++chunk) {
    const std::int64_t bytes = ToyStageModel(config, 0).SavedBytes(chunk, c.split);
    for (int stage = 0; stage < 4; ++stage) cost.activation_bytes_per_virtual_stage.push_back(bytes);
  }
  cost.boundary_bytes = 4 * kWidth;
  return Compile(spec, cost);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (bool split : {false, true}) {
    for (OffloadPolicy policy : {OffloadPolicy::kNone, OffloadPolicy::kHalf, OffloadPolicy::kFull,
                                 OffloadPolicy::kSelective}) {
      cases.push_back(Case{Family::k1F1B, 1, policy, split});
      cases.push_back(Case{Family::kInterleaved, 2, policy, split});
      cases.push_back(Case{Family::kGroupInterleaved, 2, policy, split});
      // V placement (always split): chunks 0 and 1 of stage 3 are virtual stages 3 and 4, so
      // the executor hands F's output and B's input gradient over locally there.
      if (split) cases.push_back(Case{Family::kZbv, 2, policy, split});
      if (split) cases.push_back(Case{Family::kDualPipeV, 2, policy, split});
    }
  }
  cases.push_back(Case{Family::kZbv, 2, OffloadPolicy::kAuto, true});
  cases.push_back(Case{Family::kDualPipeV, 2, OffloadPolicy::kAuto, true});
  return cases;
}

// The toy harness with every copy starting 0.5-1 ms late, so a deferred RELEASE really leaves
// blocks behind it and sends really lag.
HarnessOptions DelayedCopies() {
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  options.backend.min_copy_delay_seconds = 0.0005;
  options.backend.max_copy_delay_seconds = 0.001;
  options.executor.wait_timeout_seconds = 30.0;
  return options;
}

TEST_CASE("compiled schedules run bitwise equal to the reference with exact stash peaks",
          "[runtime][compiled]") {
  HarnessOptions options = DelayedCopies();
  bool physical_above_logical = false;  // somewhere a released block outlived its RELEASE
  for (const Case& c : AllCases()) {
    INFO(Name(c));
    absl::StatusOr<Schedule> schedule = CompileCase(c);
    INFO(schedule.status().ToString());
    REQUIRE(schedule.ok());
    REQUIRE(schedule->predictions.has_value());
    absl::StatusOr<std::vector<P2PLifetimes>> p2p = AnalyzeP2P(*schedule);
    INFO(p2p.status().ToString());
    REQUIRE(p2p.ok());
    // Deferred RELEASE capped at the predicted peak (the default), the blocking one, and
    // deferred without a cap, on the same schedule.
    enum Mode { kCapped, kBlocking, kUncapped };
    std::vector<std::vector<StageOutcome>> runs;
    for (Mode mode : {kCapped, kBlocking, kUncapped}) {
      options.executor.stash.wait_for_copy_at_release = mode == kBlocking;
      options.executor.stash_physical_slack_bytes = mode == kUncapped ? -1 : 0;
      runs.push_back(RunToyPipeline(*schedule, options));
    }
    for (std::size_t mode = 0; mode < runs.size(); ++mode) {
      CAPTURE(mode);
      const std::vector<StageOutcome>& outcomes = runs[mode];
      for (std::size_t d = 0; d < outcomes.size(); ++d) {
        // Not OK would include DataLoss: a B or W that read the poison pattern.
        INFO("stage " << d << ": " << outcomes[d].status.ToString());
        REQUIRE(outcomes[d].status.ok());
      }
      CHECK(GradsByVirtualStage(outcomes, 4, c.chunks, schedule->spec.placement) ==
            ToyReference(ToyConfig{4, c.chunks, 8, kWidth, kExtraWords}));
      std::int64_t offloaded = 0;
      for (int d = 0; d < 4; ++d) {
        CAPTURE(d);
        const StagePrediction& predicted =
            schedule->predictions->stages[static_cast<std::size_t>(d)];
        const IterationStats& measured = outcomes[static_cast<std::size_t>(d)].iterations[0];
        CHECK(measured.stash_high_water_bytes == predicted.peak_bytes);
        CHECK(measured.stash_high_water_entries == predicted.peak_units);
        CHECK(measured.host_high_water_bytes == predicted.host_bytes);
        CHECK(measured.offloaded_bytes == predicted.offloaded_bytes);
        CHECK(outcomes[static_cast<std::size_t>(d)].arena_in_use_after == 0);
        // No plan, eager transport (sends finish at once): the measured P2P peak is within the
        // bound.
        CHECK(measured.p2p_high_water_bytes > 0);
        CHECK(measured.p2p_high_water_bytes <=
              P2PBoundBytes((*p2p)[static_cast<std::size_t>(d)], kBoundaryBytes, 1));
        // Physical stash bytes also hold blocks whose copy was running: never fewer than the
        // logical ones, never beyond the budget; with a blocking RELEASE the two coincide.
        CHECK(measured.stash_physical_high_water_bytes >= measured.stash_high_water_bytes);
        CHECK(measured.stash_physical_high_water_bytes <= options.arena_budget_bytes);
        // Blocking, and deferred within the predicted peak: physical peak == prediction.
        if (mode != kUncapped) {
          CHECK(measured.stash_physical_high_water_bytes == predicted.peak_bytes);
        } else if (measured.stash_physical_high_water_bytes > measured.stash_high_water_bytes) {
          physical_above_logical = true;
        }
        CHECK(measured.release_wait_seconds <= measured.wait_seconds);
        if (measured.offloaded_bytes == 0) CHECK(measured.release_wait_seconds == 0.0);
        offloaded += measured.offloaded_bytes;
      }
      if (c.policy == OffloadPolicy::kNone) {
        CHECK(offloaded == 0);
      } else {
        CHECK(offloaded > 0);
      }
    }
    // Every release mode gives bitwise equal gradients.
    CHECK(GradsByVirtualStage(runs[0], 4, c.chunks) == GradsByVirtualStage(runs[1], 4, c.chunks));
    CHECK(GradsByVirtualStage(runs[2], 4, c.chunks) == GradsByVirtualStage(runs[1], 4, c.chunks));
    // Offload must have saved device memory somewhere, or the comparison proves little.
    std::int64_t peaks = 0;
    std::int64_t peaks_without_offload = 0;
    for (const StagePrediction& stage : schedule->predictions->stages) {
      peaks += stage.peak_bytes;
      peaks_without_offload += stage.peak_bytes_without_offload;
    }
    if (c.policy == OffloadPolicy::kNone) {
      CHECK(peaks == peaks_without_offload);
    } else {
      CHECK(peaks < peaks_without_offload);
    }
  }
  // The uncapped deferred release was exercised, not just configured.
  CHECK(physical_above_logical);
}

TEST_CASE("a measured run writes a trace in the simulator's layout", "[runtime][compiled][trace]") {
  const Case c{Family::k1F1B, 1, OffloadPolicy::kFull, false};
  absl::StatusOr<Schedule> schedule = CompileCase(c);
  REQUIRE(schedule.ok());
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  const auto outcomes = RunToyPipeline(*schedule, options);
  std::vector<IterationStats> stats;
  for (const StageOutcome& outcome : outcomes) {
    REQUIRE(outcome.status.ok());
    stats.push_back(outcome.iterations[0]);
  }
  absl::StatusOr<Timeline> timeline = MeasuredTimeline(stats);
  REQUIRE(timeline.ok());
  const std::string trace = TimelineToTraceJson(*schedule, *timeline, 1e6);
  INFO(trace.substr(0, 2000));
  CHECK(trace.find("\"D2H\"") != std::string::npos);
  CHECK(trace.find("\"H2D\"") != std::string::npos);
  CHECK(trace.find("\"OFFLOAD0.0\"") != std::string::npos);
  CHECK(trace.find("\"stage 3\"") != std::string::npos);
}

// A receive copier that first sleeps 0-300 us (random), so receivers are slow to take messages
// and each sender's block really stays in use until its receiver has copied it (rendezvous).
absl::Status SlowCopy(void* dst, const void* src, std::int64_t bytes) {
  thread_local std::minstd_rand random(
      static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
  std::memcpy(dst, src, static_cast<std::size_t>(bytes));
  return absl::OkStatus();
}

// Runs `schedule` like RunToyPipeline, but over the local transport with SlowCopy receive
// copiers, each stage with its own P2P plan (plan[d].guarantee_point) and an arena of
// budget[d] bytes.
std::vector<StageOutcome> RunPlanned(const Schedule& schedule,
                                     const std::vector<P2PLifetimes>& plan,
                                     const std::vector<std::int64_t>& budget,
                                     const HarnessOptions& options) {
  const int p = schedule.spec.num_stages;
  std::vector<StageOutcome> outcomes(static_cast<std::size_t>(p));
  LocalTransportOptions transport_options;
  transport_options.receive_copiers = {SlowCopy};
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> transports =
      CreateLocalTransports(p, transport_options);
  if (!transports.ok()) {
    for (StageOutcome& outcome : outcomes) outcome.status = transports.status();
    return outcomes;
  }
  const ToyConfig config{p,
                         schedule.spec.chunks_per_stage,
                         schedule.spec.num_microbatches,
                         options.width,
                         options.extra_words,
                         schedule.spec.placement};
  auto run_stage = [&](int d) -> absl::Status {
    StageOutcome& outcome = outcomes[static_cast<std::size_t>(d)];
    PO_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCpuBackend(options.backend));
    DeviceArenaOptions arena_options;
    arena_options.budget_bytes = budget[static_cast<std::size_t>(d)];
    arena_options.alignment = kAlignment;
    PO_ASSIGN_OR_RETURN(std::unique_ptr<DeviceArena> arena,
                        DeviceArena::Create(*backend, arena_options));
    ToyStageModel model(config, d);
    ExecutorOptions executor_options = options.executor;
    executor_options.p2p_guarantee_points = plan[static_cast<std::size_t>(d)].guarantee_point;
    const absl::Status status = [&]() -> absl::Status {
      PO_ASSIGN_OR_RETURN(
          std::unique_ptr<Executor> executor,
          Executor::Create(schedule.spec, schedule.stages[static_cast<std::size_t>(d)], model,
                           *backend, *arena, *(*transports)[static_cast<std::size_t>(d)],
                           executor_options));
      for (int it = 0; it < options.iterations; ++it) {
        PO_ASSIGN_OR_RETURN(IterationStats stats, executor->Run());
        outcome.iterations.push_back(std::move(stats));
      }
      return absl::OkStatus();
    }();
    for (int c = 0; c < config.chunks_per_stage; ++c) outcome.grads.push_back(model.grads(c));
    for (MemoryCategory category :
         {MemoryCategory::kStash, MemoryCategory::kP2P, MemoryCategory::kOther}) {
      outcome.arena_in_use_after += arena->Usage(category).in_use_bytes;
    }
    return status;
  };
  std::vector<std::thread> threads;
  for (int d = 0; d < p; ++d) {
    threads.emplace_back([&, d] { outcomes[static_cast<std::size_t>(d)].status = run_stage(d); });
  }
  for (std::thread& thread : threads) thread.join();
  return outcomes;
}

// What each stage needs with its plan: its aligned stash peak plus its aligned P2P bound.
std::vector<std::int64_t> TightBudgets(const Schedule& schedule,
                                       const std::vector<P2PLifetimes>& plan) {
  std::vector<std::int64_t> budgets;
  const ToyConfig config{4, schedule.spec.chunks_per_stage, 8, kWidth, kExtraWords};
  for (int d = 0; d < 4; ++d) {
    const ToyStageModel model(config, d);
    absl::StatusOr<internal::ProgramNeeds> needs = internal::CheckStageProgram(
        schedule.spec, schedule.stages[static_cast<std::size_t>(d)], model, kAlignment);
    PO_CHECK(needs.ok());
    budgets.push_back(
        needs->stash_peak_aligned_bytes +
        P2PBoundBytes(plan[static_cast<std::size_t>(d)], model.BoundaryBytes(), kAlignment));
  }
  return budgets;
}

int WorstCaseBlocks(const StageProgram& program) {  // bench ArenaBudget's P2P reserve
  int p2p_ops = 0;
  for (const Op& op : program.ops) p2p_ops += IsP2P(op.kind) ? 1 : 0;
  return p2p_ops + 2;
}

TEST_CASE("with its P2P plan every compiled case runs in stash peak + P2P bound, exactly",
          "[runtime][compiled][p2p]") {
  // Both guarantees: the receive posted (local / MPI), and the message consumed (any transport,
  // NCCL's in-order stream included), whose bound is never below the other's.
  const P2PGuarantee guarantee =
      GENERATE(P2PGuarantee::kReceivePosted, P2PGuarantee::kMessageConsumed);
  CAPTURE(static_cast<int>(guarantee));
  HarnessOptions options = DelayedCopies();
  options.iterations = 2;  // the second iteration reuses every block
  int reached = 0;         // stage iterations whose measured P2P peak equals the bound
  int bound_blocks = 0, worst_blocks = 0;
  for (const Case& c : AllCases()) {
    INFO(Name(c));
    absl::StatusOr<Schedule> schedule = CompileCase(c);
    REQUIRE(schedule.ok());
    absl::StatusOr<std::vector<P2PLifetimes>> plan = AnalyzeP2P(*schedule, guarantee);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    if (guarantee == P2PGuarantee::kMessageConsumed) {
      absl::StatusOr<std::vector<P2PLifetimes>> posted = AnalyzeP2P(*schedule);
      REQUIRE(posted.ok());
      for (std::size_t d = 0; d < plan->size(); ++d) {
        CHECK((*plan)[d].peak_blocks >= (*posted)[d].peak_blocks);
        for (std::size_t j = 0; j < (*plan)[d].guarantee_point.size(); ++j) {
          CHECK((*plan)[d].guarantee_point[j] >= (*posted)[d].guarantee_point[j]);
        }
      }
    }
    const std::vector<StageOutcome> outcomes =
        RunPlanned(*schedule, *plan, TightBudgets(*schedule, *plan), options);
    std::string all;  // every stage's status, for a failure's message
    for (const StageOutcome& outcome : outcomes) all += outcome.status.ToString() + "\n";
    INFO(all);
    for (std::size_t d = 0; d < outcomes.size(); ++d) {
      CAPTURE(d);
      // Not OK would include ResourceExhausted (the bound too low) or DeadlineExceeded (a
      // wait at a guarantee point that cannot finish).
      INFO("stage " << d << ": " << outcomes[d].status.ToString());
      REQUIRE(outcomes[d].status.ok());
      REQUIRE(outcomes[d].iterations.size() == 2);
      CHECK(outcomes[d].arena_in_use_after == 0);
      const std::int64_t bound = P2PBoundBytes((*plan)[d], kBoundaryBytes, 1);
      for (const IterationStats& stats : outcomes[d].iterations) {
        CHECK(stats.p2p_high_water_bytes <= bound);
        if (stats.p2p_high_water_bytes == bound) ++reached;
      }
      CHECK((*plan)[d].peak_blocks <= WorstCaseBlocks(schedule->stages[d]));
      bound_blocks += (*plan)[d].peak_blocks;
      worst_blocks += WorstCaseBlocks(schedule->stages[d]);
    }
    // Bitwise equal to the unplanned executor over the eager transport, which the test above
    // holds equal to the single-process reference (here over two iterations).
    const std::vector<StageOutcome> unplanned = RunToyPipeline(*schedule, options);
    for (const StageOutcome& outcome : unplanned) REQUIRE(outcome.status.ok());
    CHECK(GradsByVirtualStage(outcomes, 4, c.chunks) ==
          GradsByVirtualStage(unplanned, 4, c.chunks));
  }
  // The bound is tight (some stage reached it) and well below today's reserve overall.
  CHECK(reached > 0);
  CHECK(2 * bound_blocks <= worst_blocks);
}

TEST_CASE("the executor checks its P2P plan and that the arena holds what it needs",
          "[runtime][compiled][p2p]") {
  const Case c{Family::kInterleaved, 2, OffloadPolicy::kHalf, false};
  absl::StatusOr<Schedule> schedule = CompileCase(c);
  REQUIRE(schedule.ok());
  absl::StatusOr<std::vector<P2PLifetimes>> plan = AnalyzeP2P(*schedule);
  REQUIRE(plan.ok());
  std::vector<std::int64_t> budgets = TightBudgets(*schedule, *plan);
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  options.executor.wait_timeout_seconds = 1.0;  // the other stages wait for stage 1 in vain
  std::string expected;
  absl::StatusCode code = absl::StatusCode::kOk;
  SECTION("one aligned block short on stage 1") {
    budgets[1] -= kAlignment;
    code = absl::StatusCode::kResourceExhausted;
    expected = "plus its P2P plan's peak of " + std::to_string((*plan)[1].peak_blocks) +
               " boundary blocks";
  }
  SECTION("a plan that does not fit the program") {
    (*plan)[1].guarantee_point.pop_back();
    code = absl::StatusCode::kInvalidArgument;
    expected = "guarantee points for";
  }
  SECTION("a guarantee point on an op that is not a SEND") {
    const StageProgram& program = schedule->stages[1];
    std::size_t j = 0;
    while (IsSend(program.ops[j].kind)) ++j;
    (*plan)[1].guarantee_point[j] = 3;
    code = absl::StatusCode::kInvalidArgument;
    expected = "expected -1 (not a SEND)";
  }
  const std::vector<StageOutcome> outcomes = RunPlanned(*schedule, *plan, budgets, options);
  INFO(outcomes[1].status.ToString());
  CHECK(outcomes[1].status.code() == code);
  CHECK(std::string(outcomes[1].status.message()).find(expected) != std::string::npos);
}

}  // namespace
}  // namespace pipeoffload
