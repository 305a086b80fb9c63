// gpt_train's planning: the cost model carries the model's exact stash sizes; a schedule file
// is read, checked and re-simulated; the job's stage count and the flags must agree with it;
// the default budget holds the plan; every rank can compare fingerprints.
#include "examples/gpt/train_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/simulate.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload::gpt {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("po_train_plan_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// po-f on p stages, m microbatches, v chunks (group-interleaved; 1F1B when v = 1).
PipelineSpec PoFullSpec(int p, int m, int v) {
  return testing::MakeSpec(v > 1 ? Family::kGroupInterleaved : Family::k1F1B, p, m, v, 0, false,
                           OffloadPolicy::kFull);
}

// A po-f schedule from the compiler, as a file would hold it.
Schedule CompiledSchedule(int p, int m, int v) {
  absl::StatusOr<Schedule> schedule = Compile(PoFullSpec(p, m, v), UnitCostModel(0.25));
  REQUIRE(schedule.ok());
  return *schedule;
}

TEST_CASE("the cost model carries each virtual stage's exact stash bytes", "[train][plan]") {
  // p = 2, v = 2: index c * p + d.
  const std::vector<std::int64_t> saved = {1000, 2000, 3000, 4500};
  const CostModel cost = TrainCostModel(saved, 640, /*chunk_units=*/2.0);
  CHECK(cost.activation_bytes_per_virtual_stage == saved);
  CHECK(cost.activation_bytes == 4500);
  CHECK(cost.boundary_bytes == 640);
  CHECK(cost.ActivationBytes(/*stage=*/0, /*chunk=*/0, 2) == 1000);
  CHECK(cost.ActivationBytes(1, 0, 2) == 2000);
  CHECK(cost.ActivationBytes(0, 1, 2) == 3000);
  CHECK(cost.ActivationBytes(1, 1, 2) == 4500);
  // Chunk times in layer-forward units; the largest entry crosses the link in kTransferUnits
  // of a chunk's F.
  CHECK(cost.forward_time == 2.0);
  CHECK(cost.BackwardTime(0, /*split_backward=*/false) == 4.0);
  CHECK(4500 / cost.d2h_bandwidth == Catch::Approx(kTransferUnits * 2.0));
  CHECK(cost.duplex_bandwidth == cost.d2h_bandwidth);
  CHECK(ChunkComputeUnits(8, 4) == 2.0);
  CHECK(ChunkComputeUnits(8, 8) == 1.0);
  CHECK(ChunkComputeUnits(2, 16) == 0.25);

  // The compiler's predicted peak is a sum of these exact sizes: 1F1B on 2 stages, m = 4,
  // v = 1 holds min(m, p - d) entries of stage d.
  PipelineSpec spec;
  spec.num_stages = 2;
  spec.num_microbatches = 4;
  absl::StatusOr<Schedule> schedule = Compile(spec, TrainCostModel({1000, 2000}, 64, 1.0));
  REQUIRE(schedule.ok());
  CHECK(schedule->predictions->stages[0].peak_bytes == 2 * 1000);
  CHECK(schedule->predictions->stages[1].peak_bytes == 1 * 2000);
}

TEST_CASE("measured costs: each stage's pace, the slowest link, one device shared p ways",
          "[train][plan]") {
  // p = 2, v = 2. Stage 0's chunks average F 2 ms, B 3 ms; stage 1's F 2 ms, B 4 ms.
  std::vector<StageCosts> stages(2);
  stages[0].chunks = {{1e-3, 2e-3}, {3e-3, 4e-3}};
  stages[0].link = {50e9, 40e9, 30e9};
  stages[1].chunks = {{2e-3, 4e-3}, {2e-3, 4e-3}};
  stages[1].link = {45e9, 48e9, 35e9};
  CHECK(MeanChunkTimes(stages[0]).forward == Catch::Approx(2e-3));
  CHECK(MeanChunkTimes(stages[0]).backward == Catch::Approx(3e-3));
  const std::vector<std::int64_t> saved = {1000, 2000, 3000, 4500};
  for (const int share : {1, 2}) {
    CAPTURE(share);
    const CostModel cost = MeasuredTrainCostModel(saved, 640, stages, share);
    CHECK(cost.forward_time == Catch::Approx(share * 2e-3));
    CHECK(cost.backward_time == Catch::Approx(share * 1.5e-3));
    CHECK(cost.weight_time == Catch::Approx(share * 1.5e-3));
    REQUIRE(cost.stage_time_scale.size() == 2);
    CHECK(cost.stage_time_scale[0] == Catch::Approx(1.0));
    CHECK(cost.stage_time_scale[1] == Catch::Approx(6.0 / 5.0));
    CHECK(cost.BackwardTime(1, /*split_backward=*/false) == Catch::Approx(share * 3e-3 * 1.2));
    // Each figure is the slowest stage's, split `share` ways.
    CHECK(cost.d2h_bandwidth == Catch::Approx(45e9 / share));
    CHECK(cost.h2d_bandwidth == Catch::Approx(40e9 / share));
    CHECK(cost.duplex_bandwidth == Catch::Approx(30e9 / share));
    CHECK(cost.host_link_group_size == 1);
    CHECK(cost.activation_bytes_per_virtual_stage == saved);
    CHECK(cost.activation_bytes == 4500);
    CHECK(cost.boundary_bytes == 640);
  }
}

TEST_CASE("on H200 figures, po-f planned on measured costs offloads what hides; nominal stalls",
          "[train][plan]") {
  // gpt_train over NCCL on two H200s at h = 8192 (docs/benchmarks.md), 16 layers in v = 4
  // chunks of 2 per stage, m = 8: a chunk saves 1.08 GB and takes ~10.5 ms forward and ~25 ms
  // backward; the link moves 54 GB/s one way, 46 GB/s each way together.
  const PipelineSpec spec = PoFullSpec(/*p=*/2, /*m=*/8, /*v=*/4);
  constexpr std::int64_t kEntry = 1'075'974'144;
  const std::vector<std::int64_t> saved(8, kEntry);
  std::vector<StageCosts> stages(2);
  for (StageCosts& stage : stages) {
    stage.chunks.assign(4, ChunkTimes{10.5e-3, 25e-3});
    stage.link = {54e9, 50e9, 46e9};
  }
  const CostModel measured = MeasuredTrainCostModel(saved, 32 << 20, stages, 1);
  absl::StatusOr<Schedule> planned = PlanSchedule(spec, std::nullopt, measured);
  absl::StatusOr<Schedule> nominal =
      PlanSchedule(spec, std::nullopt, TrainCostModel(saved, 32 << 20, 2.0));
  REQUIRE(planned.ok());
  REQUIRE(nominal.ok());
  const Predictions& plan = *planned->predictions;
  // The nominal plan offloads every entry of stage 0 (m x v of them, as on the GPUs); timed
  // with the H200's costs it stalls well past the step without offload.
  CHECK(nominal->predictions->stages[0].offloaded_bytes == 8 * 4 * kEntry);
  absl::StatusOr<Timeline> nominal_on_gpu = Simulate(*nominal, measured);
  REQUIRE(nominal_on_gpu.ok());
  CHECK(nominal_on_gpu->predictions.step_time > 1.1 * plan.step_time_without_offload);
  // The measured plan offloads less, keeps the step within 3% of the same order without
  // offload, and still cuts stage 0's stash peak by over a third.
  CAPTURE(plan.step_time, plan.step_time_without_offload, plan.stages[0].peak_bytes);
  CHECK(plan.stages[0].offloaded_bytes < nominal->predictions->stages[0].offloaded_bytes);
  CHECK(plan.step_time <= 1.03 * plan.step_time_without_offload);
  CHECK(3 * plan.stages[0].peak_bytes < 2 * plan.stages[0].peak_bytes_without_offload);
}

TEST_CASE("the job's stage count must match the ranks, with a launch hint", "[train][plan]") {
  absl::StatusOr<TrainOptions> options = ParseTrainOptions({"--stages", "2"});
  REQUIRE(options.ok());
  absl::StatusOr<PipelineSpec> spec = JobSpec(*options, std::nullopt, 4, "mpi");
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Message(spec.status()) ==
        "the schedule has 2 stages (--stages 2) but the mpi job has 4 ranks; gpt_train runs one "
        "rank per stage (mpirun -np 2)");
  spec = JobSpec(*options, std::nullopt, 4, "local");
  REQUIRE_FALSE(spec.ok());
  CHECK(Message(spec.status()).find("(--stages 2)") != std::string::npos);
  spec = JobSpec(*options, std::nullopt, 2, "mpi");
  REQUIRE(spec.ok());
  CHECK(spec->num_stages == 2);

  // Without --stages the ranks decide.
  options = ParseTrainOptions({});
  REQUIRE(options.ok());
  spec = JobSpec(*options, std::nullopt, 3, "mpi");
  REQUIRE(spec.ok());
  CHECK(spec->num_stages == 3);
}

TEST_CASE("a schedule file decides p, v, m and split, and conflicting flags are errors",
          "[train][plan]") {
  const Schedule file = CompiledSchedule(4, 8, 2);
  absl::StatusOr<TrainOptions> options = ParseTrainOptions({"--schedule-file", "plan.json"});
  REQUIRE(options.ok());
  absl::StatusOr<PipelineSpec> spec = JobSpec(*options, file, 4, "mpi");
  REQUIRE(spec.ok());
  CHECK(*spec == file.spec);

  spec = JobSpec(*options, file, 2, "mpi");
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Message(spec.status()) ==
        "the schedule has 4 stages (--schedule-file plan.json) but the mpi job has 2 ranks; "
        "gpt_train runs one rank per stage (mpirun -np 4)");

  const std::vector<std::pair<std::vector<std::string>, std::string>> conflicts = {
      {{"--chunks", "1"}, "--chunks 1 conflicts with --schedule-file plan.json, which has 2"},
      {{"--microbatches", "4"}, "--microbatches 4 conflicts with"},
      {{"--stages", "4", "--microbatches", "16"}, "--microbatches 16 conflicts with"},
      {{"--split-backward"}, "--split-backward conflicts with --schedule-file plan.json"}};
  for (const auto& [flags, expected] : conflicts) {
    std::vector<std::string> args = {"--schedule-file", "plan.json"};
    args.insert(args.end(), flags.begin(), flags.end());
    options = ParseTrainOptions(args);
    REQUIRE(options.ok());
    spec = JobSpec(*options, file, 4, "mpi");
    CAPTURE(flags, spec.status().ToString());
    REQUIRE_FALSE(spec.ok());
    CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Message(spec.status()).find(expected) != std::string::npos);
  }
}

TEST_CASE("schedule files: missing, corrupted and invalid ones are errors naming the file",
          "[train][plan]") {
  const std::string missing = TempPath("missing.json");
  absl::StatusOr<Schedule> loaded = LoadScheduleFile(missing);
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
  CHECK(Message(loaded.status()).find(missing) != std::string::npos);

  const std::string json = ScheduleToJson(CompiledSchedule(4, 8, 2));
  const std::string truncated = TempPath("truncated.json");
  WriteFile(truncated, json.substr(0, json.size() / 2));
  loaded = LoadScheduleFile(truncated);
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(loaded.status()).find("schedule file " + truncated + " is corrupted") == 0);

  std::string bad_op = json;
  bad_op.replace(bad_op.find("\"op\": \"F\""), 9, "\"op\": \"Q\"");
  const std::string bad_op_path = TempPath("bad_op.json");
  WriteFile(bad_op_path, bad_op);
  loaded = LoadScheduleFile(bad_op_path);
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(loaded.status()).find("stages[0].ops[0]") != std::string::npos);

  // Parses, but stage 0 never sends F0.0's output: the validator rejects it.
  Schedule broken = CompiledSchedule(4, 8, 2);
  auto& ops = broken.stages[0].ops;
  ops.erase(std::find(ops.begin(), ops.end(), Op{OpKind::kSendActivation, 0, 0, 1}));
  const std::string invalid = TempPath("invalid.json");
  WriteFile(invalid, ScheduleToJson(broken));
  loaded = LoadScheduleFile(invalid);
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Message(loaded.status()).find("schedule file " + invalid + " is not a valid schedule") ==
        0);

  const std::string good = TempPath("good.json");
  WriteFile(good, json);
  loaded = LoadScheduleFile(good);
  REQUIRE(loaded.ok());
  CHECK(*loaded == CompiledSchedule(4, 8, 2));
  for (const std::string& path : {truncated, bad_op_path, invalid, good}) std::remove(path.c_str());
}

TEST_CASE("a loaded schedule is re-simulated under the model's own cost model", "[train][plan]") {
  const Schedule file = CompiledSchedule(2, 4, 1);  // predictions for 1 MiB unit entries
  const CostModel cost = TrainCostModel({5000, 7000}, 128, 1.0);
  absl::StatusOr<Schedule> planned = PlanSchedule(file.spec, file, cost);
  REQUIRE(planned.ok());
  CHECK(planned->stages == file.stages);
  absl::StatusOr<Timeline> expected = Simulate(file, cost);
  REQUIRE(expected.ok());
  CHECK(*planned->predictions == expected->predictions);
  CHECK(planned->predictions->stages[0].peak_bytes != file.predictions->stages[0].peak_bytes);
  // And without a file, the compiler's schedule for the spec.
  planned = PlanSchedule(file.spec, std::nullopt, cost);
  REQUIRE(planned.ok());
  CHECK(*planned == *Compile(file.spec, cost));
}

TEST_CASE("the default arena budget holds the aligned stash peak and every P2P buffer",
          "[train][plan]") {
  const Schedule schedule = CompiledSchedule(4, 8, 2);
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const StageProgram& program = schedule.stages[d];
    const StagePrediction& prediction = schedule.predictions->stages[d];
    int buffers = 0;
    for (const Op& op : program.ops) {
      buffers += op.kind == OpKind::kForward || op.kind == OpKind::kBackward ||
                 op.kind == OpKind::kRecvActivation || op.kind == OpKind::kRecvGrad;
    }
    const std::int64_t budget = DefaultArenaBytes(program, prediction, 1000, 256);
    CHECK(budget % 256 == 0);
    CHECK(budget >= prediction.peak_bytes + prediction.peak_units * 256 + buffers * 1024);
    CHECK(budget < 2 * (prediction.peak_bytes + prediction.peak_units * 256 + buffers * 1024));
    // One more largest entry of slack (first-fit fragmentation on the GPU).
    CHECK(DefaultArenaBytes(program, prediction, 1000, 256, 5000) == budget + 5120);
  }
}

TEST_CASE("with the P2P plan the default arena reserves the lifetimes' peak, not every buffer",
          "[train][plan]") {
  const Schedule schedule = CompiledSchedule(4, 8, 2);
  absl::StatusOr<std::vector<P2PLifetimes>> p2p = AnalyzeP2P(schedule);
  REQUIRE(p2p.ok());
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const StageProgram& program = schedule.stages[d];
    const StagePrediction& prediction = schedule.predictions->stages[d];
    const P2PLifetimes& lifetimes = (*p2p)[static_cast<std::size_t>(d)];
    const std::int64_t stash = prediction.peak_bytes + prediction.peak_units * 256;
    const std::int64_t room = stash + lifetimes.peak_blocks * 1024;
    const std::int64_t planned = DefaultArenaBytes(program, prediction, 1000, 256, 0, &lifetimes);
    // total + a quarter + one alignment, aligned up (no largest entry here).
    CHECK(planned == (room + room / 4 + 256 + 255) / 256 * 256);
    CHECK(planned < DefaultArenaBytes(program, prediction, 1000, 256));
  }
}

TEST_CASE("schedule fingerprints tell schedules apart", "[train][plan]") {
  const Schedule a = CompiledSchedule(4, 8, 2);
  Schedule b = a;
  CHECK(ScheduleFingerprint(a) == ScheduleFingerprint(b));
  std::swap(b.stages[1].ops[0], b.stages[1].ops[1]);
  CHECK(ScheduleFingerprint(a) != ScheduleFingerprint(b));
  CHECK(ScheduleFingerprint(a) != ScheduleFingerprint(CompiledSchedule(4, 8, 1)));
}

}  // namespace
}  // namespace pipeoffload::gpt
