// Which stash entries of one stage program are recomputed, how, and how many bytes their F
// keeps: read once from the program's RECOMPUTE / RECOMPUTE_LEAN ops and the model's
// RetainedBytes, for the program check (its memory walk) and the executor (what F writes).
#ifndef PIPEOFFLOAD_LIB_RUNTIME_RECOMPUTE_PLAN_H_
#define PIPEOFFLOAD_LIB_RUNTIME_RECOMPUTE_PLAN_H_

#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::internal {

// kRecompute -> kFull, kRecomputeLean -> kLean, every other kind -> kNone.
inline Recompute RecomputeOf(OpKind kind) {
  if (kind == OpKind::kRecompute) return Recompute::kFull;
  if (kind == OpKind::kRecomputeLean) return Recompute::kLean;
  return Recompute::kNone;
}

struct RecomputePlan {
  std::map<std::pair<int, int>, Recompute> modes;  // (mb, chunk) -> mode; absent: kept
  // retained[chunk][mode]: RetainedBytes for the modes the program uses on that chunk, else -1.
  std::vector<std::array<std::int64_t, 3>> retained;
  // in_place[chunk][mode]: the model's BackwardReadsRetained for those modes (B reads the
  // retained block; its RECOMPUTE* rebuilds nothing), else false.
  std::vector<std::array<bool, 3>> in_place;

  Recompute ModeOf(int mb, int chunk) const {
    const auto it = modes.find({mb, chunk});
    return it == modes.end() ? Recompute::kNone : it->second;
  }
  std::int64_t Retained(int chunk, Recompute mode) const {
    return retained[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(mode)];
  }
  bool InPlace(int chunk, Recompute mode) const {
    return in_place[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(mode)];
  }
};

// Errors: FailedPrecondition when the program recomputes an entry with a mode the model does
// not offer for its chunk (RetainedBytes <= 0: -1 is the StageModel default), naming the
// stage, the op, the chunk and the mode; or moves a recomputed entry to or from the host after
// its RECOMPUTE* (Validate's invariant 8: its transfers move the retained block, before it).
// REQUIRES: every op's chunk in [0, v) (checked before).
inline absl::StatusOr<RecomputePlan> PlanRecompute(const PipelineSpec& spec,
                                                   const StageProgram& program,
                                                   const StageModel& model) {
  RecomputePlan plan;
  plan.retained.assign(static_cast<std::size_t>(spec.chunks_per_stage), {-1, -1, -1});
  plan.in_place.assign(static_cast<std::size_t>(spec.chunks_per_stage), {false, false, false});
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const Op& op = program.ops[i];
    const Recompute mode = RecomputeOf(op.kind);
    if (mode == Recompute::kNone) continue;
    plan.modes[{op.mb, op.chunk}] = mode;
    std::int64_t& bytes = plan.retained[static_cast<std::size_t>(op.chunk)]
                                       [static_cast<std::size_t>(mode)];
    if (bytes > 0) continue;
    bytes = model.RetainedBytes(op.chunk, mode, spec.split_backward);
    plan.in_place[static_cast<std::size_t>(op.chunk)][static_cast<std::size_t>(mode)] =
        model.BackwardReadsRetained(op.chunk, mode, spec.split_backward);
    if (bytes <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "executor: stage ", program.stage, ", op ", i, " (", OpToString(op),
          "): the program recomputes chunk ", op.chunk, " with mode ", RecomputeName(mode),
          ", but the model's RetainedBytes(chunk ", op.chunk, ", ", RecomputeName(mode), ") is ",
          bytes, (bytes < 0 ? " (the model does not offer it)" : " (it must be positive)"),
          "; compile without --recompute ", RecomputeName(mode), " for this model"));
    }
  }
  // A recomputed entry's transfers move its retained block, so they come before its
  // RECOMPUTE* (after it the entry is whole again, and the walk would count the wrong bytes).
  std::map<std::pair<int, int>, std::size_t> recompute_at;
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const Op& op = program.ops[i];
    if (IsRecompute(op.kind)) recompute_at.emplace(std::pair{op.mb, op.chunk}, i);
    if (!IsOffload(op.kind)) continue;
    const auto it = recompute_at.find({op.mb, op.chunk});
    if (it != recompute_at.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "executor: stage ", program.stage, ", op ", i, " (", OpToString(op),
          "): the entry was recomputed at op ", it->second,
          "; a recomputed entry's OFFLOAD, RELEASE and RELOAD move its retained block and come "
          "before its recompute"));
    }
  }
  return plan;
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_RUNTIME_RECOMPUTE_PLAN_H_
