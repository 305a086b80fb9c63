// PyTorch CSV import of what torch writes for its V schedules, and the inference that makes
// --stages optional: ranks from the rows, placement from the rank virtual stages >= p run on,
// OVERLAP_F_B and full B in split files; and exact V round trips of compiled schedules.
//
// tests/data/torch_{zbv,dualpipev}_p*_m*.csv are compute_only files in the layout torch's
// _dump_csv writes (csv.writer: CRLF line ends, None as an empty cell): ZBVZeroBubble keeps its
// leading idle cells and turns the ops of padded microbatches (m < 2p - 1) into idle cells;
// DualPipeV writes "(<F>;<B>)OVERLAP_F_B" cells and mixes full B with I/W. The torch-labelled
// test (tests/python/torch_schedule_check.py) checks the same files against torch itself.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/validate.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using ::pipeoffload::testing::MakeSpec;

std::string ReadData(const std::string& name) {
  std::ifstream in("tests/data/" + name, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<StageProgram> ComputeOnly(const Schedule& schedule) {
  std::vector<StageProgram> out = schedule.stages;
  for (StageProgram& program : out) {
    std::vector<Op> kept;
    for (const Op& op : program.ops) {
      if (IsCompute(op.kind)) kept.push_back(op);
    }
    program.ops = kept;
  }
  return out;
}

std::string Error(std::string_view csv, const CsvImportOptions& options) {
  absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(csv, options);
  REQUIRE(!parsed.ok());
  return std::string(parsed.status().message());
}

TEST_CASE("torch's ZBV and DualPipeV files import as our zbv and dualpipev orders",
          "[io][csv][vshape]") {
  struct Case {
    const char* file;
    Family family;
    int p, m;
  };
  for (const Case& c : {Case{"torch_zbv_p2_m2.csv", Family::kZbv, 2, 2},
                        Case{"torch_zbv_p4_m8.csv", Family::kZbv, 4, 8},
                        Case{"torch_dualpipev_p2_m4.csv", Family::kDualPipeV, 2, 4},
                        Case{"torch_dualpipev_p4_m8.csv", Family::kDualPipeV, 4, 8}}) {
    INFO(c.file);
    absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(ReadData(c.file), CsvImportOptions{});
    INFO(parsed.status().ToString());
    REQUIRE(parsed.ok());
    CHECK(parsed->spec.num_stages == c.p);  // from the rows
    CHECK(parsed->spec.placement == Placement::kV);
    CHECK(parsed->spec.chunks_per_stage == 2);
    CHECK(parsed->spec.num_microbatches == c.m);
    CHECK(parsed->spec.split_backward);
    absl::StatusOr<Schedule> ours = BuildComputeOrder(MakeSpec(c.family, c.p, c.m, 2), {});
    REQUIRE(ours.ok());
    CHECK(parsed->stages == ours->stages);
    // Lowered as po-schedule import does, it is a valid schedule.
    absl::StatusOr<Schedule> lowered = LowerCommunication(*parsed);
    REQUIRE(lowered.ok());
    CHECK(Validate(*lowered).ok());
  }
}

TEST_CASE("PyTorch CSV infers the ranks from the rows; a given count must fit them",
          "[io][csv][vshape]") {
  absl::StatusOr<Schedule> three = ParsePyTorchCsv("0F0,0B0\n1F0,1B0\n2F0,2B0\n\n \n", {});
  REQUIRE(three.ok());
  CHECK(three->spec.num_stages == 3);  // trailing blank lines are an editor's, not ranks
  CHECK(three->spec.placement == Placement::kLoop);
  // An idle row is a rank that idles throughout.
  absl::StatusOr<Schedule> idle = ParsePyTorchCsv("0F0,0B0\n,\n", {});
  REQUIRE(idle.ok());
  CHECK(idle->spec.num_stages == 2);
  CHECK(ParsePyTorchCsv("0F0,0B0\n1F0,1B0\n", CsvImportOptions{2}).ok());
  CHECK(Error("0F0,0B0\n1F0,1B0\n", CsvImportOptions{3}) ==
        "the CSV has 2 rows but the pipeline has num_stages = 3 ranks (one row per rank, in "
        "rank order)");
  CHECK(Error("0F0,0B0\n1F0,1B0\n", CsvImportOptions{1}) ==
        "row 1, column 0, cell \"1F0\": the CSV has more rows (2) than the pipeline has ranks "
        "(num_stages = 1)");
  CHECK(Error("\n \n", {}) ==
        "the CSV has no rows, so the number of ranks (one row each) is unknown");
  CHECK(Error("0F0\n", CsvImportOptions{-1}) ==
        "num_stages must be >= 1, or 0 for the CSV's row count, got -1");
}

TEST_CASE("PyTorch CSV infers the placement from where virtual stages >= p run",
          "[io][csv][vshape]") {
  // p = 2: loop puts virtual stage 2 on rank 0 and 3 on rank 1; V puts 3 on rank 0, 2 on rank 1.
  const std::string loop = "0F0,2F0,2B0,0B0\n1F0,3F0,3B0,1B0\n";
  const std::string v = "0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n";
  absl::StatusOr<Schedule> as_loop = ParsePyTorchCsv(loop, {});
  REQUIRE(as_loop.ok());
  CHECK(as_loop->spec.placement == Placement::kLoop);
  CHECK(as_loop->stages[0].ops[1] == Op{OpKind::kForward, 0, 1, -1});
  absl::StatusOr<Schedule> as_v = ParsePyTorchCsv(v, {});
  REQUIRE(as_v.ok());
  CHECK(as_v->spec.placement == Placement::kV);
  // Virtual stage 3 is chunk 1 of rank 0, 2 chunk 1 of rank 1.
  CHECK(as_v->stages[0].ops[1] == Op{OpKind::kForward, 0, 1, -1});
  CHECK(as_v->stages[1].ops[1] == Op{OpKind::kForward, 0, 1, -1});
  // p = 3: virtual stage 4 runs on rank 1 under both placements; the file is V all the same,
  // since 3 sits on rank 2 (loop would put it on rank 0).
  absl::StatusOr<Schedule> told_late = ParsePyTorchCsv("0F0,5F0\n1F0,4F0\n2F0,3F0\n", {});
  INFO(told_late.status().ToString());
  REQUIRE(told_late.ok());
  CHECK(told_late->spec.placement == Placement::kV);
  // A given placement is checked, not overridden.
  CHECK(Error(v, CsvImportOptions{0, Placement::kLoop}) ==
        "row 0, column 1, cell \"3F0\": virtual stage 3 runs on rank 1 under loop placement "
        "(stage % 2), not on rank 0");
  CHECK(Error(loop, CsvImportOptions{0, Placement::kV}) ==
        "row 0, column 1, cell \"2F0\": virtual stage 2 runs on rank 1 under v placement "
        "(stage for stage < 2, 3 - stage otherwise), not on rank 0");
  // Inferred V: every later cell must follow it.
  CHECK(Error("0F0,3F0,2F0\n1F0\n", {}) ==
        "row 0, column 2, cell \"2F0\": virtual stage 2 runs on rank 1 under v placement (stage "
        "for stage < 2, 3 - stage otherwise), not on rank 0");
  CHECK(Error("0F0,3F0\n1F0,4F0\n", CsvImportOptions{0, Placement::kV}) ==
        "row 1, column 1, cell \"4F0\": virtual stage 4 has no rank under v placement (4 "
        "virtual stages for 2 ranks)");
  CHECK(Error("0F0\n1F0\n", CsvImportOptions{0, Placement::kV}) ==
        "v placement needs virtual stages up to 2p - 1 = 3 (two per rank); the CSV's highest "
        "is 1");
}

TEST_CASE("OVERLAP_F_B is its parts in order; a full B in a split file is B then W",
          "[io][csv][vshape]") {
  absl::StatusOr<Schedule> parsed =
      ParsePyTorchCsv("0F0,0F1,0I0,( 0F2 ; 0B1 )OVERLAP_F_B,0W0,0B2\n", CsvImportOptions{});
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  CHECK(parsed->spec.split_backward);
  using testing::B;
  using testing::F;
  using testing::W;
  CHECK(parsed->stages[0].ops ==
        std::vector<Op>{F(0), F(1), B(0), F(2), B(1), W(1), W(0), B(2), W(2)});
}

TEST_CASE("compiled V schedules round trip through PyTorch CSV, offload stripped",
          "[io][csv][vshape][compiler]") {
  for (Family family : {Family::kZbv, Family::kDualPipeV}) {
    for (OffloadPolicy offload : {OffloadPolicy::kNone, OffloadPolicy::kHalf}) {
      PipelineSpec spec = MakeSpec(family, 3, 6, 2);
      spec.offload = offload;
      INFO(FamilyName(family) << " " << OffloadPolicyName(offload));
      absl::StatusOr<Schedule> compiled = Compile(spec, UnitCostModel(0.25));
      REQUIRE(compiled.ok());
      const std::string comms = ScheduleToPyTorchCsv(*compiled, CsvFlavor::kComputeComms);
      // Rank 0 holds virtual stages 0 and 5: its first cell is 0F0, and 5 appears, 3 never.
      CHECK(comms.rfind("0F0,", 0) == 0);
      const std::string row0 = comms.substr(0, comms.find('\n'));
      CHECK(row0.find("5F0") != std::string::npos);
      CHECK(row0.find("3F0") == std::string::npos);
      absl::StatusOr<Schedule> from_comms = ParsePyTorchCsv(comms, {});
      REQUIRE(from_comms.ok());
      CHECK(from_comms->spec.placement == Placement::kV);
      std::vector<StageProgram> kept = compiled->stages;
      for (StageProgram& program : kept) {
        std::erase_if(program.ops,
                      [](const Op& op) { return !IsCompute(op.kind) && !IsP2P(op.kind); });
      }
      CHECK(from_comms->stages == kept);
      absl::StatusOr<Schedule> from_compute =
          ParsePyTorchCsv(ScheduleToPyTorchCsv(*compiled, CsvFlavor::kComputeOnly), {});
      REQUIRE(from_compute.ok());
      CHECK(from_compute->stages == ComputeOnly(*compiled));
    }
  }
}

}  // namespace
}  // namespace pipeoffload
