// Validate: one hand-built valid schedule per shape (1F1B with comm, offloaded with BARRIERs,
// split backward, one stage with two chunks), each broken in exactly one way per invariant;
// generated schedules over many configs (all valid, and every single-op deletion invalid); speed.
#include "pipeoffload/validate.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pipeoffload/schedule.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using namespace ::pipeoffload::testing;  // F(...), SendF(...), Make(...)

// p=2, m=2 1F1B with comm ops in a rendezvous-safe order: stage 1 receives F1 before it sends
// B0, so stage 0's SEND_F1 never faces stage 1's SEND_B0.
Schedule OneFOneB() {
  return Make(2, 2, 1, false,
              {{F(0), SendF(0, 1), F(1), SendF(1, 1), RecvB(0, 1), B(0), RecvB(1, 1), B(1)},
               {RecvF(0, 0), F(0), B(0), RecvF(1, 0), SendB(0, 0), F(1), B(1), SendB(1, 0)}});
}

// The same with split backward (W after each B).
Schedule OneFOneBSplit() {
  return Make(
      2, 2, 1, true,
      {{F(0), SendF(0, 1), F(1), SendF(1, 1), RecvB(0, 1), B(0), W(0), RecvB(1, 1), B(1), W(1)},
       {RecvF(0, 0), F(0), B(0), RecvF(1, 0), SendB(0, 0), W(0), F(1), B(1), SendB(1, 0), W(1)}});
}

// Stage 0 offloads mb 0; a BARRIER pair staggers the pair's transfers.
Schedule Offloaded() {
  return Make(
      2, 2, 1, false,
      {{F(0), Offload(0), SendF(0, 1), F(1), Barrier(1), Release(0), SendF(1, 1), Reload(0),
        RecvB(0, 1), B(0), RecvB(1, 1), B(1)},
       {RecvF(0, 0), F(0), Barrier(0), B(0), RecvF(1, 0), SendB(0, 0), F(1), B(1), SendB(1, 0)}});
}

// One stage, two chunks: the local ops are the dependencies (no comm).
Schedule OneStageTwoChunks() {
  return Make(1, 2, 2, false,
              {{F(0, 0), F(0, 1), F(1, 0), Offload(1, 0), Release(1, 0), F(1, 1), B(0, 1), B(0, 0),
                B(1, 1), Reload(1, 0), B(1, 0)}});
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// Validate fails with FailedPrecondition, and the message names each of `needles`.
void RequireFails(const Schedule& schedule, const std::vector<std::string>& needles) {
  const absl::Status status = Validate(schedule);
  INFO(Message(status));
  REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
  for (const std::string& needle : needles) {
    CAPTURE(needle);
    CHECK(Message(status).find(needle) != std::string::npos);
  }
}

std::vector<Op>& Ops(Schedule& schedule, int stage) {
  return schedule.stages[static_cast<std::size_t>(stage)].ops;
}
void Erase(Schedule& schedule, int stage, int index) {
  Ops(schedule, stage).erase(Ops(schedule, stage).begin() + index);
}
void Move(Schedule& schedule, int stage, int from, int to) {
  std::vector<Op>& ops = Ops(schedule, stage);
  const Op op = ops[static_cast<std::size_t>(from)];
  ops.erase(ops.begin() + from);
  ops.insert(ops.begin() + to, op);
}

TEST_CASE("hand-built valid schedules pass", "[validate]") {
  CHECK(Validate(OneFOneB()).ok());
  CHECK(Validate(OneFOneBSplit()).ok());
  CHECK(Validate(Offloaded()).ok());
  CHECK(Validate(OneStageTwoChunks()).ok());
}

TEST_CASE("invariant 1: shape", "[validate]") {
  SECTION("op out of range: mb") {
    Schedule s = OneFOneB();
    Ops(s, 0)[2] = F(2);
    RequireFails(s, {"invariant 1 (shape)", "stage 0, op 2 (F2.0)", "mb 2 is not in [0, 2)"});
  }
  SECTION("op out of range: chunk") {
    Schedule s = OneFOneB();
    Ops(s, 1)[1] = F(0, 1);
    RequireFails(s, {"shape", "stage 1, op 1", "chunk 1 is not in [0, 1)"});
  }
  SECTION("op out of range: peer") {
    Schedule s = OneFOneB();
    Ops(s, 0)[1].peer = 2;
    RequireFails(s, {"shape", "stage 0, op 1", "peer 2 is not in [0, 2)"});
  }
  SECTION("a compute op with a peer") {
    Schedule s = OneFOneB();
    Ops(s, 0)[0].peer = 1;
    RequireFails(s, {"shape", "F takes no peer"});
  }
  SECTION("wrong stage numbering") {
    Schedule s = OneFOneB();
    s.stages[1].stage = 0;
    RequireFails(s, {"shape", "wrong stage numbering", "program 1 says stage 0"});
  }
  SECTION("program count differs from the spec") {
    Schedule s = OneFOneB();
    s.spec.num_stages = 3;
    RequireFails(s, {"shape", "num_stages=3", "2 stage programs"});
  }
  SECTION("empty spec") {
    Schedule s;
    s.spec.num_microbatches = 0;
    RequireFails(s, {"shape", "m=0"});
  }
  SECTION("a spec far larger than the programs is refused before indexing") {
    Schedule s = OneFOneB();
    s.spec.num_microbatches = 1 << 30;
    RequireFails(s, {"completeness", "only 16 ops"});
  }
}

TEST_CASE("invariant 2: completeness", "[validate]") {
  SECTION("duplicate F") {
    Schedule s = OneFOneB();
    Ops(s, 0).insert(Ops(s, 0).begin() + 2, F(0));
    RequireFails(s, {"invariant 2 (completeness)", "stage 0, op 2 (F0.0)", "duplicate F0.0",
                     "already ran at op 0",
                     // both occurrences marked on the grid, rows aligned on the duplicate
                     "step | stage 0", "0    | F0.0 *", "2    | F0.0 *"});
  }
  SECTION("missing B") {
    Schedule s = OneFOneB();
    Erase(s, 0, 7);  // B1
    RequireFails(s, {"completeness", "missing B", "B1.0"});
  }
  SECTION("missing W with split backward") {
    Schedule s = OneFOneBSplit();
    Erase(s, 1, 9);  // W1
    RequireFails(s, {"completeness", "missing W", "W1.0"});
  }
  SECTION("W in an unsplit schedule") {
    Schedule s = OneFOneB();
    Ops(s, 0).push_back(W(1));
    RequireFails(s, {"completeness", "split_backward is false"});
  }
  SECTION("neither F nor B of an entry") {
    Schedule s = OneStageTwoChunks();
    s.spec.num_microbatches = 3;
    RequireFails(s, {"completeness", "never runs F2.0 nor B2.0"});
  }
}

TEST_CASE("invariant 3: local order", "[validate]") {
  SECTION("B before F") {
    Schedule s = OneStageTwoChunks();
    Move(s, 0, 10, 0);  // B1.0 to the front
    RequireFails(s, {"invariant 3 (local order)", "stage 0, op 0 (B1.0)", "B before F"});
  }
  SECTION("W before B") {
    Schedule s = OneFOneBSplit();
    Move(s, 0, 6, 5);  // W0 before B0 on stage 0
    RequireFails(s, {"local order", "stage 0, op 5 (W0.0)", "W before B"});
  }
}

TEST_CASE("invariant 4: dataflow", "[validate]") {
  SECTION("F without its RECV_F") {
    Schedule s = OneFOneB();
    Erase(s, 1, 3);  // RECV_F1 on stage 1
    Erase(s, 0, 3);  // and its SEND_F1 on stage 0, so that matching holds
    RequireFails(s, {"invariant 4 (dataflow)", "F without its RECV_F", "RECV_F1.0<-0",
                     "not in this stage's program"});
  }
  SECTION("F before its RECV_F") {
    Schedule s = OneFOneB();
    Move(s, 1, 0, 1);  // F0 RECV_F0 on stage 1
    RequireFails(s, {"dataflow", "stage 1, op 0 (F0.0)", "F before its RECV_F", "later, at op 1"});
  }
  SECTION("B before its RECV_B") {
    Schedule s = OneFOneB();
    Move(s, 0, 5, 4);  // B0 before RECV_B0 on stage 0
    RequireFails(s, {"dataflow", "B before its RECV_B", "stage 0, op 4 (B0.0)", "RECV_B0.0<-1"});
  }
  SECTION("SEND before the op that produces it") {
    Schedule s = OneFOneB();
    Move(s, 1, 4, 2);  // SEND_B0 before B0 on stage 1
    RequireFails(s, {"dataflow", "SEND_B before its producer B", "stage 1, op 2 (SEND_B0.0->0)"});
  }
  SECTION("one stage: F of chunk 1 before F of chunk 0") {
    Schedule s = OneStageTwoChunks();
    Move(s, 0, 5, 2);  // F1.1 before F1.0
    RequireFails(s, {"dataflow", "F before its local F of virtual stage 0"});
  }
}

TEST_CASE("invariant 5: matching", "[validate]") {
  SECTION("SEND without RECV") {
    Schedule s = OneFOneB();
    Erase(s, 1, 3);  // RECV_F1 on stage 1
    RequireFails(s, {"invariant 5 (matching)", "stage 0, op 3 (SEND_F1.0->1)", "SEND without RECV",
                     "RECV_F1.0<-0 on stage 1"});
  }
  SECTION("RECV without SEND") {
    Schedule s = OneFOneB();
    Erase(s, 1, 7);  // SEND_B1 on stage 1
    RequireFails(s, {"matching", "stage 0, op 6 (RECV_B1.0<-1)", "RECV without SEND"});
  }
  SECTION("mismatched peer") {
    Schedule s = OneFOneB();
    Ops(s, 1)[0].peer = 1;
    RequireFails(s, {"matching", "mismatched peer", "lives on stage 0"});
  }
  SECTION("duplicate SEND") {
    Schedule s = OneFOneB();
    Ops(s, 0).insert(Ops(s, 0).begin() + 2, SendF(0, 1));
    RequireFails(s, {"matching", "duplicate SEND_F0.0->1"});
  }
  SECTION("SEND_F from the last virtual stage") {
    Schedule s = OneFOneB();
    Ops(s, 1).push_back(SendF(1, 0));
    RequireFails(s, {"matching", "no next virtual stage"});
  }
  SECTION("comm within one stage") {
    Schedule s = OneStageTwoChunks();
    Ops(s, 0).insert(Ops(s, 0).begin() + 1, SendF(0, 0));
    RequireFails(s, {"matching", "p == 1"});
  }
  SECTION("BARRIER without partner") {
    Schedule s = Offloaded();
    Erase(s, 1, 2);
    RequireFails(s, {"matching", "stage 0, op 4 (BARRIER~1)", "BARRIER without partner",
                     "has only 0 BARRIERs"});
  }
}

TEST_CASE("invariant 6: deadlock", "[validate]") {
  SECTION("two stages both SEND first to each other") {
    Schedule s = OneFOneB();
    Move(s, 1, 3, 4);  // stage 1: ... B0 SEND_B0 RECV_F1 ...: both stages now send at op 3
    const absl::Status status = Validate(s);
    RequireFails(s, {"invariant 6 (deadlock)", "stage 0 blocks at op 3 SEND_F1.0->1",
                     "stage 1 blocks at op 3 SEND_B0.0->0", "blocked op"});
    // The grid marks both blocked ops on the step they share.
    CHECK(Message(status).find("SEND_F1.0->1 *") != std::string::npos);
    CHECK(Message(status).find("SEND_B0.0->0 *") != std::string::npos);
  }
  SECTION("crossed BARRIER order") {
    Schedule s = Offloaded();
    Move(s, 1, 2, 5);  // stage 1 reaches its BARRIER only after SEND_B0, which waits on stage 0
    RequireFails(
        s, {"deadlock", "stage 0 blocks at op 4 BARRIER~1", "stage 1 blocks at op 3 RECV_F1.0<-0",
            // blocked at different steps: each column centred on its own stage
            "offset | stage 0 @4", "| stage 1 @3", "+0     | BARRIER~1 *"});
  }
}

TEST_CASE("invariant 7: offload life cycle", "[validate]") {
  SECTION("RELEASE before OFFLOAD") {
    Schedule s = Offloaded();
    Move(s, 0, 5, 1);  // RELEASE0 right after F0, before OFFLOAD0
    RequireFails(s, {"invariant 7 (offload life cycle)", "stage 0, op 1 (RELEASE0.0)",
                     "RELEASE before OFFLOAD"});
  }
  SECTION("RELOAD twice") {
    Schedule s = Offloaded();
    Ops(s, 0).insert(Ops(s, 0).begin() + 8, Reload(0));
    RequireFails(s, {"offload life cycle", "duplicate RELOAD0.0", "nothing is reloaded twice"});
  }
  SECTION("OFFLOAD without RELOAD: left on the host") {
    Schedule s = Offloaded();
    Erase(s, 0, 7);
    RequireFails(s, {"offload life cycle", "stage 0, op 1 (OFFLOAD0.0)", "OFFLOAD without RELOAD",
                     "left on the host"});
  }
  SECTION("OFFLOAD without RELEASE") {
    Schedule s = Offloaded();
    Erase(s, 0, 5);
    RequireFails(s, {"offload life cycle", "OFFLOAD without RELEASE"});
  }
  SECTION("B before RELOAD") {
    Schedule s = Offloaded();
    Move(s, 0, 7, 9);  // RELOAD0 after B0
    RequireFails(s, {"offload life cycle", "stage 0, op 8 (B0.0)", "B before RELOAD"});
  }
  SECTION("RELOAD before RELEASE") {
    Schedule s = Offloaded();
    Move(s, 0, 7, 5);
    RequireFails(s, {"offload life cycle", "RELOAD before RELEASE"});
  }
  SECTION("OFFLOAD before F") {
    Schedule s = OneStageTwoChunks();
    Move(s, 0, 3, 0);
    RequireFails(s, {"offload life cycle", "OFFLOAD before F"});
  }
  SECTION("RELOAD of an entry never offloaded") {
    Schedule s = OneFOneB();
    Ops(s, 1).insert(Ops(s, 1).begin() + 2, Reload(0));
    RequireFails(s, {"offload life cycle", "RELOAD without OFFLOAD"});
  }
}

// OneFOneB with stage 0 recomputing mb 0 in full and stage 1 mb 1 from the lean layout, each
// right before its B.
Schedule Recomputed() {
  return Make(2, 2, 1, false,
              {{F(0), SendF(0, 1), F(1), SendF(1, 1), RecvB(0, 1), RecomputeFull(0), B(0),
                RecvB(1, 1), B(1)},
               {RecvF(0, 0), F(0), B(0), RecvF(1, 0), SendB(0, 0), F(1), RecomputeLean(1), B(1),
                SendB(1, 0)}});
}

TEST_CASE("invariant 8: recompute life cycle", "[validate]") {
  REQUIRE(Validate(Recomputed()).ok());
  SECTION("anywhere between F and B is legal") {
    Schedule s = Recomputed();
    Move(s, 0, 5, 1);  // RECOMPUTE0 right after F0
    CHECK(Validate(s).ok());
  }
  SECTION("RECOMPUTE before F") {
    Schedule s = Recomputed();
    Move(s, 0, 5, 0);
    RequireFails(s, {"invariant 8 (recompute life cycle)", "stage 0, op 0 (RECOMPUTE0.0)",
                     "RECOMPUTE before F: its F runs later, at op 1"});
  }
  SECTION("RECOMPUTE_LEAN after B") {
    Schedule s = Recomputed();
    Move(s, 1, 6, 7);
    RequireFails(s, {"recompute life cycle", "stage 1, op 7 (RECOMPUTE_LEAN1.0)",
                     "RECOMPUTE_LEAN after B: its B ran at op 6"});
  }
  SECTION("both kinds for one entry") {
    Schedule s = Recomputed();
    Ops(s, 0).insert(Ops(s, 0).begin() + 5, RecomputeLean(0));
    RequireFails(s, {"recompute life cycle", "stage 0, op 5 (RECOMPUTE_LEAN0.0)",
                     "two recompute choices for one entry: RECOMPUTE0.0 is at op 6"});
  }
  SECTION("the same kind twice") {
    Schedule s = Recomputed();
    Ops(s, 0).insert(Ops(s, 0).begin() + 5, RecomputeFull(0));
    RequireFails(s, {"completeness", "duplicate RECOMPUTE0.0"});
  }
  SECTION("a recomputed entry whose retained block is offloaded and back before it") {
    Schedule s = Recomputed();
    std::vector<Op>& ops = Ops(s, 0);
    ops.insert(ops.begin() + 1, {Offload(0), Release(0)});
    ops.insert(ops.begin() + 7, Reload(0));  // before RECOMPUTE0 and B0
    CHECK(Validate(s).ok());
  }
  SECTION("a recompute before the RELOAD of its retained block") {
    Schedule s = Recomputed();
    std::vector<Op>& ops = Ops(s, 0);
    ops.insert(ops.begin() + 1, {Offload(0), Release(0)});
    ops.insert(ops.begin() + 8, Reload(0));  // after RECOMPUTE0 (op 7), before B0
    RequireFails(s, {"recompute life cycle", "stage 0, op 7 (RECOMPUTE0.0)",
                     "RECOMPUTE before RELOAD: the entry's retained block is on the host until "
                     "RELOAD0.0 at op 8"});
  }
}

TEST_CASE("the grid shows the steps around the violation, stages as columns", "[validate]") {
  Schedule s = OneFOneB();
  Erase(s, 1, 3);
  const std::string message = Message(Validate(s));
  INFO(message);
  CHECK(message.find("step | stage 0") != std::string::npos);
  CHECK(message.find("SEND_F1.0->1 *") != std::string::npos);
  CHECK(message.find("(* = the op at fault)") != std::string::npos);
  // Rows 0..7 of both stages (violation at step 3, radius 4).
  CHECK(message.find("RECV_B1.0<-1") != std::string::npos);
  CHECK(message.find("RECV_F0.0<-0") != std::string::npos);
}

TEST_CASE("an unknown op kind is a shape error, not a crash", "[validate]") {
  Schedule s = OneFOneB();
  Ops(s, 0)[2].kind = static_cast<OpKind>(42);
  RequireFails(s, {"shape", "stage 0, op 2 (?42)", "unknown op kind 42"});
}

// --- generated schedules ------------------------------------------------------------------

// A GPipe-style compute order per stage (every F, chunk by chunk, then every B in reverse, W
// right after B when split), lowered round-robin over stages: each SEND is appended together
// with its RECV on the receiver, which keeps the result deadlock-free. Entries of chunks below
// `offload_chunks` are offloaded right after F and reloaded right before B.
Schedule GpipeLowered(int p, int m, int v, bool split, int offload_chunks) {
  const int num_virtual = p * v;
  Schedule schedule =
      Make(p, m, v, split, std::vector<std::vector<Op>>(static_cast<std::size_t>(p)));
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) order[static_cast<std::size_t>(d)].push_back(F(mb, c));
    }
    for (int c = v - 1; c >= 0; --c) {
      for (int mb = 0; mb < m; ++mb) {
        order[static_cast<std::size_t>(d)].push_back(B(mb, c));
        if (split) order[static_cast<std::size_t>(d)].push_back(W(mb, c));
      }
    }
  }
  // done[kind][l * m + mb]: F / B of virtual stage l has been placed.
  std::vector<std::vector<char>> done(
      2, std::vector<char>(static_cast<std::size_t>(num_virtual * m), 0));
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  const auto key = [m](int l, int mb) { return static_cast<std::size_t>(l * m + mb); };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int d = 0; d < p; ++d) {
      std::vector<Op>& out = schedule.stages[static_cast<std::size_t>(d)].ops;
      while (next[static_cast<std::size_t>(d)] < order[static_cast<std::size_t>(d)].size()) {
        const Op op = order[static_cast<std::size_t>(d)][next[static_cast<std::size_t>(d)]];
        const int l = op.chunk * p + d;
        const bool ready = op.kind == OpKind::kForward ? l == 0 || done[0][key(l - 1, op.mb)]
                           : op.kind == OpKind::kBackward
                               ? (l == num_virtual - 1 ? done[0][key(l, op.mb)] != 0
                                                       : done[1][key(l + 1, op.mb)] != 0)
                               : true;
        if (!ready) break;
        ++next[static_cast<std::size_t>(d)];
        progress = true;
        const bool offloaded = op.chunk < offload_chunks;
        if (op.kind == OpKind::kBackward && offloaded) out.push_back(Reload(op.mb, op.chunk));
        out.push_back(op);
        if (op.kind == OpKind::kForward) {
          done[0][key(l, op.mb)] = 1;
          if (offloaded) {
            out.push_back(Offload(op.mb, op.chunk));
            out.push_back(Release(op.mb, op.chunk));
          }
          if (l + 1 < num_virtual && p > 1) {
            const int to = (l + 1) % p;
            out.push_back(SendF(op.mb, to, op.chunk));
            schedule.stages[static_cast<std::size_t>(to)].ops.push_back(
                RecvF(op.mb, d, (l + 1) / p));
          }
        } else if (op.kind == OpKind::kBackward) {
          done[1][key(l, op.mb)] = 1;
          if (l > 0 && p > 1) {
            const int to = (l - 1) % p;
            out.push_back(SendB(op.mb, to, op.chunk));
            schedule.stages[static_cast<std::size_t>(to)].ops.push_back(
                RecvB(op.mb, d, (l - 1) / p));
          }
        }
      }
    }
  }
  return schedule;
}

TEST_CASE("generated schedules pass over many configs", "[validate]") {
  const int p = GENERATE(1, 2, 3, 4, 8);
  const int m = GENERATE(1, 2, 5);
  const int v = GENERATE(1, 2, 3);
  const bool split = GENERATE(false, true);
  const int offload_chunks = GENERATE(0, 1, 3);
  CAPTURE(p, m, v, split, offload_chunks);
  const absl::Status status = Validate(GpipeLowered(p, m, v, split, offload_chunks));
  INFO(status.message());
  CHECK(status.ok());
}

TEST_CASE("deleting any single op makes a valid schedule invalid", "[validate]") {
  const int p = GENERATE(1, 2, 3);
  const int v = GENERATE(1, 2);
  const bool split = GENERATE(false, true);
  const Schedule valid = GpipeLowered(p, 2, v, split, /*offload_chunks=*/1);
  REQUIRE(Validate(valid).ok());
  for (int d = 0; d < p; ++d) {
    for (int i = 0; i < static_cast<int>(valid.stages[static_cast<std::size_t>(d)].ops.size());
         ++i) {
      Schedule broken = valid;
      Erase(broken, d, i);
      CAPTURE(p, v, split, d, i);
      CHECK(Validate(broken).code() == absl::StatusCode::kFailedPrecondition);
    }
  }
}

TEST_CASE("wide pipelines show the stages around the fault", "[validate]") {
  Schedule s = GpipeLowered(16, 2, 1, false, 0);
  REQUIRE(Validate(s).ok());
  std::vector<Op>& ops = Ops(s, 9);
  ops.erase(std::find(ops.begin(), ops.end(), F(1)));
  const std::string message = Message(Validate(s));
  INFO(message);
  CHECK(message.find("missing F: F1.0") != std::string::npos);
  CHECK(message.find("step | stage 8") != std::string::npos);
  CHECK(message.find("| stage 9") != std::string::npos);
  CHECK(message.find("stage 10") != std::string::npos);
  CHECK(message.find("stage 7 ") == std::string::npos);
  CHECK(message.find("(13 of 16 stages not shown)") != std::string::npos);
}

TEST_CASE("validate accepts a valid p=64, m=512, v=4 schedule with offload", "[validate]") {
  const Schedule schedule = GpipeLowered(64, 512, 4, /*split=*/true, /*offload_chunks=*/2);
  std::size_t ops = 0;
  for (const StageProgram& program : schedule.stages) ops += program.ops.size();
  CAPTURE(ops);
  // Its speed is bench/schedule_bench's to measure; a time bound here would flake under load.
  REQUIRE(Validate(schedule).ok());
}

}  // namespace
}  // namespace pipeoffload
