// gpt_train's part of planning: the job's stage count and the flags must agree with the ranks
// and a schedule file; the nominal chunk time. (The planning itself: tests/runtime.)
#include "examples/gpt/train_plan.h"

#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload::gpt {
namespace {

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// A po-f schedule from the compiler, as a file would hold it.
Schedule CompiledSchedule(int p, int m, int v) {
  absl::StatusOr<Schedule> schedule =
      Compile(testing::MakeSpec(v > 1 ? Family::kGroupInterleaved : Family::k1F1B, p, m, v, 0,
                                false, OffloadPolicy::kFull),
              UnitCostModel(0.25));
  REQUIRE(schedule.ok());
  return *schedule;
}

TEST_CASE("the nominal chunk time is layers per chunk, at least a quarter", "[train][plan]") {
  CHECK(ChunkComputeUnits(8, 4) == 2.0);
  CHECK(ChunkComputeUnits(8, 8) == 1.0);
  CHECK(ChunkComputeUnits(2, 16) == 0.25);
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

TEST_CASE("a V-placement schedule is planned for either backend", "[train][plan]") {
  for (const std::string backend : {"cpu", "cuda"}) {
    for (const std::string family : {"zbv", "dualpipev"}) {
      CAPTURE(backend, family);
      absl::StatusOr<TrainOptions> options =
          ParseTrainOptions({"--schedule", family, "--backend", backend});
      REQUIRE(options.ok());
      absl::StatusOr<PipelineSpec> spec = JobSpec(*options, std::nullopt, 2, "local");
      REQUIRE(spec.ok());
      CHECK(JobPlacement(*spec) == Placement::kV);
    }
    // A file of a V schedule (the spec says placement v).
    absl::StatusOr<Schedule> file =
        Compile(testing::MakeSpec(Family::kZbv, 2, 4, 2, 0, true, OffloadPolicy::kNone),
                UnitCostModel(0.25));
    REQUIRE(file.ok());
    REQUIRE(file->spec.placement == Placement::kV);
    absl::StatusOr<TrainOptions> options =
        ParseTrainOptions({"--schedule-file", "v.json", "--backend", backend});
    REQUIRE(options.ok());
    absl::StatusOr<PipelineSpec> spec = JobSpec(*options, *file, 2, "mpi");
    REQUIRE(spec.ok());
    CHECK(JobPlacement(*spec) == Placement::kV);
  }
}

}  // namespace
}  // namespace pipeoffload::gpt
