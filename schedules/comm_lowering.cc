// LowerCommunication: inserts SEND_*/RECV_* pairs into a compute order, sender-driven, the way
// PyTorch's `_add_send_recv` does (ecosystem.md section 1.5). Preserves every stage's compute
// order exactly; pure function of its input.
//
// Algorithm. Rounds over the stages in ascending order; in each round a stage appends its next
// compute op when that op is ready:
//   F(l)  when l == 0, its RECV_F is already on this stage, or the local F(l-1) is placed (a
//         neighbour on the same stage: p == 1, or V placement's turn at stage p - 1);
//   B(l)  when l == L-1 and its own F is placed, its RECV_B is already on this stage, or the
//         local B(l+1) is placed;
//   W(l)  when its own B is placed.
// When F(l), l < L-1, whose next virtual stage lives on another stage delivers its output, SEND_F
// is appended here and, at that same moment, the matching RECV_F to the receiver's list (B(l),
// l > 0: SEND_B here and the peer's RECV_B). A round in which nothing is placed and nothing is
// in flight means the order cannot run: FailedPrecondition "malformed compute order".
//
// Rounds are unit-time slots. PyTorch's compute orders carry their idle slots as `None` entries,
// so its rounds are time steps; ours carry none, so each round is one slot of an as-soon-as-
// possible unit-cost replay (F = B = W = 1 slot, an unsplit B = 2): a stage busy with an op
// places nothing, and an op's SEND/RECV pair is appended in the slot its op finishes, before
// that slot's placements. Without this, a RECV lands ahead of compute that in time runs before
// the data exists (e.g. RECV_F2 before B1 on the last stage of a 1F1B pipeline), and under in-
// order issue (simulate.h) every stage behind it stalls: p=8 m=32 v=2 g=4 took 347 slots instead
// of the 210 this placement reaches (pipeoffload.md section 1.3).
//
// Why the result is deadlock-free under blocking rendezvous: read the ops in the order this pass
// appended them (one global sequence). Each RECV is appended right after its SEND, and at that
// moment both are the last op of their stage's list, so everything before either of them on its
// stage comes earlier in the global sequence. By induction over that sequence every op can run:
// its stage's earlier ops ran; a compute op's input came from a RECV (or local op) placed, hence
// run, before it; and a SEND and its RECV reach the heads of their stages together and complete
// together. Ops run strictly in order and P2P ops pair by identity, so no other interleaving
// can block either: every pair of stages sees its sends and receives in one consistent order.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "schedules/families.h"

namespace pipeoffload {
namespace {

absl::Status Malformed(std::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("malformed compute order: ", std::string(what)));
}

// Bookkeeping over (virtual stage l, mb) pairs, indexed mb * L + l.
class Lowering {
 public:
  explicit Lowering(const PipelineSpec& spec)
      : p_(spec.num_stages),
        m_(spec.num_microbatches),
        map_(spec.stage_map()),
        num_layers_(spec.num_stages * spec.chunks_per_stage),
        split_(spec.split_backward),
        flags_(Size(), 0) {}

  // Every op must be a compute op of this spec, each (kind, mb, chunk) exactly once per stage.
  absl::Status CheckInput(const Schedule& order) {
    const PipelineSpec& spec = order.spec;
    if (static_cast<int>(order.stages.size()) != p_) {
      return absl::InvalidArgumentError(absl::StrCat("compute order has ", order.stages.size(),
                                                     " stage programs for num_stages=", p_));
    }
    // The placement flags double as "seen" flags here and are cleared before the rounds.
    for (int d = 0; d < p_; ++d) {
      const StageProgram& program = order.stages[d];
      if (program.stage != d) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage program ", d, " says it is stage ", program.stage));
      }
      for (std::size_t i = 0; i < program.ops.size(); ++i) {
        const Op& op = program.ops[i];
        // Formatted only on error: this loop runs once per op.
        auto where = [&] {
          return absl::StrCat("stage ", d, " op ", i, " (", OpToString(op), ")");
        };
        if (!IsCompute(op.kind)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(), ": LowerCommunication takes compute ops only (F, B, W); lower once"));
        }
        if (op.kind == OpKind::kBackwardWeight && !split_) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(), ": W ops need split_backward in the spec"));
        }
        if (op.mb < 0 || op.mb >= m_ || op.chunk < 0 || op.chunk >= spec.chunks_per_stage) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(), ": mb must be in [0, ", m_, ") and chunk in [0, ",
                           spec.chunks_per_stage, ")"));
        }
        const std::uint8_t bit = PlacedBit(op.kind);
        std::uint8_t& flags = flags_[Index(Layer(d, op.chunk), op.mb)];
        if (flags & bit) return Malformed(absl::StrCat(where(), " appears twice"));
        flags |= bit;
      }
    }
    for (int l = 0; l < num_layers_; ++l) {
      for (int mb = 0; mb < m_; ++mb) {
        for (OpKind kind : {OpKind::kForward, OpKind::kBackward, OpKind::kBackwardWeight}) {
          if (kind == OpKind::kBackwardWeight && !split_) continue;
          if (!(flags_[Index(l, mb)] & PlacedBit(kind))) {
            return Malformed(absl::StrCat("stage ", StageOf(l), " lacks ",
                                          OpToString(Op{kind, mb, map_.chunk_of(l), -1})));
          }
        }
      }
    }
    std::fill(flags_.begin(), flags_.end(), 0);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<StageProgram>> Run(const std::vector<StageProgram>& order) {
    std::vector<StageProgram> lowered(p_);
    std::size_t remaining = 0;
    for (int d = 0; d < p_; ++d) {
      lowered[d].stage = d;
      // Compute ops plus at most one SEND and one RECV per compute op, on average.
      lowered[d].ops.reserve(order[d].ops.size() * 2);
      remaining += order[d].ops.size();
    }
    cursor_.assign(p_, 0);
    queued_.assign(p_, 0);
    // The op each stage is running; a stage runs one op at a time. finishing[s % 3] lists the
    // stages whose op ends in slot s (ops last one or two slots).
    std::vector<Op> running(p_);
    std::vector<char> busy(p_, 0);
    std::vector<int> finishing[3];
    int in_flight = 0;
    for (int d = 0; d < p_; ++d) {
      if (!order[d].ops.empty()) Wake(d);
    }
    std::vector<int> looking;
    for (std::int64_t slot = 0; remaining > 0 || in_flight > 0; ++slot) {
      // Deliveries first, in ascending stage order, so an op placed in this slot can use data
      // produced by an earlier one. A stage's readiness only changes when it finishes an op or
      // receives data, so those are the stages worth looking at: O(ops), not O(slots * p).
      std::vector<int>& ending = finishing[slot % 3];
      std::sort(ending.begin(), ending.end());
      for (int d : ending) {
        Deliver(d, running[d], lowered);
        busy[d] = 0;
        --in_flight;
        Wake(d);
      }
      ending.clear();
      looking.swap(candidates_);
      candidates_.clear();
      std::sort(looking.begin(), looking.end());
      for (int d : looking) {
        queued_[d] = 0;
        if (busy[d] || cursor_[d] == order[d].ops.size()) continue;
        const Op& op = order[d].ops[cursor_[d]];
        if (!Ready(d, op)) continue;
        Place(d, op, lowered);
        running[d] = op;
        busy[d] = 1;
        finishing[(slot + Duration(op)) % 3].push_back(d);
        ++in_flight;
        ++cursor_[d];
        --remaining;
      }
      if (in_flight == 0 && remaining > 0) return Stuck(order);
    }
    return lowered;
  }

 private:
  std::size_t Size() const { return static_cast<std::size_t>(num_layers_) * m_; }
  // Microbatch-major: stages working at the same time touch nearby microbatches, so their
  // flags share cache lines.
  std::size_t Index(int layer, int mb) const {
    return static_cast<std::size_t>(mb) * num_layers_ + layer;
  }
  int Layer(int stage, int chunk) const { return map_.virtual_stage(stage, chunk); }
  int StageOf(int layer) const { return map_.stage_of(layer); }
  // Per-entry flag bits, one byte per (l, mb) so a readiness check touches one cache line.
  static constexpr std::uint8_t kForwardPlaced = 1;
  static constexpr std::uint8_t kBackwardPlaced = 2;
  static constexpr std::uint8_t kWeightSeen = 4;    // input check only: W needs no placement flag
  static constexpr std::uint8_t kRecvForward = 8;   // RECV_F of (l, mb) is on l's stage
  static constexpr std::uint8_t kRecvBackward = 16; // RECV_B of (l, mb) is on l's stage
  static std::uint8_t PlacedBit(OpKind kind) {
    if (kind == OpKind::kForward) return kForwardPlaced;
    if (kind == OpKind::kBackward) return kBackwardPlaced;
    return kWeightSeen;
  }
  bool Has(int layer, int mb, std::uint8_t bit) const {
    return (flags_[Index(layer, mb)] & bit) != 0;
  }
  // Unit slots: F, B and W take one; a B that includes W takes two (CostModel defaults).
  std::int64_t Duration(const Op& op) const {
    return op.kind == OpKind::kBackward && !split_ ? 2 : 1;
  }

  // Local dependencies (same stage) need only "placed": a stage runs one op at a time, so
  // everything placed before the stage went idle has finished.
  bool Ready(int d, const Op& op) const {
    const int l = Layer(d, op.chunk);
    switch (op.kind) {
      case OpKind::kForward:
        return l == 0 || Has(l, op.mb, kRecvForward) ||
               (StageOf(l - 1) == d && Has(l - 1, op.mb, kForwardPlaced));
      case OpKind::kBackward:
        if (l == num_layers_ - 1) return Has(l, op.mb, kForwardPlaced);
        return Has(l, op.mb, kRecvBackward) ||
               (StageOf(l + 1) == d && Has(l + 1, op.mb, kBackwardPlaced));
      default:
        return Has(l, op.mb, kBackwardPlaced);
    }
  }

  void Place(int d, const Op& op, std::vector<StageProgram>& lowered) {
    const int l = Layer(d, op.chunk);
    lowered[d].ops.push_back(op);
    flags_[Index(l, op.mb)] |= PlacedBit(op.kind);
  }

  // `op` on stage d has finished: hand its output to the neighbouring virtual stage.
  void Deliver(int d, const Op& op, std::vector<StageProgram>& lowered) {
    const int l = Layer(d, op.chunk);
    if (op.kind == OpKind::kForward && l + 1 < num_layers_ && StageOf(l + 1) != d) {
      const int peer = StageOf(l + 1);
      lowered[d].ops.push_back(Op{OpKind::kSendActivation, op.mb, op.chunk, peer});
      lowered[peer].ops.push_back(Op{OpKind::kRecvActivation, op.mb, map_.chunk_of(l + 1), d});
      flags_[Index(l + 1, op.mb)] |= kRecvForward;
      Wake(peer);
    } else if (op.kind == OpKind::kBackward && l > 0 && StageOf(l - 1) != d) {
      const int peer = StageOf(l - 1);
      lowered[d].ops.push_back(Op{OpKind::kSendGrad, op.mb, op.chunk, peer});
      lowered[peer].ops.push_back(Op{OpKind::kRecvGrad, op.mb, map_.chunk_of(l - 1), d});
      flags_[Index(l - 1, op.mb)] |= kRecvBackward;
      Wake(peer);
    }
  }

  // What a head op that is not ready waits for, for the error message.
  std::string WaitsFor(int d, const Op& op) const {
    const int l = Layer(d, op.chunk);
    if (op.kind == OpKind::kForward) {
      return absl::StrCat("F", op.mb, ".", map_.chunk_of(l - 1), " on stage ", StageOf(l - 1));
    }
    if (op.kind == OpKind::kBackward) {
      if (l == num_layers_ - 1) return absl::StrCat("its own F", op.mb, ".", op.chunk);
      return absl::StrCat("B", op.mb, ".", map_.chunk_of(l + 1), " on stage ", StageOf(l + 1));
    }
    return absl::StrCat("its own B", op.mb, ".", op.chunk);
  }

  absl::Status Stuck(const std::vector<StageProgram>& order) const {
    constexpr int kShown = 8;
    std::string heads;
    int stuck = 0;
    for (int d = 0; d < p_; ++d) {
      if (cursor_[d] == order[d].ops.size()) continue;
      if (++stuck > kShown) continue;
      const Op& op = order[d].ops[cursor_[d]];
      absl::StrAppend(&heads, stuck == 1 ? "" : "; ", "stage ", d, " op ", cursor_[d], " ",
                      OpToString(op), " waits for ", WaitsFor(d, op));
    }
    if (stuck > kShown) absl::StrAppend(&heads, "; and ", stuck - kShown, " more");
    return Malformed(absl::StrCat("no stage can proceed; stuck heads: ", heads));
  }

  void Wake(int d) {
    if (!queued_[d]) {
      queued_[d] = 1;
      candidates_.push_back(d);
    }
  }

  int p_;
  int m_;
  VirtualStageMap map_;
  int num_layers_;
  bool split_;
  std::vector<std::uint8_t> flags_;  // bits above, indexed mb * L + l
  std::vector<std::size_t> cursor_;  // next compute op of each stage
  std::vector<int> candidates_;      // stages to look at in the next slot
  std::vector<char> queued_;         // stage is in candidates_
};

}  // namespace

absl::StatusOr<Schedule> LowerCommunication(const Schedule& compute_order) {
  PO_RETURN_IF_ERROR(internal::CheckSpecShape(compute_order.spec));
  Lowering lowering(compute_order.spec);
  PO_RETURN_IF_ERROR(lowering.CheckInput(compute_order));
  Schedule lowered;
  lowered.spec = compute_order.spec;
  PO_ASSIGN_OR_RETURN(lowered.stages, lowering.Run(compute_order.stages));
  return lowered;
}

}  // namespace pipeoffload
