// Executor on schedules from the real compiler (Compile): every family and offload policy runs
// the toy model on 4 stages over the local transport, bitwise equal to the single-process
// reference and to each other, with each stage's measured stash high-water mark equal to the
// compiler's predicted peak_bytes exactly, and a measured trace in the simulator's layout.
#include <string>
#include <vector>

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
    }
  }
  return cases;
}

TEST_CASE("compiled schedules run bitwise equal to the reference with exact stash peaks",
          "[runtime][compiled]") {
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  // Every copy starts 0.5-1 ms late, so a deferred RELEASE really leaves blocks behind it.
  options.backend.min_copy_delay_seconds = 0.0005;
  options.backend.max_copy_delay_seconds = 0.001;
  options.executor.wait_timeout_seconds = 30.0;
  bool physical_above_logical = false;  // somewhere a released block outlived its RELEASE
  for (const Case& c : AllCases()) {
    INFO(Name(c));
    absl::StatusOr<Schedule> schedule = CompileCase(c);
    INFO(schedule.status().ToString());
    REQUIRE(schedule.ok());
    REQUIRE(schedule->predictions.has_value());
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
      CHECK(GradsByVirtualStage(outcomes, 4, c.chunks) ==
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
        CHECK(measured.release_wait_seconds >= 0.0);
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

}  // namespace
}  // namespace pipeoffload
