// RecomputeAtPeaks (recompute_mix.h).
#include "schedules/recompute_mix.h"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace pipeoffload::internal {
namespace {

// One (mb, chunk) entry of a stage program: where its ops are and what the plan does with it.
// `chosen`: picked in this round, so the program has no RECOMPUTE op for it yet (it will run
// right before the entry's B) and its offload ops, if any, will be gone.
struct EntryOps {
  int forward = -1, backward = -1, recompute = -1, release = -1, reload = -1;
  Recompute mode = Recompute::kNone;
  bool chosen = false;
};

// Whether an offloaded entry is off the device at program index `at`.
bool Released(const EntryOps& entry, int at) {
  return entry.release >= 0 && entry.release < at && (entry.reload < 0 || entry.reload > at);
}

struct PeakCandidate {
  int mb, chunk;
  int backward;  // its B's index: the further, the more after the peak it lowers
  int forward;
  std::int64_t saving;
};

// The first program index at which stage `program`'s device memory peaks (program order,
// as the simulator counts: F holds the entry or its retained block, RECOMPUTE* adds what it
// rebuilds while its retained block is still held (nothing where B reads that block in place),
// RELEASE and the freeing op give it back), and that
// peak. Entries chosen this round count as recomputed: their RECOMPUTE at their B, their
// RELEASE and RELOAD ignored.
std::pair<int, std::int64_t> PeakIndex(const StageProgram& program, const PipelineSpec& spec,
                                       const CostModel& cost,
                                       const std::vector<EntryOps>& entries) {
  const VirtualStageMap map = spec.stage_map();
  const OpKind frees = spec.split_backward ? OpKind::kBackwardWeight : OpKind::kBackward;
  const int m = spec.num_microbatches;
  std::int64_t running = 0, peak = 0;
  int at = -1;
  const auto add = [&](std::int64_t bytes, int index) {
    running += bytes;
    if (running > peak) {
      peak = running;
      at = index;
    }
  };
  for (int i = 0; i < static_cast<int>(program.ops.size()); ++i) {
    const Op& op = program.ops[i];
    if (op.mb < 0 || op.chunk < 0) continue;
    const EntryOps& entry = entries[static_cast<std::size_t>(op.chunk) * m + op.mb];
    // RetainedBytes of a kept entry is the whole entry, as is what it holds for B.
    const std::int64_t retained =
        cost.RetainedBytes(program.stage, op.chunk, map, entry.mode);
    const std::int64_t rebuild = cost.RebuildBytes(program.stage, op.chunk, map, entry.mode);
    if (op.kind == OpKind::kForward) add(retained, i);
    if ((IsRecompute(op.kind) || (entry.chosen && op.kind == OpKind::kBackward)) && rebuild > 0) {
      add(rebuild, i);
      add(-retained, i);
    }
    // The plan's copies move what the entry holds then: its retained block when recomputed
    // (RetainedBytes of a kept entry is the whole entry).
    if (op.kind == OpKind::kRelease && !entry.chosen) add(-retained, i);
    if (op.kind == OpKind::kReload && !entry.chosen) add(retained, i);
    if (op.kind == frees) {
      add(-cost.BackwardHeldBytes(program.stage, op.chunk, map, entry.mode), i);
    }
  }
  return {at, peak};
}

}  // namespace

int RecomputeAtPeaks(const Schedule& planned, const CostModel& cost, std::int64_t budget_bytes,
                     Recompute mode, MixCover cover, RecomputeChoice* choice) {
  const PipelineSpec& spec = planned.spec;
  const VirtualStageMap map = spec.stage_map();
  const int m = spec.num_microbatches;
  int changed = 0;
  for (const StageProgram& program : planned.stages) {
    const int s = program.stage;
    std::vector<EntryOps> entries(static_cast<std::size_t>(m) * spec.chunks_per_stage);
    for (int i = 0; i < static_cast<int>(program.ops.size()); ++i) {
      const Op& op = program.ops[i];
      if (op.mb < 0 || op.chunk < 0 || op.kind == OpKind::kBarrier) continue;
      EntryOps& entry = entries[static_cast<std::size_t>(op.chunk) * m + op.mb];
      if (op.kind == OpKind::kForward) entry.forward = i;
      if (op.kind == OpKind::kBackward) entry.backward = i;
      if (op.kind == OpKind::kRelease) entry.release = i;
      if (op.kind == OpKind::kReload) entry.reload = i;
      if (IsRecompute(op.kind)) {
        entry.recompute = i;
        entry.mode = op.kind == OpKind::kRecompute ? Recompute::kFull : Recompute::kLean;
      }
    }
    // kPlateau: cover the peak, then the next instant still above the budget with those
    // choices, and so on, so one round lowers the whole plateau, not only its first point.
    // Every pass chooses at least one entry, so this ends.
    for (int pass = 0; cover == MixCover::kPlateau || pass == 0; ++pass) {
      const auto [at, peak] = PeakIndex(program, spec, cost, entries);
      if (peak <= budget_bytes || at < 0) break;
      std::vector<PeakCandidate> candidates;
      for (int c = 0; c < spec.chunks_per_stage; ++c) {
        if (!cost.RecomputeOffered(s, c, map, mode)) continue;
        const std::int64_t full = cost.ActivationBytes(s, c, map);
        const std::int64_t keeps = cost.RetainedBytes(s, c, map, mode);
        for (int mb = 0; mb < m; ++mb) {
          const EntryOps& entry = entries[static_cast<std::size_t>(c) * m + mb];
          // Resident at the peak, and its RECOMPUTE (right before B) would come after it.
          // Offloaded ones only for a full recompute: the plan may hold them there while
          // their copy waits for the link, or have them back already, and recomputed in full
          // they leave the link to others; lean would keep half of them on the device all
          // their life instead of none of them for most of it.
          if (entry.chosen || entry.forward > at || entry.backward <= at || Released(entry, at)) {
            continue;
          }
          if (entry.release >= 0 && mode != Recompute::kFull) continue;
          std::int64_t saving = 0;
          if (entry.mode == Recompute::kNone) {
            saving = full - keeps;
          } else if (mode == Recompute::kFull && entry.mode == Recompute::kLean &&
                     entry.recompute > at) {
            saving = cost.RetainedBytes(s, c, map, Recompute::kLean) - keeps;
          }
          if (saving > 0) candidates.push_back({mb, c, entry.backward, entry.forward, saving});
        }
      }
      std::sort(candidates.begin(), candidates.end(),
                [](const PeakCandidate& a, const PeakCandidate& b) {
                  if (a.backward != b.backward) return a.backward > b.backward;
                  return a.forward < b.forward;
                });
      std::int64_t excess = peak - budget_bytes;
      int chosen_here = 0;
      for (const PeakCandidate& candidate : candidates) {
        if (excess <= 0) break;
        (*choice)[{s, candidate.mb, candidate.chunk}] = mode;
        EntryOps& entry = entries[static_cast<std::size_t>(candidate.chunk) * m + candidate.mb];
        if (entry.mode == Recompute::kNone) {
          entry.chosen = true;
        }  // a lean entry made full keeps its RECOMPUTE op, which now keeps less
        entry.mode = mode;
        excess -= candidate.saving;
        ++changed;
        ++chosen_here;
      }
      if (chosen_here == 0) break;  // nothing left to recompute at this instant
    }
  }
  return changed;
}

}  // namespace pipeoffload::internal
