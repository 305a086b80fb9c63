// PyTorch pipelining CSV: exact export strings, import of torch-written files (both flavours,
// CRLF, idle cells, FSDP no-ops), round trips over generated schedules, a located error for
// each kind of bad file, and (once the compiler lands) round trips of compiled schedules.
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/schedule_io.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

Op MakeOp(OpKind kind, int mb, int chunk, int peer = -1) { return Op{kind, mb, chunk, peer}; }

// The ops of `schedule` that survive export: compute ops, plus P2P ops when `keep_comm`.
std::vector<StageProgram> Exported(const Schedule& schedule, bool keep_comm) {
  std::vector<StageProgram> out = schedule.stages;
  for (StageProgram& program : out) {
    std::vector<Op> kept;
    for (const Op& op : program.ops) {
      if (IsCompute(op.kind) || (keep_comm && IsP2P(op.kind))) kept.push_back(op);
    }
    program.ops = kept;
  }
  return out;
}

// p = 2, m = 2, 1F1B with comms; stage 0 offloads (0, 0) and the stages meet at BARRIERs.
Schedule HandSchedule(bool split) {
  Schedule s;
  s.spec.num_stages = 2;
  s.spec.num_microbatches = 2;
  s.spec.split_backward = split;
  s.stages.resize(2);
  s.stages[0].stage = 0;
  s.stages[1].stage = 1;
  std::vector<Op>& a = s.stages[0].ops;
  std::vector<Op>& b = s.stages[1].ops;
  a = {MakeOp(OpKind::kForward, 0, 0),      MakeOp(OpKind::kSendActivation, 0, 0, 1),
       MakeOp(OpKind::kOffload, 0, 0),      MakeOp(OpKind::kForward, 1, 0),
       MakeOp(OpKind::kSendActivation, 1, 0, 1), MakeOp(OpKind::kRelease, 0, 0),
       MakeOp(OpKind::kBarrier, -1, -1, 1), MakeOp(OpKind::kReload, 0, 0),
       MakeOp(OpKind::kRecvGrad, 0, 0, 1),  MakeOp(OpKind::kBackward, 0, 0)};
  if (split) a.push_back(MakeOp(OpKind::kBackwardWeight, 0, 0));
  a.push_back(MakeOp(OpKind::kRecvGrad, 1, 0, 1));
  a.push_back(MakeOp(OpKind::kBackward, 1, 0));
  if (split) a.push_back(MakeOp(OpKind::kBackwardWeight, 1, 0));
  b = {MakeOp(OpKind::kRecvActivation, 0, 0, 0), MakeOp(OpKind::kForward, 0, 0),
       MakeOp(OpKind::kBackward, 0, 0),         MakeOp(OpKind::kSendGrad, 0, 0, 0),
       MakeOp(OpKind::kBarrier, -1, -1, 0),     MakeOp(OpKind::kRecvActivation, 1, 0, 0),
       MakeOp(OpKind::kForward, 1, 0)};
  if (split) b.insert(b.begin() + 4, MakeOp(OpKind::kBackwardWeight, 0, 0));
  b.push_back(MakeOp(OpKind::kBackward, 1, 0));
  b.push_back(MakeOp(OpKind::kSendGrad, 1, 0, 0));
  if (split) b.push_back(MakeOp(OpKind::kBackwardWeight, 1, 0));
  return s;
}

TEST_CASE("PyTorch CSV export writes torch's cells, stripping offload ops", "[io][csv]") {
  const Schedule full = HandSchedule(/*split=*/false);
  CHECK(ScheduleToPyTorchCsv(full, CsvFlavor::kComputeOnly) ==
        "0F0,0F1,0B0,0B1\n"
        "1F0,1B0,1F1,1B1\n");
  CHECK(ScheduleToPyTorchCsv(full, CsvFlavor::kComputeComms) ==
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
        "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
  // With W split off, our B is torch's I (input gradient only).
  const Schedule split = HandSchedule(/*split=*/true);
  CHECK(ScheduleToPyTorchCsv(split, CsvFlavor::kComputeOnly) ==
        "0F0,0F1,0I0,0W0,0I1,0W1\n"
        "1F0,1I0,1W0,1F1,1I1,1W1\n");
  CHECK(ScheduleToPyTorchCsv(split, CsvFlavor::kComputeComms) ==
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0W0,0RECV_B1,0I1,0W1\n"
        "1RECV_F0,1F0,1I0,1SEND_B0,1W0,1RECV_F1,1F1,1I1,1SEND_B1,1W1\n");
}

TEST_CASE("PyTorch CSV export strips recompute ops, which torch has no action for",
          "[io][csv]") {
  for (const bool split : {false, true}) {
    const Schedule plain = HandSchedule(split);
    Schedule recomputed = plain;
    std::vector<Op>& b = recomputed.stages[1].ops;
    b.insert(b.begin() + 2, MakeOp(OpKind::kRecompute, 0, 0));  // before B0.0
    b.insert(b.end() - (split ? 3 : 2), MakeOp(OpKind::kRecomputeLean, 1, 0));  // before B1.0
    REQUIRE(recomputed.stages != plain.stages);
    for (const CsvFlavor flavor : {CsvFlavor::kComputeOnly, CsvFlavor::kComputeComms}) {
      CAPTURE(split, static_cast<int>(flavor));
      CHECK(ScheduleToPyTorchCsv(recomputed, flavor) == ScheduleToPyTorchCsv(plain, flavor));
    }
  }
}

TEST_CASE("PyTorch CSV names virtual stages chunk * p + rank, comm ops by their own stage",
          "[io][csv]") {
  // p = 3, v = 2: stage 1 chunk 0 sends to stage 2 chunk 0, which sends on to stage 0 chunk 1
  // (virtual stage 3).
  Schedule s;
  s.spec.num_stages = 3;
  s.spec.chunks_per_stage = 2;
  s.stages.resize(3);
  for (int d = 0; d < 3; ++d) s.stages[d].stage = d;
  s.stages[0].ops = {MakeOp(OpKind::kRecvActivation, 0, 1, 2), MakeOp(OpKind::kForward, 0, 1)};
  s.stages[1].ops = {MakeOp(OpKind::kForward, 0, 0), MakeOp(OpKind::kSendActivation, 0, 0, 2),
                     MakeOp(OpKind::kRecvGrad, 0, 1, 2)};
  s.stages[2].ops = {MakeOp(OpKind::kRecvActivation, 0, 0, 1), MakeOp(OpKind::kForward, 0, 0),
                     MakeOp(OpKind::kSendActivation, 0, 0, 0), MakeOp(OpKind::kForward, 0, 1),
                     MakeOp(OpKind::kBackward, 0, 1), MakeOp(OpKind::kSendGrad, 0, 1, 1)};
  const std::string csv = ScheduleToPyTorchCsv(s, CsvFlavor::kComputeComms);
  CHECK(csv ==
        "3RECV_F0,3F0\n1F0,1SEND_F0,4RECV_B0\n2RECV_F0,2F0,2SEND_F0,5F0,5B0,5SEND_B0\n");
  absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(csv, 3, Family::kInterleaved);
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  CHECK(parsed->stages == s.stages);  // peers come back from the loop placement
  CHECK(parsed->spec.chunks_per_stage == 2);
  CHECK(parsed->spec.num_microbatches == 1);
  CHECK(parsed->spec.family == Family::kInterleaved);
}

TEST_CASE("PyTorch CSV imports torch's lowered 1F1B example with CRLF and FSDP no-ops",
          "[io][csv]") {
  // ecosystem.md section 1.4: the runtime's lowering of 2-rank 1F1B, m = 4, as torch writes it.
  const std::string csv =
      "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0F2,0SEND_F2,0RECV_B1,0B1,0F3,0SEND_F3,"
      "0RECV_B2,0B2,0RECV_B3,0B3,0REDUCE_GRAD,0RESHARD\r\n"
      "1UNSHARD,1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1RECV_F2,1B1,1SEND_B1,1F2,1RECV_F3,1B2,"
      "1SEND_B2,1F3,1B3,1SEND_B3,1REDUCE_GRAD,1RESHARD\r\n";
  absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(csv, 2, Family::k1F1B);
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  CHECK(parsed->spec.num_stages == 2);
  CHECK(parsed->spec.num_microbatches == 4);
  CHECK(parsed->spec.chunks_per_stage == 1);
  CHECK_FALSE(parsed->spec.split_backward);
  CHECK_FALSE(parsed->predictions.has_value());
  using K = OpKind;
  const std::vector<Op> rank0 = {
      MakeOp(K::kForward, 0, 0),  MakeOp(K::kSendActivation, 0, 0, 1),
      MakeOp(K::kForward, 1, 0),  MakeOp(K::kSendActivation, 1, 0, 1),
      MakeOp(K::kRecvGrad, 0, 0, 1), MakeOp(K::kBackward, 0, 0),
      MakeOp(K::kForward, 2, 0),  MakeOp(K::kSendActivation, 2, 0, 1),
      MakeOp(K::kRecvGrad, 1, 0, 1), MakeOp(K::kBackward, 1, 0),
      MakeOp(K::kForward, 3, 0),  MakeOp(K::kSendActivation, 3, 0, 1),
      MakeOp(K::kRecvGrad, 2, 0, 1), MakeOp(K::kBackward, 2, 0),
      MakeOp(K::kRecvGrad, 3, 0, 1), MakeOp(K::kBackward, 3, 0)};
  const std::vector<Op> rank1 = {
      MakeOp(K::kRecvActivation, 0, 0, 0), MakeOp(K::kForward, 0, 0),
      MakeOp(K::kRecvActivation, 1, 0, 0), MakeOp(K::kBackward, 0, 0),
      MakeOp(K::kSendGrad, 0, 0, 0),       MakeOp(K::kForward, 1, 0),
      MakeOp(K::kRecvActivation, 2, 0, 0), MakeOp(K::kBackward, 1, 0),
      MakeOp(K::kSendGrad, 1, 0, 0),       MakeOp(K::kForward, 2, 0),
      MakeOp(K::kRecvActivation, 3, 0, 0), MakeOp(K::kBackward, 2, 0),
      MakeOp(K::kSendGrad, 2, 0, 0),       MakeOp(K::kForward, 3, 0),
      MakeOp(K::kBackward, 3, 0),          MakeOp(K::kSendGrad, 3, 0, 0)};
  REQUIRE(parsed->stages.size() == 2);
  CHECK(parsed->stages[0].stage == 0);
  CHECK(parsed->stages[1].stage == 1);
  CHECK(parsed->stages[0].ops == rank0);
  CHECK(parsed->stages[1].ops == rank1);
}

TEST_CASE("PyTorch CSV imports compute_only files with idle cells and whitespace",
          "[io][csv]") {
  // ecosystem.md section 1.4's compute_only example (rank 1 starts idle), with spaces, a tab,
  // an idle cell in the middle and no final line end.
  const std::string csv =
      "0F0,0F1, 0B0 ,0F2,0B1,0F3,0B2,0B3\n"
      ",1F0,1B0,\t1F1,,1B1,1F2,1B2,1F3,1B3";
  absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(csv, 2, Family::k1F1B);
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  CHECK(parsed->spec.num_microbatches == 4);
  using K = OpKind;
  CHECK(parsed->stages[0].ops ==
        std::vector<Op>{MakeOp(K::kForward, 0, 0), MakeOp(K::kForward, 1, 0),
                        MakeOp(K::kBackward, 0, 0), MakeOp(K::kForward, 2, 0),
                        MakeOp(K::kBackward, 1, 0), MakeOp(K::kForward, 3, 0),
                        MakeOp(K::kBackward, 2, 0), MakeOp(K::kBackward, 3, 0)});
  CHECK(parsed->stages[1].ops ==
        std::vector<Op>{MakeOp(K::kForward, 0, 0), MakeOp(K::kBackward, 0, 0),
                        MakeOp(K::kForward, 1, 0), MakeOp(K::kBackward, 1, 0),
                        MakeOp(K::kForward, 2, 0), MakeOp(K::kBackward, 2, 0),
                        MakeOp(K::kForward, 3, 0), MakeOp(K::kBackward, 3, 0)});
  // Trailing blank lines beyond the ranks are tolerated (editors add them).
  CHECK(ParsePyTorchCsv(csv + "\n\n \n", 2, Family::k1F1B).ok());
}

TEST_CASE("PyTorch CSV infers split backward from I and W", "[io][csv]") {
  absl::StatusOr<Schedule> parsed = ParsePyTorchCsv("0F0,0I0,0F1,0W0,0I1,0W1\n", 1,
                                                    Family::k1F1B);
  REQUIRE(parsed.ok());
  CHECK(parsed->spec.split_backward);
  CHECK(parsed->stages[0].ops ==
        std::vector<Op>{MakeOp(OpKind::kForward, 0, 0), MakeOp(OpKind::kBackward, 0, 0),
                        MakeOp(OpKind::kForward, 1, 0), MakeOp(OpKind::kBackwardWeight, 0, 0),
                        MakeOp(OpKind::kBackward, 1, 0), MakeOp(OpKind::kBackwardWeight, 1, 0)});
}

// A lowered schedule with offload ops and BARRIERs for any p, m, v: per stage all forwards
// (chunk-major), then all backwards in reverse, each with its RECV before and SEND after when
// the neighbouring virtual stage is on another rank. Not a runnable order (the formats do not
// care), but every op kind, peer and chunk mapping the CSV must carry appears.
Schedule GeneratedSchedule(int p, int m, int v, bool split) {
  Schedule s;
  s.spec.num_stages = p;
  s.spec.num_microbatches = m;
  s.spec.chunks_per_stage = v;
  s.spec.split_backward = split;
  const int num_virtual = p * v;
  for (int d = 0; d < p; ++d) {
    StageProgram program;
    program.stage = d;
    std::vector<Op>& ops = program.ops;
    auto remote = [&](int l) { return l >= 0 && l < num_virtual && l % p != d; };
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) {
        const int l = c * p + d;
        if (remote(l - 1)) ops.push_back(MakeOp(OpKind::kRecvActivation, mb, c, (l - 1) % p));
        ops.push_back(MakeOp(OpKind::kForward, mb, c));
        if (remote(l + 1)) ops.push_back(MakeOp(OpKind::kSendActivation, mb, c, (l + 1) % p));
        if ((mb + c) % 2 == 0) ops.push_back(MakeOp(OpKind::kOffload, mb, c));
      }
    }
    if (p > 1) ops.push_back(MakeOp(OpKind::kBarrier, -1, -1, (d + 1) % p));
    for (int c = v - 1; c >= 0; --c) {
      for (int mb = 0; mb < m; ++mb) {
        const int l = c * p + d;
        if ((mb + c) % 2 == 0) {
          ops.push_back(MakeOp(OpKind::kRelease, mb, c));
          if (p > 1) ops.push_back(MakeOp(OpKind::kBarrier, mb, c, (d + p - 1) % p));
          ops.push_back(MakeOp(OpKind::kReload, mb, c));
        }
        if (remote(l + 1)) ops.push_back(MakeOp(OpKind::kRecvGrad, mb, c, (l + 1) % p));
        ops.push_back(MakeOp(OpKind::kBackward, mb, c));
        if (remote(l - 1)) ops.push_back(MakeOp(OpKind::kSendGrad, mb, c, (l - 1) % p));
        if (split) ops.push_back(MakeOp(OpKind::kBackwardWeight, mb, c));
      }
    }
    s.stages.push_back(program);
  }
  return s;
}

TEST_CASE("PyTorch CSV round trip over generated schedules equals the ops minus offload",
          "[io][csv]") {
  int checked = 0;
  for (int p = 1; p <= 5; ++p) {
    for (int m : {1, 2, 3, 2 * p}) {
      for (int v = 1; v <= 3; ++v) {
        for (bool split : {false, true}) {
          const Schedule s = GeneratedSchedule(p, m, v, split);
          CAPTURE(p, m, v, split);
          for (CsvFlavor flavor : {CsvFlavor::kComputeComms, CsvFlavor::kComputeOnly}) {
            const bool comms = flavor == CsvFlavor::kComputeComms;
            const std::string csv = ScheduleToPyTorchCsv(s, flavor);
            CAPTURE(comms, csv);
            absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(csv, p, Family::kGroupInterleaved);
            INFO(parsed.status().ToString());
            REQUIRE(parsed.ok());
            REQUIRE(parsed->stages == Exported(s, comms));
            CHECK(parsed->spec.num_stages == p);
            CHECK(parsed->spec.num_microbatches == m);
            CHECK(parsed->spec.chunks_per_stage == v);
            CHECK(parsed->spec.split_backward == split);
            CHECK(parsed->spec.family == Family::kGroupInterleaved);
            CHECK(parsed->spec.group_size == 0);
            // Export of the import is the same file: nothing is lost or reordered.
            CHECK(ScheduleToPyTorchCsv(*parsed, flavor) == csv);
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked == 5 * 4 * 3 * 2 * 2);
}

// Parses `csv` for `p` ranks expecting InvalidArgument containing `message`.
void ExpectError(const std::string& csv, int p, const std::string& message) {
  absl::StatusOr<Schedule> parsed = ParsePyTorchCsv(csv, p, Family::k1F1B);
  INFO("csv: " << csv);
  INFO("status: " << parsed.status().ToString());
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(parsed.status().message()).find(message) != std::string::npos);
}

TEST_CASE("PyTorch CSV errors name row, column and cell", "[io][csv]") {
  SECTION("unknown action types") {
    ExpectError("0F0,0X1\n", 1,
                "row 0, column 1, cell \"0X1\": unknown action type \"X\"; expected one of F, I, "
                "B, W, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD");
    ExpectError("0F0,0BW0\n", 1, "\"BW\" is the pre-2.6 dialect's full backward");
    ExpectError("0f0\n", 1, "unknown action type \"f\"");
    ExpectError("0OFFLOAD0\n", 1, "unknown action type \"OFFLOAD\"");
  }
  SECTION("malformed OVERLAP_F_B") {
    ExpectError("(0F0;0B0)\n", 1,
                "row 0, column 0, cell \"(0F0;0B0)\": a cell that starts with \"(\" must be "
                "\"(<action>;<action>...)OVERLAP_F_B\"");
    ExpectError("(0F0;0SEND_F0)OVERLAP_F_B\n", 1,
                "OVERLAP_F_B part \"0SEND_F0\" is not a compute action (F, I, B or W)");
    ExpectError("(0F0;0X0)OVERLAP_F_B\n", 1,
                "row 0, column 0, cell \"(0F0;0X0)OVERLAP_F_B\": OVERLAP_F_B part \"0X0\": "
                "unknown action type \"X\"");
    ExpectError("()OVERLAP_F_B\n", 1, "OVERLAP_F_B without sub-actions");
  }
  SECTION("malformed cells") {
    ExpectError("F0\n", 1, "cell \"F0\": expected <virtual stage><TYPE>[<microbatch>]");
    ExpectError("0F\n", 1, "cell \"0F\": a F action needs a microbatch number");
    ExpectError("0F1x\n", 1, "cell \"0F1x\": unexpected \"x\" after the action");
    ExpectError("0F0,\"0B0\"\n", 1, "column 1, cell \"\"0B0\"\"");
    ExpectError("0\n", 1, "missing the action type after the stage number");
    ExpectError("0F99999999999\n", 1, "microbatch is out of range");
    ExpectError("99999999999F0\n", 1, "virtual stage is out of range");
  }
  SECTION("virtual stage on the wrong rank") {
    ExpectError("0F0,1F0\n", 2,
                "row 0, column 1, cell \"1F0\": virtual stage 1 runs on rank 1 under loop "
                "placement (stage % 2), not on rank 0");
    ExpectError("0F0\n1F0,0F1\n", 2,
                "row 1, column 1, cell \"0F1\": virtual stage 0 runs on rank 0");
    // Virtual stage 2 on rank 1 is V placement's (2p - 1 - 2), not an error.
    CHECK(ParsePyTorchCsv("0F0,3F0\n1F0,2F0\n", 2, Family::kZbv).ok());
    CHECK(ParsePyTorchCsv("0F0,2F0\n1F0,3F0\n", 2, Family::kInterleaved).ok());
  }
  SECTION("row count") {
    ExpectError("0F0\n1F0\n0F1\n", 2,
                "row 2, column 0, cell \"0F1\": the CSV has more rows (3) than the pipeline has "
                "ranks (num_stages = 2)");
    ExpectError("0F0\n", 2, "the CSV has 1 rows but the pipeline has num_stages = 2 ranks");
    ExpectError("", 1, "the CSV has 0 rows");
    ExpectError("0F0\n", 0, "num_stages must be >= 1");
  }
  SECTION("comm actions without a neighbour") {
    ExpectError("0RECV_F0,0F0\n1F0\n", 2,
                "cell \"0RECV_F0\": virtual stage 0 has no neighbour -1 to talk to");
    ExpectError("0F0\n1F0,1SEND_F0\n", 2,
                "cell \"1SEND_F0\": virtual stage 1 has no neighbour 2 to talk to (there are 2 "
                "virtual stages)");
    ExpectError("0F0,0SEND_F0,1F0\n", 1,
                "cell \"0SEND_F0\": virtual stages 0 and 1 are both on rank 0");
    ExpectError("0F0\n1F0,1SEND_B7\n", 2, "microbatch 7 has no compute action anywhere");
  }
  SECTION("nothing to run") {
    ExpectError("0UNSHARD,0RESHARD\n", 1, "the CSV holds no F, I, B or W action");
    ExpectError(",,\n", 1, "the CSV holds no F, I, B or W action");
  }
}

TEST_CASE("PyTorch CSV skips torch's UNSHARD, RESHARD and REDUCE_GRAD", "[io][csv]") {
  absl::StatusOr<Schedule> parsed =
      ParsePyTorchCsv("0UNSHARD,0F0,0B0,0REDUCE_GRAD,0RESHARD\n", 1, Family::k1F1B);
  REQUIRE(parsed.ok());
  CHECK(parsed->stages[0].ops ==
        std::vector<Op>{MakeOp(OpKind::kForward, 0, 0), MakeOp(OpKind::kBackward, 0, 0)});
}

// Needs the compiler (schedules/); the lead makes this pass when Compile lands.
TEST_CASE("compiled schedules round trip through PyTorch CSV and JSON", "[io][compiler]") {
  struct Case {
    Family family;
    int p, m, v;
    bool split;
    OffloadPolicy offload;
  };
  const Case cases[] = {
      {Family::k1F1B, 4, 8, 1, false, OffloadPolicy::kNone},
      {Family::k1F1B, 4, 8, 1, true, OffloadPolicy::kNone},
      {Family::kInterleaved, 4, 8, 2, false, OffloadPolicy::kNone},
      {Family::kGroupInterleaved, 4, 8, 2, false, OffloadPolicy::kHalf},
      {Family::kGroupInterleaved, 4, 12, 3, true, OffloadPolicy::kFull},
  };
  for (const Case& c : cases) {
    PipelineSpec spec;
    spec.family = c.family;
    spec.num_stages = c.p;
    spec.num_microbatches = c.m;
    spec.chunks_per_stage = c.v;
    spec.split_backward = c.split;
    spec.offload = c.offload;
    CAPTURE(std::string(FamilyName(c.family)), c.p, c.m, c.v, c.split,
            std::string(OffloadPolicyName(c.offload)));
    absl::StatusOr<Schedule> compiled = Compile(spec, UnitCostModel(0.25));
    INFO(compiled.status().ToString());
    REQUIRE(compiled.ok());

    absl::StatusOr<Schedule> from_json = ParseScheduleJson(ScheduleToJson(*compiled));
    REQUIRE(from_json.ok());
    CHECK(*from_json == *compiled);

    for (CsvFlavor flavor : {CsvFlavor::kComputeComms, CsvFlavor::kComputeOnly}) {
      const bool comms = flavor == CsvFlavor::kComputeComms;
      absl::StatusOr<Schedule> from_csv =
          ParsePyTorchCsv(ScheduleToPyTorchCsv(*compiled, flavor), c.p, c.family);
      INFO(from_csv.status().ToString());
      REQUIRE(from_csv.ok());
      CHECK(from_csv->stages == Exported(*compiled, comms));
      CHECK(from_csv->spec.num_microbatches == c.m);
      CHECK(from_csv->spec.chunks_per_stage == c.v);
      CHECK(from_csv->spec.split_backward == c.split);
    }
  }
}

}  // namespace
}  // namespace pipeoffload
