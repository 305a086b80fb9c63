// Simulate: runs a Schedule under a CostModel, one op start at a time in time order, and
// predicts time, memory and traffic (semantics: simulate.h).
//
// Invariants of the event loop (EventLoop below):
//  - each stage has one head op; every op before it has started (compute, copies, RELEASE,
//    BARRIER) or been posted (SEND/RECV), so when an op becomes the head its own-stage
//    dependencies (F before SEND/OFFLOAD, OFFLOAD before RELEASE/RELOAD, RELOAD before B/W) and
//    its engines' free times are known; only the transfer behind a RECV it consumes may still be
//    open, and then the head waits for that transfer ("waits_for") instead of being queued;
//  - a SEND or RECV head is posted at once, at the stage's issue time, and the head moves on: a
//    post never gates the ops after it. A transfer is resolved (its start and end fixed) as soon
//    as both ends are posted and every earlier send of the sender and every earlier receive of
//    the receiver is resolved (each engine moves messages in program order); its start is then
//    max(both posts, the producer's end, both engines free), all of them known;
//  - a BARRIER head is parked until its partner is the head of the partner's stage; the two
//    then start together as one event;
//  - events leave the queue in nondecreasing start time: posts happen at the current time, so a
//    transfer never starts before the event that resolved it, nor a consumer before its data;
//    when a copy starts, every copy that started before it is known, so "is the opposite
//    direction of this host link busy" is one lookup of the latest end time on that direction;
//  - a head whose dependency is missing, or later in its own program, never becomes ready, and
//    a transfer whose partner never posts never resolves; when the queue runs dry with ops left
//    or transfers open, the programs hang and the error shows where.
#include "pipeoffload/simulate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/checked_math.h"
#include "lib/base/parallel_for.h"
#include "lib/base/status_macros.h"
#include "lib/ir/grid_format.h"
#include "lib/ir/grid_index.h"
#include "lib/sim/sim_cost_check.h"
#include "lib/sim/simulate_parts.h"

namespace pipeoffload {
namespace {

using internal::ScheduleIndex;

// Engine slots of one stage that the head-of-line logic times. With a shared copy engine, D2H
// and H2D use the same slot. The send and recv engines belong to the transfer chains.
enum Slot : int { kComputeSlot, kD2HSlot, kH2DSlot, kNumSlots };

// Two instants closer than this (relative to the times involved) count as equal: a transfer
// that starts exactly when another ends does not see it busy, despite rounding.
bool Later(double a, double b) { return a - b > 1e-12 * std::max(1.0, std::fabs(b)); }

// Structural problems that would make the event loop's lookups ambiguous: FailedPrecondition
// naming the first one (Validate names every invariant; this is the subset we rely on).
absl::Status CheckStructure(const Schedule& schedule, const ScheduleIndex* index) {
  std::optional<internal::GridViolation> found;
  if (index == nullptr) {
    found = internal::CheckShape(schedule);
    if (!found) found = internal::CheckPeers(schedule);
  } else {
    for (auto cls : {ScheduleIndex::kComputeDuplicate, ScheduleIndex::kP2PDuplicate,
                     ScheduleIndex::kOffloadDuplicate}) {
      if (!found && index->Duplicate(cls)) found = index->Duplicate(cls);
    }
  }
  if (!found) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "Simulate: malformed schedule (Validate reports every invariant): " +
      internal::FormatViolation(schedule.stages, *found));
}

class EventLoop {
 public:
  EventLoop(const Schedule& schedule, const ScheduleIndex& index, const CostModel& cost)
      : schedule_(schedule),
        index_(index),
        cost_(cost),
        p_(schedule.spec.num_stages),
        map_(schedule.spec.stage_map()),
        split_(schedule.spec.split_backward),
        p2p_duration_(cost.p2p_latency +
                      static_cast<double>(cost.boundary_bytes) / cost.p2p_bandwidth),
        stages_(static_cast<std::size_t>(p_)),
        timed_(static_cast<std::size_t>(p_)) {
    const auto groups = CeilDiv(p_, cost.host_link_group_size);
    link_end_.assign(static_cast<std::size_t>(groups), {0.0, 0.0});
    // Each stage's arrays are its own: filled on several threads for large schedules.
    internal::ParallelForSized(p_, internal::TotalOps(schedule.stages), [&](int s) {
      const std::vector<Op>& ops = Ops(s);
      // Only reserved: ops are timed in program order (the head's), so each is appended when
      // the head reaches it, and none is written twice (a million-op zero fill per simulation).
      timed_[static_cast<std::size_t>(s)].reserve(ops.size());
      StageState& state = State(s);
      state.post.assign(ops.size(), -1.0);
      state.resolved.assign(ops.size(), 0);
      state.end.assign(ops.size(), 0.0);
      state.deps.resize(ops.size());
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        const OpKind kind = ops[static_cast<std::size_t>(i)].kind;
        if (IsP2P(kind)) (IsSend(kind) ? state.sends : state.recvs).push_back(i);
        state.deps[static_cast<std::size_t>(i)] = Resolve(s, i);
      }
    });
  }

  // Runs to completion; the timed ops land in *timed. FailedPrecondition on a hang.
  absl::Status Run(std::vector<std::vector<TimedOp>>* timed) {
    for (int s = 0; s < p_; ++s) to_arm_.push_back(s);
    Settle();
    while (!queue_.empty()) {
      const auto [time, s] = queue_.top();
      queue_.pop();
      Fire(s, time);
      Settle();
    }
    PO_RETURN_IF_ERROR(HangReport());
    *timed = std::move(timed_);
    return absl::OkStatus();
  }

 private:
  // Op i's own-stage dependencies as program indices (Resolve).
  struct Dependencies {
    std::array<int, 3> op{};
    std::uint8_t count = 0;
    std::uint8_t bounds = 0;    // bit k: op[k]'s end bounds the start
    std::uint8_t transfer = 0;  // bit k: op[k] is a RECV, whose transfer must be resolved
    bool stuck = false;         // a further dependency is missing or not before op i
  };

  struct StageState {
    int head = 0;
    double issue = 0.0;  // start of the latest started op (posts do not move it): in-order issue
    std::array<double, kNumSlots> engine_free{};
    bool parked = false;  // the head is a BARRIER waiting for its partner
    double ready = 0.0;   // the parked head's own earliest start
    int waits_for = -1;   // the head waits for the transfer of this RECV (an index), or -1
    std::string stuck;    // why the head can never start; "" when it can
    // P2P: program indices of the stage's sends and receives in program order, how many of
    // each are resolved (a prefix: each engine moves messages in program order), when each
    // engine frees up, and per op its post time (-1: not posted) and whether it is resolved.
    std::vector<int> sends, recvs;
    std::size_t sends_done = 0, recvs_done = 0;
    double send_free = 0.0, recv_free = 0.0;
    std::vector<double> post;
    std::vector<char> resolved;
    // Per op: its dependencies, and its end once it started or its transfer resolved (a dense
    // copy of timed_'s ends, which the dependants read: 8 bytes an op instead of a TimedOp).
    std::vector<Dependencies> deps;
    std::vector<double> end;
  };

  const std::vector<Op>& Ops(int s) const {
    return schedule_.stages[static_cast<std::size_t>(s)].ops;
  }
  const Op& OpAt(int s, int i) const { return Ops(s)[static_cast<std::size_t>(i)]; }
  StageState& State(int s) { return stages_[static_cast<std::size_t>(s)]; }
  const StageState& State(int s) const { return stages_[static_cast<std::size_t>(s)]; }
  TimedOp& Timed(int s, int i) {
    return timed_[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)];
  }
  // Times stage s's head op (Start, Post): heads move in program order, so it lands at its
  // index.
  TimedOp& AppendTimed(int s, const TimedOp& timed) {
    return timed_[static_cast<std::size_t>(s)].emplace_back(timed);
  }
  int Slot(OpKind kind) const {
    switch (EngineOf(kind)) {
      case Engine::kCompute:
        return kComputeSlot;
      case Engine::kD2H:
        return kD2HSlot;
      case Engine::kH2D:
        return cost_.shared_copy_engine ? kD2HSlot : kH2DSlot;
      default:
        return -1;
    }
  }
  std::string Where(int s, int i) const {
    return OpToString(OpAt(s, i)) + " (stage " + std::to_string(s) + " op " + std::to_string(i) +
           ")";
  }

  // An own-stage dependency of an op: (kind, mb, chunk), which must come before it in the
  // program. Its end bounds the op's start, except a SEND's producer, which bounds only the
  // transfer (ResolveSends).
  struct DependencyKey {
    OpKind kind = OpKind::kForward;
    int mb = 0;
    int chunk = 0;
    bool bounds = true;
  };

  // The own-stage dependencies of `op` on stage s, in the order they are checked; how many.
  // The neighbour's data is a RECV, or the neighbour's own op when it is on this stage.
  int DependencyKeys(int s, const Op& op, std::array<DependencyKey, 3>* keys) const {
    int n = 0;
    const auto add = [&](OpKind kind, int chunk, bool bounds) {
      (*keys)[static_cast<std::size_t>(n++)] = {kind, op.mb, chunk, bounds};
    };
    const std::optional<internal::NeighbourInput> input =
        internal::InputOf(map_, s, op.kind, op.chunk);
    const auto offloaded = [&] {
      return index_.Position(s, OpKind::kReload, op.mb, op.chunk) >= 0 ||
             index_.Position(s, OpKind::kRelease, op.mb, op.chunk) >= 0;
    };
    switch (op.kind) {
      case OpKind::kForward:
        if (input) add(input->kind, input->chunk, true);
        break;
      case OpKind::kBackward:
        add(OpKind::kForward, op.chunk, true);
        if (input) add(input->kind, input->chunk, true);
        if (offloaded()) add(OpKind::kReload, op.chunk, true);
        break;
      case OpKind::kBackwardWeight:
        add(OpKind::kBackward, op.chunk, true);
        if (offloaded()) add(OpKind::kReload, op.chunk, true);
        break;
      case OpKind::kSendActivation:
        add(OpKind::kForward, op.chunk, false);
        break;
      case OpKind::kOffload:
        add(OpKind::kForward, op.chunk, true);
        break;
      case OpKind::kRecompute:
      case OpKind::kRecomputeLean:
        add(OpKind::kForward, op.chunk, true);
        // An offloaded retained block is read back first.
        if (offloaded()) add(OpKind::kReload, op.chunk, true);
        break;
      case OpKind::kSendGrad:
        add(OpKind::kBackward, op.chunk, false);
        break;
      case OpKind::kRelease:
      case OpKind::kReload:
        add(OpKind::kOffload, op.chunk, true);
        break;
      default:
        break;  // RECV and BARRIER depend on their partner only
    }
    return n;
  }

  // Op i of s's dependencies resolved to program indices, up to the first one that is missing
  // or not before it (then `stuck`: the op can never start). One sequential pass before the
  // loop, so that the loop reads dense per-stage arrays instead of the index's rows.
  Dependencies Resolve(int s, int i) const {
    std::array<DependencyKey, 3> keys;
    const int n = DependencyKeys(s, OpAt(s, i), &keys);
    Dependencies deps;
    for (int k = 0; k < n; ++k) {
      const DependencyKey& key = keys[static_cast<std::size_t>(k)];
      const int j = index_.Position(s, key.kind, key.mb, key.chunk);
      if (j < 0 || j >= i) {
        deps.stuck = true;
        break;
      }
      deps.op[static_cast<std::size_t>(k)] = j;
      deps.bounds |= static_cast<std::uint8_t>(key.bounds ? 1 << k : 0);
      deps.transfer |= static_cast<std::uint8_t>(IsP2P(key.kind) ? 1 << k : 0);
      ++deps.count;
    }
    return deps;
  }

  // Why op i of s (Resolve: stuck) can never start: its first dependency that is missing or
  // comes later. Only for the hang report; recomputed from the index.
  std::string StuckReason(int s, int i) const {
    std::array<DependencyKey, 3> keys;
    const int n = DependencyKeys(s, OpAt(s, i), &keys);
    for (int k = 0; k < n; ++k) {
      const DependencyKey& key = keys[static_cast<std::size_t>(k)];
      const int j = index_.Position(s, key.kind, key.mb, key.chunk);
      if (j >= 0 && j < i) continue;
      return "needs " + std::string(OpKindName(key.kind)) + std::to_string(key.mb) + "." +
             std::to_string(key.chunk) +
             (j < 0 ? ", which is not in its program"
                    : ", which comes later, at op " + std::to_string(j));
    }
    return "";
  }

  // The head's earliest start (a post time for SEND/RECV) from its own stage, or nullopt with
  // *why (stuck) or *waits_for (a RECV before it whose transfer is still open: the head is not
  // stuck, only waiting).
  std::optional<double> OwnReady(int s, std::string* why, int* waits_for) const {
    const StageState& state = State(s);
    const Op& op = OpAt(s, state.head);
    double t = state.issue;
    if (const int slot = Slot(op.kind); slot >= 0) {
      t = std::max(t, state.engine_free[static_cast<std::size_t>(slot)]);
    }
    const Dependencies& deps = state.deps[static_cast<std::size_t>(state.head)];
    for (int k = 0; k < deps.count; ++k) {
      const auto j = static_cast<std::size_t>(deps.op[static_cast<std::size_t>(k)]);
      if ((deps.transfer >> k & 1) != 0 && !state.resolved[j]) {
        *waits_for = static_cast<int>(j);
        return std::nullopt;
      }
      if ((deps.bounds >> k & 1) != 0) t = std::max(t, state.end[j]);
    }
    if (deps.stuck) {
      *why = StuckReason(s, state.head);
      return std::nullopt;
    }
    return t;
  }

  // Arms stages and resolves transfers until nothing changes at the current time.
  void Settle() {
    while (!to_arm_.empty() || !to_check_.empty()) {
      if (!to_check_.empty()) {
        const int s = to_check_.back();
        to_check_.pop_back();
        ResolveSends(s);
        continue;
      }
      const int s = to_arm_.back();
      to_arm_.pop_back();
      Arm(s);
    }
  }

  // The head of s changed (or the transfer it waited for resolved): post SEND/RECV heads, then
  // queue the next head, park it, or note what it waits for.
  void Arm(int s) {
    StageState& state = State(s);
    state.parked = false;
    state.waits_for = -1;
    state.stuck.clear();
    while (static_cast<std::size_t>(state.head) < Ops(s).size()) {
      const Op& op = OpAt(s, state.head);
      std::optional<double> ready = OwnReady(s, &state.stuck, &state.waits_for);
      if (!ready) return;
      if (IsP2P(op.kind)) {
        Post(s, state.head, *ready);
        ++state.head;
        continue;
      }
      if (op.kind != OpKind::kBarrier) {
        queue_.push({*ready, s});
        return;
      }
      const int partner = index_.Partner(s, state.head);
      if (partner < 0) {
        state.stuck = "has no partner on stage " + std::to_string(op.peer);
        return;
      }
      StageState& other = State(op.peer);
      if (other.parked && other.head == partner) {
        other.parked = false;
        queue_.push({std::max(*ready, other.ready), s});
        return;
      }
      state.parked = true;
      state.ready = *ready;
      return;
    }
  }

  // Posts P2P op i of s at t and looks for the transfers that may now resolve.
  void Post(int s, int i, double t) {
    StageState& state = State(s);
    state.post[static_cast<std::size_t>(i)] = t;
    const Op& op = OpAt(s, i);
    AppendTimed(s, TimedOp{s, i, op, EngineOf(op.kind), t, t, cost_.boundary_bytes});
    state.end[static_cast<std::size_t>(i)] = t;
    if (IsSend(op.kind)) {
      to_check_.push_back(s);
    } else if (index_.Partner(s, i) >= 0) {
      to_check_.push_back(op.peer);  // the sender's chain may be waiting for this receive
    }
  }

  // Resolves, in program order, the transfers behind stage s's sends whose both ends are
  // posted and whose receives are next on their receivers' recv engines.
  void ResolveSends(int s) {
    StageState& sender = State(s);
    while (sender.sends_done < sender.sends.size()) {
      const int i = sender.sends[sender.sends_done];
      if (sender.post[static_cast<std::size_t>(i)] < 0) return;
      const Op& op = OpAt(s, i);
      const int j = index_.Partner(s, i);
      if (j < 0) return;
      StageState& receiver = State(op.peer);
      if (receiver.post[static_cast<std::size_t>(j)] < 0) return;
      if (receiver.recvs_done >= receiver.recvs.size() ||
          receiver.recvs[receiver.recvs_done] != j) {
        return;  // an earlier receive of that stage is still open; it will check us again
      }
      // The producer (F or B): the SEND's one dependency, before it (Arm checked).
      const int k = sender.deps[static_cast<std::size_t>(i)].op[0];
      const double start =
          std::max({sender.post[static_cast<std::size_t>(i)],
                    receiver.post[static_cast<std::size_t>(j)],
                    sender.end[static_cast<std::size_t>(k)], sender.send_free,
                    receiver.recv_free});
      const double end = start + p2p_duration_;
      for (const auto& [stage, index] : {std::pair{s, i}, std::pair{op.peer, j}}) {
        TimedOp& timed = Timed(stage, index);
        timed.start = start;
        timed.end = end;
        State(stage).resolved[static_cast<std::size_t>(index)] = 1;
        State(stage).end[static_cast<std::size_t>(index)] = end;
      }
      sender.send_free = end;
      receiver.recv_free = end;
      ++sender.sends_done;
      ++receiver.recvs_done;
      if (receiver.waits_for == j) to_arm_.push_back(op.peer);
      // The receiver's next receive may pair with a send of another stage.
      if (receiver.recvs_done < receiver.recvs.size()) {
        const int next = receiver.recvs[receiver.recvs_done];
        if (index_.Partner(op.peer, next) >= 0) to_check_.push_back(OpAt(op.peer, next).peer);
      }
    }
  }

  // Starts the head of s (and of its partner stage, for a BARRIER) at t.
  void Fire(int s, double t) {
    const Op& op = OpAt(s, State(s).head);
    if (op.kind != OpKind::kBarrier) {
      Start(s, t, Duration(s, op, t));
      to_arm_.push_back(s);
      return;
    }
    Start(s, t, 0.0);
    Start(op.peer, t, 0.0);
    to_arm_.push_back(s);
    to_arm_.push_back(op.peer);
  }

  // Duration of a compute op or copy starting at t; decides a copy's bandwidth.
  double Duration(int s, const Op& op, double t) const {
    switch (op.kind) {
      case OpKind::kForward:
        return cost_.ForwardTime(s);
      case OpKind::kBackward:
        return cost_.BackwardTime(s, split_);
      case OpKind::kBackwardWeight:
        return cost_.WeightTime(s);
      case OpKind::kRecompute:
        return cost_.RecomputeTime(s, Recompute::kFull);
      case OpKind::kRecomputeLean:
        return cost_.RecomputeTime(s, Recompute::kLean);
      case OpKind::kOffload:
      case OpKind::kReload: {
        const bool d2h = op.kind == OpKind::kOffload;
        const auto& ends = link_end_[static_cast<std::size_t>(s / cost_.host_link_group_size)];
        const bool duplex = Later(ends[d2h ? 1 : 0], t);  // opposite direction busy at t
        const double bandwidth =
            duplex ? cost_.duplex_bandwidth : (d2h ? cost_.d2h_bandwidth : cost_.h2d_bandwidth);
        return static_cast<double>(TransferBytes(s, op)) / bandwidth;
      }
      default:
        return 0.0;
    }
  }

  // Bytes an OFFLOAD or RELOAD of `op`'s entry moves: the retained block of an entry the
  // program recomputes (schedule.h), else the whole entry.
  std::int64_t TransferBytes(int s, const Op& op) const {
    return cost_.RetainedBytes(s, op.chunk, map_, index_.RecomputeMode(s, op.mb, op.chunk));
  }

  void Start(int s, double t, double duration) {
    StageState& state = State(s);
    const Op& op = OpAt(s, state.head);
    TimedOp& timed =
        AppendTimed(s, TimedOp{s, state.head, op, EngineOf(op.kind), t, t + duration, 0});
    if (op.kind == OpKind::kOffload || op.kind == OpKind::kReload) {
      timed.bytes = TransferBytes(s, op);
      double& end = link_end_[static_cast<std::size_t>(s / cost_.host_link_group_size)]
                             [op.kind == OpKind::kOffload ? 0 : 1];
      end = std::max(end, timed.end);
    }
    if (const int slot = Slot(op.kind); slot >= 0) {
      state.engine_free[static_cast<std::size_t>(slot)] = timed.end;
    }
    state.end[static_cast<std::size_t>(state.head)] = timed.end;
    state.issue = t;
    ++state.head;
  }

  // Why the transfer behind posted P2P op i of s never happens.
  std::string OpenTransfer(int s, int i) const {
    const Op& op = OpAt(s, i);
    const int j = index_.Partner(s, i);
    if (j < 0) return "has no partner on stage " + std::to_string(op.peer);
    const StageState& state = State(s);
    const StageState& other = State(op.peer);
    const std::vector<int>& own_chain = IsSend(op.kind) ? state.sends : state.recvs;
    const std::size_t own_done = IsSend(op.kind) ? state.sends_done : state.recvs_done;
    if (own_chain[own_done] != i) {
      return "queues on stage " + std::to_string(s) + "'s " + (IsSend(op.kind) ? "send" : "recv") +
             " engine behind " + Where(s, own_chain[own_done]);
    }
    if (other.post[static_cast<std::size_t>(j)] < 0) {
      return "waits for its partner " + Where(op.peer, j) + ", but stage " +
             std::to_string(op.peer) + " is at op " + std::to_string(other.head);
    }
    const std::vector<int>& peer_chain = IsSend(op.kind) ? other.recvs : other.sends;
    const std::size_t peer_done = IsSend(op.kind) ? other.recvs_done : other.sends_done;
    return "waits for its partner " + Where(op.peer, j) + ", which queues behind " +
           Where(op.peer, peer_chain[peer_done]);
  }

  absl::Status HangReport() const {
    std::vector<internal::GridMark> marks;
    std::string detail;
    int listed = 0;
    const auto note = [&](int s, int i, const std::string& why) {
      marks.push_back({s, i});
      if (++listed > 8) return;
      detail += "\n  stage " + std::to_string(s) + " op " + std::to_string(i) + " " +
                OpToString(OpAt(s, i)) + " " + why;
    };
    for (int s = 0; s < p_; ++s) {
      const StageState& state = State(s);
      if (static_cast<std::size_t>(state.head) >= Ops(s).size()) continue;
      const Op& op = OpAt(s, state.head);
      if (state.waits_for >= 0) {
        note(s, state.head,
             "waits for the transfer of " + OpToString(OpAt(s, state.waits_for)) + " (op " +
                 std::to_string(state.waits_for) + "), which " +
                 OpenTransfer(s, state.waits_for));
      } else if (state.parked) {
        const int partner = index_.Partner(s, state.head);
        note(s, state.head,
             "waits for its partner " + Where(op.peer, partner) + ", but stage " +
                 std::to_string(op.peer) + " is at op " + std::to_string(State(op.peer).head));
      } else {
        note(s, state.head, state.stuck);
      }
    }
    // Posted messages that never move, first on each engine (the runtime waits for every send
    // and receive before the iteration ends).
    for (int s = 0; s < p_; ++s) {
      const StageState& state = State(s);
      for (const auto& [chain, done] : {std::pair{&state.sends, state.sends_done},
                                        std::pair{&state.recvs, state.recvs_done}}) {
        if (done >= chain->size()) continue;
        const int i = (*chain)[done];
        if (state.post[static_cast<std::size_t>(i)] < 0) continue;  // behind the head
        if (state.waits_for == i) continue;                          // reported above
        note(s, i, OpenTransfer(s, i));
      }
    }
    if (marks.empty()) return absl::OkStatus();
    if (listed > 8) detail += "\n  ... and " + std::to_string(listed - 8) + " more";
    return absl::FailedPreconditionError(
        "Simulate: the programs hang (a dependency never resolves):" + detail + "\n" +
        internal::FormatStepGrid(schedule_.stages, marks, "blocked op"));
  }

  const Schedule& schedule_;
  const ScheduleIndex& index_;
  const CostModel& cost_;
  const int p_;
  const VirtualStageMap map_;
  const bool split_;
  const double p2p_duration_;
  std::vector<StageState> stages_;
  std::vector<std::vector<TimedOp>> timed_;
  std::vector<std::array<double, 2>> link_end_;  // [host link][0 = D2H, 1 = H2D]: latest end
  // (start time, stage): the earliest event first; the stage breaks ties deterministically.
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>>
      queue_;
  std::vector<int> to_arm_;    // stages whose head may move at the current time
  std::vector<int> to_check_;  // stages whose send chain may resolve at the current time
};

// What RunPrograms needs of its input: a structure the event loop can index, and a cost model
// whose times and bytes add up (FailedPrecondition / InvalidArgument naming the first problem).
absl::Status CheckSimulable(const Schedule& schedule, const CostModel& cost) {
  PO_RETURN_IF_ERROR(CheckStructure(schedule, nullptr));
  PO_RETURN_IF_ERROR(Annotate(internal::CheckCostModel(cost, schedule.spec), "Simulate"));
  return Annotate(internal::CheckTotalOpTime(schedule, cost), "Simulate");
}

// Timed ops of `schedule`, or why it cannot be simulated. REQUIRES: CheckSimulable(schedule,
// cost) passed.
absl::StatusOr<std::vector<std::vector<TimedOp>>> RunPrograms(const Schedule& schedule,
                                                              const CostModel& cost) {
  const ScheduleIndex index(schedule);
  PO_RETURN_IF_ERROR(CheckStructure(schedule, &index));
  std::vector<std::vector<TimedOp>> timed;
  PO_RETURN_IF_ERROR(EventLoop(schedule, index, cost).Run(&timed));
  return timed;
}

// Program-order memory of one stage (the *units / *_bytes fields), its time-ordered samples
// (simulate.h: who holds memory when, and ties; not when `samples` is null), and its busy/end
// times.
void StageMemory(const Schedule& schedule, const CostModel& cost, int s,
                 const std::vector<TimedOp>& timed, StagePrediction* out,
                 std::vector<MemorySample>* samples) {
  const PipelineSpec& spec = schedule.spec;
  const int v = spec.chunks_per_stage;
  const OpKind frees = spec.split_backward ? OpKind::kBackwardWeight : OpKind::kBackward;
  std::int64_t units = 0, bytes = 0, plain_units = 0, plain_bytes = 0, host = 0;
  std::vector<char> on_host(
      static_cast<std::size_t>(spec.num_microbatches) * static_cast<std::size_t>(v), 0);
  struct Change {
    double time;
    int index;
    std::int64_t bytes;
    std::int64_t units;
  };
  std::vector<Change> changes;
  // Recomputed entries: F holds the retained block (which OFFLOAD / RELEASE / RELOAD move when
  // the plan offloads it); RECOMPUTE* adds what it rebuilds (RebuildBytes: the full entry, or
  // nothing where B reads the lean block in place) when it starts and, when it built a block,
  // frees the retained one when it ends (the runtime's Regrow / DropRetained).
  std::vector<Recompute> recomputed(on_host.size(), Recompute::kNone);
  for (const TimedOp& t : timed) {
    if (IsRecompute(t.op.kind)) {
      recomputed[static_cast<std::size_t>(t.op.mb) * static_cast<std::size_t>(v) +
                 static_cast<std::size_t>(t.op.chunk)] =
          t.op.kind == OpKind::kRecompute ? Recompute::kFull : Recompute::kLean;
    }
  }
  // `transfer`: an OFFLOAD / RELEASE / RELOAD's change, which the plan without offload lacks.
  const auto change = [&](std::int64_t delta_bytes, int delta_units, double when, int index,
                          bool transfer) {
    units += delta_units;
    bytes += delta_bytes;
    out->peak_units = std::max(out->peak_units, units);
    out->peak_bytes = std::max(out->peak_bytes, bytes);
    if (samples != nullptr) changes.push_back({when, index, delta_bytes, delta_units});
    if (transfer) return;
    plain_units += delta_units;
    plain_bytes += delta_bytes;
    out->peak_units_without_offload = std::max(out->peak_units_without_offload, plain_units);
    out->peak_bytes_without_offload = std::max(out->peak_bytes_without_offload, plain_bytes);
  };
  for (const TimedOp& t : timed) {
    const Op& op = t.op;
    // BARRIERs may carry chunk -1; they allocate nothing, so any size will do for them.
    const int chunk = std::max(op.chunk, 0);
    const Recompute mode =
        op.mb < 0 ? Recompute::kNone
                  : recomputed[static_cast<std::size_t>(op.mb) * static_cast<std::size_t>(v) +
                               static_cast<std::size_t>(op.chunk)];
    // What the entry holds before its RECOMPUTE* (and what OFFLOAD / RELEASE / RELOAD move);
    // RetainedBytes of a kept entry is the whole entry.
    const std::int64_t held = cost.RetainedBytes(s, chunk, spec.stage_map(), mode);
    // What its RECOMPUTE* allocates, and what it holds from there (kept: from F) until freed.
    const std::int64_t rebuild = cost.RebuildBytes(s, chunk, spec.stage_map(), mode);
    const std::int64_t for_backward = cost.BackwardHeldBytes(s, chunk, spec.stage_map(), mode);
    // F, RELEASE and RELOAD move what the entry holds then; the op that frees it, the entry.
    if (op.kind == OpKind::kForward) change(held, 1, t.start, t.index, false);
    if (op.kind == OpKind::kReload) change(held, 1, t.start, t.index, true);
    if (op.kind == OpKind::kRelease) change(-held, -1, t.start, t.index, true);
    if (IsRecompute(op.kind) && rebuild > 0) {
      change(rebuild, 0, t.start, t.index, false);
      change(-held, 0, t.end, t.index, false);
    }
    if (op.kind == frees) change(-for_backward, -1, t.end, t.index, false);
    // The host copy lives from its OFFLOAD to the op that takes the entry back: B, or the
    // RECOMPUTE* of a recomputed one (the runtime returns the host slot there).
    if (op.kind == OpKind::kOffload || op.kind == OpKind::kBackward || IsRecompute(op.kind)) {
      char& flag = on_host[static_cast<std::size_t>(op.mb) * static_cast<std::size_t>(v) +
                           static_cast<std::size_t>(op.chunk)];
      if (op.kind == OpKind::kOffload) {
        out->offloaded_bytes += held;
        host += held;
        out->host_bytes = std::max(out->host_bytes, host);
        flag = 1;
      } else if (flag) {  // its host copy is no longer needed
        host -= held;
        flag = 0;
      }
    }
    if (t.engine == Engine::kCompute) out->busy_time += t.end - t.start;
    out->end_time = std::max(out->end_time, t.end);
  }
  if (samples == nullptr) return;
  // Time order; at one instant frees first (simulate.h), then program order.
  std::stable_sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) {
    if (a.time != b.time) return a.time < b.time;
    // A recompute's free of its retained block changes no unit count, only bytes.
    const bool a_frees = a.units < 0 || a.bytes < 0;
    const bool b_frees = b.units < 0 || b.bytes < 0;
    if (a_frees != b_frees) return a_frees;
    return a.index < b.index;
  });
  MemorySample current;
  for (const Change& change : changes) {
    current.time = change.time;
    current.bytes += change.bytes;
    current.units += change.units;
    samples->push_back(current);
  }
}

std::vector<LinkTraffic> Traffic(const Timeline& timeline, const CostModel& cost, int p) {
  const int group = cost.host_link_group_size;
  std::vector<LinkTraffic> links(static_cast<std::size_t>(CeilDiv(p, group)));
  for (std::size_t k = 0; k < links.size(); ++k) links[k].name = "host:" + std::to_string(k);
  std::map<std::pair<int, int>, std::int64_t> p2p;
  for (const auto& stage : timeline.stages) {
    for (const TimedOp& t : stage) {
      LinkTraffic& own = links[static_cast<std::size_t>(t.stage / group)];
      if (t.op.kind == OpKind::kOffload) own.bytes_d2h += t.bytes;
      if (t.op.kind == OpKind::kReload) own.bytes_h2d += t.bytes;
      if (!IsSend(t.op.kind)) continue;
      p2p[{t.stage, t.op.peer}] += t.bytes;
      if (cost.p2p_shares_host_link) {
        own.bytes_d2h += t.bytes;
        links[static_cast<std::size_t>(t.op.peer / group)].bytes_h2d += t.bytes;
      }
    }
  }
  for (const auto& [ends, bytes] : p2p) {
    links.push_back(
        {"p2p:" + std::to_string(ends.first) + "->" + std::to_string(ends.second), bytes, 0});
  }
  return links;
}

}  // namespace

std::string_view EngineName(Engine engine) {
  switch (engine) {
    case Engine::kCompute:
      return "compute";
    case Engine::kSend:
      return "send";
    case Engine::kRecv:
      return "recv";
    case Engine::kD2H:
      return "D2H";
    case Engine::kH2D:
      return "H2D";
    case Engine::kNone:
      return "none";
  }
  return "none";
}

namespace internal {

absl::StatusOr<double> StepTimeWithoutTransfers(const Schedule& schedule, const CostModel& cost) {
  // What offload costs in time: the same programs without the ops that move activations.
  const auto is_transfer = [](const Op& op) {
    return IsOffload(op.kind) || op.kind == OpKind::kBarrier;
  };
  Schedule plain = schedule;
  for (StageProgram& program : plain.stages) std::erase_if(program.ops, is_transfer);
  // Checked here, not assumed: the planner runs this beside the simulation of `schedule`.
  if (absl::Status simulable = CheckSimulable(plain, cost); !simulable.ok()) {
    return Annotate(simulable, "Simulate: the programs without offload ops");
  }
  absl::StatusOr<std::vector<std::vector<TimedOp>>> plain_timed = RunPrograms(plain, cost);
  if (!plain_timed.ok()) {
    return Annotate(plain_timed.status(), "Simulate: the programs without offload ops");
  }
  double plain_step_time = 0.0;
  for (const auto& stage : *plain_timed) {
    for (const TimedOp& t : stage) plain_step_time = std::max(plain_step_time, t.end);
  }
  return plain_step_time;
}

bool HasTransfers(const Schedule& schedule) {
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) {
      if (IsOffload(op.kind) || op.kind == OpKind::kBarrier) return true;
    }
  }
  return false;
}

absl::StatusOr<Timeline> SimulateOnce(const Schedule& schedule, const CostModel& cost,
                                      SimulateDetail detail) {
  PO_RETURN_IF_ERROR(CheckSimulable(schedule, cost));
  const int p = schedule.spec.num_stages;
  Timeline timeline;
  PO_ASSIGN_OR_RETURN(timeline.stages, RunPrograms(schedule, cost));

  Predictions& predictions = timeline.predictions;
  if (detail == SimulateDetail::kStepTime) {
    // The same maximum StageMemory takes, over every op's end.
    for (const auto& stage : timeline.stages) {
      for (const TimedOp& t : stage) predictions.step_time = std::max(predictions.step_time, t.end);
    }
    predictions.step_time_without_offload = predictions.step_time;
    return timeline;
  }
  predictions.stages.resize(static_cast<std::size_t>(p));
  if (detail == SimulateDetail::kFull) timeline.memory.resize(static_cast<std::size_t>(p));
  internal::ParallelForSized(p, internal::TotalOps(schedule.stages), [&](int s) {
    StageMemory(schedule, cost, s, timeline.stages[static_cast<std::size_t>(s)],
                &predictions.stages[static_cast<std::size_t>(s)],
                detail == SimulateDetail::kFull ? &timeline.memory[static_cast<std::size_t>(s)]
                                                : nullptr);
  });
  double busy = 0.0;  // summed in stage order, whatever the threads did
  for (const StagePrediction& stage : predictions.stages) {
    predictions.step_time = std::max(predictions.step_time, stage.end_time);
    busy += stage.busy_time;
  }
  predictions.step_time_without_offload = predictions.step_time;
  predictions.bubble_ratio =
      predictions.step_time > 0 ? 1.0 - busy / (p * predictions.step_time) : 0.0;
  predictions.links = Traffic(timeline, cost, p);
  predictions.collisions = CountCollisions(timeline, cost, p);
  return timeline;
}

}  // namespace internal

absl::StatusOr<Timeline> Simulate(const Schedule& schedule, const CostModel& cost) {
  PO_ASSIGN_OR_RETURN(Timeline timeline, internal::SimulateOnce(schedule, cost));
  if (internal::HasTransfers(schedule)) {
    PO_ASSIGN_OR_RETURN(timeline.predictions.step_time_without_offload,
                        internal::StepTimeWithoutTransfers(schedule, cost));
  }
  return timeline;
}

std::vector<PeakInTime> PeaksInTime(const Timeline& timeline) {
  std::vector<PeakInTime> peaks(timeline.memory.size());
  for (std::size_t s = 0; s < timeline.memory.size(); ++s) {
    for (const MemorySample& sample : timeline.memory[s]) {
      peaks[s].units = std::max(peaks[s].units, sample.units);
      peaks[s].bytes = std::max(peaks[s].bytes, sample.bytes);
    }
  }
  return peaks;
}

int CountCollisions(const Timeline& timeline, const CostModel& cost, int num_stages) {
  const int group = std::max(1, cost.host_link_group_size);
  double horizon = 1.0;
  // Transfers by (host link, direction 0 = D2H / 1 = H2D): [start, end).
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> transfers;
  for (const auto& stage : timeline.stages) {
    for (const TimedOp& t : stage) {
      horizon = std::max(horizon, std::fabs(t.end));
      if (t.stage < 0 || t.stage >= num_stages) continue;
      if (t.op.kind == OpKind::kOffload) {
        transfers[{t.stage / group, 0}].push_back({t.start, t.end});
      }
      if (t.op.kind == OpKind::kReload) transfers[{t.stage / group, 1}].push_back({t.start, t.end});
      if (cost.p2p_shares_host_link && IsSend(t.op.kind) && t.op.peer >= 0 &&
          t.op.peer < num_stages) {
        transfers[{t.stage / group, 0}].push_back({t.start, t.end});
        transfers[{t.op.peer / group, 1}].push_back({t.start, t.end});
      }
    }
  }
  // Overlaps shorter than this are rounding, not collisions.
  const double epsilon = 1e-9 * horizon;
  int collisions = 0;
  for (auto& [link, intervals] : transfers) {
    std::sort(intervals.begin(), intervals.end());
    // Ends of the transfers still running, earliest first. An interval longer than epsilon
    // overlaps an earlier-starting one by more than epsilon iff that one ends after its
    // start + epsilon; shorter intervals cannot overlap anything by more than epsilon.
    std::priority_queue<double, std::vector<double>, std::greater<>> running;
    for (const auto& [start, end] : intervals) {
      if (end - start <= epsilon) continue;
      while (!running.empty() && running.top() <= start + epsilon) running.pop();
      collisions += static_cast<int>(running.size());
      running.push(end);
    }
  }
  return collisions;
}

}  // namespace pipeoffload
