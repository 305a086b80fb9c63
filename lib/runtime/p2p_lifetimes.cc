// P2P lifetimes (p2p_lifetimes.h): vector clocks over all stages, guarantee points of sends,
// and the per-stage walk that bounds live P2P blocks.
//
// Invariants:
//  - clock_[d][j * p + q] is the largest op index of stage q that happens before or at op j of
//    stage d (-1: none); clock_[d][j * p + d] == j. Clocks are monotone in j, so a guarantee
//    point is a binary search.
//  - An op is stamped only once everything it waits for is stamped: its predecessor, the SEND
//    whose message it consumes, and for a BARRIER its partner's predecessor (both sides of the
//    pair are stamped together). Ops left unstamped when nothing can move form a cycle.
//  - The walk mirrors the executor's ownership (stage_executor.h) of P2P blocks; see the header.
#include "pipeoffload/p2p_lifetimes.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/ir/grid_format.h"
#include "lib/ir/grid_index.h"

namespace pipeoffload {
namespace {

using internal::ScheduleIndex;

absl::Status Malformed(const std::string& detail) {
  return absl::FailedPreconditionError(absl::StrCat("AnalyzeP2P: ", detail));
}

}  // namespace

absl::StatusOr<P2PLifetimes> WalkP2P(const PipelineSpec& spec, const StageProgram& program,
                                     const std::vector<int>& guarantee_points) {
  using Key = std::tuple<bool, int, int>;  // (is_grad, mb, chunk)
  const VirtualStageMap map = spec.stage_map();
  const int d = program.stage;
  const std::vector<Op>& ops = program.ops;
  const int n = static_cast<int>(ops.size());
  auto where = [&](int j) {
    return absl::StrCat("stage ", d, ", op ", j, " (", OpToString(ops[static_cast<std::size_t>(j)]),
                        ")");
  };
  if (guarantee_points.size() != ops.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "P2P plan of stage ", d, ": ", guarantee_points.size(), " guarantee points for ", n,
        " ops (one per op: -1, or for a SEND an op index in [0, ", n, "])"));
  }
  for (int j = 0; j < n; ++j) {
    const int g = guarantee_points[static_cast<std::size_t>(j)];
    const bool send = IsSend(ops[static_cast<std::size_t>(j)].kind);
    if (send ? (g < 0 || g > n) : g != -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "P2P plan of ", where(j), ": guarantee point ", g, ", expected ",
          send ? absl::StrCat("an op index in [0, ", n, "]") : std::string("-1 (not a SEND)")));
    }
  }
  P2PLifetimes out;
  out.stage = d;
  out.live_blocks.assign(static_cast<std::size_t>(n), 0);
  out.guarantee_point = guarantee_points;
  std::set<Key> receives;      // posted, not yet consumed
  std::map<Key, int> outputs;  // F outputs / B input gradients not yet sent, by op
  std::vector<int> sends_ending(static_cast<std::size_t>(n) + 1, 0);
  int live = 0;
  // Takes the input of F/B op j: a received message, or the neighbouring chunk's output when
  // that virtual stage is on this stage too (p = 1, V's turn). Returns 1: a block is consumed.
  auto take = [&](int j, const Op& op, bool grad,
                  const internal::NeighbourInput& input) -> absl::StatusOr<int> {
    const int neighbour_chunk = input.chunk;
    if (!input.local) {
      if (receives.erase(Key(grad, op.mb, op.chunk)) == 1) return 1;
      return Malformed(absl::StrCat(where(j), ": no ", grad ? "RECV_B" : "RECV_F", op.mb, ".",
                                    op.chunk, " was posted before it"));
    }
    if (outputs.erase(Key(grad, op.mb, neighbour_chunk)) == 1) return 1;
    return Malformed(absl::StrCat(where(j), ": its input, the output of ", grad ? "B" : "F", op.mb,
                                  ".", neighbour_chunk, ", is not produced before it"));
  };
  for (int j = 0; j < n; ++j) {
    const Op& op = ops[static_cast<std::size_t>(j)];
    live -= sends_ending[static_cast<std::size_t>(j)];
    const int l = map.virtual_stage(d, op.chunk);
    int allocated = 0, consumed = 0;
    switch (op.kind) {
      case OpKind::kRecvActivation:
      case OpKind::kRecvGrad:
        if (!receives.insert(Key(op.kind == OpKind::kRecvGrad, op.mb, op.chunk)).second) {
          return Malformed(absl::StrCat(where(j), ": posted again before its data was consumed"));
        }
        allocated = 1;
        break;
      case OpKind::kForward:
      case OpKind::kBackward: {
        const bool grad = op.kind == OpKind::kBackward;
        if (const auto input = internal::InputOf(map, d, op.kind, op.chunk)) {
          absl::StatusOr<int> taken = take(j, op, grad, *input);
          if (!taken.ok()) return taken.status();
          consumed = *taken;
        }
        if (grad ? l > 0 : l < map.num_virtual_stages() - 1) {
          allocated = 1;
          outputs[Key(grad, op.mb, op.chunk)] = j;
        }
        break;
      }
      case OpKind::kSendActivation:
      case OpKind::kSendGrad: {
        const bool grad = op.kind == OpKind::kSendGrad;
        if (outputs.erase(Key(grad, op.mb, op.chunk)) != 1) {
          return Malformed(absl::StrCat(where(j), ": it sends the output of ", grad ? "B" : "F",
                                        op.mb, ".", op.chunk,
                                        ", which has not run before it or was already sent"));
        }
        const int g = guarantee_points[static_cast<std::size_t>(j)];
        ++sends_ending[static_cast<std::size_t>(std::max(g, j + 1))];
        break;
      }
      default:
        break;
    }
    const int during = live + allocated;
    out.live_blocks[static_cast<std::size_t>(j)] = during;
    if (during > out.peak_blocks) {
      out.peak_blocks = during;
      out.peak_op = j;
    }
    live += allocated - consumed;
  }
  if (!receives.empty()) {
    const auto& [grad, mb, chunk] = *receives.begin();
    return Malformed(absl::StrCat("stage ", d, ": ", grad ? "RECV_B" : "RECV_F", mb, ".", chunk,
                                  " is never consumed"));
  }
  if (!outputs.empty()) {
    return Malformed(
        absl::StrCat(where(outputs.begin()->second), ": its output is never sent or consumed"));
  }
  return out;
}

namespace {

class Analyzer {
 public:
  Analyzer(const Schedule& schedule, const ScheduleIndex& index, P2PGuarantee guarantee)
      : schedule_(schedule),
        index_(index),
        guarantee_(guarantee),
        p_(schedule.spec.num_stages),
        num_virtual_(schedule.spec.num_virtual_stages()) {}

  absl::StatusOr<std::vector<P2PLifetimes>> Run() {
    if (absl::Status status = FindMessages(); !status.ok()) return status;
    if (absl::Status status = StampClocks(); !status.ok()) return status;
    std::vector<P2PLifetimes> result;
    for (int d = 0; d < p_; ++d) {
      absl::StatusOr<P2PLifetimes> stage = Walk(d);
      if (!stage.ok()) return stage.status();
      result.push_back(*std::move(stage));
    }
    return result;
  }

 private:
  const std::vector<Op>& Ops(int stage) const {
    return schedule_.stages[static_cast<std::size_t>(stage)].ops;
  }
  int Size(int stage) const { return static_cast<int>(Ops(stage).size()); }
  std::string Where(int stage, int index) const {
    return internal::DescribeOp(schedule_.stages, stage, index);
  }
  int Clock(int stage, int index, int of) const {
    return clock_[static_cast<std::size_t>(stage)]
                 [static_cast<std::size_t>(index) * static_cast<std::size_t>(p_) +
                  static_cast<std::size_t>(of)];
  }

  // Every rendezvous op has its partner; every RECV's message is consumed by a later F/B of its
  // stage, which gets the SEND as its incoming edge.
  absl::Status FindMessages() {
    incoming_.resize(static_cast<std::size_t>(p_));
    for (int d = 0; d < p_; ++d) {
      incoming_[static_cast<std::size_t>(d)].assign(Ops(d).size(), {-1, -1});
    }
    for (int d = 0; d < p_; ++d) {
      for (int i = 0; i < Size(d); ++i) {
        const Op& op = Ops(d)[static_cast<std::size_t>(i)];
        if (!HasPeer(op.kind)) continue;
        const int partner = index_.Partner(d, i);
        if (partner < 0) {
          return Malformed(absl::StrCat(
              Where(d, i), " has no matching ",
              op.kind == OpKind::kBarrier ? std::string("BARRIER")
                                          : std::string(OpKindName(internal::PartnerKind(op.kind))),
              " on stage ", op.peer));
        }
        if (op.kind != OpKind::kRecvActivation && op.kind != OpKind::kRecvGrad) continue;
        const OpKind consumer_kind =
            op.kind == OpKind::kRecvActivation ? OpKind::kForward : OpKind::kBackward;
        const int consumer = index_.Position(d, consumer_kind, op.mb, op.chunk);
        if (consumer <= i) {
          return Malformed(absl::StrCat(
              Where(d, i), ": no later ", std::string(OpKindName(consumer_kind)), op.mb, ".",
              op.chunk, " consumes its message (",
              consumer < 0 ? std::string("none on this stage") : Where(d, consumer), ")"));
        }
        incoming_[static_cast<std::size_t>(d)][static_cast<std::size_t>(consumer)] = {op.peer,
                                                                                      partner};
      }
    }
    return absl::OkStatus();
  }

  // Stamps op j of stage d from its predecessor, joined with `other` (a clock row or null).
  void Stamp(int d, int j, const int* other) {
    std::vector<int>& row = clock_[static_cast<std::size_t>(d)];
    const std::size_t at = static_cast<std::size_t>(j) * static_cast<std::size_t>(p_);
    for (int q = 0; q < p_; ++q) {
      const std::size_t k = at + static_cast<std::size_t>(q);
      int value = j > 0 ? row[k - static_cast<std::size_t>(p_)] : -1;
      if (other != nullptr) value = std::max(value, other[q]);
      row[k] = value;
    }
    row[at + static_cast<std::size_t>(d)] = j;
  }
  const int* Row(int stage, int index) const {
    return clock_[static_cast<std::size_t>(stage)].data() +
           static_cast<std::size_t>(index) * static_cast<std::size_t>(p_);
  }

  absl::Status StampClocks() {
    clock_.resize(static_cast<std::size_t>(p_));
    for (int d = 0; d < p_; ++d) {
      clock_[static_cast<std::size_t>(d)].assign(Ops(d).size() * static_cast<std::size_t>(p_), -1);
    }
    std::vector<int> cursor(static_cast<std::size_t>(p_), 0);
    std::vector<int> joined(static_cast<std::size_t>(p_));
    for (bool moved = true; moved;) {
      moved = false;
      for (int d = 0; d < p_; ++d) {
        int& j = cursor[static_cast<std::size_t>(d)];
        while (j < Size(d)) {
          const Op& op = Ops(d)[static_cast<std::size_t>(j)];
          const auto [q, s] = incoming_[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)];
          if (q >= 0) {
            if (cursor[static_cast<std::size_t>(q)] <= s) break;  // its SEND is not stamped
            Stamp(d, j, Row(q, s));
          } else if (op.kind == OpKind::kBarrier) {
            const int b = index_.Partner(d, j);
            int& peer_at = cursor[static_cast<std::size_t>(op.peer)];
            if (peer_at != b) break;  // the peer has not reached its side of the pair
            // Both sides happen after everything before either side.
            for (int k = 0; k < p_; ++k) {
              const int mine = j > 0 ? Row(d, j - 1)[k] : -1;
              const int theirs = b > 0 ? Row(op.peer, b - 1)[k] : -1;
              joined[static_cast<std::size_t>(k)] = std::max(mine, theirs);
            }
            joined[static_cast<std::size_t>(d)] = j;
            joined[static_cast<std::size_t>(op.peer)] = b;
            Stamp(d, j, joined.data());
            Stamp(op.peer, b, joined.data());
            ++peer_at;
          } else {
            Stamp(d, j, nullptr);
          }
          ++j;
          moved = true;
        }
      }
    }
    std::string blocked;
    for (int d = 0; d < p_; ++d) {
      const int j = cursor[static_cast<std::size_t>(d)];
      if (j == Size(d)) continue;
      const Op& op = Ops(d)[static_cast<std::size_t>(j)];
      const auto [q, s] = incoming_[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)];
      absl::StrAppend(&blocked, blocked.empty() ? "" : "; ", Where(d, j), " waits for ");
      if (q >= 0) {
        absl::StrAppend(&blocked, "the message of ", Where(q, s));
      } else {
        absl::StrAppend(&blocked, "its partner ", Where(op.peer, index_.Partner(d, j)));
      }
    }
    if (blocked.empty()) return absl::OkStatus();
    return Malformed(absl::StrCat(
        "the messages cannot be ordered (a cycle of waits: the schedule would deadlock): ",
        blocked));
  }

  // What stage d knows of stage q when it is about to run op j, before any wait inside j: the
  // clock of j, except for a BARRIER, whose partner's side completes only once d has reached
  // it (its predecessor's clock). An F/B's own clock is fine: the message it waits for depends
  // on nothing d does from j on. Monotone in j.
  int EntryClock(int d, int j, int q) const {
    if (Ops(d)[static_cast<std::size_t>(j)].kind != OpKind::kBarrier) return Clock(d, j, q);
    return j > 0 ? Clock(d, j - 1, q) : -1;
  }

  // The first op of stage d whose entry clock has seen op r of stage q; Size(d) when none.
  int GuaranteePoint(int d, int q, int r) const {
    int lo = 0, hi = Size(d);
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (EntryClock(d, mid, q) >= r) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  // The op of stage q that must happen before a wait for the message q receives at op r: r
  // itself, or the last BARRIER of q between r and the F/B consuming the message. A stage
  // blocked inside Transport::Barrier serves none of its posted receives, and some transports
  // move a message only while its receiver tests or waits (the local transport with copiers);
  // past its last such BARRIER, q only runs, or waits while serving its receives
  // (executor_p2p.cc).
  // With kMessageConsumed: the consuming F/B itself (the message has arrived by its end).
  int WaitTarget(int q, int r) const {
    const Op& recv = Ops(q)[static_cast<std::size_t>(r)];
    const int consumer =
        index_.Position(q, recv.kind == OpKind::kRecvGrad ? OpKind::kBackward : OpKind::kForward,
                        recv.mb, recv.chunk);  // > r: FindMessages checked it
    if (guarantee_ == P2PGuarantee::kMessageConsumed) return consumer;
    for (int k = consumer - 1; k > r; --k) {
      if (Ops(q)[static_cast<std::size_t>(k)].kind == OpKind::kBarrier) return k;
    }
    return r;
  }

  absl::StatusOr<P2PLifetimes> Walk(int d) const {
    std::vector<int> guarantee(Ops(d).size(), -1);
    for (int j = 0; j < Size(d); ++j) {
      const Op& op = Ops(d)[static_cast<std::size_t>(j)];
      if (IsSend(op.kind)) {
        guarantee[static_cast<std::size_t>(j)] =
            GuaranteePoint(d, op.peer, WaitTarget(op.peer, index_.Partner(d, j)));
      }
    }
    return WalkP2P(schedule_.spec, schedule_.stages[static_cast<std::size_t>(d)], guarantee);
  }

  const Schedule& schedule_;
  const ScheduleIndex& index_;
  const P2PGuarantee guarantee_;
  const int p_;
  const int num_virtual_;
  // [stage][op]: (stage, op index) of the SEND whose message the op consumes, or (-1, -1).
  std::vector<std::vector<std::pair<int, int>>> incoming_;
  std::vector<std::vector<int>> clock_;  // [stage][op * p + stage]
};

}  // namespace

absl::StatusOr<std::vector<P2PLifetimes>> AnalyzeP2P(const Schedule& schedule,
                                                      P2PGuarantee guarantee) {
  std::optional<internal::GridViolation> found = internal::CheckShape(schedule);
  if (!found) found = internal::CheckPeers(schedule);
  if (found) {
    return Malformed(internal::FormatViolation(schedule.stages, *found));
  }
  const ScheduleIndex index(schedule);
  for (auto cls : {ScheduleIndex::kP2PDuplicate, ScheduleIndex::kComputeDuplicate}) {
    if (const auto& duplicate = index.Duplicate(cls)) {
      return Malformed(internal::FormatViolation(schedule.stages, *duplicate));
    }
  }
  return Analyzer(schedule, index, guarantee).Run();
}

std::int64_t P2PBoundBytes(const P2PLifetimes& lifetimes, std::int64_t boundary_bytes,
                           std::int64_t alignment) {
  const std::int64_t a = std::max<std::int64_t>(alignment, 1);
  return static_cast<std::int64_t>(lifetimes.peak_blocks) * ((boundary_bytes + a - 1) / a * a);
}

}  // namespace pipeoffload
