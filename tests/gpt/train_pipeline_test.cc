// gpt_train's pipeline driver, every stage a thread (local group + local transport), against the
// single-process reference: every family and offload policy ends with bitwise the same
// parameters and losses; the measured stash peaks equal the predictions exactly; offload moves
// bytes and lowers the peak; bad input (stage count, schedule file, budget) and a failing step
// stop every rank with the reason, within the watchdog; the trace holds every stage.
#include "examples/gpt/train_pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "examples/gpt/gpt_stage_model.h"
#include "nlohmann/json.hpp"
#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/transport.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

std::shared_ptr<const GptData> Corpus() {
  static const auto* const kData =
      new std::shared_ptr<const GptData>(std::make_shared<const GptData>(GptData::Synthetic()));
  return *kData;
}

// The tiny model of every test here: 4 layers, C 16, T 8, B 2, m 8, 3 steps, warmed up over
// those 3 (the 100-step default would leave rates too small to move the loss in 3 steps).
TrainOptions Options(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--layers", "4",  "--embd",     "16", "--heads",
                                   "2",        "--seq", "8",        "--batch", "2",
                                   "--microbatches", "8", "--steps", "3",     "--watchdog",
                                   "20",       "--warmup-steps", "3"};
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<TrainOptions> options = ParseTrainOptions(args);
  INFO(options.status().ToString());
  REQUIRE(options.ok());
  return *options;
}

struct LocalRun {
  std::vector<absl::StatusOr<TrainResult>> ranks;
  double seconds = 0.0;
};

// Runs every stage of the pipeline on its own thread, as `gpt_train --transport local` does.
LocalRun RunLocal(const TrainOptions& options, int stages) {
  auto groups = CreateLocalRankGroups(stages, 3 * options.watchdog_seconds + 30);
  REQUIRE(groups.ok());
  auto transports = CreateLocalTransports(stages);
  REQUIRE(transports.ok());
  LocalRun run;
  run.ranks.assign(static_cast<std::size_t>(stages), absl::UnknownError("not run"));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < stages; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      run.ranks[i] = RunPipelineRank(options, Corpus(), *(*groups)[i], *(*transports)[i],
                                     /*out=*/nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

TrainResult Reference(const TrainOptions& options) {
  absl::StatusOr<TrainResult> result = RunReference(options, Corpus(), /*out=*/nullptr);
  REQUIRE(result.ok());
  REQUIRE(result->losses.size() == static_cast<std::size_t>(options.steps));
  return *result;
}

// Every rank succeeded and agrees with rank 0; returns rank 0's result.
TrainResult Agreed(const LocalRun& run) {
  for (std::size_t r = 0; r < run.ranks.size(); ++r) {
    CAPTURE(r, run.ranks[r].status().ToString());
    REQUIRE(run.ranks[r].ok());
    CHECK(run.ranks[r]->checksum == run.ranks[0]->checksum);
    CHECK(run.ranks[r]->losses == run.ranks[0]->losses);
  }
  return *run.ranks[0];
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("po_train_pipeline_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST_CASE("every family and offload policy ends bitwise equal to the single-process reference",
          "[train][pipeline]") {
  const std::vector<std::string> flags = GENERATE(values<std::vector<std::string>>(
      {{"--schedule", "1f1b"},
       {"--schedule", "interleaved"},
       {"--schedule", "group-interleaved"},
       {"--schedule", "po-h"},
       {"--schedule", "po-f"},
       {"--schedule", "selective", "--offload-fraction", "0.5"},
       {"--schedule", "selective", "--offload-chunks", "1"},
       {"--schedule", "po-f", "--family", "1f1b"},
       {"--schedule", "po-f", "--split-backward", "--tied"},
       {"--schedule", "interleaved", "--split-backward"},
       {"--schedule", "po-h", "--tied", "--poison"},
       {"--schedule", "auto", "--memory-budget", "50%"},
       {"--schedule", "interleaved", "--recompute", "full"},
       {"--schedule", "1f1b", "--recompute", "lean", "--split-backward", "--tied"},
       {"--schedule", "group-interleaved", "--recompute", "full", "--recompute-fraction", "0.5"},
       // V placement: the models' chunks follow VirtualStageMap (stage 0 holds the first and
       // the last virtual stage, so tied wte needs no exchange).
       {"--schedule", "zbv"},
       {"--schedule", "zbv", "--tied"},
       {"--schedule", "dualpipev"},
       {"--schedule", "po-f", "--family", "zbv"}}));
  CAPTURE(flags);
  const TrainOptions options = Options(flags);
  const TrainResult reference = Reference(options);
  const TrainResult result = Agreed(RunLocal(options, 4));

  CHECK(result.checksum == reference.checksum);
  CHECK(result.losses == reference.losses);  // every step's mean loss, exactly
  CHECK(result.losses.back() < result.losses.front());

  REQUIRE(result.schedule.has_value());
  REQUIRE(result.stages.size() == 4);
  const bool offload = result.schedule->spec.offload != OffloadPolicy::kNone;
  std::int64_t offloaded = 0;
  for (const StageSummary& stage : result.stages) {
    CAPTURE(stage.stage);
    const StagePrediction& predicted = result.schedule->predictions->stages[stage.stage];
    CHECK(stage.stash_peak_bytes == stage.predicted_stash_peak_bytes);
    CHECK(stage.stash_peak_bytes == predicted.peak_bytes);
    CHECK(stage.host_peak_bytes == predicted.host_bytes);
    CHECK(stage.offloaded_bytes == predicted.offloaded_bytes);
    CHECK(stage.p2p_peak_bytes > 0);
    CHECK(stage.other_arena_peak_bytes == 0);  // the GPT keeps its weights outside the arena
    CHECK(stage.stash_peak_bytes + stage.p2p_peak_bytes <= stage.arena_budget_bytes);
    CHECK(stage.model_state_bytes > 0);
    offloaded += stage.offloaded_bytes;
    if (!offload) CHECK(stage.host_peak_bytes == 0);
  }
  CHECK(result.peaks_match);
  CHECK((offloaded > 0) == offload);
}

TEST_CASE("--recompute: RECOMPUTE ops before B, bitwise as keeping, lower measured peaks",
          "[train][pipeline]") {
  const TrainResult plain = Agreed(RunLocal(Options({"--schedule", "interleaved"}), 4));
  for (const auto& [mode, kind] :
       {std::pair{"full", OpKind::kRecompute}, std::pair{"lean", OpKind::kRecomputeLean}}) {
    CAPTURE(mode);
    const TrainResult recomputed =
        Agreed(RunLocal(Options({"--schedule", "interleaved", "--recompute", mode}), 4));
    CHECK(recomputed.checksum == plain.checksum);
    CHECK(recomputed.losses == plain.losses);
    REQUIRE(recomputed.schedule.has_value());
    int forwards = 0, recomputes = 0;
    for (const StageProgram& program : recomputed.schedule->stages) {
      for (const Op& op : program.ops) {
        forwards += op.kind == OpKind::kForward ? 1 : 0;
        recomputes += op.kind == kind ? 1 : 0;
      }
    }
    CHECK(recomputes == forwards);  // every entry
    REQUIRE(recomputed.stages.size() == plain.stages.size());
    for (std::size_t d = 0; d < plain.stages.size(); ++d) {
      CAPTURE(d);
      CHECK(recomputed.stages[d].stash_peak_bytes ==
            recomputed.stages[d].predicted_stash_peak_bytes);
      CHECK(recomputed.stages[d].stash_peak_bytes < plain.stages[d].stash_peak_bytes);
    }
  }
}

TEST_CASE("--recompute beside po-f: what F keeps goes to the host and back, bitwise as keeping",
          "[train][pipeline]") {
  const TrainResult plain = Agreed(RunLocal(Options({"--schedule", "po-f"}), 4));
  for (const char* mode : {"full", "lean"}) {
    CAPTURE(mode);
    const TrainResult alone =
        Agreed(RunLocal(Options({"--schedule", "group-interleaved", "--recompute", mode}), 4));
    const TrainResult both =
        Agreed(RunLocal(Options({"--schedule", "po-f", "--recompute", mode, "--poison"}), 4));
    CHECK(both.checksum == plain.checksum);
    CHECK(both.losses == plain.losses);
    CHECK(both.peaks_match);
    std::int64_t offloaded = 0;
    REQUIRE(both.stages.size() == alone.stages.size());
    for (std::size_t d = 0; d < both.stages.size(); ++d) {
      CAPTURE(d);
      CHECK(both.stages[d].stash_peak_bytes == both.stages[d].predicted_stash_peak_bytes);
      CHECK(both.stages[d].stash_peak_bytes <= alone.stages[d].stash_peak_bytes);
      offloaded += both.stages[d].offloaded_bytes;
    }
    CHECK(offloaded > 0);
    CHECK(both.stages[0].stash_peak_bytes < alone.stages[0].stash_peak_bytes);
  }
}

TEST_CASE("--schedule auto keeps every stage's measured stash peak within --memory-budget",
          "[train][pipeline]") {
  const TrainResult plain = Agreed(RunLocal(Options({"--schedule", "group-interleaved"}), 4));
  std::int64_t plain_peak = 0;
  for (const StageSummary& stage : plain.stages) {
    plain_peak = std::max(plain_peak, stage.stash_peak_bytes);
  }
  // 50% of the no-offload peak: only a plan that offloads fits.
  const TrainResult share =
      Agreed(RunLocal(Options({"--schedule", "auto", "--memory-budget", "50%"}), 4));
  const std::int64_t budget = plain_peak / 2;
  const TrainResult bytes = Agreed(
      RunLocal(Options({"--schedule", "auto", "--memory-budget", std::to_string(budget)}), 4));
  for (const TrainResult* result : {&share, &bytes}) {
    REQUIRE(result->schedule.has_value());
    CHECK(result->schedule->spec.offload != OffloadPolicy::kNone);
    CHECK(result->checksum == plain.checksum);
    CHECK(result->peaks_match);
    // Half the plain peak fits only by moving activations: the chosen plan does, and moves
    // exactly the bytes it planned.
    std::int64_t offloaded = 0;
    for (const StageSummary& stage : result->stages) {
      CAPTURE(stage.stage);
      CHECK(stage.stash_peak_bytes <= budget);
      CHECK(stage.offloaded_bytes == stage.predicted_offloaded_bytes);
      offloaded += stage.offloaded_bytes;
    }
    CHECK(offloaded > 0);
  }
  // A budget below every plan's peak: every rank fails at setup, naming the smallest peak.
  const LocalRun tiny = RunLocal(Options({"--schedule", "auto", "--memory-budget", "1K"}), 4);
  for (const auto& rank : tiny.ranks) {
    REQUIRE_FALSE(rank.ok());
    CHECK(std::string(rank.status().message()).find("no plan fits memory_budget_bytes=1000") !=
          std::string::npos);
  }
}

TEST_CASE("offload on and off: bitwise equal parameters, and po-f lowers every measured peak",
          "[train][pipeline]") {
  const TrainResult off = Agreed(RunLocal(Options({"--schedule", "group-interleaved"}), 4));
  const TrainResult on = Agreed(RunLocal(Options({"--schedule", "po-f", "--poison"}), 4));
  CHECK(on.checksum == off.checksum);
  CHECK(on.losses == off.losses);
  REQUIRE(on.stages.size() == 4);
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d, on.stages[d].stash_peak_bytes, off.stages[d].stash_peak_bytes);
    CHECK(on.stages[d].stash_peak_bytes < off.stages[d].stash_peak_bytes);
    CHECK(on.schedule->predictions->stages[d].peak_bytes_without_offload ==
          off.stages[d].stash_peak_bytes);
    CHECK(on.stages[d].offloaded_bytes > 0);
  }
}

TEST_CASE("--costs measured: every stage times its chunks and link; training stays bitwise",
          "[train][pipeline]") {
  const TrainResult reference = Reference(Options({}));
  const TrainResult measured =
      Agreed(RunLocal(Options({"--schedule", "po-f", "--costs", "measured"}), 4));
  // Measuring runs F and B before the first step; StartIteration zeroes what they left.
  CHECK(measured.checksum == reference.checksum);
  CHECK(measured.losses == reference.losses);
  CHECK(measured.peaks_match);
  REQUIRE(measured.measured_costs.size() == 4);
  for (const StageCosts& stage : measured.measured_costs) {
    REQUIRE(stage.chunks.size() == 2);  // po-f: group-interleaved v = 2
    for (const ChunkTimes& chunk : stage.chunks) {
      CHECK(chunk.forward > 0.0);
      CHECK(chunk.backward > 0.0);
    }
    CHECK(stage.link.d2h > 0.0);
    CHECK(stage.link.h2d > 0.0);
    CHECK(stage.link.duplex > 0.0);
  }
  // The plan's times are seconds now: the predicted step is a small fraction of a second for
  // this tiny model, where nominal units give tens.
  REQUIRE(measured.schedule.has_value());
  CHECK(measured.schedule->predictions->step_time < 1.0);
  const TrainResult nominal = Agreed(RunLocal(Options({"--schedule", "po-f"}), 4));
  CHECK(nominal.measured_costs.empty());
  CHECK(nominal.schedule->predictions->step_time > 10.0);
}

TEST_CASE("a different seed or data changes the checksum (the comparison is not blind)",
          "[train][pipeline]") {
  const TrainResult base = Reference(Options({}));
  CHECK(Reference(Options({"--seed", "77"})).checksum != base.checksum);
  CHECK(Reference(Options({"--steps", "2"})).checksum != base.checksum);
  CHECK(Reference(Options({"--lr", "0.002"})).checksum != base.checksum);
}

TEST_CASE("a stage count that differs from the ranks stops every rank with the reason",
          "[train][pipeline]") {
  const LocalRun run = RunLocal(Options({"--stages", "2"}), 4);
  for (const auto& rank : run.ranks) {
    REQUIRE_FALSE(rank.ok());
    CHECK(rank.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(rank.status().message()) ==
          "setup (model) failed on every rank: the schedule has 2 stages (--stages 2) but the "
          "local job has 4 ranks; gpt_train runs one rank per stage (--stages 2)");
  }
}

TEST_CASE("schedule files: a corrupted one stops every rank, a valid one trains bitwise equal",
          "[train][pipeline]") {
  PipelineSpec spec;
  spec.family = Family::kGroupInterleaved;
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.chunks_per_stage = 2;
  spec.offload = OffloadPolicy::kFull;
  absl::StatusOr<Schedule> compiled = Compile(spec, UnitCostModel(0.25));
  REQUIRE(compiled.ok());
  const std::string json = ScheduleToJson(*compiled);

  const std::string good = TempPath("good.json");
  std::ofstream(good) << json;
  const TrainOptions from_file = Options({"--schedule-file", good});
  const TrainResult result = Agreed(RunLocal(from_file, 4));
  CHECK(result.checksum == Reference(from_file).checksum);
  CHECK(result.peaks_match);
  CHECK(result.schedule->stages == compiled->stages);

  const std::string corrupted = TempPath("corrupted.json");
  std::ofstream(corrupted) << json.substr(0, json.size() - 10);
  const LocalRun run = RunLocal(Options({"--schedule-file", corrupted}), 4);
  for (const auto& rank : run.ranks) {
    REQUIRE_FALSE(rank.ok());
    CHECK(rank.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(rank.status().message())
              .find("setup (model) failed on every rank: schedule file " + corrupted +
                    " is corrupted: JSON syntax error") == 0);
  }
  std::remove(good.c_str());
  std::remove(corrupted.c_str());
}

TEST_CASE("a budget below the plan's stash peak stops every rank before the first step",
          "[train][pipeline]") {
  const LocalRun run = RunLocal(Options({"--arena-bytes", "16Ki"}), 4);
  for (const auto& rank : run.ranks) {
    REQUIRE_FALSE(rank.ok());
    CHECK(rank.status().code() == absl::StatusCode::kResourceExhausted);
    const std::string message(rank.status().message());
    CAPTURE(message);
    CHECK(message.find("setup (schedule) failed on every rank:") == 0);
    for (int d = 0; d < 4; ++d) {
      // Each stage's own numbers.
      CHECK(message.find("rank " + std::to_string(d) +
                         ": the arena budget of 16384 bytes is too small for the plan: "
                         "executor: stage " +
                         std::to_string(d) + ": the program's activation stash peaks at") !=
            std::string::npos);
    }
  }
}

TEST_CASE("a step that fails on one rank stops every rank within the watchdog",
          "[train][pipeline]") {
  // Stage 0's budget is exactly its stash peak with the arena's alignment. Without the P2P plan
  // (--p2p-reserve worst) that passes the executor's up-front check, but F allocates its
  // output's P2P buffer before its stash entry, so the F that reaches the peak fails in the
  // arena; the others then wait for stage 0's messages until the watchdog fires. With the plan
  // (the default) the same budget is refused before the first step, naming the P2P peak.
  const TrainOptions plain = Options({});
  const TrainResult ok = Agreed(RunLocal(plain, 4));
  absl::StatusOr<std::unique_ptr<GptStageModel>> model =
      GptStageModel::Create(plain.config, 4, 2, /*stage=*/0, Corpus());
  REQUIRE(model.ok());
  const auto aligned = [](std::int64_t bytes) { return (bytes + 255) / 256 * 256; };
  std::int64_t stash = 0;
  std::int64_t budget = 0;
  for (const Op& op : ok.schedule->stages[0].ops) {
    const std::int64_t entry = aligned((*model)->SavedBytes(op.chunk, false));
    if (op.kind == OpKind::kForward || op.kind == OpKind::kReload) stash += entry;
    if (op.kind == OpKind::kBackward || op.kind == OpKind::kRelease) stash -= entry;
    budget = std::max(budget, stash);
  }
  const LocalRun run = RunLocal(Options({"--arena-bytes", std::to_string(budget), "--watchdog",
                                          "1", "--p2p-reserve", "worst"}),
                                 4);
  CHECK(run.seconds < 15.0);
  for (const auto& rank : run.ranks) {
    REQUIRE_FALSE(rank.ok());
    const std::string message(rank.status().message());
    CAPTURE(message);
    CHECK(message.find("step 0 failed on") == 0);
    CHECK(message.find("rank 0: stage 0, op ") != std::string::npos);
    CHECK(message.find("device arena: cannot allocate") != std::string::npos);
    CHECK(message.find("waited 1.0 s for") != std::string::npos);  // the watchdog's words
  }
  const LocalRun planned =
      RunLocal(Options({"--arena-bytes", std::to_string(budget), "--watchdog", "1"}), 4);
  REQUIRE_FALSE(planned.ranks[0].ok());
  const std::string refused(planned.ranks[0].status().message());
  CAPTURE(refused);
  CHECK(refused.find("setup (schedule) failed on") == 0);
  CHECK(refused.find("rank 0: the arena budget of " + std::to_string(budget) +
                     " bytes is too small for the plan") != std::string::npos);
  CHECK(refused.find("plus its P2P plan's peak of") != std::string::npos);
}

TEST_CASE("--trace writes every stage's measured last step in the simulator's layout",
          "[train][pipeline]") {
  const std::string path = TempPath("trace.json");
  const TrainResult result = Agreed(RunLocal(Options({"--schedule", "po-f", "--trace", path}), 4));
  std::ifstream in(path);
  REQUIRE(in.good());
  const nlohmann::json trace = nlohmann::json::parse(in);
  const nlohmann::json& events = trace.is_object() ? trace.at("traceEvents") : trace;
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    int compute = 0;
    int copies = 0;
    bool named = false;
    for (const nlohmann::json& event : events) {
      if (event.value("pid", -1) != d) continue;
      if (event.value("ph", "") == "M" && event.value("name", "") == "process_name") {
        named = event["args"].value("name", "") == "stage " + std::to_string(d);
      }
      if (event.value("ph", "") != "X") continue;
      const std::string name = event.value("name", "");
      compute += name[0] == 'F' || name[0] == 'B' || name[0] == 'W';
      copies += name.rfind("OFFLOAD", 0) == 0 || name.rfind("RELOAD", 0) == 0;
    }
    int expected_compute = 0;
    int expected_copies = 0;
    for (const Op& op : result.schedule->stages[d].ops) {
      expected_compute += IsCompute(op.kind);
      expected_copies += op.kind == OpKind::kOffload || op.kind == OpKind::kReload;
    }
    CHECK(named);
    CHECK(compute == expected_compute);
    CHECK(copies == expected_copies);
    CHECK(copies > 0);
  }
  // The link report of the same step: every stage's P2P ops counted, spans non-negative, and
  // links grouped as the plan's cost model groups them (nominal costs: pairs of stages).
  REQUIRE(result.links.has_value());
  CHECK(result.links->stages_per_link == 2);
  REQUIRE(result.links->stages.size() == 4);
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    int sends = 0;
    int receives = 0;
    for (const Op& op : result.schedule->stages[d].ops) {
      sends += IsSend(op.kind);
      receives += IsP2P(op.kind) && !IsSend(op.kind);
    }
    const P2PTimes& times = result.links->stages[static_cast<std::size_t>(d)];
    CHECK(times.sends == sends);
    CHECK(times.receives == receives);
    CHECK(times.median_send_seconds <= times.send_seconds);
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pipeoffload::gpt
