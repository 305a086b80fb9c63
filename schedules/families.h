// Private interface of the compute-order families (DESIGN.md section 4, pass 1) and of the
// group building-block construction (reference/pipeoffload.md section 1.3), exposed so tests can
// check each step alone. Pure functions of their arguments; no I/O.
//
// Notation (pipeoffload.md section 0): p = num_stages, m = num_microbatches, v = chunks_per_stage,
// g = group_size, L = p * v virtual stages; chunk c on stage d is virtual stage l = c * p + d
// under loop placement (1f1b, interleaved, group-interleaved) and d or 2p - 1 - d under V
// placement (zbv, dualpipev): VirtualStageMap in schedule.h.
#ifndef PIPEOFFLOAD_SCHEDULES_FAMILIES_H_
#define PIPEOFFLOAD_SCHEDULES_FAMILIES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// Limits ResolveSpec enforces so that no spec can ask for an absurd allocation. The product
// p * v * m bounds the number of (stage, mb, chunk) entries; each entry yields at most three
// compute ops and four P2P ops, so the cap keeps a schedule under ~30M ops. Compiling, validating
// and simulating is linear in the ops: p=64 m=512 v=4 takes ~0.5 s; at the cap (p=4096 m=1024,
// or p=64 m=16384 v=4, no offload) it takes 16-23 s and 2.5 GB on the 2-core build machine.
inline constexpr int kMaxStages = 4096;
inline constexpr int kMaxMicrobatches = 1 << 20;
inline constexpr int kMaxChunksPerStage = 1024;
inline constexpr std::int64_t kMaxEntries = std::int64_t{1} << 22;
// Offload planning (po-h, po-f, selective, auto) costs far more per entry than building an
// order: its placement search visits, for every entry, the ops of the entry's lifetime on its
// stage, about p * v of them. Its work, entries * virtual stages = p*m*v * p*v, is capped here:
// p=64 m=512 v=4 (the benchmark shape, 2^25, ~2 s and ~0.6 GB) plans; twice that is the most a
// spec may ask, where larger shapes once ran for minutes (p=171 m=88 v=6 split: 40 s and more)
// or out of memory (the 4M-entry limit). docs/hardening.md and --help name the limit.
inline constexpr std::int64_t kMaxOffloadPlanWork = std::int64_t{1} << 26;

// Checks p, m and v against the limits above: InvalidArgument naming the field and the range.
[[nodiscard]] absl::Status CheckSpecShape(const PipelineSpec& spec);

// ceil(p / 2): the smallest group size the reference accepts and the group-interleaved default
// (pipeoffload.md section 1.3, README of the reference code: ceil(p/2) <= g <= p).
int MinGroupSize(int num_stages);

// Appends F(mb, chunk) to `program`.
inline void AppendForward(StageProgram& program, int mb, int chunk) {
  program.ops.push_back(Op{OpKind::kForward, mb, chunk, -1});
}
// Appends B(mb, chunk), and W(mb, chunk) right after it when `split` (the families' default
// placement of W; the unsplit variant folds W into B).
inline void AppendBackward(StageProgram& program, int mb, int chunk, bool split) {
  program.ops.push_back(Op{OpKind::kBackward, mb, chunk, -1});
  if (split) program.ops.push_back(Op{OpKind::kBackwardWeight, mb, chunk, -1});
}

// The per-family builders. Each returns one StageProgram per stage holding F, B (and W when
// spec.split_backward) ops only. REQUIRES: `spec` came from ResolveSpec and names that family.
//
// 1f1b (v = 1, any m >= 1): unit-cost makespan (m + p - 1)(F + B + W) unsplit and
//   3m + 2(p - 1) split; stage d peaks at min(p - d, m) chunk units.
std::vector<StageProgram> BuildOneFOneBOrder(const PipelineSpec& spec);
// interleaved (v >= 2, m % p == 0): Megatron's order; makespan 3mv + 3(p - 1) unsplit,
//   3mv + 2(p - 1) split; stage d peaks at min(2(p-d-1) + (v-1)p + 1, mv).
std::vector<StageProgram> BuildInterleavedOrder(const PipelineSpec& spec);
// zbv (v = 2, V placement, split, any m >= 1): torch's ScheduleZBVZeroBubble, op for op
//   (zbv.cc has the phases); chunk 0 of stage d is virtual stage d, chunk 1 is 2p - 1 - d.
std::vector<StageProgram> BuildZbvOrder(const PipelineSpec& spec);
// dualpipev (v = 2, V placement, split, m >= 2p): torch's ScheduleDualPipeV with each
//   OVERLAP_F_B as its forward then its full backward (B and W), and each full backward as B
//   and W back to back (dualpipev.cc has the steps and why).
std::vector<StageProgram> BuildDualPipeVOrder(const PipelineSpec& spec);
// group-interleaved (ceil(p/2) <= g <= p, any v >= 1, any m >= 1). Decisions, all tested:
//  - v = 1 is accepted: microbatch k = n g + j then sits at slot 3k whatever g is, so the order
//    is exactly 1F1B's;
//  - any m: the last group's ids >= m are dropped (as the reference does), which keeps every
//    dependency; peaks stay <= G(v-1) + (p-d) and equal it once m >= 2g; with whole groups
//    (m % g == 0) the split makespan is 3mv + 2(p-1) + (v-1)(p-g), every row of the table;
//  - unsplit: the same order with each W folded into the B just before it (the slots assume
//    split passes, so unsplit g < p pays extra bubbles).
// Internal error when the building-block construction contradicts itself (a slot collision or a
// dependency the shifted slot timeline violates); that would be a bug, never a user error.
[[nodiscard]] absl::StatusOr<std::vector<StageProgram>> BuildGroupInterleavedOrder(
    const PipelineSpec& spec);

// --- The building-block construction, step by step (pipeoffload.md section 1.3) -------------
// A slot is one unit-time pass (F = B = W = 1). Passes are always split (F, B, W); the unsplit
// family drops W afterwards.
struct SlottedOp {
  Op op;                  // kForward, kBackward or kBackwardWeight; peer -1
  std::int64_t slot = 0;  // absolute slot on its stage

  friend bool operator==(const SlottedOp&, const SlottedOp&) = default;
};
// [stage] -> passes in strictly increasing slot order.
using SlotTimeline = std::vector<std::vector<SlottedOp>>;

struct BlockShape {
  int num_stages = 1;      // p
  int chunks = 1;          // v
  int group_size = 1;      // g
  int min_group_size = 1;  // g_min; G = g * ceil(g_min / g)

  int Multiplier() const { return (min_group_size + group_size - 1) / group_size; }  // K
  int EffectiveGroup() const { return group_size * Multiplier(); }                     // G
  std::int64_t Period() const { return 3LL * group_size * chunks; }                    // 3gv
};

// Step 1, the block: every pass of group 0 (mb = member j < min(g, m)) at its absolute slot
//   F(c, j, d) = 3Gc + 3j + d + jump(c),  jump(c) = 3g * floor(c / (v / gcd(v, K)))
//   B(v-1-c', j, d) = F(v-1, 0, d) + 3(p-1-d) + 1 + 3Gc' + 3j + jump(c'),  W = B + 1.
// Errors: InvalidArgument for a shape outside 1 <= g, 1 <= v, 1 <= p; Internal when two passes
// of one stage fall on the same slot modulo the period 3gv (the block would not tile).
// Members j >= m are never generated: they would be dropped in step 2 anyway, and skipping them
// keeps the block's size proportional to the schedule's instead of p * 3gv.
[[nodiscard]] absl::StatusOr<SlotTimeline> BuildingBlock(const BlockShape& shape,
                                                         int num_microbatches);

// Step 2, unroll and repeat: group n = 0..ceil(m/g)-1 is the block shifted by n * 3gv slots with
// microbatch ids j + n * g; ids >= m are dropped.
SlotTimeline RepeatBlock(const SlotTimeline& block, const BlockShape& shape, int num_microbatches);

// Step 3, shift: stage i is delayed by min(i, e) slots, e = min(p - 1, smallest slack with which
// stage 0's F of chunk c + 1 follows stage p-1's F of chunk c). Internal error when that slack is
// negative (the chunk wrap-around dependency would be violated).
[[nodiscard]] absl::StatusOr<SlotTimeline> ShiftForDependencies(SlotTimeline timeline,
                                                                int chunks, int num_microbatches);

// Step 4, squeeze: lock-step replay that starts every pass at the earliest slot its stage is free
// and its dependency (F(l-1), B(l+1); none for W and for B of the last virtual stage) finished in
// an earlier slot, keeping each stage's order. Internal error when the replay stops progressing.
[[nodiscard]] absl::StatusOr<SlotTimeline> Squeeze(SlotTimeline timeline, int chunks,
                                                   int num_microbatches);

// Steps 1-4 for a resolved group-interleaved spec (split passes regardless of
// spec.split_backward): the unit-cost timeline whose order BuildGroupInterleavedOrder emits.
[[nodiscard]] absl::StatusOr<SlotTimeline> GroupInterleavedTimeline(const PipelineSpec& spec);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_FAMILIES_H_
