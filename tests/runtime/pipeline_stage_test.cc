// PipelineStage::Open and Run (pipeline.h), the way in: the toy model's stages as threads on
// CPU backends over the local transport, each opened in one call with a local rank group.
// What it proves: the model's F / B / W calls come in the schedule's order, iteration after
// iteration; the bytes through the arena, the host pool and the copy queues are the compiler's
// predictions exactly; the arena Open sizes holds the plan (and one of exactly the plan's need
// does too); every kind of bad input fails Open with its reason, on every rank at once.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/pipeline.h"
#include "pipeoffload/schedule_io.h"
#include "tests/runtime/toy_model.h"
#include "tests/runtime/toy_stage_options.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using testing::ToyConfig;
using testing::ToyGrads;
using testing::ToyReference;
using testing::ToyStageModel;

constexpr double kTimeout = testing::kToyStageTimeout;

// The toy model, recording every call the executor makes.
class RecordingModel final : public StageModel {
 public:
  RecordingModel(const ToyConfig& config, int stage) : inner_(config, stage) {}
  std::int64_t SavedBytes(int chunk, bool split) const override {
    return inner_.SavedBytes(chunk, split);
  }
  std::int64_t BoundaryBytes() const override { return inner_.BoundaryBytes(); }
  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override {
    calls_.push_back(Op{OpKind::kForward, mb, chunk, -1});
    return inner_.Forward(mb, chunk, input, output, saved);
  }
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input, void* saved,
                        bool with_weight_grad) override {
    calls_.push_back(Op{OpKind::kBackward, mb, chunk, -1});
    return inner_.Backward(mb, chunk, grad_output, grad_input, saved, with_weight_grad);
  }
  absl::Status BackwardWeight(int mb, int chunk, void* saved) override {
    calls_.push_back(Op{OpKind::kBackwardWeight, mb, chunk, -1});
    return inner_.BackwardWeight(mb, chunk, saved);
  }
  std::int64_t RetainedBytes(int chunk, Recompute mode, bool split) const override {
    return inner_.RetainedBytes(chunk, mode, split);
  }
  absl::Status ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                void* retained, Recompute mode) override {
    calls_.push_back(Op{OpKind::kForward, mb, chunk, -1});
    return inner_.ForwardRetaining(mb, chunk, input, output, retained, mode);
  }
  absl::Status RecomputeSaved(int mb, int chunk, const void* retained, void* full,
                              Recompute mode) override {
    calls_.push_back(
        Op{mode == Recompute::kFull ? OpKind::kRecompute : OpKind::kRecomputeLean, mb, chunk, -1});
    return inner_.RecomputeSaved(mb, chunk, retained, full, mode);
  }
  bool BackwardReadsRetained(int chunk, Recompute mode, bool split) const override {
    return inner_.BackwardReadsRetained(chunk, mode, split);
  }
  const std::vector<Op>& calls() const { return calls_; }
  const ToyStageModel& inner() const { return inner_; }

 private:
  ToyStageModel inner_;
  std::vector<Op> calls_;
};

// The spec of `family` on p stages, m microbatches, v chunks, with `offload`.
PipelineSpec Spec(Family family, int p, int m, int v, OffloadPolicy offload) {
  return testing::MakeSpec(family, p, m, v, 0, false, offload);
}

ToyConfig Config(const PipelineSpec& spec) { return testing::ToyStageConfig(spec); }
StageOptions Options(const PipelineSpec& spec) { return testing::ToyStageOptions(spec); }

// What one stage's thread saw.
struct StageRun {
  absl::Status status;  // Open's, else the first failing Run's
  std::vector<IterationStats> iterations;
  std::vector<Op> calls;
  std::vector<ToyGrads> grads;  // [chunk]
  Schedule schedule;
  ArenaNeed need;
  std::vector<std::int64_t> arena_budgets;
  std::vector<StageCosts> measured;
  BackendStats backend;
};

// Opens stage d of `config` with options_for(d) on a thread of its own (its own CPU backend,
// transport endpoint d and, unless `with_group` is false, rank group endpoint d), then runs
// `iterations` iterations.
std::vector<StageRun> RunStages(const ToyConfig& config,
                                const std::function<StageOptions(int)>& options_for, int iterations,
                                bool with_group = true) {
  const int p = config.num_stages;
  auto transports = CreateLocalTransports(p);
  auto groups = CreateLocalRankGroups(p, kTimeout);
  REQUIRE(transports.ok());
  REQUIRE(groups.ok());
  std::vector<StageRun> runs(static_cast<std::size_t>(p));
  std::vector<std::thread> threads;
  for (int d = 0; d < p; ++d) {
    threads.emplace_back([&, d] {
      StageRun& run = runs[static_cast<std::size_t>(d)];
      RecordingModel model(config, d);
      StageOptions options = options_for(d);
      options.transport = (*transports)[static_cast<std::size_t>(d)].get();
      options.group = with_group ? (*groups)[static_cast<std::size_t>(d)].get() : nullptr;
      absl::StatusOr<std::unique_ptr<PipelineStage>> stage = PipelineStage::Open(options, model);
      if (!stage.ok()) {
        run.status = stage.status();
        return;
      }
      run.schedule = (*stage)->schedule();
      run.need = (*stage)->arena_need();
      run.arena_budgets = (*stage)->arena_budgets();
      run.measured = (*stage)->measured_costs();
      for (int it = 0; it < iterations && run.status.ok(); ++it) {
        absl::StatusOr<IterationStats> stats = (*stage)->Run();
        if (stats.ok()) {
          run.iterations.push_back(*std::move(stats));
        } else {
          run.status = stats.status();
        }
      }
      run.backend = (*stage)->backend().Stats();
      run.calls = model.calls();
      for (int c = 0; c < config.chunks_per_stage; ++c) run.grads.push_back(model.inner().grads(c));
    });
  }
  for (std::thread& thread : threads) thread.join();
  return runs;
}

// The compute ops of `program`, repeated `times` times: the calls the model must see.
std::vector<Op> ComputeOps(const StageProgram& program, int times) {
  std::vector<Op> ops;
  for (int t = 0; t < times; ++t) {
    for (const Op& op : program.ops) {
      if (IsCompute(op.kind)) ops.push_back(Op{op.kind, op.mb, op.chunk, -1});
    }
  }
  return ops;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("pipeline_stage_test_" + name)).string();
}

TEST_CASE("1f1b and po-f: calls in the schedule's order, bytes exactly as predicted",
          "[runtime][pipeline]") {
  constexpr int kIterations = 3;
  for (const PipelineSpec& spec :
       {Spec(Family::k1F1B, 2, 4, 1, OffloadPolicy::kNone),
        Spec(Family::k1F1B, 2, 4, 1, OffloadPolicy::kFull),
        Spec(Family::kGroupInterleaved, 2, 4, 2, OffloadPolicy::kFull)}) {
    CAPTURE(FamilyName(spec.family), OffloadPolicyName(spec.offload), spec.chunks_per_stage);
    const std::vector<StageRun> runs = RunStages(
        Config(spec), [&](int) { return Options(spec); }, kIterations);
    std::int64_t offloaded = 0;
    for (int d = 0; d < spec.num_stages; ++d) {
      CAPTURE(d);
      const StageRun& run = runs[static_cast<std::size_t>(d)];
      INFO(run.status.ToString());
      REQUIRE(run.status.ok());
      REQUIRE(run.iterations.size() == kIterations);
      const StageProgram& program = run.schedule.stages[static_cast<std::size_t>(d)];
      CHECK(run.calls == ComputeOps(program, kIterations));
      // Every rank planned, and holds, the same schedule.
      CHECK(run.schedule == runs[0].schedule);
      const StagePrediction& predicted =
          run.schedule.predictions->stages[static_cast<std::size_t>(d)];
      for (const IterationStats& stats : run.iterations) {
        CHECK(stats.stash_high_water_bytes == predicted.peak_bytes);
        CHECK(stats.stash_high_water_entries == predicted.peak_units);
        CHECK(stats.offloaded_bytes == predicted.offloaded_bytes);
        CHECK(stats.reloaded_bytes == predicted.offloaded_bytes);
        CHECK(stats.host_high_water_bytes == predicted.host_bytes);
        // The P2P plan: live blocks never above the analysed peak the arena reserved.
        CHECK(stats.p2p_high_water_bytes > 0);
        CHECK(stats.p2p_high_water_bytes <= run.need.p2p_blocks * 4 * testing::kToyStageWidth);
        CHECK(stats.stash_physical_high_water_bytes <= run.need.budget_bytes);
      }
      // Every offload and reload went through the backend's copy queues, once per iteration.
      CHECK(run.backend.bytes_d2h == kIterations * predicted.offloaded_bytes);
      CHECK(run.backend.bytes_h2d == kIterations * predicted.offloaded_bytes);
      // The sized arena: the program's exact need plus a quarter and one spare entry.
      CHECK(run.need.budget_bytes >= run.need.exact() + run.need.exact() / 4);
      CHECK(run.arena_budgets == runs[0].arena_budgets);
      CHECK(run.arena_budgets[static_cast<std::size_t>(d)] == run.need.budget_bytes);
      offloaded += predicted.offloaded_bytes;
    }
    CHECK((offloaded > 0) == (spec.offload != OffloadPolicy::kNone));
  }
}

TEST_CASE("one iteration trains bitwise like the single-process reference", "[runtime][pipeline]") {
  const PipelineSpec spec = Spec(Family::kGroupInterleaved, 2, 4, 2, OffloadPolicy::kFull);
  const std::vector<StageRun> runs = RunStages(
      Config(spec), [&](int) { return Options(spec); }, 1);
  const std::vector<ToyGrads> reference = ToyReference(Config(spec));
  for (int d = 0; d < 2; ++d) {
    REQUIRE(runs[static_cast<std::size_t>(d)].status.ok());
    for (int c = 0; c < 2; ++c) {
      CAPTURE(d, c);
      CHECK(runs[static_cast<std::size_t>(d)].grads[static_cast<std::size_t>(c)] ==
            reference[static_cast<std::size_t>(c * 2 + d)]);
    }
  }
}

TEST_CASE("a model whose B reads its lean blocks: Open plans for it, peaks exactly as predicted",
          "[runtime][pipeline][recompute]") {
  // Setup gathers each stage's BackwardReadsRetained into the cost model (lean_rebuild_bytes),
  // so the compiler predicts the lower peaks the stash then measures, through a rank group
  // (p = 2) and without one (p = 1); an arena of exactly the plan's need holds them.
  for (const int p : {1, 2}) {
    PipelineSpec spec = Spec(Family::kInterleaved, p, 4, 2, OffloadPolicy::kNone);
    spec.recompute = Recompute::kLean;
    std::vector<std::int64_t> rebuilt_peaks;
    for (const bool reads_lean : {false, true}) {
      CAPTURE(p, reads_lean);
      ToyConfig config = Config(spec);
      config.backward_reads_lean = reads_lean;
      const std::vector<StageRun> runs = RunStages(
          config,
          [&](int) {
            StageOptions options = Options(spec);
            options.arena.fragmentation_share = 0.0;
            options.arena.spare_largest_entry = false;
            return options;
          },
          1, /*with_group=*/p > 1);
      const std::vector<ToyGrads> reference = ToyReference(config);
      for (int d = 0; d < p; ++d) {
        CAPTURE(d);
        const StageRun& run = runs[static_cast<std::size_t>(d)];
        INFO(run.status.ToString());
        REQUIRE(run.status.ok());
        const StagePrediction& predicted =
            run.schedule.predictions->stages[static_cast<std::size_t>(d)];
        for (const IterationStats& stats : run.iterations) {
          CHECK(stats.stash_high_water_bytes == predicted.peak_bytes);
          CHECK(stats.stash_physical_high_water_bytes == predicted.peak_bytes);
        }
        // Rebuilt, the model sees a RecomputeSaved per lean entry; read in place, none.
        int rebuilds = 0;
        for (const Op& call : run.calls) rebuilds += call.kind == OpKind::kRecomputeLean;
        CHECK(rebuilds == (reads_lean ? 0 : spec.num_microbatches * 2));
        for (int c = 0; c < 2; ++c) {
          CHECK(run.grads[static_cast<std::size_t>(c)] ==
                reference[static_cast<std::size_t>(c * p + d)]);
        }
        if (!reads_lean) {
          rebuilt_peaks.push_back(predicted.peak_bytes);
        } else {
          CHECK(predicted.peak_bytes < rebuilt_peaks[static_cast<std::size_t>(d)]);
        }
      }
    }
  }
}

TEST_CASE("an arena of exactly the plan's need runs it", "[runtime][pipeline]") {
  const PipelineSpec spec = Spec(Family::kGroupInterleaved, 2, 4, 2, OffloadPolicy::kHalf);
  const std::vector<StageRun> runs = RunStages(
      Config(spec),
      [&](int) {
        StageOptions options = Options(spec);
        options.arena.fragmentation_share = 0.0;
        options.arena.spare_largest_entry = false;
        return options;
      },
      2);
  for (const StageRun& run : runs) {
    INFO(run.status.ToString());
    REQUIRE(run.status.ok());
    CHECK(run.need.budget_bytes == run.need.exact());
    CHECK(run.need.stash_bytes > 0);
    CHECK(run.need.p2p_bytes == run.need.p2p_blocks * 256);  // 64-byte messages, 256 aligned
  }
}

TEST_CASE("a one-stage pipeline needs no transport and no group", "[runtime][pipeline]") {
  const PipelineSpec spec = Spec(Family::kInterleaved, 1, 4, 2, OffloadPolicy::kFull);
  RecordingModel model(Config(spec), 0);
  absl::StatusOr<std::unique_ptr<PipelineStage>> stage = PipelineStage::Open(Options(spec), model);
  INFO(stage.status().ToString());
  REQUIRE(stage.ok());
  CHECK((*stage)->transport().size() == 1);
  CHECK((*stage)->backend().Name() == "cpu");
  for (int it = 0; it < 2; ++it) {
    absl::StatusOr<IterationStats> stats = (*stage)->Run();
    REQUIRE(stats.ok());
    CHECK(stats->stash_high_water_bytes == (*stage)->schedule().predictions->stages[0].peak_bytes);
  }
  CHECK(model.calls() == ComputeOps((*stage)->schedule().stages[0], 2));
}

TEST_CASE("measured costs: every stage times its chunks in turns, the plan is in seconds",
          "[runtime][pipeline]") {
  const PipelineSpec spec = Spec(Family::kGroupInterleaved, 2, 4, 2, OffloadPolicy::kFull);
  const std::vector<StageRun> runs = RunStages(
      Config(spec),
      [&](int) {
        StageOptions options = Options(spec);
        options.costs.source = CostSource::kMeasured;
        options.costs.measure_in_turns = true;
        options.costs.probe.link_probe_max_bytes = 1 << 20;
        return options;
      },
      1);
  for (const StageRun& run : runs) {
    INFO(run.status.ToString());
    REQUIRE(run.status.ok());
    REQUIRE(run.measured.size() == 2);
    for (const StageCosts& stage : run.measured) {
      REQUIRE(stage.chunks.size() == 2);
      for (const ChunkTimes& chunk : stage.chunks) {
        CHECK(chunk.forward > 0.0);
        CHECK(chunk.backward > 0.0);
      }
      CHECK(stage.link.d2h > 0.0);
    }
    CHECK(run.schedule.predictions->step_time < 1.0);  // seconds of a tiny model, not units
  }
}

TEST_CASE("a bad schedule file fails Open naming the file and what is wrong",
          "[runtime][pipeline][errors]") {
  const PipelineSpec spec = Spec(Family::k1F1B, 1, 4, 1, OffloadPolicy::kNone);
  RecordingModel model(Config(spec), 0);
  const auto open = [&](const std::string& path) {
    StageOptions options = Options(spec);
    options.spec.reset();
    options.schedule_file = path;
    return PipelineStage::Open(options, model).status();
  };
  const std::string missing = TempPath("missing.json");
  absl::Status status = open(missing);
  CHECK(status.code() == absl::StatusCode::kNotFound);
  CHECK(Message(status).find("cannot read schedule file " + missing) == 0);

  absl::StatusOr<Schedule> compiled = Compile(spec, UnitCostModel(0.25));
  REQUIRE(compiled.ok());
  const std::string json = ScheduleToJson(*compiled);
  const std::string truncated = TempPath("truncated.json");
  std::ofstream(truncated) << json.substr(0, json.size() / 2);
  status = open(truncated);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(status).find("schedule file " + truncated + " is corrupted") == 0);

  Schedule broken = *compiled;
  broken.stages[0].ops.pop_back();  // the last B never runs
  const std::string invalid = TempPath("invalid.json");
  std::ofstream(invalid) << ScheduleToJson(broken);
  status = open(invalid);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Message(status).find("schedule file " + invalid + " is not a valid schedule") == 0);

  // The same file, intact, runs.
  const std::string good = TempPath("good.json");
  std::ofstream(good) << json;
  CHECK(open(good).ok());
  for (const std::string& path : {truncated, invalid, good}) std::remove(path.c_str());
}

TEST_CASE("a stage model whose stash size differs from the given costs is refused",
          "[runtime][pipeline][errors]") {
  // No group: the other stage's sizes come from the given costs, so they must hold the truth.
  const PipelineSpec spec = Spec(Family::k1F1B, 2, 4, 1, OffloadPolicy::kNone);
  const ToyConfig config = Config(spec);
  const std::int64_t saved = ToyStageModel(config, 0).SavedBytes(0, false);
  CostModel given = UnitCostModel(0.25);
  given.boundary_bytes = 4 * testing::kToyStageWidth;
  given.activation_bytes_per_virtual_stage = {saved, saved + 4};  // stage 1's is wrong
  const std::vector<StageRun> runs = RunStages(
      config,
      [&](int) {
        StageOptions options = Options(spec);
        options.costs.source = CostSource::kGiven;
        options.costs.given = given;
        options.executor.wait_timeout_seconds = 1.0;  // stage 0 waits for stage 1 in vain
        return options;
      },
      1, /*with_group=*/false);
  REQUIRE_FALSE(runs[1].status.ok());
  CHECK(runs[1].status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(runs[1].status) ==
        "stash size mismatch: stage 1 chunk 0 (virtual stage 1) saves " + std::to_string(saved) +
            " bytes (StageModel::SavedBytes) but the given cost model says " +
            std::to_string(saved + 4) +
            "; give costs.given every stage's activation_bytes_per_virtual_stage, or open the "
            "stages with a RankGroup so they share their sizes");
  // Stage 0 opened (its size is right) and then waited for stage 1's messages in vain.
  CHECK(runs[0].status.code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("an arena budget too small for the plan fails Open on every rank with the numbers",
          "[runtime][pipeline][errors]") {
  const PipelineSpec spec = Spec(Family::k1F1B, 2, 4, 1, OffloadPolicy::kNone);
  const std::vector<StageRun> runs = RunStages(
      Config(spec),
      [&](int) {
        StageOptions options = Options(spec);
        options.arena.budget_bytes = 128;  // below one stash entry of either stage
        return options;
      },
      1);
  for (const StageRun& run : runs) {
    CHECK(run.status.code() == absl::StatusCode::kResourceExhausted);
    const std::string message = Message(run.status);
    CAPTURE(message);
    CHECK(message.find("setup (schedule) failed on every rank:") == 0);
    for (int d = 0; d < 2; ++d) {
      CHECK(message.find("rank " + std::to_string(d) +
                         ": the arena budget of 128 bytes is too small for the plan: executor: "
                         "stage " +
                         std::to_string(d) + ": the program's activation stash peaks at") !=
            std::string::npos);
    }
  }
}

TEST_CASE("bad options and disagreeing ranks fail Open with the reason",
          "[runtime][pipeline][errors]") {
  const PipelineSpec spec = Spec(Family::k1F1B, 2, 4, 1, OffloadPolicy::kNone);
  RecordingModel model(Config(spec), 0);
  StageOptions two_sources = Options(spec);
  two_sources.schedule_file = "x.json";
  absl::Status status = PipelineStage::Open(two_sources, model).status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(status) == "give exactly one of spec, schedule_file and schedule; got 2");

  status = PipelineStage::Open(Options(spec), model).status();  // two stages, no transport
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(status).find("a 2-stage pipeline needs a transport") == 0);

  // Measured costs of two stages without a group to share them.
  std::vector<StageRun> runs = RunStages(
      Config(spec),
      [&](int) {
        StageOptions options = Options(spec);
        options.costs.source = CostSource::kMeasured;
        return options;
      },
      1, /*with_group=*/false);
  for (const StageRun& run : runs) {
    CHECK(run.status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Message(run.status).find("measured costs of a multi-stage pipeline need a RankGroup") ==
          0);
  }

  // Ranks given different specs compile different schedules: every rank refuses to run.
  runs = RunStages(
      Config(spec),
      [&](int d) {
        StageOptions options = Options(spec);
        if (d == 1) options.spec->offload = OffloadPolicy::kFull;
        return options;
      },
      1);
  for (const StageRun& run : runs) {
    CHECK(run.status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Message(run.status).find("rank 1 holds a different schedule than rank 0") == 0);
  }

  // A rank whose set-up fails stops the others at the first gather, with its reason.
  runs = RunStages(
      Config(spec),
      [&](int d) {
        StageOptions options = Options(spec);
        if (d == 0) options.executor.wait_timeout_seconds = -1.0;
        return options;
      },
      1);
  for (const StageRun& run : runs) {
    CHECK(run.status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Message(run.status) ==
          "setup (stage models) failed on 1 of 2 ranks (rank 0): wait_timeout_seconds must be "
          "positive, got -1");
  }
}

TEST_CASE("LocalPipeline opens and runs every stage of this process on threads of its own",
          "[runtime][pipeline]") {
  const PipelineSpec spec = Spec(Family::kGroupInterleaved, 2, 4, 2, OffloadPolicy::kFull);
  std::vector<std::unique_ptr<RecordingModel>> models;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<StageModel*> model_ptrs;
  std::vector<Backend*> backend_ptrs;
  for (int d = 0; d < 2; ++d) {
    models.push_back(std::make_unique<RecordingModel>(Config(spec), d));
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
    REQUIRE(backend.ok());
    backends.push_back(*std::move(backend));
    model_ptrs.push_back(models.back().get());
    backend_ptrs.push_back(backends.back().get());
  }
  // Stages on backends of the caller's: messages are copied on each receiver's compute queue.
  absl::StatusOr<std::unique_ptr<LocalPipeline>> pipeline =
      LocalPipeline::Open(Options(spec), model_ptrs, backend_ptrs);
  INFO(pipeline.status().ToString());
  REQUIRE(pipeline.ok());
  REQUIRE((*pipeline)->num_stages() == 2);
  for (int it = 0; it < 2; ++it) {
    absl::StatusOr<std::vector<IterationStats>> stats = (*pipeline)->Run();
    REQUIRE(stats.ok());
    for (int d = 0; d < 2; ++d) {
      const PipelineStage& stage = (*pipeline)->stage(d);
      CHECK(&(*pipeline)->stage(d).backend() == backend_ptrs[static_cast<std::size_t>(d)]);
      CHECK((*stats)[static_cast<std::size_t>(d)].stash_high_water_bytes ==
            stage.schedule().predictions->stages[static_cast<std::size_t>(d)].peak_bytes);
    }
  }
  for (int d = 0; d < 2; ++d) {
    CHECK(models[static_cast<std::size_t>(d)]->calls() ==
          ComputeOps((*pipeline)->stage(d).schedule().stages[static_cast<std::size_t>(d)], 2));
  }
  StageOptions with_transport = Options(spec);
  with_transport.transport = &(*pipeline)->stage(0).transport();
  CHECK(LocalPipeline::Open(with_transport, model_ptrs).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(LocalPipeline::Open(Options(spec), model_ptrs, {backend_ptrs[0]}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload
