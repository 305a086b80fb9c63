// Recompute in the compiler and the simulator (issue 15): the pass puts one RECOMPUTE* right
// before B of exactly the entries the spec picks (all, a fraction longest-lived first, or the
// first chunks); the simulator charges the recompute time on the compute stream and holds the
// retained bytes from F, both blocks during the recompute, the full entry after; specs without
// recompute compile to the same schedules as before; auto trades recompute against offload.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/offload_planner.h"
#include "schedules/recompute_mix.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using namespace ::pipeoffload::testing;  // F(...), B(...), Make(...)

int Count(const Schedule& schedule, OpKind kind) {
  int count = 0;
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) count += op.kind == kind ? 1 : 0;
  }
  return count;
}

TEST_CASE("cost model recompute fields derive from the others", "[recompute][cost]") {
  CostModel cost;
  cost.forward_time = 2.0;
  cost.boundary_bytes = 640;
  cost.stage_time_scale = {1.0, 3.0};
  const VirtualStageMap map{Placement::kLoop, 2, 1};
  CHECK(cost.RecomputeTime(0, Recompute::kFull) == 2.0);
  CHECK(cost.RecomputeTime(1, Recompute::kFull) == 6.0);
  CHECK(cost.RecomputeTime(1, Recompute::kLean) == kLeanRecomputeShare * 6.0);
  CHECK(cost.RecomputeTime(1, Recompute::kNone) == 0.0);
  CHECK(cost.RetainedBytes(0, 0, map, Recompute::kFull) == 640);
  CHECK(cost.RetainedBytes(0, 0, map, Recompute::kLean) == 0);
  CHECK(cost.RetainedBytes(0, 0, map, Recompute::kNone) == cost.activation_bytes);
  CHECK(cost.RecomputeOffered(0, 0, map, Recompute::kFull));
  CHECK_FALSE(cost.RecomputeOffered(0, 0, map, Recompute::kLean));
  cost.recompute_lean_time = 0.5;
  cost.retained_lean_bytes = 100;
  cost.retained_full_bytes_per_virtual_stage = {-1, 0};
  CHECK(cost.RecomputeTime(1, Recompute::kLean) == 1.5);
  CHECK(cost.RetainedBytes(0, 0, map, Recompute::kFull) == 640);  // -1 derives
  CHECK(cost.RetainedBytes(1, 0, map, Recompute::kFull) == 0);    // 0: not offered on stage 1
  CHECK_FALSE(cost.RecomputeOffered(1, 0, map, Recompute::kFull));
  CHECK(cost.RecomputeOffered(1, 0, map, Recompute::kLean));
  const CostModel unit = UnitCostModel(0.5);
  CHECK(unit.RecomputeTime(0, Recompute::kFull) == 1.0);
  CHECK(unit.RecomputeTime(0, Recompute::kLean) == 0.25);
  CHECK(unit.RetainedBytes(0, 0, map, Recompute::kFull) == (1 << 20) / 16);
  CHECK(unit.RetainedBytes(0, 0, map, Recompute::kLean) == (1 << 20) / 2);
  const CostModel gpt = EstimateGptCostModel(GptShape{});
  CHECK(gpt.RecomputeTime(0, Recompute::kFull) == gpt.forward_time);
  CHECK(gpt.RetainedBytes(0, 0, map, Recompute::kFull) == gpt.boundary_bytes);
  CHECK(gpt.RetainedBytes(0, 0, map, Recompute::kLean) * 34 == gpt.activation_bytes * 22);
  CHECK(gpt.RecomputeTime(0, Recompute::kLean) < 0.05 * gpt.forward_time);
}

TEST_CASE("what a rebuild allocates and what B then reads", "[recompute][cost]") {
  CostModel cost;
  cost.activation_bytes = 1000;
  cost.retained_lean_bytes = 400;
  const VirtualStageMap map{Placement::kLoop, 2, 2};
  // Default: every RECOMPUTE* rebuilds the whole entry, which B reads.
  for (const Recompute mode : {Recompute::kNone, Recompute::kLean, Recompute::kFull}) {
    CAPTURE(RecomputeName(mode));
    CHECK(cost.RebuildBytes(1, 1, map, mode) == 1000);
    CHECK(cost.BackwardHeldBytes(1, 1, map, mode) == 1000);
  }
  // 0: B reads the lean block in place; full recompute still rebuilds the entry.
  cost.lean_rebuild_bytes = 0;
  CHECK(cost.RebuildBytes(0, 0, map, Recompute::kLean) == 0);
  CHECK(cost.BackwardHeldBytes(0, 0, map, Recompute::kLean) == 400);
  CHECK(cost.RebuildBytes(0, 0, map, Recompute::kFull) == 1000);
  CHECK(cost.BackwardHeldBytes(0, 0, map, Recompute::kNone) == 1000);
  // Per virtual stage (c * p + d): in place on virtual stages 0 and 1, a 600-byte block on 2,
  // the whole entry (-1) on 3, the last stage's head chunk.
  cost.lean_rebuild_bytes_per_virtual_stage = {0, 0, 600, -1};
  CHECK(cost.BackwardHeldBytes(1, 0, map, Recompute::kLean) == 400);
  CHECK(cost.RebuildBytes(0, 1, map, Recompute::kLean) == 600);
  CHECK(cost.BackwardHeldBytes(0, 1, map, Recompute::kLean) == 600);
  CHECK(cost.RebuildBytes(1, 1, map, Recompute::kLean) == 1000);
}

TEST_CASE("the simulator charges recompute time and holds retained bytes until it ends",
          "[recompute][sim]") {
  // One stage, F0 F1 RECOMPUTE0 B0 RECOMPUTE_LEAN1 B1 with F = 1, B = 1, full 0.5, lean 0.25.
  Schedule s = Make(1, 2, 1, false,
                    {{F(0), F(1), RecomputeFull(0), B(0), RecomputeLean(1), B(1)}});
  REQUIRE(Validate(s).ok());
  CostModel cost = HandTimedCosts();
  cost.activation_bytes = 100;
  cost.recompute_full_time = 0.5;
  cost.recompute_lean_time = 0.25;
  cost.retained_full_bytes = 10;
  cost.retained_lean_bytes = 40;
  absl::StatusOr<Timeline> timeline = Simulate(s, cost);
  INFO(timeline.status().ToString());
  REQUIRE(timeline.ok());
  const std::vector<TimedOp>& ops = timeline->stages[0];
  const double ends[] = {1.0, 2.0, 2.5, 3.5, 3.75, 4.75};
  for (std::size_t i = 0; i < ops.size(); ++i) {
    CAPTURE(i);
    CHECK(ops[i].end == ends[i]);
    CHECK(ops[i].engine == Engine::kCompute);
  }
  const StagePrediction& stage = timeline->predictions.stages[0];
  CHECK(timeline->predictions.step_time == 4.75);
  CHECK(stage.busy_time == 4.75);
  // 10 + 40 after the Fs; + 100 while RECOMPUTE0 runs; B0 frees 100; + 100 while the lean
  // recompute runs with its 40 still held.
  CHECK(stage.peak_bytes == 150);
  CHECK(stage.peak_units == 2);
  CHECK(stage.peak_bytes_without_offload == 150);
  std::vector<std::int64_t> bytes;
  for (const MemorySample& sample : timeline->memory[0]) bytes.push_back(sample.bytes);
  CHECK(bytes == std::vector<std::int64_t>{10, 50, 150, 140, 40, 140, 100, 0});
}

TEST_CASE("the simulator holds what a lean rebuild allocates, or only the lean block in place",
          "[recompute][sim]") {
  // One stage, F0 F1 RECOMPUTE_LEAN0 B0 RECOMPUTE_LEAN1 B1; entries of 100 bytes, lean 40.
  Schedule s = Make(1, 2, 1, false,
                    {{F(0), F(1), RecomputeLean(0), B(0), RecomputeLean(1), B(1)}});
  REQUIRE(Validate(s).ok());
  CostModel cost = HandTimedCosts();
  cost.activation_bytes = 100;
  cost.recompute_lean_time = 0.25;
  cost.retained_lean_bytes = 40;
  // lean_rebuild_bytes -> the samples: a rebuild holds its block beside the lean one while it
  // runs, then the block alone until B; in place, nothing changes at the rebuild.
  const std::map<std::int64_t, std::vector<std::int64_t>> expected = {
      {-1, {40, 80, 180, 140, 40, 140, 100, 0}},
      {60, {40, 80, 140, 100, 40, 100, 60, 0}},
      {0, {40, 80, 40, 0}}};
  for (const auto& [rebuild, samples] : expected) {
    CAPTURE(rebuild);
    cost.lean_rebuild_bytes = rebuild;
    absl::StatusOr<Timeline> timeline = Simulate(s, cost);
    REQUIRE(timeline.ok());
    std::vector<std::int64_t> bytes;
    for (const MemorySample& sample : timeline->memory[0]) bytes.push_back(sample.bytes);
    CHECK(bytes == samples);
    const StagePrediction& stage = timeline->predictions.stages[0];
    CHECK(stage.peak_bytes == *std::max_element(samples.begin(), samples.end()));
    CHECK(stage.peak_units == 2);
    // Same ops, same times: only the bytes differ.
    CHECK(timeline->predictions.step_time == 4.5);
  }
}

TEST_CASE("the simulator moves an offloaded retained block and recomputes after its reload",
          "[recompute][sim][offload]") {
  // F0's lean block (40 of 100 bytes) goes to the host and back at 10 B/s: 4 s each way, not
  // the 10 s a whole entry takes; RECOMPUTE_LEAN0 waits for the reload.
  Schedule s = Make(1, 2, 1, false,
                    {{F(0), Offload(0), Release(0), F(1), Reload(0), RecomputeLean(0), B(0),
                      B(1)}});
  REQUIRE(Validate(s).ok());
  CostModel cost = HandTimedCosts();
  cost.activation_bytes = 100;
  cost.recompute_lean_time = 0.25;
  cost.retained_lean_bytes = 40;
  absl::StatusOr<Timeline> timeline = Simulate(s, cost);
  INFO(timeline.status().ToString());
  REQUIRE(timeline.ok());
  const std::vector<TimedOp>& ops = timeline->stages[0];
  CHECK(ops[1].end - ops[1].start == 4.0);  // OFFLOAD0
  CHECK(ops[1].bytes == 40);
  CHECK(ops[4].end - ops[4].start == 4.0);  // RELOAD0
  CHECK(ops[4].bytes == 40);
  CHECK(ops[5].start == ops[4].end);        // RECOMPUTE_LEAN0 after its reload
  CHECK(ops[5].end - ops[5].start == 0.25);
  const StagePrediction& stage = timeline->predictions.stages[0];
  // 40 (F0), 0 (RELEASE0), 100 (F1), 140 (RELOAD0), 240 while RECOMPUTE_LEAN0 runs.
  CHECK(stage.peak_bytes == 240);
  CHECK(stage.peak_units == 2);
  CHECK(stage.offloaded_bytes == 40);
  CHECK(stage.host_bytes == 40);
  CHECK(timeline->predictions.links[0].bytes_d2h == 40);
  CHECK(timeline->predictions.links[0].bytes_h2d == 40);
  std::vector<std::int64_t> bytes;
  for (const MemorySample& sample : timeline->memory[0]) bytes.push_back(sample.bytes);
  CHECK(bytes.back() == 0);
  CHECK(*std::max_element(bytes.begin(), bytes.end()) == 240);
}

TEST_CASE("recompute beside an offload policy offloads retained blocks",
          "[recompute][compile][offload]") {
  // Unit costs, k = 0.5: a whole entry's copy takes 1.5 F, a lean block (half of it) 0.75.
  const CostModel cost = UnitCostModel(0.5);
  for (const Recompute mode : {Recompute::kLean, Recompute::kFull}) {
    for (const bool split : {false, true}) {
      CAPTURE(RecomputeName(mode), split);
      PipelineSpec spec = MakeSpec(Family::kInterleaved, 4, 8, 2, 0, split);
      spec.recompute = mode;
      absl::StatusOr<Schedule> alone = Compile(spec, cost);
      REQUIRE(alone.ok());
      spec.offload = OffloadPolicy::kFull;
      absl::StatusOr<Schedule> both = Compile(spec, cost);
      INFO(both.status().ToString());
      REQUIRE(both.ok());
      CHECK(Validate(*both).ok());
      CHECK(Count(*both, OpKind::kRecompute) == Count(*alone, OpKind::kRecompute));
      CHECK(Count(*both, OpKind::kRecomputeLean) == Count(*alone, OpKind::kRecomputeLean));
      const std::int64_t retained = cost.RetainedBytes(0, 0, spec.stage_map(), mode);
      for (int d = 0; d < 4; ++d) {
        CAPTURE(d);
        int offloads = 0;
        for (const Op& op : both->stages[static_cast<std::size_t>(d)].ops) {
          offloads += op.kind == OpKind::kOffload;
        }
        const StagePrediction& stage = both->predictions->stages[static_cast<std::size_t>(d)];
        // Every entry is recomputed, so every copy moves a retained block.
        CHECK(stage.offloaded_bytes == offloads * retained);
        CHECK(stage.peak_bytes <= alone->predictions->stages[static_cast<std::size_t>(d)].peak_bytes);
      }
      CHECK(Count(*both, OpKind::kOffload) > 0);
      CHECK(both->predictions->stages[0].peak_bytes < alone->predictions->stages[0].peak_bytes);
      CHECK(both->predictions->step_time <= alone->predictions->step_time * 1.01 + 1e-9);
    }
  }
}

TEST_CASE("the recompute pass puts each op right before its entry's B", "[recompute][compile]") {
  PipelineSpec spec = MakeSpec(Family::kInterleaved, 2, 4, 2, 0, true);
  const CostModel cost = UnitCostModel(0.5);
  absl::StatusOr<Schedule> plain = Compile(spec, cost);
  REQUIRE(plain.ok());
  // Without recompute the spec writes no recompute key.
  CHECK(ScheduleToJson(*plain).find("recompute") == std::string::npos);
  CHECK(ScheduleToText(*plain).find("recompute") == std::string::npos);
  for (const Recompute mode : {Recompute::kLean, Recompute::kFull}) {
    spec.recompute = mode;
    absl::StatusOr<Schedule> recomputed = Compile(spec, cost);
    INFO(recomputed.status().ToString());
    REQUIRE(recomputed.ok());
    const OpKind kind = mode == Recompute::kFull ? OpKind::kRecompute : OpKind::kRecomputeLean;
    CHECK(Count(*recomputed, kind) == 2 * 4 * 2);
    for (std::size_t d = 0; d < recomputed->stages.size(); ++d) {
      // Without the recompute ops, the programs are the plain ones.
      std::vector<Op> others;
      const std::vector<Op>& ops = recomputed->stages[d].ops;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        if (!IsRecompute(ops[i].kind)) {
          others.push_back(ops[i]);
          continue;
        }
        REQUIRE(i + 1 < ops.size());
        CHECK(ops[i + 1] == Op{OpKind::kBackward, ops[i].mb, ops[i].chunk, -1});
      }
      CHECK(others == plain->stages[d].ops);
    }
    // Recompute lowers the peak of stage 0, which holds the most entries, and costs time.
    CHECK(recomputed->predictions->stages[0].peak_bytes <
          plain->predictions->stages[0].peak_bytes);
    CHECK(recomputed->predictions->step_time > plain->predictions->step_time);
    // The text form says so; the JSON carries the ops and the spec's recompute keys.
    CHECK(ScheduleToText(*recomputed).find(std::string(" recompute=") + RecomputeName(mode) +
                                           " recompute-fraction=1") != std::string::npos);
    const std::string json = ScheduleToJson(*recomputed);
    const nlohmann::json doc = nlohmann::json::parse(json);
    CHECK(doc["spec"]["recompute"] == RecomputeName(mode));
    CHECK(doc["spec"]["recompute_fraction"] == 1.0);
    CHECK(doc["spec"]["recompute_chunks"] == 0);
    absl::StatusOr<Schedule> parsed = ParseScheduleJson(json);
    REQUIRE(parsed.ok());
    CHECK(parsed->spec == recomputed->spec);
    CHECK(parsed->stages == recomputed->stages);
    std::string bad = json;
    const std::string key = std::string("\"recompute\": \"") + RecomputeName(mode) + "\"";
    bad.replace(bad.find(key), key.size(), "\"recompute\": \"some\"");
    CHECK(std::string(ParseScheduleJson(bad).status().message())
              .find("spec.recompute: unknown recompute mode \"some\"; expected one of none, "
                    "lean, full") != std::string::npos);
  }
}

TEST_CASE("recompute picks a fraction longest-lived first, or the first chunks",
          "[recompute][compile]") {
  PipelineSpec spec = MakeSpec(Family::kInterleaved, 2, 4, 2);
  spec.recompute = Recompute::kFull;
  spec.recompute_chunks = 1;
  absl::StatusOr<Schedule> chunks = Compile(spec, UnitCostModel(0.5));
  REQUIRE(chunks.ok());
  for (const StageProgram& program : chunks->stages) {
    int count = 0;
    for (const Op& op : program.ops) {
      if (!IsRecompute(op.kind)) continue;
      CHECK(op.chunk == 0);
      ++count;
    }
    CHECK(count == 4);
  }
  spec.recompute_chunks = 0;
  spec.recompute_fraction = 0.25;  // 2 of each stage's 8 entries
  absl::StatusOr<Schedule> fraction = Compile(spec, UnitCostModel(0.5));
  REQUIRE(fraction.ok());
  spec.recompute = Recompute::kNone;
  absl::StatusOr<Schedule> plain = Compile(spec, UnitCostModel(0.5));
  REQUIRE(plain.ok());
  for (std::size_t d = 0; d < plain->stages.size(); ++d) {
    // Lifespans (F to B, in ops) in the plain program; the chosen entries live longest.
    std::map<std::pair<int, int>, int> span;
    const std::vector<Op>& ops = plain->stages[d].ops;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == OpKind::kForward) span[{ops[i].mb, ops[i].chunk}] -= static_cast<int>(i);
      if (ops[i].kind == OpKind::kBackward) span[{ops[i].mb, ops[i].chunk}] += static_cast<int>(i);
    }
    std::map<std::pair<int, int>, bool> chosen;
    for (const Op& op : fraction->stages[d].ops) {
      if (IsRecompute(op.kind)) chosen[{op.mb, op.chunk}] = true;
    }
    CHECK(chosen.size() == 2);
    int shortest_chosen = 1 << 30, longest_kept = -1;
    for (const auto& [entry, length] : span) {
      if (chosen.count(entry) != 0) {
        shortest_chosen = std::min(shortest_chosen, length);
      } else {
        longest_kept = std::max(longest_kept, length);
      }
    }
    CHECK(shortest_chosen >= longest_kept);
  }
}

TEST_CASE("recompute spec errors say what is accepted", "[recompute][compile]") {
  PipelineSpec spec = MakeSpec(Family::k1F1B, 2, 4, 1);
  spec.recompute = Recompute::kLean;
  CostModel cost = UnitCostModel(0.5);
  cost.retained_lean_bytes = 0;
  absl::Status status = Compile(spec, cost).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) ==
        "recompute lean: the cost model offers it for no entry of chunk 0 on stage 0 "
        "(retained_lean_bytes is 0 there); give the retained bytes or choose another mode");
  spec.recompute_fraction = 0.0;
  CHECK(std::string(Compile(spec, UnitCostModel(0.5)).status().message()) ==
        "recompute_fraction must be in (0, 1], got 0");
  spec.recompute_fraction = 1.0;
  spec.recompute_chunks = 2;
  CHECK(std::string(Compile(spec, UnitCostModel(0.5)).status().message()) ==
        "recompute_chunks must be in [0, v] = [0, 1], got 2");
}

TEST_CASE("auto may recompute when the link cannot carry the offload", "[recompute][auto]") {
  // A slow link (k = 4: an entry's copy takes 12 F) makes offload expensive; a full recompute
  // costs one F per entry.
  PipelineSpec spec = MakeSpec(Family::k1F1B, 4, 8, 1);
  spec.offload = OffloadPolicy::kAuto;
  const CostModel cost = UnitCostModel(4.0);
  absl::StatusOr<Schedule> plain = Compile(MakeSpec(Family::k1F1B, 4, 8, 1), cost);
  REQUIRE(plain.ok());
  spec.memory_budget_bytes = plain->predictions->stages[0].peak_bytes / 2;
  absl::StatusOr<Schedule> offload_only = Compile(spec, cost);
  spec.recompute = Recompute::kFull;
  std::vector<std::string> alternatives;
  absl::StatusOr<Schedule> with_recompute = Compile(spec, cost);
  INFO(with_recompute.status().ToString());
  REQUIRE(with_recompute.ok());
  CHECK(Count(*with_recompute, OpKind::kRecompute) +
            Count(*with_recompute, OpKind::kRecomputeLean) >
        0);
  for (const StagePrediction& stage : with_recompute->predictions->stages) {
    CHECK(stage.peak_bytes <= spec.memory_budget_bytes);
  }
  if (offload_only.ok()) {
    CHECK(with_recompute->predictions->step_time < offload_only->predictions->step_time);
  }
  // Without --recompute, auto plans exactly as before.
  spec.recompute = Recompute::kNone;
  absl::StatusOr<Schedule> again = Compile(spec, cost);
  REQUIRE(again.ok() == offload_only.ok());
  if (again.ok()) CHECK(again->stages == offload_only->stages);
}


TEST_CASE("auto mixes offload and recompute per entry where offload alone cannot fit",
          "[recompute][auto][mix]") {
  // k = 1: an entry's copy takes 3 F, so in 1F1B's warm-up (forwards back to back) the link
  // cannot take every entry out in time: po-f stops above the budget below, and recomputing
  // alone costs one F per recomputed entry.
  const CostModel cost = UnitCostModel(1.0);
  PipelineSpec spec = MakeSpec(Family::k1F1B, 4, 16, 1);
  spec.offload = OffloadPolicy::kFull;
  absl::StatusOr<Schedule> full_offload = Compile(spec, cost);
  REQUIRE(full_offload.ok());
  std::int64_t po_f_peak = 0;
  for (const StagePrediction& stage : full_offload->predictions->stages) {
    po_f_peak = std::max(po_f_peak, stage.peak_bytes);
  }
  spec.offload = OffloadPolicy::kAuto;
  spec.memory_budget_bytes = po_f_peak - cost.activation_bytes;  // one entry below po-f
  spec.recompute = Recompute::kFull;
  absl::StatusOr<Schedule> mixed = Compile(spec, cost);
  INFO(mixed.status().ToString());
  REQUIRE(mixed.ok());
  const int recomputed =
      Count(*mixed, OpKind::kRecompute) + Count(*mixed, OpKind::kRecomputeLean);
  CHECK(Count(*mixed, OpKind::kOffload) > 0);
  CHECK(recomputed > 0);
  // One choice per entry (Validate's recompute life cycle), and every stage fits.
  CHECK(Validate(*mixed).ok());
  for (const StagePrediction& stage : mixed->predictions->stages) {
    CHECK(stage.peak_bytes <= spec.memory_budget_bytes);
  }
  // The predictions are the simulator's for the program it returns (priced for its v).
  absl::StatusOr<Timeline> again =
      Simulate(*mixed, internal::RechunkedCost(cost, 1, mixed->spec.chunks_per_stage));
  REQUIRE(again.ok());
  for (std::size_t s = 0; s < again->predictions.stages.size(); ++s) {
    CHECK(again->predictions.stages[s].peak_bytes == mixed->predictions->stages[s].peak_bytes);
  }
  CHECK(again->predictions.step_time == mixed->predictions->step_time);
  // Faster than every recompute-only plan of the same order that fits.
  int fitting_recompute_only = 0;
  for (const Recompute mode : {Recompute::kLean, Recompute::kFull}) {
    for (const double fraction : {0.25, 0.5, 0.75, 1.0}) {
      PipelineSpec alone = MakeSpec(Family::k1F1B, 4, 16, 1);
      alone.recompute = mode;
      alone.recompute_fraction = fraction;
      absl::StatusOr<Schedule> plan = Compile(alone, cost);
      REQUIRE(plan.ok());
      std::int64_t peak = 0;
      for (const StagePrediction& stage : plan->predictions->stages) {
        peak = std::max(peak, stage.peak_bytes);
      }
      if (peak > spec.memory_budget_bytes) continue;
      ++fitting_recompute_only;
      CAPTURE(RecomputeName(mode), fraction);
      CHECK(mixed->predictions->step_time < plan->predictions->step_time);
    }
  }
  CHECK(fitting_recompute_only > 0);
  // Only the entries the link could not carry are recomputed: fewer than half of them.
  CHECK(2 * recomputed < 4 * 16 * mixed->spec.chunks_per_stage);
}

TEST_CASE("auto knows a lean block read in place: its budget holds more, at no slower a step",
          "[recompute][auto][mix]") {
  // The same spec and budget, planned for a model whose lean rebuild writes a whole entry and
  // for one whose B reads the lean block in place (lean_rebuild_bytes = 0). The budget is what
  // every entry lean takes in place: a rebuilding plan must recompute in full or offload
  // more to fit it, the in-place plan need not.
  CostModel rebuilt = UnitCostModel(1.0);
  CostModel read = rebuilt;
  read.lean_rebuild_bytes = 0;
  PipelineSpec lean = MakeSpec(Family::kInterleaved, 4, 16, 2);
  lean.recompute = Recompute::kLean;
  absl::StatusOr<Schedule> all_lean_read = Compile(lean, read);
  absl::StatusOr<Schedule> all_lean_rebuilt = Compile(lean, rebuilt);
  REQUIRE(all_lean_read.ok());
  REQUIRE(all_lean_rebuilt.ok());
  REQUIRE(all_lean_read->stages == all_lean_rebuilt->stages);
  std::int64_t budget = 0;
  for (std::size_t d = 0; d < all_lean_read->stages.size(); ++d) {
    CAPTURE(d);
    const std::int64_t read_peak = all_lean_read->predictions->stages[d].peak_bytes;
    // In place, each stage's peak is lower by the one rebuilt entry's block.
    CHECK(read_peak < all_lean_rebuilt->predictions->stages[d].peak_bytes);
    budget = std::max(budget, read_peak);
  }
  PipelineSpec spec = MakeSpec(Family::kInterleaved, 4, 16, 2);
  spec.offload = OffloadPolicy::kAuto;
  spec.recompute = Recompute::kFull;
  spec.memory_budget_bytes = budget;
  absl::StatusOr<Schedule> planned_read = Compile(spec, read);
  INFO(planned_read.status().ToString());
  REQUIRE(planned_read.ok());
  for (const StagePrediction& stage : planned_read->predictions->stages) {
    CHECK(stage.peak_bytes <= budget);
  }
  absl::StatusOr<Schedule> planned_rebuilt = Compile(spec, rebuilt);
  if (planned_rebuilt.ok()) {
    INFO(planned_read->predictions->warnings.back());
    INFO(planned_rebuilt->predictions->warnings.back());
    CHECK(planned_read->predictions->step_time <= planned_rebuilt->predictions->step_time);
  }
}

TEST_CASE("a mix round covers the first peak, or every instant above the budget",
          "[recompute][auto][mix]") {
  // The po-f plan of the test above, one entry below its peak and two: a round at the first
  // peak picks a subset of a round that covers the whole plateau, and the plateau round's
  // choices, applied to the same program (each chosen entry keeps its retained block from F,
  // both blocks at its B, no copies), leave no instant above the budget in program order.
  const CostModel cost = UnitCostModel(1.0);
  PipelineSpec spec = MakeSpec(Family::k1F1B, 4, 16, 1);
  spec.offload = OffloadPolicy::kFull;
  absl::StatusOr<Schedule> planned = Compile(spec, cost);
  REQUIRE(planned.ok());
  std::int64_t peak = 0;
  for (const StagePrediction& stage : planned->predictions->stages) {
    peak = std::max(peak, stage.peak_bytes);
  }
  const OpKind frees = OpKind::kBackward;
  bool plateau_larger = false;
  for (const int below : {1, 2}) {
    CAPTURE(below);
    const std::int64_t budget = peak - below * cost.activation_bytes;
    RecomputeChoice at_peak, plateau;
    const int picked_at_peak = internal::RecomputeAtPeaks(*planned, cost, budget, Recompute::kFull,
                                                          internal::MixCover::kPeak, &at_peak);
    const int picked_plateau = internal::RecomputeAtPeaks(
        *planned, cost, budget, Recompute::kFull, internal::MixCover::kPlateau, &plateau);
    CHECK(picked_at_peak == static_cast<int>(at_peak.size()));
    CHECK(picked_plateau == static_cast<int>(plateau.size()));
    CHECK(picked_at_peak > 0);
    for (const auto& [entry, mode] : at_peak) CHECK(plateau.count(entry) == 1);
    plateau_larger = plateau_larger || plateau.size() > at_peak.size();
    const std::int64_t retained = cost.RetainedBytes(0, 0, spec.stage_map(), Recompute::kFull);
    for (const StageProgram& program : planned->stages) {
      std::int64_t running = 0, highest = 0;
      for (const Op& op : program.ops) {
        if (op.mb < 0) continue;
        const bool chosen = plateau.count({program.stage, op.mb, op.chunk}) == 1;
        const auto add = [&](std::int64_t bytes) {
          running += bytes;
          highest = std::max(highest, running);
        };
        if (op.kind == OpKind::kForward) add(chosen ? retained : cost.activation_bytes);
        if (chosen && op.kind == OpKind::kBackward) {
          add(cost.activation_bytes);
          add(-retained);
        }
        if (!chosen && op.kind == OpKind::kRelease) add(-cost.activation_bytes);
        if (!chosen && op.kind == OpKind::kReload) add(cost.activation_bytes);
        if (op.kind == frees) add(-cost.activation_bytes);
      }
      CAPTURE(program.stage);
      CHECK(highest <= budget);
    }
  }
  CHECK(plateau_larger);
}

}  // namespace
}  // namespace pipeoffload
