// Recompute on the CPU backend (issue 15): schedules whose entries are kept, recomputed from
// the lean layout or from the chunk's input, or a mix per entry, run the toy model bitwise
// equal to the single-process reference (so to no recompute), with and without split backward,
// on 1F1B and interleaved; each stage's measured stash high-water mark equals the simulator's
// predicted peak_bytes exactly, and stage 0's peak is below the no-recompute one. A model that
// does not offer a mode is refused before anything runs.
#include <algorithm>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
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

constexpr int kStages = 4;
constexpr int kMicrobatches = 8;
// Small x, many extra words (chunk c saves 64 * (c + 1), lean keeps half): recomputing saves
// most of an entry.
constexpr int kWidth = 16;
constexpr int kExtraWords = 64;

// How a case picks its entries.
enum class Pick { kKeep, kLean, kFull, kMixed };

struct Case {
  Family family;
  int chunks;
  bool split;
  Pick pick;
};

std::string Name(const Case& c) {
  const char* picks[] = {"keep", "lean", "full", "mixed"};
  return std::string(FamilyName(c.family)) + " v=" + std::to_string(c.chunks) +
         (c.split ? " split " : " ") + picks[static_cast<int>(c.pick)];
}

// Unit costs with the toy model's exact bytes, saved and retained, per virtual stage.
CostModel ToyCosts(const Case& c) {
  CostModel cost = UnitCostModel(/*offload_ratio_k=*/0.5);
  const ToyConfig config{kStages, c.chunks, kMicrobatches, kWidth, kExtraWords};
  const ToyStageModel model(config, 0);
  cost.activation_bytes_per_virtual_stage.clear();
  cost.retained_full_bytes_per_virtual_stage.clear();
  cost.retained_lean_bytes_per_virtual_stage.clear();
  for (int chunk = 0; chunk < c.chunks; ++chunk) {
    for (int stage = 0; stage < kStages; ++stage) {
      cost.activation_bytes_per_virtual_stage.push_back(model.SavedBytes(chunk, c.split));
      cost.retained_full_bytes_per_virtual_stage.push_back(
          model.RetainedBytes(chunk, Recompute::kFull, c.split));
      cost.retained_lean_bytes_per_virtual_stage.push_back(
          model.RetainedBytes(chunk, Recompute::kLean, c.split));
    }
  }
  cost.boundary_bytes = 4 * kWidth;
  return cost;
}

PipelineSpec CaseSpec(const Case& c) {
  PipelineSpec spec;
  spec.family = c.family;
  spec.num_stages = kStages;
  spec.num_microbatches = kMicrobatches;
  spec.chunks_per_stage = c.chunks;
  spec.split_backward = c.split;
  spec.recompute = c.pick == Pick::kLean   ? Recompute::kLean
                   : c.pick == Pick::kFull ? Recompute::kFull
                                           : Recompute::kNone;
  return spec;
}

// keep / lean / full by (stage + mb + chunk) % 3: every stage mixes all three.
RecomputeChoice MixedChoice(const Schedule& schedule) {
  RecomputeChoice choice;
  const Recompute modes[] = {Recompute::kNone, Recompute::kLean, Recompute::kFull};
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) {
      if (op.kind != OpKind::kForward) continue;
      choice[{program.stage, op.mb, op.chunk}] = modes[(program.stage + op.mb + op.chunk) % 3];
    }
  }
  return choice;
}

// The case's schedule with predictions: Compile for keep / lean / full, and for the mix the
// no-recompute schedule through AddRecompute, validated and simulated.
absl::StatusOr<Schedule> CaseSchedule(const Case& c) {
  const CostModel cost = ToyCosts(c);
  absl::StatusOr<Schedule> compiled = Compile(CaseSpec(c), cost);
  if (!compiled.ok() || c.pick != Pick::kMixed) return compiled;
  Schedule plain = *compiled;
  plain.predictions.reset();
  absl::StatusOr<Schedule> mixed = AddRecompute(plain, MixedChoice(plain));
  if (!mixed.ok()) return mixed.status();
  if (absl::Status valid = Validate(*mixed); !valid.ok()) return valid;
  absl::StatusOr<Timeline> timeline = Simulate(*mixed, cost);
  if (!timeline.ok()) return timeline.status();
  mixed->predictions = timeline->predictions;
  return mixed;
}

int CountRecomputeOps(const Schedule& schedule, OpKind kind) {
  int count = 0;
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) count += op.kind == kind ? 1 : 0;
  }
  return count;
}

TEST_CASE("recomputed schedules run bitwise equal to the reference with exact stash peaks",
          "[runtime][recompute]") {
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  for (const Family family : {Family::k1F1B, Family::kInterleaved}) {
    const int chunks = family == Family::k1F1B ? 1 : 2;
    for (const bool split : {false, true}) {
      std::vector<std::int64_t> kept_peaks;  // per stage, of the keep case
      for (const Pick pick : {Pick::kKeep, Pick::kLean, Pick::kFull, Pick::kMixed}) {
        const Case c{family, chunks, split, pick};
        INFO(Name(c));
        absl::StatusOr<Schedule> schedule = CaseSchedule(c);
        INFO(schedule.status().ToString());
        REQUIRE(schedule.ok());
        REQUIRE(schedule->predictions.has_value());
        const int entries = kStages * kMicrobatches * chunks;
        const int full = CountRecomputeOps(*schedule, OpKind::kRecompute);
        const int lean = CountRecomputeOps(*schedule, OpKind::kRecomputeLean);
        switch (pick) {
          case Pick::kKeep: CHECK(full + lean == 0); break;
          case Pick::kLean: CHECK((full == 0 && lean == entries)); break;
          case Pick::kFull: CHECK((full == entries && lean == 0)); break;
          case Pick::kMixed: CHECK((full > 0 && lean > 0 && full + lean < entries)); break;
        }
        const std::vector<StageOutcome> outcomes = RunToyPipeline(*schedule, options);
        for (std::size_t d = 0; d < outcomes.size(); ++d) {
          INFO("stage " << d << ": " << outcomes[d].status.ToString());
          REQUIRE(outcomes[d].status.ok());
        }
        CHECK(GradsByVirtualStage(outcomes, kStages, chunks) ==
              ToyReference(ToyConfig{kStages, chunks, kMicrobatches, kWidth, kExtraWords}));
        for (int d = 0; d < kStages; ++d) {
          CAPTURE(d);
          const StagePrediction& predicted =
              schedule->predictions->stages[static_cast<std::size_t>(d)];
          const IterationStats& measured = outcomes[static_cast<std::size_t>(d)].iterations[0];
          CHECK(measured.stash_high_water_bytes == predicted.peak_bytes);
          CHECK(measured.stash_high_water_entries == predicted.peak_units);
          CHECK(measured.offloaded_bytes == 0);
          CHECK(outcomes[static_cast<std::size_t>(d)].arena_in_use_after == 0);
          if (pick == Pick::kKeep) {
            kept_peaks.push_back(predicted.peak_bytes);
            CHECK(measured.recompute_seconds == 0.0);
          } else if (d == 0) {
            // Stage 0 holds the most entries; there recompute must save memory. (A stage that
            // holds one entry at a time needs both blocks during the recompute: no saving.)
            CHECK(predicted.peak_bytes < kept_peaks[0]);
          }
          for (const TimedOp& timed : measured.ops) {
            if (IsRecompute(timed.op.kind)) CHECK(timed.engine == Engine::kCompute);
          }
        }
      }
    }
  }
}

TEST_CASE("a full recompute's stash peak is exact by hand", "[runtime][recompute]") {
  // One stage, one chunk, 2 microbatches, every entry recomputed in full: F0 F1 (two retained
  // blocks), then RECOMPUTE0 (+ a full entry while both retained blocks live), B0 frees it.
  const Case c{Family::k1F1B, 1, false, Pick::kFull};
  const ToyConfig config{1, 1, 2, kWidth, kExtraWords};
  const ToyStageModel model(config, 0);
  const std::int64_t saved = model.SavedBytes(0, false);
  const std::int64_t retained = model.RetainedBytes(0, Recompute::kFull, false);
  REQUIRE(saved == 4 * (3 + kWidth + kExtraWords));
  REQUIRE(retained == 4 * (3 + kWidth));
  Schedule schedule;
  schedule.spec = CaseSpec(c);
  schedule.spec.num_stages = 1;
  schedule.spec.num_microbatches = 2;
  schedule.stages = {StageProgram{0,
                                  {{OpKind::kForward, 0, 0, -1},
                                   {OpKind::kForward, 1, 0, -1},
                                   {OpKind::kRecompute, 0, 0, -1},
                                   {OpKind::kBackward, 0, 0, -1},
                                   {OpKind::kRecompute, 1, 0, -1},
                                   {OpKind::kBackward, 1, 0, -1}}}};
  REQUIRE(Validate(schedule).ok());
  CostModel cost = ToyCosts(Case{Family::k1F1B, 1, false, Pick::kFull});
  cost.activation_bytes_per_virtual_stage = {saved};
  cost.retained_full_bytes_per_virtual_stage = {retained};
  cost.retained_lean_bytes_per_virtual_stage = {};
  absl::StatusOr<Timeline> timeline = Simulate(schedule, cost);
  REQUIRE(timeline.ok());
  CHECK(timeline->predictions.stages[0].peak_bytes == 2 * retained + saved);
  CHECK(timeline->predictions.stages[0].peak_units == 2);
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  const std::vector<StageOutcome> outcomes = RunToyPipeline(schedule, options);
  REQUIRE(outcomes[0].status.ok());
  const IterationStats& measured = outcomes[0].iterations[0];
  CHECK(measured.stash_high_water_bytes == 2 * retained + saved);
  CHECK(GradsByVirtualStage(outcomes, 1, 1) == ToyReference(config));
  // The stash's samples: F0, F1 (retained), RECOMPUTE0 grows then drops, B0 frees, and so on.
  std::vector<std::int64_t> bytes;
  for (const MemorySample& sample : measured.memory) bytes.push_back(sample.bytes);
  CHECK(bytes == std::vector<std::int64_t>{0, retained, 2 * retained, 2 * retained + saved,
                                           retained + saved, retained, retained + saved, saved,
                                           0});
}

TEST_CASE("auto's per-entry mix of offload and recompute runs bitwise with exact peaks",
          "[runtime][recompute][mix]") {
  // Below what full offload reaches on its own, auto keeps, offloads or recomputes each entry
  // (schedules/recompute_mix.h); the CPU run carries out all three in one program.
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  for (const bool split : {false, true}) {
    const Case c{Family::kInterleaved, 2, split, Pick::kKeep};
    INFO(Name(c));
    const CostModel cost = ToyCosts(c);
    PipelineSpec spec = CaseSpec(c);
    spec.offload = OffloadPolicy::kFull;
    absl::StatusOr<Schedule> full_offload = Compile(spec, cost);
    REQUIRE(full_offload.ok());
    std::int64_t po_f_peak = 0;
    for (const StagePrediction& stage : full_offload->predictions->stages) {
      po_f_peak = std::max(po_f_peak, stage.peak_bytes);
    }
    spec.offload = OffloadPolicy::kAuto;
    spec.recompute = Recompute::kFull;
    spec.memory_budget_bytes = po_f_peak * 7 / 8;
    absl::StatusOr<Schedule> schedule = Compile(spec, cost);
    INFO(schedule.status().ToString());
    REQUIRE(schedule.ok());
    INFO(schedule->predictions->warnings.back());
    CHECK(CountRecomputeOps(*schedule, OpKind::kOffload) > 0);
    CHECK(CountRecomputeOps(*schedule, OpKind::kRecompute) +
              CountRecomputeOps(*schedule, OpKind::kRecomputeLean) >
          0);
    const std::vector<StageOutcome> outcomes = RunToyPipeline(*schedule, options);
    for (std::size_t d = 0; d < outcomes.size(); ++d) {
      INFO("stage " << d << ": " << outcomes[d].status.ToString());
      REQUIRE(outcomes[d].status.ok());
    }
    CHECK(GradsByVirtualStage(outcomes, kStages, c.chunks) ==
          ToyReference(ToyConfig{kStages, c.chunks, kMicrobatches, kWidth, kExtraWords}));
    for (int d = 0; d < kStages; ++d) {
      CAPTURE(d);
      const StagePrediction& predicted = schedule->predictions->stages[static_cast<std::size_t>(d)];
      const IterationStats& measured = outcomes[static_cast<std::size_t>(d)].iterations[0];
      CHECK(predicted.peak_bytes <= spec.memory_budget_bytes);
      CHECK(measured.stash_high_water_bytes == predicted.peak_bytes);
      CHECK(measured.offloaded_bytes == predicted.offloaded_bytes);
      CHECK(outcomes[static_cast<std::size_t>(d)].arena_in_use_after == 0);
    }
  }
}

// The toy model without its recompute hooks: StageModel's defaults.
class KeepOnlyModel final : public StageModel {
 public:
  explicit KeepOnlyModel(const ToyConfig& config) : toy_(config, 0) {}
  std::int64_t SavedBytes(int chunk, bool split) const override {
    return toy_.SavedBytes(chunk, split);
  }
  std::int64_t BoundaryBytes() const override { return toy_.BoundaryBytes(); }
  absl::Status Forward(int mb, int chunk, const void* input, void* output,
                       void* saved) override {
    return toy_.Forward(mb, chunk, input, output, saved);
  }
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input,
                        void* saved, bool with_weight_grad) override {
    return toy_.Backward(mb, chunk, grad_output, grad_input, saved, with_weight_grad);
  }
  absl::Status BackwardWeight(int mb, int chunk, void* saved) override {
    return toy_.BackwardWeight(mb, chunk, saved);
  }

 private:
  ToyStageModel toy_;
};

TEST_CASE("a model that does not offer a recompute mode is refused before the run",
          "[runtime][recompute]") {
  const ToyConfig config{1, 1, 1, kWidth, 0};
  KeepOnlyModel model(config);
  CHECK(model.RetainedBytes(0, Recompute::kLean, false) == -1);
  CHECK(model.ForwardRetaining(0, 0, nullptr, nullptr, nullptr, Recompute::kFull).code() ==
        absl::StatusCode::kUnimplemented);
  CHECK(model.RecomputeSaved(0, 0, nullptr, nullptr, Recompute::kLean).code() ==
        absl::StatusCode::kUnimplemented);
  PipelineSpec spec;
  spec.num_stages = 1;
  spec.num_microbatches = 1;
  const StageProgram program{0,
                             {{OpKind::kForward, 0, 0, -1},
                              {OpKind::kRecomputeLean, 0, 0, -1},
                              {OpKind::kBackward, 0, 0, -1}}};
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend({});
  REQUIRE(backend.ok());
  DeviceArenaOptions arena_options;
  arena_options.budget_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<DeviceArena>> arena =
      DeviceArena::Create(**backend, arena_options);
  REQUIRE(arena.ok());
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> transports = CreateLocalTransports(1);
  REQUIRE(transports.ok());
  const absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(
      spec, program, model, **backend, **arena, *(*transports)[0], ExecutorOptions{});
  INFO(executor.status().ToString());
  REQUIRE(executor.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(executor.status().message()) ==
        "executor: stage 0, op 1 (RECOMPUTE_LEAN0.0): the program recomputes chunk 0 with mode "
        "lean, but the model's RetainedBytes(chunk 0, lean) is -1 (the model does not offer "
        "it); compile without --recompute lean for this model");
}

}  // namespace
}  // namespace pipeoffload
