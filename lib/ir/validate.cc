// Validate: checks a Schedule against every invariant of validate.h and reports the first
// violation with the step x stage grid around it. No timing; see lib/sim for that.
//
// The checks run as passes in this order, each over stages 0..p-1 and each stage's ops in
// program order; the first pass that finds anything reports its first finding:
//   shape (1) -> matching (5) -> completeness (2) -> local order (3) -> dataflow (4)
//   -> offload life cycle (7) -> recompute life cycle (8) -> deadlock (6).
// Matching runs before completeness and dataflow so that a lone SEND or RECV is reported as the
// unmatched message it is rather than as the missing input of the F it feeds; deadlock runs last
// because its rendezvous simulation needs every partner to exist.
// Cost: O(total ops + p*m*v) time and memory (grid_index.h); the deadlock check visits each op
// once.
#include "pipeoffload/validate.h"

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/ir/grid_format.h"
#include "lib/ir/grid_index.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload {
namespace {

using internal::GridMark;
using internal::GridViolation;
using internal::ScheduleIndex;
using internal::ViolationAt;

// "RECV_F0.1<-0": how an op that should exist would print.
std::string Named(OpKind kind, int mb, int chunk, int peer = -1) {
  return OpToString(Op{kind, mb, chunk, peer});
}

class Validator {
 public:
  Validator(const Schedule& schedule, const ScheduleIndex& index)
      : schedule_(schedule),
        index_(index),
        p_(schedule.spec.num_stages),
        m_(schedule.spec.num_microbatches),
        v_(schedule.spec.chunks_per_stage),
        map_(schedule.spec.stage_map()),
        split_(schedule.spec.split_backward) {}

  std::optional<GridViolation> Run() {
    if (auto found = Matching()) return found;
    if (auto found = Completeness()) return found;
    if (auto found = LocalOrder()) return found;
    if (auto found = Dataflow()) return found;
    if (auto found = OffloadLifeCycle()) return found;
    if (auto found = RecomputeLifeCycle()) return found;
    return Deadlock();
  }

 private:
  const std::vector<Op>& Ops(int stage) const {
    return schedule_.stages[static_cast<std::size_t>(stage)].ops;
  }
  int Pos(int stage, OpKind kind, int mb, int chunk) const {
    return index_.Position(stage, kind, mb, chunk);
  }
  // Where op `index` of `stage` would be said to sit, for "(op 7)" and "(none)".
  static std::string At(int index) {
    return index < 0 ? "none on this stage" : "op " + std::to_string(index);
  }

  // Invariant 5: peers, duplicates, a partner for every SEND/RECV and BARRIER.
  std::optional<GridViolation> Matching() const {
    if (auto found = internal::CheckPeers(schedule_)) return found;
    if (const auto& dup = index_.Duplicate(ScheduleIndex::kP2PDuplicate)) return *dup;
    // BARRIERs of stage a with peer b, keyed a * p + b, to say how many the peer has.
    std::unordered_map<long long, int> barrier_totals;
    for (int d = 0; d < p_; ++d) {
      for (const Op& op : Ops(d)) {
        if (op.kind == OpKind::kBarrier) ++barrier_totals[static_cast<long long>(d) * p_ + op.peer];
      }
    }
    for (int d = 0; d < p_; ++d) {
      std::unordered_map<int, int> barriers_seen;
      const std::vector<Op>& ops = Ops(d);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const int index = static_cast<int>(i);
        if (op.kind == OpKind::kBarrier) {
          const int k = ++barriers_seen[op.peer];
          if (index_.Partner(d, index) >= 0) continue;
          return ViolationAt(
              internal::kMatching, d, index,
              "BARRIER without partner: it is this stage's BARRIER #" + std::to_string(k) +
                  " with stage " + std::to_string(op.peer) + ", but stage " +
                  std::to_string(op.peer) + " has only " +
                  std::to_string(barrier_totals[static_cast<long long>(op.peer) * p_ + d]) +
                  " BARRIERs with stage " + std::to_string(d));
        }
        if (!IsP2P(op.kind) || index_.Partner(d, index) >= 0) continue;
        const int neighbour =
            internal::NeighbourVirtualStage(op.kind, map_.virtual_stage(d, op.chunk));
        const std::string expected =
            Named(internal::PartnerKind(op.kind), op.mb, map_.chunk_of(neighbour), d);
        return ViolationAt(
            internal::kMatching, d, index,
            std::string(IsSend(op.kind) ? "SEND without RECV" : "RECV without SEND") +
                ": no matching " + expected + " on stage " + std::to_string(op.peer));
      }
    }
    return std::nullopt;
  }

  // Invariant 2: F and B (and W iff split) of every (mb, chunk) exactly once per stage.
  std::optional<GridViolation> Completeness() const {
    if (const auto& dup = index_.Duplicate(ScheduleIndex::kComputeDuplicate)) return *dup;
    for (int d = 0; d < p_; ++d) {
      const std::vector<Op>& ops = Ops(d);
      for (std::size_t i = 0; i < ops.size() && !split_; ++i) {
        if (ops[i].kind == OpKind::kBackwardWeight) {
          return ViolationAt(internal::kCompleteness, d, static_cast<int>(i),
                             "a W op, but spec.split_backward is false (B is the full backward)");
        }
      }
      for (int mb = 0; mb < m_; ++mb) {
        for (int c = 0; c < v_; ++c) {
          const int f = Pos(d, OpKind::kForward, mb, c);
          const int b = Pos(d, OpKind::kBackward, mb, c);
          const int w = split_ ? Pos(d, OpKind::kBackwardWeight, mb, c) : 0;
          if (f < 0 && b < 0) {
            return ViolationAt(internal::kCompleteness, d, -1,
                               "missing F and B: the stage never runs " +
                                   Named(OpKind::kForward, mb, c) + " nor " +
                                   Named(OpKind::kBackward, mb, c));
          }
          if (f < 0) {
            return ViolationAt(
                internal::kCompleteness, d, b,
                "missing F: " + Named(OpKind::kForward, mb, c) + " never runs on this stage");
          }
          if (b < 0) {
            return ViolationAt(
                internal::kCompleteness, d, f,
                "missing B: " + Named(OpKind::kBackward, mb, c) + " never runs on this stage");
          }
          if (w < 0) {
            return ViolationAt(internal::kCompleteness, d, b,
                               "missing W: " + Named(OpKind::kBackwardWeight, mb, c) +
                                   " never runs on this stage (spec.split_backward is true)");
          }
        }
      }
    }
    return std::nullopt;
  }

  // Invariant 3: F < B < W of one entry on its stage.
  std::optional<GridViolation> LocalOrder() const {
    for (int d = 0; d < p_; ++d) {
      const std::vector<Op>& ops = Ops(d);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const int index = static_cast<int>(i);
        if (op.kind == OpKind::kBackward) {
          const int f = Pos(d, OpKind::kForward, op.mb, op.chunk);
          if (f > index) {
            return ViolationAt(internal::kLocalOrder, d, index,
                               "B before F: its F runs later, at op " + std::to_string(f));
          }
        } else if (op.kind == OpKind::kBackwardWeight) {
          const int b = Pos(d, OpKind::kBackward, op.mb, op.chunk);
          if (b > index) {
            return ViolationAt(internal::kLocalOrder, d, index,
                               "W before B: its B runs later, at op " + std::to_string(b));
          }
        }
      }
    }
    return std::nullopt;
  }

  // Invariant 4: each F/B has its input before it; each SEND follows the op producing its data.
  std::optional<GridViolation> Dataflow() const {
    for (int d = 0; d < p_; ++d) {
      const std::vector<Op>& ops = Ops(d);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const int index = static_cast<int>(i);
        std::string problem;
        if (const auto in = internal::InputOf(map_, d, op.kind, op.chunk)) {
          const std::string subject(OpKindName(op.kind));
          const int l = map_.virtual_stage(d, op.chunk) + (op.kind == OpKind::kForward ? -1 : 1);
          problem = in->local
                        ? NeedsBefore(d, index, subject,
                                      "local " + subject + " of virtual stage " + std::to_string(l),
                                      in->kind, op.mb, in->chunk, -1)
                        : NeedsBefore(d, index, subject, std::string(OpKindName(in->kind)),
                                      in->kind, op.mb, op.chunk, map_.stage_of(l));
        } else if (op.kind == OpKind::kSendActivation) {
          problem =
              NeedsBefore(d, index, "SEND_F", "producer F", OpKind::kForward, op.mb, op.chunk, -1);
        } else if (op.kind == OpKind::kSendGrad) {
          problem =
              NeedsBefore(d, index, "SEND_B", "producer B", OpKind::kBackward, op.mb, op.chunk, -1);
        }
        if (!problem.empty()) return ViolationAt(internal::kDataflow, d, index, problem);
      }
    }
    return std::nullopt;
  }

  // "" when (kind, mb, chunk) sits before op `index` of `stage`; else "<subject> without its
  // <role>" (absent) or "<subject> before its <role>" (later), and where it is.
  std::string NeedsBefore(int stage, int index, const std::string& subject, const std::string& role,
                          OpKind kind, int mb, int chunk, int peer) const {
    const int at = Pos(stage, kind, mb, chunk);
    if (at >= 0 && at < index) return "";
    const std::string name = Named(kind, mb, chunk, peer);
    if (at < 0) {
      return subject + " without its " + role + ": " + name + " is not in this stage's program";
    }
    return subject + " before its " + role + ": " + name + " is later, at op " + std::to_string(at);
  }

  // Invariant 7: F < OFFLOAD < RELEASE < RELOAD < B per entry, each once, all three or none.
  std::optional<GridViolation> OffloadLifeCycle() const {
    if (const auto& dup = index_.Duplicate(ScheduleIndex::kOffloadDuplicate)) return *dup;
    for (int d = 0; d < p_; ++d) {
      const std::vector<Op>& ops = Ops(d);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const int index = static_cast<int>(i);
        if (!IsOffload(op.kind) && op.kind != OpKind::kBackward) continue;
        const int f = Pos(d, OpKind::kForward, op.mb, op.chunk);
        const int offload = Pos(d, OpKind::kOffload, op.mb, op.chunk);
        const int release = Pos(d, OpKind::kRelease, op.mb, op.chunk);
        const int reload = Pos(d, OpKind::kReload, op.mb, op.chunk);
        std::string problem;
        if (op.kind == OpKind::kOffload) {
          if (f > index) {
            problem = "OFFLOAD before F: its F runs later, at op " + std::to_string(f);
          } else if (release < 0) {
            problem = "OFFLOAD without RELEASE: the device copy is never freed";
          } else if (reload < 0) {
            problem =
                "OFFLOAD without RELOAD: the entry is left on the host at the end of the "
                "iteration and its B has no activations";
          }
        } else if (op.kind == OpKind::kRelease) {
          if (offload < 0) {
            problem = "RELEASE without OFFLOAD: it would free the only copy";
          } else if (offload > index) {
            problem = "RELEASE before OFFLOAD: the D2H copy starts later, at op " +
                      std::to_string(offload);
          }
        } else if (op.kind == OpKind::kReload) {
          if (offload < 0) {
            problem = "RELOAD without OFFLOAD: nothing was copied to the host";
          } else if (release < 0 || release > index) {
            problem = "RELOAD before RELEASE: the device copy is still resident (RELEASE: " +
                      At(release) + ")";
          }
        } else if (offload >= 0 || release >= 0 || reload >= 0) {  // B of an offloaded entry
          if (reload < 0 || reload > index) {
            problem =
                "B before RELOAD: the entry is offloaded and its RELOAD is " +
                (reload < 0 ? std::string("missing") : "later, at op " + std::to_string(reload));
          }
        }
        if (!problem.empty()) return ViolationAt(internal::kOffloadLifeCycle, d, index, problem);
      }
    }
    return std::nullopt;
  }

  // Invariant 8: a RECOMPUTE* sits between its entry's F and B, once per entry and of one kind.
  // An entry it recomputes may be offloaded too: F kept only the retained block, and that is
  // what OFFLOAD / RELEASE / RELOAD move, so the block must be back before the recompute reads
  // it (F < OFFLOAD < RELEASE < RELOAD < RECOMPUTE* < B; the rest of the triple's order is
  // invariant 7's).
  std::optional<GridViolation> RecomputeLifeCycle() const {
    for (int d = 0; d < p_; ++d) {
      const std::vector<Op>& ops = Ops(d);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        if (!IsRecompute(op.kind)) continue;
        const int index = static_cast<int>(i);
        const OpKind other =
            op.kind == OpKind::kRecompute ? OpKind::kRecomputeLean : OpKind::kRecompute;
        const int f = Pos(d, OpKind::kForward, op.mb, op.chunk);
        const int b = Pos(d, OpKind::kBackward, op.mb, op.chunk);
        const int reload = Pos(d, OpKind::kReload, op.mb, op.chunk);
        std::string problem;
        if (const int twin = Pos(d, other, op.mb, op.chunk); twin >= 0) {
          problem = "two recompute choices for one entry: " + Named(other, op.mb, op.chunk) +
                    " is at op " + std::to_string(twin) +
                    " (RECOMPUTE or RECOMPUTE_LEAN, not both)";
        } else if (f > index) {
          problem = std::string(OpKindName(op.kind)) + " before F: its F runs later, at op " +
                    std::to_string(f);
        } else if (b < index) {
          problem = std::string(OpKindName(op.kind)) + " after B: its B ran at op " +
                    std::to_string(b) + " (a recompute rebuilds the entry B reads)";
        } else if (reload > index) {
          problem = std::string(OpKindName(op.kind)) +
                    " before RELOAD: the entry's retained block is on the host until " +
                    Named(OpKind::kReload, op.mb, op.chunk) + " at op " +
                    std::to_string(reload) + " (an offloaded retained block comes back first)";
        }
        if (!problem.empty()) return ViolationAt(internal::kRecomputeLifeCycle, d, index, problem);
      }
    }
    return std::nullopt;
  }

  // Invariant 6: run every stage with zero durations; SEND/RECV/BARRIER block until the partner
  // is at the head of its stage. Each stage is re-examined only when a partner moved it.
  std::optional<GridViolation> Deadlock() const {
    std::vector<int> cursor(static_cast<std::size_t>(p_), 0);
    std::vector<int> work;
    for (int d = p_ - 1; d >= 0; --d) work.push_back(d);
    while (!work.empty()) {
      const int d = work.back();
      work.pop_back();
      const std::vector<Op>& ops = Ops(d);
      int& at = cursor[static_cast<std::size_t>(d)];
      while (static_cast<std::size_t>(at) < ops.size()) {
        const Op& op = ops[static_cast<std::size_t>(at)];
        if (!HasPeer(op.kind)) {
          ++at;
          continue;
        }
        const int partner = index_.Partner(d, at);
        int& peer_at = cursor[static_cast<std::size_t>(op.peer)];
        if (peer_at != partner) break;  // the peer will pick us up when it gets there
        ++at;
        ++peer_at;
        work.push_back(op.peer);
      }
    }
    std::vector<GridMark> marks;
    std::string blocked;
    int first = -1, listed = 0;
    for (int d = 0; d < p_; ++d) {
      const int at = cursor[static_cast<std::size_t>(d)];
      if (static_cast<std::size_t>(at) == Ops(d).size()) continue;
      marks.push_back({d, at});
      if (first < 0) first = d;
      if (++listed > 8) continue;
      const Op& op = Ops(d)[static_cast<std::size_t>(at)];
      const int partner = index_.Partner(d, at);
      blocked += "; stage " + std::to_string(d) + " blocks at op " + std::to_string(at) + " " +
                 OpToString(op) + " waiting for stage " + std::to_string(op.peer) +
                 " to reach op " + std::to_string(partner) + " " +
                 OpToString(Ops(op.peer)[static_cast<std::size_t>(partner)]);
    }
    if (first < 0) return std::nullopt;
    if (listed > 8) blocked += "; and " + std::to_string(listed - 8) + " more stages";
    GridViolation violation =
        ViolationAt(internal::kDeadlock, first, cursor[static_cast<std::size_t>(first)],
                    "deadlock under blocking rendezvous: no stage can make progress" + blocked);
    violation.marks = std::move(marks);
    return violation;
  }

  const Schedule& schedule_;
  const ScheduleIndex& index_;
  const int p_, m_, v_;
  const VirtualStageMap map_;
  const bool split_;
};

}  // namespace

absl::Status Validate(const Schedule& schedule) {
  std::optional<GridViolation> found = internal::CheckShape(schedule);
  if (!found) {
    const ScheduleIndex index(schedule);
    found = Validator(schedule, index).Run();
  }
  if (!found) return absl::OkStatus();
  const std::string legend =
      found->invariant == internal::kDeadlock ? "blocked op" : "the op at fault";
  return absl::FailedPreconditionError("Validate: " +
                                       internal::FormatViolation(schedule.stages, *found, legend));
}

}  // namespace pipeoffload
