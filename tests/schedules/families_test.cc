// Tests of the compute-order families and of LowerCommunication (compiler.h, schedules/
// families.h): exact orders against the reference's worked examples and table, property sweeps
// over many specs, the building-block steps one by one, lowering errors and speed.
//
// The unit-cost oracles here are test-local (F = B = W = 1 slot, an unsplit B = 2, free comm)
// and independent of lib/sim; the "[families][sim]" cases check the real Validate/Simulate.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "schedules/families.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using ::pipeoffload::testing::MakeSpec;

std::string Describe(const PipelineSpec& spec) {
  return std::string(FamilyName(spec.family)) + " p=" + std::to_string(spec.num_stages) +
         " m=" + std::to_string(spec.num_microbatches) + " v=" +
         std::to_string(spec.chunks_per_stage) + " g=" + std::to_string(spec.group_size) +
         (spec.split_backward ? " split" : " unsplit");
}

Schedule MustBuild(const PipelineSpec& spec) {
  absl::StatusOr<Schedule> order = BuildComputeOrder(spec, CostModel{});
  INFO(Describe(spec) << ": " << order.status().ToString());
  REQUIRE(order.ok());
  return *std::move(order);
}

Schedule MustLower(const Schedule& order) {
  absl::StatusOr<Schedule> lowered = LowerCommunication(order);
  INFO(Describe(order.spec) << ": " << lowered.status().ToString());
  REQUIRE(lowered.ok());
  return *std::move(lowered);
}

// "F0.0 F1.0 ..." for one stage (all ops, or compute ops only).
std::string Row(const StageProgram& program, bool compute_only = false) {
  std::string row;
  for (const Op& op : program.ops) {
    if (compute_only && !IsCompute(op.kind)) continue;
    if (!row.empty()) row += ' ';
    row += OpToString(op);
  }
  return row;
}

// The reference writes 1F1B ops without chunks ("F3"); we write "F3.0".
std::string WithChunkZero(const std::string& row) {
  std::string out;
  for (std::size_t i = 0; i < row.size(); ++i) {
    out += row[i];
    if (i + 1 == row.size() || row[i + 1] == ' ') out += ".0";
  }
  return out;
}

struct Dims {
  int p, m, v, layers;
  explicit Dims(const PipelineSpec& s)
      : p(s.num_stages), m(s.num_microbatches), v(s.chunks_per_stage),
        layers(s.num_stages * s.chunks_per_stage) {}
  std::size_t Index(int layer, int mb) const { return static_cast<std::size_t>(layer) * m + mb; }
  std::size_t Size() const { return static_cast<std::size_t>(layers) * m; }
};

std::int64_t Duration(const Op& op, bool split) {
  return op.kind == OpKind::kBackward && !split ? 2 : 1;
}

// As-soon-as-possible unit-cost replay of the compute ops in each stage's order, with the
// cross-stage dependencies of pipeoffload.md section 1.1 and free comm. Comm ops are ignored.
struct UnitReplay {
  bool complete = false;
  std::int64_t makespan = 0;
  std::int64_t work = 0;       // total compute slots
  std::vector<int> peaks;      // program-order stash peak per stage (+1 at F, -1 at W or B)
};

UnitReplay ReplayUnitCost(const Schedule& schedule) {
  const Dims dims(schedule.spec);
  const bool split = schedule.spec.split_backward;
  std::vector<std::int64_t> forward_end(dims.Size(), -1), backward_end(dims.Size(), -1);
  std::vector<std::size_t> cursor(dims.p, 0);
  std::vector<std::int64_t> free_at(dims.p, 0);
  UnitReplay replay;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int d = 0; d < dims.p; ++d) {
      const std::vector<Op>& ops = schedule.stages[d].ops;
      for (; cursor[d] < ops.size(); ++cursor[d]) {
        const Op& op = ops[cursor[d]];
        if (!IsCompute(op.kind)) continue;
        const int l = op.chunk * dims.p + d;
        std::int64_t dep = 0;
        if (op.kind == OpKind::kForward && l > 0) dep = forward_end[dims.Index(l - 1, op.mb)];
        if (op.kind == OpKind::kBackward) {
          dep = l == dims.layers - 1 ? forward_end[dims.Index(l, op.mb)]
                                     : backward_end[dims.Index(l + 1, op.mb)];
        }
        if (op.kind == OpKind::kBackwardWeight) dep = backward_end[dims.Index(l, op.mb)];
        if (dep < 0) break;
        const std::int64_t end = std::max(dep, free_at[d]) + Duration(op, split);
        free_at[d] = end;
        replay.work += Duration(op, split);
        replay.makespan = std::max(replay.makespan, end);
        if (op.kind == OpKind::kForward) forward_end[dims.Index(l, op.mb)] = end;
        if (op.kind == OpKind::kBackward) backward_end[dims.Index(l, op.mb)] = end;
        progress = true;
      }
    }
  }
  replay.complete = true;
  for (int d = 0; d < dims.p; ++d) {
    if (cursor[d] != schedule.stages[d].ops.size()) replay.complete = false;
    int live = 0, peak = 0;
    for (const Op& op : schedule.stages[d].ops) {
      if (op.kind == OpKind::kForward) peak = std::max(peak, ++live);
      if (op.kind == (split ? OpKind::kBackwardWeight : OpKind::kBackward)) --live;
    }
    replay.peaks.push_back(peak);
  }
  return replay;
}

// Replays a lowered schedule with simulate.h's issue rules and free comm: op i never starts
// before op i-1 of its stage starts; compute is serial; a SEND and its RECV start together once
// both are issued and the SEND's data exists; F/B wait for their RECV. Blocking rendezvous, so
// nullopt means the programs hang (a deadlock).
std::optional<std::int64_t> InOrderIssueMakespan(const Schedule& lowered) {
  const Dims dims(lowered.spec);
  const bool split = lowered.spec.split_backward;
  // Indexed by the *sender's* (virtual stage, mb): one message per direction.
  std::vector<std::int64_t> f_end(dims.Size(), -1), b_end(dims.Size(), -1);
  std::vector<std::int64_t> recv_f_end(dims.Size(), -1), recv_b_end(dims.Size(), -1);
  std::vector<std::int64_t> send_ready[2] = {std::vector<std::int64_t>(dims.Size(), -1),
                                             std::vector<std::int64_t>(dims.Size(), -1)};
  std::vector<std::int64_t> recv_ready[2] = {std::vector<std::int64_t>(dims.Size(), -1),
                                             std::vector<std::int64_t>(dims.Size(), -1)};
  std::vector<std::size_t> cursor(dims.p, 0);
  std::vector<std::int64_t> last_start(dims.p, 0), free_at(dims.p, 0);
  std::int64_t makespan = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int d = 0; d < dims.p; ++d) {
      const std::vector<Op>& ops = lowered.stages[d].ops;
      for (; cursor[d] < ops.size(); ++cursor[d]) {
        const Op& op = ops[cursor[d]];
        const int l = op.chunk * dims.p + d;
        std::int64_t start = last_start[d];
        if (IsCompute(op.kind)) {
          std::int64_t dep = 0;
          if (op.kind == OpKind::kForward && l > 0) {
            dep = dims.p == 1 ? f_end[dims.Index(l - 1, op.mb)] : recv_f_end[dims.Index(l, op.mb)];
          } else if (op.kind == OpKind::kBackward) {
            if (l == dims.layers - 1) {
              dep = f_end[dims.Index(l, op.mb)];
            } else {
              dep = dims.p == 1 ? b_end[dims.Index(l + 1, op.mb)]
                                : recv_b_end[dims.Index(l, op.mb)];
            }
          } else if (op.kind == OpKind::kBackwardWeight) {
            dep = b_end[dims.Index(l, op.mb)];
          }
          if (dep < 0) break;  // its input is not (yet) on this stage: never, in program order
          start = std::max({start, dep, free_at[d]});
          const std::int64_t end = start + Duration(op, split);
          free_at[d] = end;
          makespan = std::max(makespan, end);
          if (op.kind == OpKind::kForward) f_end[dims.Index(l, op.mb)] = end;
          if (op.kind == OpKind::kBackward) b_end[dims.Index(l, op.mb)] = end;
        } else {
          const bool forward = op.kind == OpKind::kSendActivation ||
                               op.kind == OpKind::kRecvActivation;
          const bool send = IsSend(op.kind);
          const int sender_layer = send ? l : (forward ? l - 1 : l + 1);
          const std::size_t key = dims.Index(sender_layer, op.mb);
          std::int64_t mine = start;
          if (send) {
            const std::int64_t produced = forward ? f_end[key] : b_end[key];
            if (produced < 0) break;
            mine = std::max(mine, produced);
          }
          (send ? send_ready : recv_ready)[forward][key] = mine;
          const std::int64_t theirs = (send ? recv_ready : send_ready)[forward][key];
          if (theirs < 0) break;  // partner not issued yet: blocked
          start = std::max(mine, theirs);
          if (!send) (forward ? recv_f_end : recv_b_end)[dims.Index(l, op.mb)] = start;
        }
        last_start[d] = start;
        progress = true;
      }
    }
  }
  for (int d = 0; d < dims.p; ++d) {
    if (cursor[d] != lowered.stages[d].ops.size()) return std::nullopt;
  }
  return makespan;
}

// Each stage runs F and B (and W iff split) of every (mb, chunk) exactly once, F < B < W.
std::string CheckEachComputeOnce(const Schedule& schedule) {
  const Dims dims(schedule.spec);
  if (static_cast<int>(schedule.stages.size()) != dims.p) return "wrong number of stages";
  for (int d = 0; d < dims.p; ++d) {
    if (schedule.stages[d].stage != d) return "stage numbering";
    std::vector<int> position[3];
    for (auto& v : position) v.assign(static_cast<std::size_t>(dims.v) * dims.m, -1);
    const std::vector<Op>& ops = schedule.stages[d].ops;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      const Op& op = ops[i];
      if (!IsCompute(op.kind)) continue;
      if (op.mb < 0 || op.mb >= dims.m || op.chunk < 0 || op.chunk >= dims.v) {
        return "out of range: " + OpToString(op);
      }
      int& slot = position[static_cast<int>(op.kind)][op.chunk * dims.m + op.mb];
      if (slot >= 0) return "stage " + std::to_string(d) + " runs " + OpToString(op) + " twice";
      slot = i;
    }
    for (int e = 0; e < dims.v * dims.m; ++e) {
      const std::string what = "stage " + std::to_string(d) + " entry " + std::to_string(e);
      if (position[0][e] < 0 || position[1][e] < 0) return what + " lacks F or B";
      if (position[0][e] > position[1][e]) return what + ": B before F";
      if (schedule.spec.split_backward != (position[2][e] >= 0)) return what + ": W wrong";
      if (position[2][e] >= 0 && position[2][e] < position[1][e]) return what + ": W before B";
    }
  }
  return "";
}

// Comm ops: exactly one message per cross-stage dependency, correct peers and chunks, SEND after
// its producer, RECV before its consumer, and both ends of every stage pair listing their shared
// messages in the same order.
std::string CheckComm(const Schedule& lowered) {
  const Dims dims(lowered.spec);
  // Message id: direction (0 forward, 1 backward), sender virtual stage, mb.
  auto id = [&](int dir, int layer, int mb) {
    return (static_cast<std::int64_t>(dir) * dims.layers + layer) * dims.m + mb;
  };
  std::vector<std::vector<std::vector<std::int64_t>>> pair_sequence(
      dims.p, std::vector<std::vector<std::int64_t>>(dims.p));
  std::vector<int> sends(2 * dims.Size(), 0), recvs(2 * dims.Size(), 0);
  for (int d = 0; d < dims.p; ++d) {
    std::vector<char> done_f(dims.Size(), 0), done_b(dims.Size(), 0);
    std::vector<char> got_f(dims.Size(), 0), got_b(dims.Size(), 0);
    for (const Op& op : lowered.stages[d].ops) {
      const int l = op.chunk * dims.p + d;
      const std::string where = "stage " + std::to_string(d) + " " + OpToString(op);
      switch (op.kind) {
        case OpKind::kForward:
          if (l > 0 && dims.p > 1 && !got_f[dims.Index(l, op.mb)]) return where + " before RECV_F";
          done_f[dims.Index(l, op.mb)] = 1;
          break;
        case OpKind::kBackward:
          if (l < dims.layers - 1 && dims.p > 1 && !got_b[dims.Index(l, op.mb)]) {
            return where + " before RECV_B";
          }
          done_b[dims.Index(l, op.mb)] = 1;
          break;
        case OpKind::kSendActivation:
        case OpKind::kSendGrad: {
          const bool forward = op.kind == OpKind::kSendActivation;
          const int to = forward ? l + 1 : l - 1;
          if (to < 0 || to >= dims.layers || op.peer != to % dims.p || op.peer == d) {
            return where + ": wrong peer";
          }
          if (!(forward ? done_f : done_b)[dims.Index(l, op.mb)]) return where + " before its op";
          ++sends[id(forward ? 0 : 1, l, op.mb)];
          pair_sequence[d][op.peer].push_back(id(forward ? 0 : 1, l, op.mb));
          break;
        }
        case OpKind::kRecvActivation:
        case OpKind::kRecvGrad: {
          const bool forward = op.kind == OpKind::kRecvActivation;
          const int from = forward ? l - 1 : l + 1;
          if (from < 0 || from >= dims.layers || op.peer != from % dims.p || op.peer == d) {
            return where + ": wrong peer";
          }
          (forward ? got_f : got_b)[dims.Index(l, op.mb)] = 1;
          ++recvs[id(forward ? 0 : 1, from, op.mb)];
          pair_sequence[d][op.peer].push_back(id(forward ? 0 : 1, from, op.mb));
          break;
        }
        default:
          break;
      }
    }
  }
  for (int dir = 0; dir < 2; ++dir) {
    for (int l = 0; l < dims.layers; ++l) {
      const int to = dir == 0 ? l + 1 : l - 1;
      const int expected = to >= 0 && to < dims.layers && to % dims.p != l % dims.p ? 1 : 0;
      for (int mb = 0; mb < dims.m; ++mb) {
        if (sends[id(dir, l, mb)] != expected || recvs[id(dir, l, mb)] != expected) {
          return "message " + std::to_string(dir) + "/" + std::to_string(l) + "/" +
                 std::to_string(mb) + " appears " + std::to_string(sends[id(dir, l, mb)]) +
                 "/" + std::to_string(recvs[id(dir, l, mb)]) + " times";
        }
      }
    }
  }
  for (int a = 0; a < dims.p; ++a) {
    for (int b = a + 1; b < dims.p; ++b) {
      if (pair_sequence[a][b] != pair_sequence[b][a]) {
        return "stages " + std::to_string(a) + " and " + std::to_string(b) +
               " order their messages differently";
      }
    }
  }
  return "";
}

bool SameComputeOrder(const Schedule& order, const Schedule& lowered) {
  if (order.stages.size() != lowered.stages.size()) return false;
  for (std::size_t d = 0; d < order.stages.size(); ++d) {
    std::vector<Op> compute;
    for (const Op& op : lowered.stages[d].ops) {
      if (IsCompute(op.kind)) compute.push_back(op);
    }
    if (compute != order.stages[d].ops) return false;
  }
  return true;
}

// Everything a family's order and its lowering must satisfy, whatever the family.
void CheckCommonProperties(const Schedule& order, const Schedule& lowered,
                           const UnitReplay& replay) {
  REQUIRE(CheckEachComputeOnce(order).empty());
  for (const StageProgram& program : order.stages) {
    for (const Op& op : program.ops) REQUIRE(IsCompute(op.kind));
  }
  REQUIRE(replay.complete);
  REQUIRE(SameComputeOrder(order, lowered));
  INFO(CheckComm(lowered));
  REQUIRE(CheckComm(lowered).empty());
  // The slot-timed lowering reproduces the order's unit-cost timing under in-order issue.
  const std::optional<std::int64_t> issued = InOrderIssueMakespan(lowered);
  REQUIRE(issued.has_value());
  REQUIRE(*issued == replay.makespan);
}

TEST_CASE("1f1b reproduces the reference's p=4 m=8 order", "[families]") {
  // reference/pipeoffload.md section 1.2 (split, W right after B).
  const Schedule order = MustBuild(MakeSpec(Family::k1F1B, 4, 8, 1, 0, true));
  const char* expected[] = {
      "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7",
      "F0 F1 F2 B0 W0 F3 B1 W1 F4 B2 W2 F5 B3 W3 F6 B4 W4 F7 B5 W5 B6 W6 B7 W7",
      "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 F4 B3 W3 F5 B4 W4 F6 B5 W5 F7 B6 W6 B7 W7",
      "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4 F5 B5 W5 F6 B6 W6 F7 B7 W7"};
  for (int d = 0; d < 4; ++d) CHECK(Row(order.stages[d]) == WithChunkZero(expected[d]));
  const UnitReplay replay = ReplayUnitCost(order);
  CHECK(replay.peaks == std::vector<int>{4, 3, 2, 1});
}

TEST_CASE("group-interleaved reproduces the reference's p=4 m=8 v=2 g=2 example", "[families]") {
  // reference/pipeoffload.md section 1.3, worked example (devices 0 and 3, first ops).
  const Schedule order = MustBuild(MakeSpec(Family::kGroupInterleaved, 4, 8, 2, 2, true));
  const std::string d0 =
      "F0.0 F1.0 F0.1 F1.1 F2.0 F3.0 B0.1 W0.1 F2.1 B1.1 W1.1 F3.1 B0.0 W0.0 F4.0 B1.0 W1.0 "
      "F5.0 B2.1 W2.1 F4.1";
  const std::string d3 =
      "F0.0 F1.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F2.0 B0.0 W0.0 F3.0 B1.0 W1.0 F2.1 B2.1 W2.1 "
      "F3.1 B3.1";
  CHECK(Row(order.stages[0]).substr(0, d0.size()) == d0);
  CHECK(Row(order.stages[3]).substr(0, d3.size()) == d3);
  // Per-device peaks [6, 5, 4, 3] (g = 2), against [8, 7, 6, 5] for g = p = 4.
  CHECK(ReplayUnitCost(order).peaks == std::vector<int>{6, 5, 4, 3});
  const Schedule standard = MustBuild(MakeSpec(Family::kGroupInterleaved, 4, 8, 2, 4, true));
  CHECK(ReplayUnitCost(standard).peaks == std::vector<int>{8, 7, 6, 5});
}

TEST_CASE("group-interleaved matches every row of the reference table", "[families]") {
  // reference/pipeoffload.md section 1.3: unit costs, split backward, zero comm.
  struct Row {
    int p, m, v, g;
    std::int64_t makespan;
    int peak0;
  };
  const Row rows[] = {{8, 32, 1, 8, 110, 8},   {8, 32, 2, 8, 206, 16}, {8, 32, 2, 4, 210, 12},
                      {8, 32, 3, 4, 310, 16},  {8, 32, 4, 4, 410, 20}, {16, 64, 2, 16, 414, 32},
                      {16, 64, 2, 8, 422, 24}, {16, 64, 4, 8, 822, 40}};
  for (const Row& row : rows) {
    const PipelineSpec spec = MakeSpec(Family::kGroupInterleaved, row.p, row.m, row.v, row.g, true);
    INFO(Describe(spec));
    const Schedule order = MustBuild(spec);
    const UnitReplay replay = ReplayUnitCost(order);
    REQUIRE(replay.complete);
    CHECK(replay.work == 3LL * row.m * row.v * row.p);
    CHECK(replay.makespan == row.makespan);
    CHECK(replay.peaks[0] == row.peak0);
    // The library's own squeeze (step 4) finds the same makespan.
    absl::StatusOr<internal::SlotTimeline> timeline = internal::GroupInterleavedTimeline(spec);
    REQUIRE(timeline.ok());
    std::int64_t last = 0;
    for (const auto& stage : *timeline) last = std::max(last, stage.back().slot + 1);
    CHECK(last == row.makespan);
  }
}

TEST_CASE("interleaved follows Megatron's order for p=2 m=4 v=2", "[families]") {
  // Hand-derived from ecosystem.md section 2.1: warm-up 2(p-d-1) + (v-1)p = 4 and 2; forward k ->
  // chunk (k/p)%v, mb (k/(pv))p + k%p; backward chunk v-1-(k/p)%v.
  const Schedule order = MustBuild(MakeSpec(Family::kInterleaved, 2, 4, 2, 0, false));
  CHECK(Row(order.stages[0]) ==
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  CHECK(Row(order.stages[1]) ==
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  CHECK(order.spec.group_size == 2);
}

TEST_CASE("the unsplit variant is the split order with W folded into B", "[families]") {
  for (Family family : {Family::k1F1B, Family::kInterleaved, Family::kGroupInterleaved}) {
    for (int p : {1, 3, 4}) {
      const int v = family == Family::k1F1B ? 1 : 2;
      const PipelineSpec split = MakeSpec(family, p, 2 * p, v, 0, true);
      PipelineSpec unsplit = split;
      unsplit.split_backward = false;
      INFO(Describe(split));
      const Schedule with_w = MustBuild(split);
      const Schedule without_w = MustBuild(unsplit);
      for (int d = 0; d < p; ++d) {
        std::vector<Op> folded;
        for (const Op& op : with_w.stages[d].ops) {
          if (op.kind != OpKind::kBackwardWeight) folded.push_back(op);
        }
        CHECK(folded == without_w.stages[d].ops);
        // And every W sits right after its B.
        const std::vector<Op>& ops = with_w.stages[d].ops;
        for (std::size_t i = 0; i < ops.size(); ++i) {
          if (ops[i].kind != OpKind::kBackwardWeight) continue;
          REQUIRE(i > 0);
          CHECK(ops[i - 1] == Op{OpKind::kBackward, ops[i].mb, ops[i].chunk, -1});
        }
      }
    }
  }
}

TEST_CASE("group-interleaved with one chunk per stage is 1F1B", "[families]") {
  // Decision (schedules/families.h): v = 1 is accepted; slot 3k of microbatch k = n g + j makes
  // the group size irrelevant, so every g gives exactly the 1F1B order.
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p; ++m) {
      for (int g = internal::MinGroupSize(p); g <= p; ++g) {
        for (bool split : {false, true}) {
          const PipelineSpec spec = MakeSpec(Family::kGroupInterleaved, p, m, 1, g, split);
          INFO(Describe(spec));
          const PipelineSpec one_f_one_b = MakeSpec(Family::k1F1B, p, m, 1, 0, split);
          CHECK(MustBuild(spec).stages == MustBuild(one_f_one_b).stages);
        }
      }
    }
  }
}

TEST_CASE("1f1b sweep: exact closed forms for any m", "[families][sweep]") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 4 * p; ++m) {
      for (bool split : {false, true}) {
        const PipelineSpec spec = MakeSpec(Family::k1F1B, p, m, 1, 0, split);
        INFO(Describe(spec));
        const Schedule order = MustBuild(spec);
        const UnitReplay replay = ReplayUnitCost(order);
        CheckCommonProperties(order, MustLower(order), replay);
        // (m + p - 1)(F + B + W) unsplit; with W split off, the fill and drain carry F + B only.
        CHECK(replay.makespan == (split ? 3 * m + 2 * (p - 1) : 3 * (m + p - 1)));
        for (int d = 0; d < p; ++d) CHECK(replay.peaks[d] == std::min(p - d, m));
      }
    }
  }
}

TEST_CASE("interleaved sweep: exact closed forms", "[families][sweep]") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 4 * p; m += p) {
      for (int v = 2; v <= 4; ++v) {
        for (bool split : {false, true}) {
          const PipelineSpec spec = MakeSpec(Family::kInterleaved, p, m, v, 0, split);
          INFO(Describe(spec));
          const Schedule order = MustBuild(spec);
          const UnitReplay replay = ReplayUnitCost(order);
          CheckCommonProperties(order, MustLower(order), replay);
          CHECK(replay.makespan == (split ? 3 * m * v + 2 * (p - 1) : 3 * (m * v + p - 1)));
          // Megatron's peak is its warm-up plus the first steady F (pipeoffload.md section 2).
          for (int d = 0; d < p; ++d) {
            CHECK(replay.peaks[d] == std::min(2 * (p - d - 1) + (v - 1) * p + 1, m * v));
          }
        }
      }
    }
  }
}

TEST_CASE("group-interleaved sweep: peaks, makespans, any m", "[families][sweep]") {
  for (int p = 1; p <= 8; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int g = internal::MinGroupSize(p); g <= p; ++g) {
        for (int m = 1; m <= 4 * p; ++m) {
          for (bool split : {false, true}) {
            const PipelineSpec spec = MakeSpec(Family::kGroupInterleaved, p, m, v, g, split);
            INFO(Describe(spec));
            const Schedule order = MustBuild(spec);
            const UnitReplay replay = ReplayUnitCost(order);
            CheckCommonProperties(order, MustLower(order), replay);
            // P_d = G(v-1) + (p-d), G = g here (pipeoffload.md section 2): an upper bound for
            // every m, reached once two groups run (m >= 2g).
            for (int d = 0; d < p; ++d) {
              const int formula = g * (v - 1) + (p - d);
              CHECK(replay.peaks[d] <= formula);
              if (m >= 2 * g) CHECK(replay.peaks[d] == formula);
            }
            // Whole groups, split: 3mv + 2(p-1) + (v-1)(p-g); fits every row of the table.
            if (split && m % g == 0) {
              CHECK(replay.makespan == 3 * m * v + 2 * (p - 1) + (v - 1) * (p - g));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("building block: slots of the reference formula", "[families][block]") {
  internal::BlockShape shape;
  shape.num_stages = 4;
  shape.chunks = 2;
  shape.group_size = 2;
  shape.min_group_size = 2;
  absl::StatusOr<internal::SlotTimeline> block = internal::BuildingBlock(shape, 8);
  REQUIRE(block.ok());
  REQUIRE(block->size() == 4);
  std::string stage0;
  for (const internal::SlottedOp& pass : (*block)[0]) {
    stage0 += OpToString(pass.op) + "@" + std::to_string(pass.slot) + " ";
  }
  // F(c,j,0) = 6c + 3j; first B = F(1,0,0) + 3(p-1) + 1 = 16; B(1-c',j) = 16 + 6c' + 3j.
  CHECK(stage0 ==
        "F0.0@0 F1.0@3 F0.1@6 F1.1@9 B0.1@16 W0.1@17 B1.1@19 W1.1@20 B0.0@22 W0.0@23 "
        "B1.0@25 W1.0@26 ");
  CHECK((*block)[3].front().slot == 3);  // F moves one slot per stage

  const internal::SlotTimeline repeated = internal::RepeatBlock(*block, shape, 8);
  CHECK(repeated[0].size() == 3u * 8 * 2);
  CHECK(repeated[0][4].op == Op{OpKind::kForward, 2, 0, -1});  // group 1 starts at slot 12
  CHECK(repeated[0][4].slot == 12);

  // e = min(p - 1, 3G - p) = 2: stage i starts min(i, 2) slots late.
  absl::StatusOr<internal::SlotTimeline> shifted =
      internal::ShiftForDependencies(repeated, shape.chunks, 8);
  REQUIRE(shifted.ok());
  for (int d = 0; d < 4; ++d) CHECK((*shifted)[d].front().slot == d + std::min(d, 2));

  absl::StatusOr<internal::SlotTimeline> squeezed = internal::Squeeze(*shifted, shape.chunks, 8);
  REQUIRE(squeezed.ok());
  const Schedule order = MustBuild(MakeSpec(Family::kGroupInterleaved, 4, 8, 2, 2, true));
  for (int d = 0; d < 4; ++d) {
    REQUIRE((*squeezed)[d].size() == order.stages[d].ops.size());
    for (std::size_t i = 0; i < order.stages[d].ops.size(); ++i) {
      CHECK((*squeezed)[d][i].op == order.stages[d].ops[i]);  // squeeze keeps the order
      if (i > 0) CHECK((*squeezed)[d][i].slot > (*squeezed)[d][i - 1].slot);
    }
  }
  CHECK((*squeezed)[0].back().slot + 1 == ReplayUnitCost(order).makespan);
}

TEST_CASE("building block with K > 1 uses the jump and still yields valid orders",
          "[families][block]") {
  // Only reachable internally (ResolveSpec keeps g >= ceil(p/2) = g_min, so K = 1): a larger
  // g_min than g makes G = K g and spreads chunk runs with the 3g "jump".
  int checked = 0;
  for (int p = 2; p <= 8; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int g_min = internal::MinGroupSize(p); g_min <= p; ++g_min) {
        for (int g = 1; g < g_min; ++g) {
          internal::BlockShape shape{p, v, g, g_min};
          const int m = 3 * g;
          INFO("p=" << p << " v=" << v << " g=" << g << " g_min=" << g_min);
          absl::StatusOr<internal::SlotTimeline> block = internal::BuildingBlock(shape, m);
          REQUIRE(block.ok());
          absl::StatusOr<internal::SlotTimeline> shifted = internal::ShiftForDependencies(
              internal::RepeatBlock(*block, shape, m), v, m);
          REQUIRE(shifted.ok());
          absl::StatusOr<internal::SlotTimeline> squeezed = internal::Squeeze(*shifted, v, m);
          REQUIRE(squeezed.ok());
          Schedule order;
          order.spec = MakeSpec(Family::kGroupInterleaved, p, m, v, g, true);
          for (int d = 0; d < p; ++d) {
            order.stages.push_back(StageProgram{d, {}});
            for (const internal::SlottedOp& pass : (*squeezed)[d]) {
              order.stages[d].ops.push_back(pass.op);
            }
          }
          const UnitReplay replay = ReplayUnitCost(order);
          CheckCommonProperties(order, MustLower(order), replay);
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 100);
}

TEST_CASE("building block errors are reported, never emitted", "[families][block]") {
  internal::BlockShape bad_shape{4, 0, 2, 2};
  absl::StatusOr<internal::SlotTimeline> block = internal::BuildingBlock(bad_shape, 8);
  REQUIRE(block.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(block.status().message()).find("v=0") != std::string::npos);

  // g_min below ceil(p/2): chunk 1 would start on stage 0 before chunk 0 left stage p-1.
  internal::BlockShape too_narrow{7, 3, 1, 2};
  block = internal::BuildingBlock(too_narrow, 3);
  REQUIRE(block.ok());
  absl::StatusOr<internal::SlotTimeline> shifted =
      internal::ShiftForDependencies(internal::RepeatBlock(*block, too_narrow, 3), 3, 3);
  REQUIRE(shifted.status().code() == absl::StatusCode::kInternal);
  CHECK(std::string(shifted.status().message()).find("does not follow") != std::string::npos);

  // A timeline whose order breaks a dependency makes the squeeze stop, naming the heads.
  internal::SlotTimeline broken(2);
  broken[0] = {{Op{OpKind::kBackward, 0, 0, -1}, 0}, {Op{OpKind::kForward, 0, 0, -1}, 1}};
  broken[1] = {{Op{OpKind::kForward, 0, 0, -1}, 0}, {Op{OpKind::kBackward, 0, 0, -1}, 1}};
  absl::StatusOr<internal::SlotTimeline> squeezed = internal::Squeeze(broken, 1, 1);
  REQUIRE(squeezed.status().code() == absl::StatusCode::kInternal);
  CHECK(std::string(squeezed.status().message()).find("stage 0: B0.0") != std::string::npos);
}

TEST_CASE("p=64 m=512 v=4 builds and lowers with every op in place", "[families]") {
  for (Family family : {Family::k1F1B, Family::kInterleaved, Family::kGroupInterleaved}) {
    const PipelineSpec spec =
        MakeSpec(family, 64, 512, family == Family::k1F1B ? 1 : 4, 0, true);
    INFO(Describe(spec));
    // Build and lower time is bench/schedule_bench's to measure (no time bounds in tests).
    const Schedule order = MustBuild(spec);
    const Schedule lowered = MustLower(order);
    std::size_t compute = 0, total = 0;
    for (const StageProgram& program : lowered.stages) {
      total += program.ops.size();
      for (const Op& op : program.ops) compute += IsCompute(op.kind) ? 1 : 0;
    }
    const std::size_t entries = 64u * 512u * spec.chunks_per_stage;
    CHECK(compute == 3 * entries);
    // One SEND and one RECV per boundary in each direction: (L - 1) boundaries per microbatch.
    CHECK(total - compute == 4u * (64u * spec.chunks_per_stage - 1) * 512u);
  }
}

// The real validator and simulator on the families (lib/ir, lib/sim).
TEST_CASE("lowered families validate and simulate to the unit-cost oracle", "[families][sim]") {
  const CostModel cost = UnitCostModel(0.0);  // F = B = W = 1, free comm
  int checked = 0;
  for (Family family : {Family::k1F1B, Family::kInterleaved, Family::kGroupInterleaved}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int v = 1; v <= 3; ++v) {
        for (int m : {1, 2, p, p + 1, 2 * p, 4 * p}) {
          for (bool split : {false, true}) {
            PipelineSpec spec = MakeSpec(family, p, m, v, 0, split);
            if (!ResolveSpec(spec).ok()) continue;
            INFO(Describe(spec));
            const Schedule order = MustBuild(spec);
            const Schedule lowered = MustLower(order);
            const absl::Status valid = Validate(lowered);
            INFO(valid.ToString());
            REQUIRE(valid.ok());
            absl::StatusOr<Timeline> timeline = Simulate(lowered, cost);
            INFO(timeline.status().ToString());
            REQUIRE(timeline.ok());
            const UnitReplay replay = ReplayUnitCost(order);
            const Predictions& predicted = timeline->predictions;
            CHECK(predicted.step_time == Catch::Approx(static_cast<double>(replay.makespan)));
            REQUIRE(predicted.stages.size() == static_cast<std::size_t>(p));
            for (int d = 0; d < p; ++d) CHECK(predicted.stages[d].peak_units == replay.peaks[d]);
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked > 150);
}

}  // namespace
}  // namespace pipeoffload
