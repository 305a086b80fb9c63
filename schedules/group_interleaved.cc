// The group-interleaved compute order: the building-block construction of
// reference/pipeoffload.md section 1.3 (slot formula, jump, unroll and repeat per group, shift,
// squeeze), in unit slots. Pure functions of their arguments; no comm, no offload.
//
// Why it is correct by construction (K = ceil(g_min / g) = 1, which every spec ResolveSpec accepts
// has, since g >= ceil(p/2) = g_min):
//  - no collisions: on stage d, F slots are = d, B slots = d + 1 and W slots = d + 2 (mod 3), and
//    within one kind 3gc + 3j (c < v, j < g) are distinct modulo the period 3gv;
//  - dependencies: F moves one slot per stage, B returns two slots per stage earlier, the chunk
//    wrap-around F(c, p-1) -> F(c+1, 0) has slack 3G - p >= 0, and the shift e = min(p-1, 3G-p)
//    repairs B(c+1, 0) -> B(c, p-1) (slack 3G - 2p + 2 + e >= 1).
// The code checks both facts anyway (collisions in BuildingBlock, the slack in the shift, every
// dependency in the squeeze) and reports Internal errors, so a K > 1 block (reachable only
// through this file's internal API) cannot produce a silently wrong order.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "schedules/families.h"

namespace pipeoffload::internal {
namespace {

std::string ShapeString(const BlockShape& shape) {
  return absl::StrCat("p=", shape.num_stages, " v=", shape.chunks, " g=", shape.group_size,
                      " g_min=", shape.min_group_size);
}

void SortBySlot(std::vector<SlottedOp>& passes) {
  std::sort(passes.begin(), passes.end(),
            [](const SlottedOp& a, const SlottedOp& b) { return a.slot < b.slot; });
}

}  // namespace

absl::StatusOr<SlotTimeline> BuildingBlock(const BlockShape& shape, int num_microbatches) {
  const int p = shape.num_stages;
  const int v = shape.chunks;
  const int g = shape.group_size;
  if (p < 1 || v < 1 || g < 1 || shape.min_group_size < 1 || num_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "building block needs p, v, g, g_min and m >= 1 (got ", ShapeString(shape),
        " m=", num_microbatches, ")"));
  }
  const std::int64_t big_g = shape.EffectiveGroup();  // G
  const int k = shape.Multiplier();                    // K
  // Chunks are visited in gcd(v, K) runs; each later run starts 3g slots late ("jump"), which
  // keeps the F slots of a K > 1 block from landing on one another modulo the period.
  const int run = v / std::gcd(v, k);
  auto jump = [&](int c) -> std::int64_t { return 3LL * g * (c / run); };
  const std::int64_t period = shape.Period();
  const int members = std::min(g, num_microbatches);

  SlotTimeline block(p);
  // occupied[s] == d + 1 when stage d holds a pass at slot s (mod the period); stamping with the
  // stage id avoids clearing the table between stages.
  std::vector<int> occupied(static_cast<std::size_t>(period), 0);
  for (int d = 0; d < p; ++d) {
    std::vector<SlottedOp>& passes = block[d];
    passes.reserve(static_cast<std::size_t>(3) * members * v);
    auto place = [&](OpKind kind, int j, int c, std::int64_t slot) -> absl::Status {
      int& cell = occupied[static_cast<std::size_t>(slot % period)];
      if (cell == d + 1) {
        return absl::InternalError(absl::StrCat(
            "group building block collision on stage ", d, " at slot ", slot, " (mod ", period,
            ") placing ", OpToString(Op{kind, j, c, -1}), " for ", ShapeString(shape)));
      }
      cell = d + 1;
      passes.push_back(SlottedOp{Op{kind, j, c, -1}, slot});
      return absl::OkStatus();
    };
    for (int c = 0; c < v; ++c) {
      for (int j = 0; j < members; ++j) {
        PO_RETURN_IF_ERROR(place(OpKind::kForward, j, c, 3 * big_g * c + 3 * j + d + jump(c)));
      }
    }
    // The backwards start with the last chunk's member 0: its F reaches stage p-1 after p-1-d
    // more slots (one per stage), and its B climbs back two slots per stage, so it arrives here
    // (p-1-d) + 1 + 2(p-1-d) slots after this stage's F.
    const std::int64_t first_b = 3 * big_g * (v - 1) + d + jump(v - 1) + 3 * (p - 1 - d) + 1;
    for (int c_rev = 0; c_rev < v; ++c_rev) {
      const int c = v - 1 - c_rev;
      for (int j = 0; j < members; ++j) {
        const std::int64_t b_slot = first_b + 3 * big_g * c_rev + 3 * j + jump(c_rev);
        PO_RETURN_IF_ERROR(place(OpKind::kBackward, j, c, b_slot));
        PO_RETURN_IF_ERROR(place(OpKind::kBackwardWeight, j, c, b_slot + 1));
      }
    }
    SortBySlot(passes);
  }
  return block;
}

SlotTimeline RepeatBlock(const SlotTimeline& block, const BlockShape& shape,
                         int num_microbatches) {
  const int g = shape.group_size;
  const int groups = (num_microbatches + g - 1) / g;
  const std::int64_t period = shape.Period();
  SlotTimeline repeated(block.size());
  for (std::size_t d = 0; d < block.size(); ++d) {
    std::vector<SlottedOp>& passes = repeated[d];
    passes.reserve(block[d].size() * groups);
    for (int n = 0; n < groups; ++n) {
      for (const SlottedOp& pass : block[d]) {
        const int mb = pass.op.mb + n * g;
        if (mb >= num_microbatches) continue;
        SlottedOp copy = pass;
        copy.op.mb = mb;
        copy.slot += n * period;
        passes.push_back(copy);
      }
    }
    // Copies of consecutive groups interleave (a block spans more than one period).
    SortBySlot(passes);
  }
  return repeated;
}

absl::StatusOr<SlotTimeline> ShiftForDependencies(SlotTimeline timeline, int chunks,
                                                  int num_microbatches) {
  const int p = static_cast<int>(timeline.size());
  if (p == 0) return timeline;
  // Slot of F(mb, c) on the last stage, indexed mb * v + c.
  constexpr std::int64_t kAbsent = std::numeric_limits<std::int64_t>::min();
  std::vector<std::int64_t> last_forward(static_cast<std::size_t>(num_microbatches) * chunks,
                                         kAbsent);
  for (const SlottedOp& pass : timeline[p - 1]) {
    if (pass.op.kind == OpKind::kForward) {
      last_forward[static_cast<std::size_t>(pass.op.mb) * chunks + pass.op.chunk] = pass.slot;
    }
  }
  std::int64_t extra = p - 1;
  for (const SlottedOp& pass : timeline[0]) {
    if (pass.op.kind != OpKind::kForward || pass.op.chunk == 0) continue;
    const std::int64_t previous =
        last_forward[static_cast<std::size_t>(pass.op.mb) * chunks + pass.op.chunk - 1];
    const std::int64_t slack = pass.slot - 1 - previous;
    if (previous == kAbsent || slack < 0) {
      return absl::InternalError(absl::StrCat(
          "group schedule shift: stage 0's ", OpToString(pass.op), " at slot ", pass.slot,
          " does not follow F", pass.op.mb, ".", pass.op.chunk - 1, " on stage ", p - 1));
    }
    extra = std::min(extra, slack);
  }
  for (int i = 0; i < p; ++i) {
    const std::int64_t delay = std::min<std::int64_t>(i, extra);
    for (SlottedOp& pass : timeline[i]) pass.slot += delay;
  }
  return timeline;
}

absl::StatusOr<SlotTimeline> Squeeze(SlotTimeline timeline, int chunks, int num_microbatches) {
  const int p = static_cast<int>(timeline.size());
  const int num_layers = p * chunks;  // L
  // Group-interleaved builds loop placement only (its blocks assume chunk c at c * p + d).
  const VirtualStageMap map{Placement::kLoop, p, chunks};
  // Slot in which F / B of (virtual stage l, mb) finished, indexed mb * L + l (microbatch-major:
  // stages busy at the same time work on nearby microbatches).
  constexpr std::int64_t kNotYet = std::numeric_limits<std::int64_t>::max();
  const std::size_t entries = static_cast<std::size_t>(num_layers) * num_microbatches;
  std::vector<std::int64_t> forward_done(entries, kNotYet);
  std::vector<std::int64_t> backward_done(entries, kNotYet);
  auto index = [&](int layer, int mb) {
    return static_cast<std::size_t>(mb) * num_layers + layer;
  };

  std::vector<std::size_t> cursor(p, 0);
  std::size_t remaining = 0;
  // A stage can only start a pass in a slot after it finished one or after the pass it waits
  // for finished elsewhere, so each slot looks only at the stages woken by the slot before:
  // O(passes) instead of O(slots * p).
  std::vector<int> candidates;
  std::vector<char> queued(p, 0);
  auto wake = [&](int d) {
    if (!queued[d]) {
      queued[d] = 1;
      candidates.push_back(d);
    }
  };
  for (int d = 0; d < p; ++d) {
    remaining += timeline[d].size();
    if (!timeline[d].empty()) wake(d);
  }
  std::vector<int> looking;
  std::vector<int> started;  // stages that started a pass in the current slot
  for (std::int64_t slot = 0; remaining > 0; ++slot) {
    if (candidates.empty()) {
      std::string heads;
      int shown = 0;
      for (int d = 0; d < p && shown < 8; ++d) {
        if (cursor[d] == timeline[d].size()) continue;
        absl::StrAppend(&heads, " stage ", d, ": ", OpToString(timeline[d][cursor[d]].op), ";");
        ++shown;
      }
      return absl::InternalError(
          absl::StrCat("group schedule squeeze stopped at slot ", slot, ", waiting:", heads));
    }
    looking.swap(candidates);
    candidates.clear();
    std::sort(looking.begin(), looking.end());
    started.clear();
    for (int d : looking) {
      queued[d] = 0;
      if (cursor[d] == timeline[d].size()) continue;
      const Op& op = timeline[d][cursor[d]].op;
      const int layer = map.virtual_stage(d, op.chunk);
      bool ready = true;  // W, F of the first and B of the last virtual stage
      if (op.kind == OpKind::kForward && layer > 0) {
        ready = forward_done[index(layer - 1, op.mb)] < slot;
      } else if (op.kind == OpKind::kBackward && layer < num_layers - 1) {
        ready = backward_done[index(layer + 1, op.mb)] < slot;
      }
      if (!ready) continue;
      timeline[d][cursor[d]].slot = slot;
      started.push_back(d);
    }
    // Finish this slot's passes only now: a dependency must end in an earlier slot.
    for (int d : started) {
      const Op& op = timeline[d][cursor[d]].op;
      const int layer = map.virtual_stage(d, op.chunk);
      if (op.kind == OpKind::kForward) {
        forward_done[index(layer, op.mb)] = slot;
        if (layer + 1 < num_layers) wake(map.stage_of(layer + 1));
      }
      if (op.kind == OpKind::kBackward) {
        backward_done[index(layer, op.mb)] = slot;
        if (layer > 0) wake(map.stage_of(layer - 1));
      }
      wake(d);
      ++cursor[d];
      --remaining;
    }
  }
  return timeline;
}

absl::StatusOr<SlotTimeline> GroupInterleavedTimeline(const PipelineSpec& spec) {
  BlockShape shape;
  shape.num_stages = spec.num_stages;
  shape.chunks = spec.chunks_per_stage;
  shape.group_size = spec.group_size;
  shape.min_group_size = MinGroupSize(spec.num_stages);
  const int m = spec.num_microbatches;
  PO_ASSIGN_OR_RETURN(SlotTimeline timeline, BuildingBlock(shape, m));
  timeline = RepeatBlock(timeline, shape, m);
  PO_ASSIGN_OR_RETURN(timeline, ShiftForDependencies(std::move(timeline), shape.chunks, m));
  return Squeeze(std::move(timeline), shape.chunks, m);
}

// The order is the repeated block's slot order; shift and squeeze change only the timing, and
// running them proves the order has a dependency-respecting unit-cost timeline.
absl::StatusOr<std::vector<StageProgram>> BuildGroupInterleavedOrder(const PipelineSpec& spec) {
  PO_ASSIGN_OR_RETURN(const SlotTimeline timeline, GroupInterleavedTimeline(spec));
  std::vector<StageProgram> stages(timeline.size());
  for (std::size_t d = 0; d < timeline.size(); ++d) {
    stages[d].stage = static_cast<int>(d);
    stages[d].ops.reserve(timeline[d].size());
    for (const SlottedOp& pass : timeline[d]) {
      // The unsplit variant folds W into the B just before it.
      if (pass.op.kind == OpKind::kBackwardWeight && !spec.split_backward) continue;
      stages[d].ops.push_back(pass.op);
    }
  }
  return stages;
}

}  // namespace pipeoffload::internal
