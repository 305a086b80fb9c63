// The recompute pass (issue 15): which entries a spec recomputes, and the RECOMPUTE /
// RECOMPUTE_LEAN ops that carry it out, each right before its entry's B. Right before B is
// where the full entry lives shortest (from the recompute to B or W); the op after a RECV_B
// post still overlaps the wait for the gradient, since posts do not block. An offload policy
// beside it plans the recomputed entries' retained blocks like any other entry (issue 16).
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeoffload/compiler.h"

namespace pipeoffload {

absl::Status CheckRecomputeSpec(const PipelineSpec& spec) {
  if (spec.recompute != Recompute::kNone && spec.recompute != Recompute::kLean &&
      spec.recompute != Recompute::kFull) {
    return absl::InvalidArgumentError(absl::StrCat("recompute ", static_cast<int>(spec.recompute),
                                                   " is unknown; expected none, lean or full"));
  }
  if (!(spec.recompute_fraction > 0.0 && spec.recompute_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recompute_fraction must be in (0, 1], got ", spec.recompute_fraction));
  }
  if (spec.recompute_chunks < 0 || spec.recompute_chunks > spec.chunks_per_stage) {
    return absl::InvalidArgumentError(absl::StrCat("recompute_chunks must be in [0, v] = [0, ",
                                                   spec.chunks_per_stage, "], got ",
                                                   spec.recompute_chunks));
  }
  return absl::OkStatus();
}

RecomputeChoice ChooseRecompute(const Schedule& lowered) {
  const PipelineSpec& spec = lowered.spec;
  RecomputeChoice choice;
  if (spec.recompute == Recompute::kNone) return choice;
  for (const StageProgram& program : lowered.stages) {
    // (mb, chunk) -> (F position, B position): the entry lives from F to B (W frees it when
    // split, but B is where the recompute goes, so B bounds the saving).
    std::map<std::pair<int, int>, std::pair<int, int>> span;
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      const Op& op = program.ops[i];
      if (op.kind == OpKind::kForward) span[{op.mb, op.chunk}].first = static_cast<int>(i);
      if (op.kind == OpKind::kBackward) span[{op.mb, op.chunk}].second = static_cast<int>(i);
    }
    std::vector<std::pair<int, std::pair<int, int>>> entries;  // (lifespan, (mb, chunk))
    for (const auto& [key, positions] : span) {
      if (spec.recompute_chunks > 0 && key.second >= spec.recompute_chunks) continue;
      entries.push_back({positions.second - positions.first, key});
    }
    std::size_t count = entries.size();
    if (spec.recompute_chunks == 0) {
      count = std::min(count, static_cast<std::size_t>(std::ceil(
                                  spec.recompute_fraction * static_cast<double>(entries.size()) -
                                  1e-9)));
      // Longest-lived first; ties in (mb, chunk) order, so the choice is deterministic.
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
    }
    for (std::size_t k = 0; k < count; ++k) {
      choice[{program.stage, entries[k].second.first, entries[k].second.second}] =
          spec.recompute;
    }
  }
  return choice;
}

absl::StatusOr<Schedule> AddRecompute(const Schedule& lowered, const RecomputeChoice& choice) {
  Schedule out = lowered;
  for (StageProgram& program : out.stages) {
    std::vector<Op> ops;
    ops.reserve(program.ops.size());
    for (const Op& op : program.ops) {
      if (op.kind == OpKind::kBackward) {
        const auto it = choice.find({program.stage, op.mb, op.chunk});
        if (it != choice.end() && it->second != Recompute::kNone) {
          ops.push_back(Op{it->second == Recompute::kFull ? OpKind::kRecompute
                                                          : OpKind::kRecomputeLean,
                           op.mb, op.chunk, -1});
        }
      }
      if (IsRecompute(op.kind)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "AddRecompute: stage ", program.stage, " already has ", OpToString(op)));
      }
      ops.push_back(op);
    }
    program.ops = std::move(ops);
  }
  return out;
}

}  // namespace pipeoffload
