// The step x stage grid of a schedule as data: where each (kind, mb, chunk) op sits on each
// stage, and which op each rendezvous op (SEND/RECV/BARRIER) pairs with. Shared by Validate and
// Simulate, with the structural checks both need before they can index anything safely
// (invariant 1, shape, and the peer part of invariant 5). Header-only for the same reason as
// grid_format.h. Builds in O(total ops + p*m*v); no quadratic scans.
#ifndef PIPEOFFLOAD_LIB_IR_GRID_INDEX_H_
#define PIPEOFFLOAD_LIB_IR_GRID_INDEX_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lib/base/checked_math.h"
#include "lib/ir/grid_format.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// The invariants of validate.h, by their numbers there.
enum Invariant : int {
  kShape = 1,
  kCompleteness = 2,
  kLocalOrder = 3,
  kDataflow = 4,
  kMatching = 5,
  kDeadlock = 6,
  kOffloadLifeCycle = 7,
  kRecomputeLifeCycle = 8,
};

// Ops over every stage's program: how large a schedule is, for the loops that split their
// work across threads only for large ones (ParallelForSized).
inline std::int64_t TotalOps(const std::vector<StageProgram>& programs) {
  std::int64_t total = 0;
  for (const StageProgram& program : programs) {
    total += static_cast<std::int64_t>(program.ops.size());
  }
  return total;
}

inline std::string_view InvariantName(int invariant) {
  switch (invariant) {
    case kShape:
      return "shape";
    case kCompleteness:
      return "completeness";
    case kLocalOrder:
      return "local order";
    case kDataflow:
      return "dataflow";
    case kMatching:
      return "matching";
    case kDeadlock:
      return "deadlock";
    case kOffloadLifeCycle:
      return "offload life cycle";
    case kRecomputeLifeCycle:
      return "recompute life cycle";
    default:
      return "?";
  }
}

// The first problem a check found. stage/index are -1 when it concerns no single op.
struct GridViolation {
  int invariant = 0;
  int stage = -1;
  int index = -1;
  std::string detail;
  std::vector<GridMark> marks;  // cells to mark in the grid; empty = no grid
};

inline GridViolation ViolationAt(int invariant, int stage, int index, std::string detail) {
  GridViolation violation{invariant, stage, index, std::move(detail), {}};
  if (stage >= 0 && index >= 0) violation.marks.push_back({stage, index});
  return violation;
}

// "invariant 4 (dataflow) violated at stage 1, op 2 (F0.0): <detail>" and the grid below it.
inline std::string FormatViolation(const std::vector<StageProgram>& programs,
                                   const GridViolation& violation,
                                   const std::string& legend = "the op at fault") {
  std::string out = "invariant " + std::to_string(violation.invariant) + " (" +
                    std::string(InvariantName(violation.invariant)) + ") violated";
  if (violation.stage >= 0) out += " at " + DescribeOp(programs, violation.stage, violation.index);
  out += ": " + violation.detail;
  if (!violation.marks.empty()) out += "\n" + FormatStepGrid(programs, violation.marks, legend);
  return out;
}

// SEND_F <-> RECV_F, SEND_B <-> RECV_B.
inline OpKind PartnerKind(OpKind kind) {
  switch (kind) {
    case OpKind::kSendActivation:
      return OpKind::kRecvActivation;
    case OpKind::kRecvActivation:
      return OpKind::kSendActivation;
    case OpKind::kSendGrad:
      return OpKind::kRecvGrad;
    case OpKind::kRecvGrad:
      return OpKind::kSendGrad;
    default:
      return kind;
  }
}

// The virtual stage a P2P op at virtual stage l talks to: l+1 for SEND_F and RECV_B, l-1 for
// RECV_F and SEND_B. May fall outside [0, L); the caller checks.
inline int NeighbourVirtualStage(OpKind kind, int virtual_stage) {
  const bool downstream = kind == OpKind::kSendActivation || kind == OpKind::kRecvGrad;
  return downstream ? virtual_stage + 1 : virtual_stage - 1;
}

// What F or B of (mb, chunk) on `stage` waits for from its neighbouring virtual stage (l - 1 for
// F, l + 1 for B): the RECV_F / RECV_B on this stage when that neighbour lives on another stage,
// or the neighbour's own F / B when it lives on this one (p == 1, or V placement's turn, virtual
// stages p - 1 and p on stage p - 1), which hands the data over locally. nullopt for F of the
// first and B of the last virtual stage, and for every other kind.
struct NeighbourInput {
  OpKind kind = OpKind::kForward;
  int chunk = 0;       // the chunk, on `stage`, of the op named by `kind`
  bool local = false;  // the neighbour's own op (no message)
};
inline std::optional<NeighbourInput> InputOf(const VirtualStageMap& map, int stage, OpKind kind,
                                             int chunk) {
  if (kind != OpKind::kForward && kind != OpKind::kBackward) return std::nullopt;
  const bool forward = kind == OpKind::kForward;
  const int neighbour = map.virtual_stage(stage, chunk) + (forward ? -1 : 1);
  if (neighbour < 0 || neighbour >= map.num_virtual_stages()) return std::nullopt;
  if (map.stage_of(neighbour) == stage) return NeighbourInput{kind, map.chunk_of(neighbour), true};
  return NeighbourInput{forward ? OpKind::kRecvActivation : OpKind::kRecvGrad, chunk, false};
}

// Invariant 1: the spec's sizes, one program per stage in order, every op's mb, chunk and peer
// in range (peer -1 on ops without one). Also the cheap part of invariant 2 that bounds the
// index's size: a stage needs at least 2*m*v ops, so p*m*v above the total op count is reported
// before anything is allocated from those numbers.
inline std::optional<GridViolation> CheckShape(const Schedule& schedule) {
  const PipelineSpec& spec = schedule.spec;
  const int p = spec.num_stages, m = spec.num_microbatches, v = spec.chunks_per_stage;
  if (p < 1 || m < 1 || v < 1) {
    return ViolationAt(kShape, -1, -1,
                       "the spec needs num_stages, num_microbatches and chunks_per_stage >= 1 "
                       "(got p=" +
                           std::to_string(p) + ", m=" + std::to_string(m) +
                           ", v=" + std::to_string(v) + ")");
  }
  if (PlacementName(spec.placement) == "?") {
    return ViolationAt(kShape, -1, -1,
                       "unknown placement " + std::to_string(static_cast<int>(spec.placement)) +
                           " (accepted: loop, v)");
  }
  if (spec.placement == Placement::kV && v != 2) {
    return ViolationAt(kShape, -1, -1,
                       "placement v needs chunks_per_stage == 2 (got v=" + std::to_string(v) +
                           "): each stage holds virtual stages d and 2p - 1 - d");
  }
  if (schedule.stages.size() != static_cast<std::size_t>(p)) {
    return ViolationAt(kShape, -1, -1,
                       "the spec has num_stages=" + std::to_string(p) + " but the schedule has " +
                           std::to_string(schedule.stages.size()) + " stage programs");
  }
  std::int64_t total_ops = 0;
  for (int d = 0; d < p; ++d) {
    const StageProgram& program = schedule.stages[static_cast<std::size_t>(d)];
    if (program.stage != d) {
      return ViolationAt(kShape, d, -1,
                         "wrong stage numbering: program " + std::to_string(d) + " says stage " +
                             std::to_string(program.stage) +
                             " (programs must be stages 0..p-1 "
                             "in order)");
    }
    total_ops += static_cast<std::int64_t>(program.ops.size());
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      const Op& op = program.ops[i];
      const int index = static_cast<int>(i);
      const auto bad = [&](const std::string& what) {
        return ViolationAt(kShape, d, index, "op out of range: " + what);
      };
      if (static_cast<int>(op.kind) >= kNumOpKinds) {
        return bad("unknown op kind " + std::to_string(static_cast<int>(op.kind)));
      }
      const bool unguarded_barrier = op.kind == OpKind::kBarrier && op.mb == -1 && op.chunk == -1;
      if (!unguarded_barrier) {
        if (op.mb < 0 || op.mb >= m) {
          return bad("mb " + std::to_string(op.mb) + " is not in [0, " + std::to_string(m) + ")");
        }
        if (op.chunk < 0 || op.chunk >= v) {
          return bad("chunk " + std::to_string(op.chunk) + " is not in [0, " + std::to_string(v) +
                     ")");
        }
      }
      if (HasPeer(op.kind)) {
        if (op.peer < 0 || op.peer >= p) {
          return bad("peer " + std::to_string(op.peer) + " is not in [0, " + std::to_string(p) +
                     ")");
        }
        if (op.peer == d && op.kind == OpKind::kBarrier) {
          return bad("a BARRIER's peer must be another stage (got its own stage " +
                     std::to_string(d) + ")");
        }
      } else if (op.peer != -1) {
        return bad(std::string(OpKindName(op.kind)) + " takes no peer (got " +
                   std::to_string(op.peer) + "; use -1)");
      }
    }
  }
  // Checked: p * m * v of a hostile file overflows an int64 (p = 4, m = v = 2^31 - 1), and a
  // wrapped product would pass this test and size the index.
  const std::optional<std::int64_t> pm = CheckedMul(p, m);
  const std::optional<std::int64_t> entries = pm ? CheckedMul(*pm, v) : std::nullopt;
  if (!entries.has_value() || *entries > total_ops) {
    const std::string asked =
        entries ? std::to_string(*entries)
                : "p * m * v = " + std::to_string(p) + " * " + std::to_string(m) + " * " +
                      std::to_string(v) + " (more than 2^63)";
    return ViolationAt(kCompleteness, -1, -1,
                       "the spec asks for F and B of " + asked +
                           " (stage, mb, chunk) entries but the programs hold only " +
                           std::to_string(total_ops) + " ops in total");
  }
  return std::nullopt;
}

// The peer part of invariant 5: every P2P op names the stage that holds its neighbouring
// virtual stage, and has such a neighbour (no SEND_F from the last virtual stage, no comm at all
// when p == 1, where the local op is the dependency). REQUIRES: CheckShape passed.
inline std::optional<GridViolation> CheckPeers(const Schedule& schedule) {
  const int p = schedule.spec.num_stages;
  const VirtualStageMap map = schedule.spec.stage_map();
  const int num_virtual = map.num_virtual_stages();
  for (int d = 0; d < p; ++d) {
    const std::vector<Op>& ops = schedule.stages[static_cast<std::size_t>(d)].ops;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (!IsP2P(op.kind)) continue;
      const int index = static_cast<int>(i);
      const int l = map.virtual_stage(d, op.chunk);
      const int neighbour = NeighbourVirtualStage(op.kind, l);
      if (p == 1) {
        return ViolationAt(kMatching, d, index,
                           "no comm between virtual stages of one stage (p == 1): the local op is "
                           "the dependency");
      }
      if (neighbour < 0 || neighbour >= num_virtual) {
        return ViolationAt(kMatching, d, index,
                           "virtual stage " + std::to_string(l) + " has no " +
                               (neighbour < 0 ? "previous" : "next") +
                               " virtual stage to talk to (L=" + std::to_string(num_virtual) + ")");
      }
      if (map.stage_of(neighbour) == d) {
        return ViolationAt(kMatching, d, index,
                           "virtual stages " + std::to_string(l) + " and " +
                               std::to_string(neighbour) + " are both on stage " +
                               std::to_string(d) +
                               " (V placement), which hands data over locally: no comm");
      }
      if (op.peer != map.stage_of(neighbour)) {
        return ViolationAt(kMatching, d, index,
                           "mismatched peer: it names stage " + std::to_string(op.peer) +
                               " but virtual stage " + std::to_string(neighbour) +
                               " (the neighbour of " + std::to_string(l) + ") lives on stage " +
                               std::to_string(map.stage_of(neighbour)));
      }
    }
  }
  return std::nullopt;
}

// Positions and rendezvous partners. REQUIRES: CheckShape passed (so every index is in range).
class ScheduleIndex {
 public:
  // Kinds with a position table: all (BARRIER's rows stay empty: it pairs by count instead, and
  // kinds appended after it, RECOMPUTE*, need rows of their own).
  static constexpr int kKeyedKinds = kNumOpKinds;
  // What a duplicate op breaks: compute ops completeness, P2P ops matching, offload ops the
  // offload life cycle.
  enum DuplicateClass : int { kComputeDuplicate = 0, kP2PDuplicate = 1, kOffloadDuplicate = 2 };

  explicit ScheduleIndex(const Schedule& schedule)
      : p_(schedule.spec.num_stages),
        m_(schedule.spec.num_microbatches),
        v_(schedule.spec.chunks_per_stage),
        map_(schedule.spec.stage_map()) {
    const std::size_t entries = static_cast<std::size_t>(m_) * static_cast<std::size_t>(v_);
    positions_.assign(static_cast<std::size_t>(p_), std::vector<int>(entries * kKeyedKinds, -1));
    partners_.resize(static_cast<std::size_t>(p_));
    // BARRIERs of stage a with peer b, in program order, keyed a * p + b.
    std::unordered_map<std::int64_t, std::vector<int>> barriers;
    for (int d = 0; d < p_; ++d) {
      const std::vector<Op>& ops = schedule.stages[static_cast<std::size_t>(d)].ops;
      partners_[static_cast<std::size_t>(d)].assign(ops.size(), -1);
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        const int index = static_cast<int>(i);
        if (op.kind == OpKind::kBarrier) {
          barriers[static_cast<std::int64_t>(d) * p_ + op.peer].push_back(index);
          continue;
        }
        int& slot = positions_[static_cast<std::size_t>(d)][Key(op.kind, op.mb, op.chunk)];
        if (slot == -1) {
          slot = index;
          continue;
        }
        const int cls = IsCompute(op.kind) ? kComputeDuplicate
                        : IsP2P(op.kind)   ? kP2PDuplicate
                                           : kOffloadDuplicate;
        if (!duplicates_[static_cast<std::size_t>(cls)].has_value()) {
          GridViolation violation =
              ViolationAt(cls == kComputeDuplicate ? kCompleteness
                          : cls == kP2PDuplicate   ? kMatching
                                                   : kOffloadLifeCycle,
                          d, index,
                          "duplicate " + OpToString(op) + ": it already ran at op " +
                              std::to_string(slot) + " (each op runs exactly once" +
                              (op.kind == OpKind::kReload ? "; nothing is reloaded twice)" : ")"));
          violation.marks.push_back({d, slot});
          duplicates_[static_cast<std::size_t>(cls)] = std::move(violation);
        }
      }
    }
    for (int d = 0; d < p_; ++d) {
      const std::vector<Op>& ops = schedule.stages[static_cast<std::size_t>(d)].ops;
      std::unordered_map<int, int> barrier_count;  // peer -> BARRIERs seen so far
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        int& partner = partners_[static_cast<std::size_t>(d)][i];
        if (op.kind == OpKind::kBarrier) {
          const int k = barrier_count[op.peer]++;
          const auto it = barriers.find(static_cast<std::int64_t>(op.peer) * p_ + d);
          if (it != barriers.end() && static_cast<std::size_t>(k) < it->second.size()) {
            partner = it->second[static_cast<std::size_t>(k)];
          }
        } else if (IsP2P(op.kind) && p_ > 1) {
          const int neighbour = NeighbourVirtualStage(op.kind, map_.virtual_stage(d, op.chunk));
          if (neighbour < 0 || neighbour >= p_ * v_ || map_.stage_of(neighbour) != op.peer) {
            continue;
          }
          const int j = Position(op.peer, PartnerKind(op.kind), op.mb, map_.chunk_of(neighbour));
          if (j >= 0 && schedule.stages[static_cast<std::size_t>(op.peer)]
                                .ops[static_cast<std::size_t>(j)]
                                .peer == d) {
            partner = j;
          }
        }
      }
    }
  }

  int num_stages() const { return p_; }

  // Index of (kind, mb, chunk) in `stage`'s program (its first occurrence), -1 when absent.
  // REQUIRES: kind != kBarrier, everything in range.
  int Position(int stage, OpKind kind, int mb, int chunk) const {
    return positions_[static_cast<std::size_t>(stage)][Key(kind, mb, chunk)];
  }

  // How `stage`'s program recomputes (mb, chunk): kFull / kLean when it holds a RECOMPUTE /
  // RECOMPUTE_LEAN of it (the first found, should it hold both), else kNone. REQUIRES:
  // everything in range.
  Recompute RecomputeMode(int stage, int mb, int chunk) const {
    if (Position(stage, OpKind::kRecompute, mb, chunk) >= 0) return Recompute::kFull;
    if (Position(stage, OpKind::kRecomputeLean, mb, chunk) >= 0) return Recompute::kLean;
    return Recompute::kNone;
  }

  // The op that op `index` of `stage` meets: its matching RECV/SEND on the peer (peers as
  // CheckPeers wants them, both ways), or the k-th BARRIER of the peer with this stage for this
  // stage's k-th BARRIER with the peer. -1 when it has none or is not a rendezvous op.
  int Partner(int stage, int index) const {
    return partners_[static_cast<std::size_t>(stage)][static_cast<std::size_t>(index)];
  }

  // The first duplicate of that class, in stage order and then op order.
  const std::optional<GridViolation>& Duplicate(DuplicateClass cls) const {
    return duplicates_[static_cast<std::size_t>(cls)];
  }

 private:
  std::size_t Key(OpKind kind, int mb, int chunk) const {
    return (static_cast<std::size_t>(kind) * static_cast<std::size_t>(m_) +
            static_cast<std::size_t>(mb)) *
               static_cast<std::size_t>(v_) +
           static_cast<std::size_t>(chunk);
  }

  int p_, m_, v_;
  VirtualStageMap map_;
  std::vector<std::vector<int>> positions_;  // [stage][key]
  std::vector<std::vector<int>> partners_;   // [stage][op index]
  std::array<std::optional<GridViolation>, 3> duplicates_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_IR_GRID_INDEX_H_
