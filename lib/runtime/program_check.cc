// CheckStageProgram: the executor's validation at the boundary ("validate once", STYLE.md
// 3.4), and the program-order memory walk that sizes the host pool and checks the budget.
#include "lib/runtime/program_check.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/runtime/recompute_plan.h"
#include "pipeoffload/cost_model.h"

namespace pipeoffload::internal {
namespace {

std::string Where(const StageProgram& program, int index, const Op& op) {
  return absl::StrCat("stage ", program.stage, ", op ", index, " (", OpToString(op), ")");
}

absl::Status CheckSpec(const PipelineSpec& spec) {
  if (spec.num_stages < 1 || spec.num_microbatches < 1 || spec.chunks_per_stage < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor: the spec needs num_stages, num_microbatches and chunks_per_stage >= 1, got "
        "p=", spec.num_stages, " m=", spec.num_microbatches, " v=", spec.chunks_per_stage));
  }
  return absl::OkStatus();
}

// The stage an op's peer must be, or -1 when the op may not exist at all on this stage.
int ExpectedPeer(const VirtualStageMap& place, int stage, const Op& op) {
  const int l = place.virtual_stage(stage, op.chunk);
  const int last = place.num_virtual_stages() - 1;
  switch (op.kind) {
    case OpKind::kSendActivation:
    case OpKind::kRecvGrad:
      return l < last ? place.stage_of(l + 1) : -1;
    case OpKind::kRecvActivation:
    case OpKind::kSendGrad:
      return l > 0 ? place.stage_of(l - 1) : -1;
    default:
      return -1;
  }
}

absl::Status CheckOp(const PipelineSpec& spec, const VirtualStageMap& place,
                     const StageProgram& program, int index, const Op& op) {
  const int stage = program.stage;
  if (op.kind == OpKind::kBarrier) {
    if (op.peer < 0 || op.peer >= spec.num_stages || op.peer == stage) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(program, index, op), ": a BARRIER's peer must be another stage in [0, ",
          spec.num_stages, ")"));
    }
    return absl::OkStatus();
  }
  if (op.mb < 0 || op.mb >= spec.num_microbatches || op.chunk < 0 ||
      op.chunk >= spec.chunks_per_stage) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(program, index, op), ": mb must be in [0, ", spec.num_microbatches,
        ") and chunk in [0, ", spec.chunks_per_stage, ")"));
  }
  if (!IsP2P(op.kind)) return absl::OkStatus();
  const int expected = ExpectedPeer(place, stage, op);
  if (expected < 0 || expected == stage) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(program, index, op), ": virtual stage ", place.virtual_stage(stage, op.chunk),
        expected < 0 ? " has no neighbour in that direction"
                     : " exchanges that data with a chunk of its own stage, without messages"));
  }
  if (op.peer != expected) {
    return absl::InvalidArgumentError(absl::StrCat(Where(program, index, op),
                                                   ": the peer must be stage ", expected, " (",
                                                   std::string(PlacementName(spec.placement)),
                                                   " placement), not ", op.peer));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProgramNeeds> CheckStageProgram(const PipelineSpec& spec,
                                               const StageProgram& program,
                                               const StageModel& model,
                                               std::int64_t arena_alignment) {
  if (absl::Status ok = CheckSpec(spec); !ok.ok()) return ok;
  if (program.stage < 0 || program.stage >= spec.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("executor: program for stage ", program.stage,
                                                   " but the spec has ", spec.num_stages,
                                                   " stages"));
  }
  if (spec.placement == Placement::kV && spec.chunks_per_stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor: placement v needs chunks_per_stage == 2, got v=", spec.chunks_per_stage));
  }
  const VirtualStageMap place = spec.stage_map();
  std::vector<std::int64_t> saved(static_cast<std::size_t>(spec.chunks_per_stage));
  for (int chunk = 0; chunk < spec.chunks_per_stage; ++chunk) {
    saved[static_cast<std::size_t>(chunk)] = model.SavedBytes(chunk, spec.split_backward);
    if (saved[static_cast<std::size_t>(chunk)] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "executor: stage ", program.stage, ": the model's SavedBytes(chunk ", chunk,
          ") is ", saved[static_cast<std::size_t>(chunk)], "; it must be positive"));
    }
  }
  if (place.num_virtual_stages() > 1 && model.BoundaryBytes() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("executor: the model's BoundaryBytes() is ",
                                                   model.BoundaryBytes(),
                                                   "; it must be positive"));
  }

  auto aligned = [&](std::int64_t bytes) {
    return (bytes + arena_alignment - 1) / arena_alignment * arena_alignment;
  };
  ProgramNeeds needs;
  std::set<std::pair<int, int>> on_device;
  std::set<std::pair<int, int>> on_host;
  std::map<std::int64_t, std::pair<int, int>> host_count;  // bytes -> (now, max)
  std::int64_t bytes_now = 0;
  std::int64_t aligned_now = 0;
  for (int index = 0; index < static_cast<int>(program.ops.size()); ++index) {
    const Op& op = program.ops[static_cast<std::size_t>(index)];
    if (absl::Status ok = CheckOp(spec, place, program, index, op); !ok.ok()) return ok;
  }
  PO_ASSIGN_OR_RETURN(needs.recompute, PlanRecompute(spec, program, model));
  const RecomputePlan& recompute = needs.recompute;
  auto add = [&](std::int64_t bytes, int index) {
    bytes_now += bytes;
    aligned_now += bytes < 0 ? -aligned(-bytes) : aligned(bytes);
    needs.stash_peak_bytes = std::max(needs.stash_peak_bytes, bytes_now);
    if (aligned_now > needs.stash_peak_aligned_bytes) {
      needs.stash_peak_aligned_bytes = aligned_now;
      needs.stash_peak_op = index;
    }
  };
  for (int index = 0; index < static_cast<int>(program.ops.size()); ++index) {
    const Op& op = program.ops[static_cast<std::size_t>(index)];
    if (op.kind == OpKind::kBarrier) continue;
    const std::pair<int, int> key(op.mb, op.chunk);
    const std::int64_t full = saved[static_cast<std::size_t>(op.chunk)];
    // What the entry's block holds before a RECOMPUTE*, and what its transfers move: the
    // retained block of a recomputed entry, else the whole entry.
    const Recompute mode = recompute.ModeOf(op.mb, op.chunk);
    const std::int64_t held = mode == Recompute::kNone ? full : recompute.Retained(op.chunk, mode);
    // Where B reads the retained block in place, its RECOMPUTE* rebuilds nothing and the block
    // stays until B frees it.
    const bool in_place = mode != Recompute::kNone && recompute.InPlace(op.chunk, mode);
    // (A rebuild of 0 bytes that is not in place, an empty entry, counts as the planner counts
    // it: the retained block stays.)
    const std::int64_t for_backward = HeldForBackward(in_place ? 0 : full, held);
    // The walk tolerates illegal sequences (the stash reports those at run time); it only
    // counts, so a broken program cannot make it over- or under-count twice.
    const auto take_host_copy = [&] {
      if (on_host.erase(key)) --host_count[held].first;
    };
    switch (op.kind) {
      case OpKind::kForward:
      case OpKind::kReload:
        if (on_device.insert(key).second) add(held, index);
        break;
      case OpKind::kRelease:
        if (on_device.erase(key)) add(-held, index);
        break;
      case OpKind::kRecompute:
      case OpKind::kRecomputeLean:
        // Rebuilds the full entry, then frees the retained block (both held meanwhile); the
        // retained block's host copy, if any, is returned here.
        if (on_device.count(key) != 0 && !in_place) {
          add(full, index);
          add(-held, index);
        }
        take_host_copy();
        break;
      case OpKind::kBackward:
        if (!spec.split_backward && on_device.erase(key)) add(-for_backward, index);
        take_host_copy();
        break;
      case OpKind::kBackwardWeight:
        if (on_device.erase(key)) add(-for_backward, index);
        break;
      case OpKind::kOffload:
        if (on_host.insert(key).second) {
          auto& [now, max] = host_count[held];
          max = std::max(max, ++now);
        }
        break;
      default:
        break;
    }
  }
  for (const auto& [bytes, counts] : host_count) {
    needs.host_slots.push_back(HostSlotClass{bytes, counts.second});
  }
  return needs;
}

}  // namespace pipeoffload::internal
