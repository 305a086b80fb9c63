// Recompute on the CPU backend (issue 15): schedules whose entries are kept, recomputed from
// the lean layout or from the chunk's input, or a mix per entry, run the toy model bitwise
// equal to the single-process reference (so to no recompute), with and without split backward,
// on 1F1B and interleaved; each stage's measured stash high-water mark equals the simulator's
// predicted peak_bytes exactly, and stage 0's peak is below the no-recompute one; with po-f on
// top the retained blocks travel to the host and back, bytes as predicted. A model that does
// not offer a mode is refused before anything runs.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_planner.h"
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
  // The model's B reads lean blocks in place, and the cost model says so (lean_rebuild_bytes).
  bool lean_in_place = false;
};

std::string Name(const Case& c) {
  const char* picks[] = {"keep", "lean", "full", "mixed"};
  return std::string(FamilyName(c.family)) + " v=" + std::to_string(c.chunks) +
         (c.split ? " split " : " ") + picks[static_cast<int>(c.pick)] +
         (c.lean_in_place ? " in place" : "");
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
  if (c.lean_in_place) cost.lean_rebuild_bytes = 0;
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

// Runs `schedule` on the toy model (kWidth, kExtraWords): every stage must succeed and the
// gradients equal the single-process reference's. Returns each stage's outcome.
// With `backward_reads_lean`, the model's B reads lean retained blocks as they are.
std::vector<StageOutcome> RunBitwise(const Schedule& schedule, bool backward_reads_lean = false) {
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  options.backward_reads_lean = backward_reads_lean;
  const std::vector<StageOutcome> outcomes = RunToyPipeline(schedule, options);
  for (std::size_t d = 0; d < outcomes.size(); ++d) {
    INFO("stage " << d << ": " << outcomes[d].status.ToString());
    REQUIRE(outcomes[d].status.ok());
  }
  const PipelineSpec& spec = schedule.spec;
  CHECK(GradsByVirtualStage(outcomes, spec.num_stages, spec.chunks_per_stage) ==
        ToyReference(ToyConfig{spec.num_stages, spec.chunks_per_stage, spec.num_microbatches,
                               kWidth, kExtraWords}));
  return outcomes;
}

TEST_CASE("recomputed schedules run bitwise equal to the reference with exact stash peaks",
          "[runtime][recompute]") {
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
        const std::vector<StageOutcome> outcomes = RunBitwise(*schedule);
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

// One stage, one chunk, two microbatches running `ops`, every entry recomputed in `mode`:
// the schedule (validated) and a cost model with the toy's exact saved and retained bytes.
struct HandCase {
  Schedule schedule;
  CostModel cost;
  std::int64_t saved = 0, retained = 0;
};
HandCase OneStageHandCase(Recompute mode, std::vector<Op> ops) {
  const Case c{Family::k1F1B, 1, false, mode == Recompute::kLean ? Pick::kLean : Pick::kFull};
  const ToyStageModel model(ToyConfig{1, 1, 2, kWidth, kExtraWords}, 0);
  HandCase hand;
  hand.saved = model.SavedBytes(0, false);
  hand.retained = model.RetainedBytes(0, mode, false);
  hand.schedule.spec = CaseSpec(c);
  hand.schedule.spec.num_stages = 1;
  hand.schedule.spec.num_microbatches = 2;
  hand.schedule.stages = {StageProgram{0, std::move(ops)}};
  REQUIRE(Validate(hand.schedule).ok());
  hand.cost = ToyCosts(c);
  hand.cost.activation_bytes_per_virtual_stage = {hand.saved};
  hand.cost.retained_full_bytes_per_virtual_stage.clear();
  hand.cost.retained_lean_bytes_per_virtual_stage.clear();
  (mode == Recompute::kLean ? hand.cost.retained_lean_bytes_per_virtual_stage
                            : hand.cost.retained_full_bytes_per_virtual_stage) = {hand.retained};
  return hand;
}

TEST_CASE("a full recompute's stash peak is exact by hand", "[runtime][recompute]") {
  // One stage, one chunk, 2 microbatches, every entry recomputed in full: F0 F1 (two retained
  // blocks), then RECOMPUTE0 (+ a full entry while both retained blocks live), B0 frees it.
  const HandCase hand = OneStageHandCase(
      Recompute::kFull, {{OpKind::kForward, 0, 0, -1},
                         {OpKind::kForward, 1, 0, -1},
                         {OpKind::kRecompute, 0, 0, -1},
                         {OpKind::kBackward, 0, 0, -1},
                         {OpKind::kRecompute, 1, 0, -1},
                         {OpKind::kBackward, 1, 0, -1}});
  const ToyConfig config{1, 1, 2, kWidth, kExtraWords};
  const std::int64_t saved = hand.saved;
  const std::int64_t retained = hand.retained;
  REQUIRE(saved == 4 * (3 + kWidth + kExtraWords));
  REQUIRE(retained == 4 * (3 + kWidth));
  const Schedule& schedule = hand.schedule;
  absl::StatusOr<Timeline> timeline = Simulate(schedule, hand.cost);
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
    const std::vector<StageOutcome> outcomes = RunBitwise(*schedule);
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

// Every stage's measured stash high-water mark (bytes and entries) and D2H and H2D bytes are
// the prediction, and its arena is empty after the step.
void CheckStagesAsPredicted(const Schedule& schedule, const std::vector<StageOutcome>& outcomes) {
  for (std::size_t d = 0; d < outcomes.size(); ++d) {
    CAPTURE(d);
    const StagePrediction& predicted = schedule.predictions->stages[d];
    const IterationStats& measured = outcomes[d].iterations[0];
    CHECK(measured.stash_high_water_bytes == predicted.peak_bytes);
    CHECK(measured.stash_high_water_entries == predicted.peak_units);
    CHECK(measured.offloaded_bytes == predicted.offloaded_bytes);
    CHECK(measured.reloaded_bytes == predicted.offloaded_bytes);
    CHECK(outcomes[d].arena_in_use_after == 0);
  }
}

// Recomputed entries of (family, chunks, split) with po-f on top: every entry `pick` chooses
// (lean, full, or MixedChoice's per-entry mix), and the planner's candidates for them are
// their retained blocks.
absl::StatusOr<Schedule> OffloadedRecomputeSchedule(const Case& c) {
  const CostModel cost = ToyCosts(c);
  PipelineSpec spec = CaseSpec(c);
  spec.offload = OffloadPolicy::kFull;
  if (c.pick != Pick::kMixed) return Compile(spec, cost);
  PipelineSpec plain = spec;
  plain.offload = OffloadPolicy::kNone;
  absl::StatusOr<Schedule> order = Compile(plain, cost);
  if (!order.ok()) return order.status();
  return internal::CompileWithRecompute(spec, cost, MixedChoice(*order));
}

// How many OFFLOADs of `schedule` move a recomputed entry's retained block.
int RetainedOffloads(const Schedule& schedule) {
  int count = 0;
  for (const StageProgram& program : schedule.stages) {
    std::set<std::pair<int, int>> recomputed;
    for (const Op& op : program.ops) {
      if (IsRecompute(op.kind)) recomputed.insert({op.mb, op.chunk});
    }
    for (const Op& op : program.ops) {
      count += op.kind == OpKind::kOffload && recomputed.count({op.mb, op.chunk}) != 0;
    }
  }
  return count;
}

TEST_CASE("retained blocks offloaded under po-f run bitwise equal with exact peaks and bytes",
          "[runtime][recompute][offload]") {
  // Issue 16's lever: recompute lean (or full) and offload what F kept. Every stage's stash
  // high-water mark and D2H bytes equal the simulator's, the gradients the reference's, and
  // the retained offload lowers stage 0's peak below recompute alone.
  for (const Family family : {Family::k1F1B, Family::kInterleaved}) {
    const int chunks = family == Family::k1F1B ? 1 : 2;
    for (const bool split : {false, true}) {
      for (const Pick pick : {Pick::kLean, Pick::kFull, Pick::kMixed}) {
        const Case c{family, chunks, split, pick};
        INFO(Name(c));
        absl::StatusOr<Schedule> schedule = OffloadedRecomputeSchedule(c);
        INFO(schedule.status().ToString());
        REQUIRE(schedule.ok());
        REQUIRE(Validate(*schedule).ok());
        CHECK(RetainedOffloads(*schedule) > 0);
        const std::vector<StageOutcome> outcomes = RunBitwise(*schedule);
        CheckStagesAsPredicted(*schedule, outcomes);
        if (pick != Pick::kMixed) {
          absl::StatusOr<Schedule> alone = Compile(CaseSpec(c), ToyCosts(c));
          REQUIRE(alone.ok());
          CHECK(schedule->predictions->stages[0].peak_bytes <
                alone->predictions->stages[0].peak_bytes);
        }
      }
    }
  }
}

TEST_CASE("an offloaded retained block's bytes and host slot are exact by hand",
          "[runtime][recompute][offload]") {
  // One stage, 2 microbatches, both recomputed lean: F0 keeps its lean block, which goes to
  // the host and back before RECOMPUTE_LEAN0 rebuilds the entry.
  const HandCase hand = OneStageHandCase(
      Recompute::kLean, {{OpKind::kForward, 0, 0, -1},
                         {OpKind::kOffload, 0, 0, -1},
                         {OpKind::kRelease, 0, 0, -1},
                         {OpKind::kForward, 1, 0, -1},
                         {OpKind::kReload, 0, 0, -1},
                         {OpKind::kRecomputeLean, 0, 0, -1},
                         {OpKind::kBackward, 0, 0, -1},
                         {OpKind::kRecomputeLean, 1, 0, -1},
                         {OpKind::kBackward, 1, 0, -1}});
  const ToyConfig config{1, 1, 2, kWidth, kExtraWords};
  const std::int64_t saved = hand.saved;
  const std::int64_t lean = hand.retained;
  REQUIRE(lean < saved);
  const Schedule& schedule = hand.schedule;
  absl::StatusOr<Timeline> timeline = Simulate(schedule, hand.cost);
  REQUIRE(timeline.ok());
  const StagePrediction& predicted = timeline->predictions.stages[0];
  CHECK(predicted.peak_bytes == 2 * lean + saved);
  CHECK(predicted.offloaded_bytes == lean);
  CHECK(predicted.host_bytes == lean);
  CHECK(timeline->predictions.links[0].bytes_d2h == lean);
  CHECK(timeline->predictions.links[0].bytes_h2d == lean);
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  const std::vector<StageOutcome> outcomes = RunToyPipeline(schedule, options);
  REQUIRE(outcomes[0].status.ok());
  const IterationStats& measured = outcomes[0].iterations[0];
  CHECK(measured.stash_high_water_bytes == 2 * lean + saved);
  CHECK(measured.offloaded_bytes == lean);
  CHECK(GradsByVirtualStage(outcomes, 1, 1) == ToyReference(config));
  std::vector<std::int64_t> bytes;
  for (const MemorySample& sample : measured.memory) bytes.push_back(sample.bytes);
  // F0; RELEASE0; F1; RELOAD0; RECOMPUTE0 grows, drops; B0; RECOMPUTE1 grows, drops; B1.
  CHECK(bytes == std::vector<std::int64_t>{0, lean, 0, lean, 2 * lean, 2 * lean + saved,
                                           lean + saved, lean, lean + saved, saved, 0});
}

TEST_CASE("a model whose B reads the lean block is not rebuilt: same bits, lower peaks, as "
          "predicted",
          "[runtime][recompute][offload]") {
  // StageModel::BackwardReadsRetained: RECOMPUTE_LEAN allocates, copies and counts nothing,
  // and the cost model says so (lean_rebuild_bytes = 0), so the stash's logical peaks and the
  // transfers are the predicted ones to the byte. Without offload the program is the same as
  // the rebuilding one, and its peaks are never higher, and lower on stage 0 when every entry
  // is lean (it peaks while one is rebuilt next to the others).
  for (const Family family : {Family::k1F1B, Family::kInterleaved}) {
    const int chunks = family == Family::k1F1B ? 1 : 2;
    for (const Pick pick : {Pick::kLean, Pick::kMixed}) {
      for (const bool offload : {false, true}) {
        const Case copied_case{family, chunks, /*split=*/false, pick};
        const Case read_case{family, chunks, /*split=*/false, pick, /*lean_in_place=*/true};
        INFO(Name(read_case) << (offload ? " + po-f" : ""));
        absl::StatusOr<Schedule> read_schedule =
            offload ? OffloadedRecomputeSchedule(read_case) : CaseSchedule(read_case);
        INFO(read_schedule.status().ToString());
        REQUIRE(read_schedule.ok());
        REQUIRE(CountRecomputeOps(*read_schedule, OpKind::kRecomputeLean) > 0);
        const std::vector<StageOutcome> read = RunBitwise(*read_schedule, true);
        CheckStagesAsPredicted(*read_schedule, read);
        if (offload) {
          CHECK(RetainedOffloads(*read_schedule) > 0);
          continue;
        }
        absl::StatusOr<Schedule> copied_schedule = CaseSchedule(copied_case);
        REQUIRE(copied_schedule.ok());
        for (std::size_t d = 0; d < read.size(); ++d) {
          CAPTURE(d);
          CHECK(read_schedule->stages[d].ops == copied_schedule->stages[d].ops);
          const std::int64_t read_peak = read_schedule->predictions->stages[d].peak_bytes;
          const std::int64_t copied_peak = copied_schedule->predictions->stages[d].peak_bytes;
          CHECK(read_peak <= copied_peak);
          // Nothing offloaded, nothing pending: the device holds what is counted.
          CHECK(read[d].iterations[0].stash_physical_high_water_bytes == read_peak);
          if (pick == Pick::kLean && d == 0) CHECK(read_peak < copied_peak);
        }
      }
    }
  }
}

TEST_CASE("a lean block read in place: predicted, logical and physical bytes by hand",
          "[runtime][recompute]") {
  // F0 F1 keep lean blocks; RECOMPUTE_LEAN0 allocates and counts nothing; B0 frees the lean
  // block. Every count stays within the two lean blocks.
  HandCase hand = OneStageHandCase(
      Recompute::kLean, {{OpKind::kForward, 0, 0, -1},
                         {OpKind::kForward, 1, 0, -1},
                         {OpKind::kRecomputeLean, 0, 0, -1},
                         {OpKind::kBackward, 0, 0, -1},
                         {OpKind::kRecomputeLean, 1, 0, -1},
                         {OpKind::kBackward, 1, 0, -1}});
  const std::int64_t saved = hand.saved;
  const std::int64_t lean = hand.retained;
  REQUIRE(lean < saved);
  hand.cost.lean_rebuild_bytes = 0;
  absl::StatusOr<Timeline> timeline = Simulate(hand.schedule, hand.cost);
  REQUIRE(timeline.ok());
  CHECK(timeline->predictions.stages[0].peak_bytes == 2 * lean);
  CHECK(timeline->predictions.stages[0].peak_units == 2);
  HarnessOptions options;
  options.width = kWidth;
  options.extra_words = kExtraWords;
  options.backward_reads_lean = true;
  const std::vector<StageOutcome> outcomes = RunToyPipeline(hand.schedule, options);
  REQUIRE(outcomes[0].status.ok());
  const IterationStats& measured = outcomes[0].iterations[0];
  CHECK(measured.stash_high_water_bytes == 2 * lean);
  CHECK(measured.stash_physical_high_water_bytes == 2 * lean);
  CHECK(outcomes[0].arena_in_use_after == 0);
  CHECK(GradsByVirtualStage(outcomes, 1, 1) ==
        ToyReference(ToyConfig{1, 1, 2, kWidth, kExtraWords}));
  std::vector<std::int64_t> bytes;
  for (const MemorySample& sample : measured.memory) bytes.push_back(sample.bytes);
  CHECK(bytes == std::vector<std::int64_t>{0, lean, 2 * lean, lean, 0});
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
