// BuildSlideProgram (slot choice, upload and load placement) and CheckSlideProgram (the walk
// that proves a program's invariants). See program.h for the model of a step.
#include "lib/slide/program.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pipeoffload::internal {
namespace {

struct Use {
  int unit = 0;
  bool backward = false;
};

// F0 .. F(U-2), B(U-1) .. B0.
std::vector<Use> StepUses(int num_units) {
  std::vector<Use> uses;
  for (int u = 0; u + 1 < num_units; ++u) uses.push_back({u, false});
  for (int u = num_units - 1; u >= 0; --u) uses.push_back({u, true});
  return uses;
}

std::int64_t ViewElements(const SlidingModelShape& shape, int unit) {
  const SlidingUnitShape& s = shape.units[static_cast<std::size_t>(unit)];
  std::int64_t n = s.param_count;
  if (s.borrowed_unit >= 0) n += shape.units[static_cast<std::size_t>(s.borrowed_unit)].param_count;
  return n;
}

// Slot state of the builder's simulation.
struct SlotState {
  int unit = -1;
  int grads_out_position = -1;  // position before which its occupant's gradients go out
};

constexpr int kNever = std::numeric_limits<int>::max();

// The first use at or after `from` of `unit`, or kNever.
int NextUse(const std::vector<Use>& uses, int unit, int from) {
  for (int j = from; j < static_cast<int>(uses.size()); ++j) {
    if (uses[static_cast<std::size_t>(j)].unit == unit) return j;
  }
  return kNever;
}

}  // namespace

std::string_view SlideOpKindName(SlideOpKind kind) {
  switch (kind) {
    case SlideOpKind::kBeginStep: return "begin_step";
    case SlideOpKind::kUpload: return "upload";
    case SlideOpKind::kForward: return "forward";
    case SlideOpKind::kSaveCheckpoint: return "save_ckpt";
    case SlideOpKind::kLoadCheckpoint: return "load_ckpt";
    case SlideOpKind::kBeginGrads: return "begin_grads";
    case SlideOpKind::kBackward: return "backward";
    case SlideOpKind::kFinishGrads: return "finish_grads";
    case SlideOpKind::kEndUse: return "end_use";
    case SlideOpKind::kGradsOut: return "grads_out";
    case SlideOpKind::kGpuUpdate: return "gpu_update";
    case SlideOpKind::kNorm: return "norm";
  }
  return "?";
}

std::string SlideProgram::ToString() const {
  std::string out;
  for (const SlideOp& op : ops) {
    absl::StrAppend(&out, std::string(SlideOpKindName(op.kind)));
    if (op.unit >= 0) absl::StrAppend(&out, " u", op.unit);
    if (op.mb >= 0) absl::StrAppend(&out, " mb", op.mb);
    if (op.slot >= 0) absl::StrAppend(&out, " s", op.slot);
    if (op.wait_update) absl::StrAppend(&out, " wait_update");
    out += '\n';
  }
  return out;
}

absl::StatusOr<SlideProgram> BuildSlideProgram(const SlidingModelShape& shape,
                                               const SlidingPlan& plan,
                                               const SlideProgramOptions& options) {
  const int num_units = static_cast<int>(shape.units.size());
  const int M = options.num_microbatches;
  if (M < 1) return absl::InvalidArgumentError("slide program: num_microbatches must be >= 1");
  if (options.upload_distance < 0) {
    return absl::InvalidArgumentError("slide program: upload_distance must be >= 0");
  }
  if (options.grads_out_distance < 1 || options.grads_out_distance > 2) {
    return absl::InvalidArgumentError("slide program: grads_out_distance must be 1 or 2");
  }
  if (static_cast<int>(plan.placement.size()) != num_units) {
    return absl::InvalidArgumentError("slide program: the plan's placement does not fit the shape");
  }
  auto sliding = [&](int unit) {
    return plan.placement[static_cast<std::size_t>(unit)] == UnitPlace::kSliding;
  };
  const std::vector<Use> uses = StepUses(num_units);
  const int num_uses = static_cast<int>(uses.size());
  const int g = options.grads_out_distance;

  // Per position k (before use k; k == num_uses: after the last use), what is issued there.
  std::vector<std::vector<SlideOp>> grads_out_at(static_cast<std::size_t>(num_uses) + 1);
  std::vector<std::vector<SlideOp>> loads_at(static_cast<std::size_t>(num_uses) + 1);
  std::vector<std::vector<SlideOp>> uploads_at(static_cast<std::size_t>(num_uses) + 1);
  std::vector<int> use_slot(static_cast<std::size_t>(num_uses), -1);

  std::vector<SlotState> slots(plan.slot_elements.size());
  std::vector<bool> uploaded(static_cast<std::size_t>(num_units), false);
  SlideProgram program;
  int last_upload_position = 0;
  for (int j = 0; j < num_uses; ++j) {
    const Use& use = uses[static_cast<std::size_t>(j)];
    if (use.backward && sliding(use.unit)) {
      const int position = std::min(j + g, num_uses);
      grads_out_at[static_cast<std::size_t>(position)].push_back(
          {SlideOpKind::kGradsOut, use.unit, -1, -1, false});  // slot filled below
      program.grads_out_order.push_back(use.unit);
    }
    if (!sliding(use.unit)) continue;
    // Still in a slot from earlier in the step?
    int slot = -1;
    for (std::size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].unit == use.unit) slot = static_cast<int>(s);
    }
    if (slot < 0) {
      const std::int64_t need = ViewElements(shape, use.unit);
      int position = std::max({j - options.upload_distance, last_upload_position, 0});
      // Candidates, best first: a slot whose occupant's gradients are out (else its hand-over
      // moves up to this upload), the smallest capacity that fits (big slots stay free for big
      // units), empty or needed furthest in the future (Belady), the lowest index.
      bool moves_grads_out = false;
      for (; position <= j && slot < 0; ++position) {
        std::tuple<int, std::int64_t, int, int> best{2, 0, 0, 0};
        for (std::size_t s = 0; s < slots.size(); ++s) {
          if (plan.slot_elements[s] < need) continue;
          const SlotState& state = slots[s];
          int next = kNever;
          int tier = 0;
          if (state.unit >= 0) {
            next = NextUse(uses, state.unit, position);
            if (next < j) continue;  // a use between the upload and j needs the occupant
            if (state.grads_out_position > position) tier = 1;  // gradients not out yet
          }
          const std::tuple<int, std::int64_t, int, int> key{tier, plan.slot_elements[s], -next,
                                                            static_cast<int>(s)};
          if (key < best) {
            best = key;
            slot = static_cast<int>(s);
          }
        }
        // Moving a hand-over up is the last resort: only when nothing else fits even right
        // before the use.
        if (slot >= 0 && std::get<0>(best) == 1 && position < j) slot = -1;
        if (slot >= 0) {
          moves_grads_out = std::get<0>(best) == 1;
          break;
        }
      }
      if (slot < 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "slide program: no slot of the ring (", plan.slot_elements.size(),
            " slots) can take ", shape.units[static_cast<std::size_t>(use.unit)].name, " (",
            need, " elements) for its ", use.backward ? "backward" : "forward",
            "; the plan needs more or larger slots"));
      }
      if (moves_grads_out) {
        SlotState& evicted = slots[static_cast<std::size_t>(slot)];
        auto& from = grads_out_at[static_cast<std::size_t>(evicted.grads_out_position)];
        for (auto it = from.begin(); it != from.end(); ++it) {
          if (it->unit == evicted.unit) {
            grads_out_at[static_cast<std::size_t>(position)].push_back(*it);
            from.erase(it);
            break;
          }
        }
      }
      last_upload_position = position;
      slots[static_cast<std::size_t>(slot)] = SlotState{use.unit, -1};
      // The first upload of a unit in a step reads what the previous step's update wrote.
      uploads_at[static_cast<std::size_t>(position)].push_back(
          {SlideOpKind::kUpload, use.unit, -1, slot, !uploaded[static_cast<std::size_t>(use.unit)]});
      uploaded[static_cast<std::size_t>(use.unit)] = true;
      ++program.uploads;
      program.upload_elements += ViewElements(shape, use.unit);
    }
    use_slot[static_cast<std::size_t>(j)] = slot;
    if (use.backward) {
      slots[static_cast<std::size_t>(slot)].grads_out_position = std::min(j + g, num_uses);
      for (SlideOp& op : grads_out_at[static_cast<std::size_t>(std::min(j + g, num_uses))]) {
        if (op.unit == use.unit) op.slot = slot;
      }
    }
  }
  // Checkpoint loads of unit u: right after B(u+2), the last reader of act[u % 2]; those on
  // the drive one by one after B(u+1, mb) instead (below).
  auto on_drive = [&](int unit) {
    return static_cast<int>(plan.nvme_checkpoints.size()) == num_units &&
           IsCheckpointed(unit, num_units) && plan.nvme_checkpoints[static_cast<std::size_t>(unit)];
  };
  for (int u = 1; u < num_units; ++u) {
    if (!IsCheckpointed(u, num_units) || on_drive(u)) continue;
    const int position = 2 * num_units - 3 - u;  // the index of use B(u+1)
    for (int mb = 0; mb < M; ++mb) {
      loads_at[static_cast<std::size_t>(position)].push_back(
          {SlideOpKind::kLoadCheckpoint, u, mb, -1, false});
    }
  }

  auto emit_position = [&](int k) {
    for (const auto* list : {&grads_out_at[static_cast<std::size_t>(k)],
                             &loads_at[static_cast<std::size_t>(k)],
                             &uploads_at[static_cast<std::size_t>(k)]}) {
      program.ops.insert(program.ops.end(), list->begin(), list->end());
    }
  };
  program.ops.push_back({SlideOpKind::kBeginStep, -1, -1, -1, false});
  for (int j = 0; j < num_uses; ++j) {
    emit_position(j);
    const Use& use = uses[static_cast<std::size_t>(j)];
    const int slot = use_slot[static_cast<std::size_t>(j)];
    if (!use.backward) {
      for (int mb = 0; mb < M; ++mb) {
        program.ops.push_back({SlideOpKind::kForward, use.unit, mb, slot, false});
        if (IsCheckpointed(use.unit + 1, num_units)) {
          program.ops.push_back({SlideOpKind::kSaveCheckpoint, use.unit + 1, mb, -1, false});
        }
      }
      if (slot >= 0) program.ops.push_back({SlideOpKind::kEndUse, use.unit, -1, slot, false});
      continue;
    }
    program.ops.push_back({SlideOpKind::kBeginGrads, use.unit, -1, slot, false});
    for (int mb = 0; mb < M; ++mb) {
      program.ops.push_back({SlideOpKind::kBackward, use.unit, mb, slot, false});
      if (on_drive(use.unit - 1)) {
        program.ops.push_back({SlideOpKind::kLoadCheckpoint, use.unit - 1, mb, -1, false});
      }
    }
    program.ops.push_back({SlideOpKind::kFinishGrads, use.unit, -1, slot, false});
    if (slot >= 0) program.ops.push_back({SlideOpKind::kEndUse, use.unit, -1, slot, false});
    if (!sliding(use.unit) && !options.defer_updates) {
      program.ops.push_back({SlideOpKind::kGpuUpdate, use.unit, -1, -1, false});
    }
  }
  emit_position(num_uses);
  program.ops.push_back({SlideOpKind::kNorm, -1, -1, -1, false});
  if (options.defer_updates) {
    for (int u = 0; u < num_units; ++u) {
      if (!sliding(u)) program.ops.push_back({SlideOpKind::kGpuUpdate, u, -1, -1, false});
    }
  }
  return program;
}

absl::Status CheckSlideProgram(const SlidingModelShape& shape, const SlidingPlan& plan,
                               int num_microbatches, const SlideProgram& program) {
  const int num_units = static_cast<int>(shape.units.size());
  const int M = num_microbatches;
  auto sliding = [&](int unit) {
    return plan.placement[static_cast<std::size_t>(unit)] == UnitPlace::kSliding;
  };
  std::vector<int> occupant(plan.slot_elements.size(), -1);
  std::set<int> grads_pending;  // finished, not handed out
  std::vector<int> grads_out(static_cast<std::size_t>(num_units), 0);
  std::vector<int> gpu_updates(static_cast<std::size_t>(num_units), 0);
  std::vector<bool> finished(static_cast<std::size_t>(num_units), false);
  std::map<std::pair<int, int>, int> forwards, backwards, saves, loads;
  std::vector<bool> uploaded(static_cast<std::size_t>(num_units), false);
  bool norm = false;
  int begin_steps = 0;
  auto fail = [](std::size_t i, const SlideOp& op, std::string_view why) {
    return absl::InternalError(absl::StrCat("slide program op ", i, " (",
                                            std::string(SlideOpKindName(op.kind)), " u", op.unit,
                                            " mb", op.mb, " s", op.slot, "): ", std::string(why)));
  };
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    const SlideOp& op = program.ops[i];
    const bool has_slot_unit = op.unit >= 0 && op.unit < num_units;
    switch (op.kind) {
      case SlideOpKind::kBeginStep:
        if (i != 0) return fail(i, op, "BeginStep must be the first op");
        ++begin_steps;
        break;
      case SlideOpKind::kUpload: {
        if (!has_slot_unit || !sliding(op.unit)) return fail(i, op, "uploads a non-sliding unit");
        if (op.slot < 0 || op.slot >= static_cast<int>(occupant.size())) {
          return fail(i, op, "bad slot");
        }
        const int evicted = occupant[static_cast<std::size_t>(op.slot)];
        if (evicted >= 0 && grads_pending.count(evicted) != 0) {
          return fail(i, op, absl::StrCat("evicts unit ", evicted, " before its gradients go out"));
        }
        if (plan.slot_elements[static_cast<std::size_t>(op.slot)] < ViewElements(shape, op.unit)) {
          return fail(i, op, "slot too small");
        }
        if (op.wait_update != !uploaded[static_cast<std::size_t>(op.unit)]) {
          return fail(i, op, "a unit's first upload of the step (and only it) waits for its update");
        }
        uploaded[static_cast<std::size_t>(op.unit)] = true;
        occupant[static_cast<std::size_t>(op.slot)] = op.unit;
        break;
      }
      case SlideOpKind::kForward:
      case SlideOpKind::kBackward:
      case SlideOpKind::kBeginGrads:
      case SlideOpKind::kFinishGrads: {
        if (!has_slot_unit) return fail(i, op, "bad unit");
        if (sliding(op.unit)) {
          if (op.slot < 0 || occupant[static_cast<std::size_t>(op.slot)] != op.unit) {
            return fail(i, op, "the unit is not in its slot");
          }
        } else if (op.slot != -1) {
          return fail(i, op, "a resident unit uses a slot");
        }
        const std::pair<int, int> key{op.unit, op.mb};
        if (op.kind == SlideOpKind::kForward) {
          if (op.unit > 0 && forwards.count({op.unit - 1, op.mb}) == 0) {
            return fail(i, op, "forward before the previous unit's");
          }
          // It overwrites act[(unit+1) % 2][mb], which held unit-1's input.
          if (IsCheckpointed(op.unit - 1, num_units) && saves.count({op.unit - 1, op.mb}) == 0) {
            return fail(i, op, "overwrites a checkpoint before it is saved");
          }
          if (++forwards[key] > 1) return fail(i, op, "forward twice");
        } else if (op.kind == SlideOpKind::kBackward) {
          if (op.unit + 1 < num_units && backwards.count({op.unit + 1, op.mb}) == 0) {
            return fail(i, op, "backward before the next unit's");
          }
          if (IsCheckpointed(op.unit, num_units) && loads.count(key) == 0) {
            return fail(i, op, "backward before its checkpoint is loaded");
          }
          if (++backwards[key] > 1) return fail(i, op, "backward twice");
        } else if (op.kind == SlideOpKind::kFinishGrads) {
          for (int mb = 0; mb < M; ++mb) {
            if (backwards.count({op.unit, mb}) == 0) return fail(i, op, "before every backward");
          }
          finished[static_cast<std::size_t>(op.unit)] = true;
          if (sliding(op.unit)) grads_pending.insert(op.unit);
        }
        break;
      }
      case SlideOpKind::kSaveCheckpoint:
        if (!IsCheckpointed(op.unit, num_units)) return fail(i, op, "unit not checkpointed");
        if (forwards.count({op.unit - 1, op.mb}) == 0) {
          return fail(i, op, "saved before the forward that writes it");
        }
        if (++saves[{op.unit, op.mb}] > 1) return fail(i, op, "saved twice");
        break;
      case SlideOpKind::kLoadCheckpoint:
        if (saves.count({op.unit, op.mb}) == 0) return fail(i, op, "loaded before saved");
        for (int mb = 0; mb < M; ++mb) {
          if (backwards.count({op.unit + 2, mb}) == 0) {
            return fail(i, op, "loaded before the last reader of its buffer ran");
          }
        }
        if (++loads[{op.unit, op.mb}] > 1) return fail(i, op, "loaded twice");
        break;
      case SlideOpKind::kEndUse:
        if (op.slot < 0 || occupant[static_cast<std::size_t>(op.slot)] != op.unit) {
          return fail(i, op, "ends a use of a unit not in the slot");
        }
        break;
      case SlideOpKind::kGradsOut:
        if (!has_slot_unit || !sliding(op.unit) || grads_pending.erase(op.unit) != 1) {
          return fail(i, op, "hands out gradients not finished (or twice)");
        }
        if (op.slot < 0 || occupant[static_cast<std::size_t>(op.slot)] != op.unit) {
          return fail(i, op, "its slot no longer holds the unit");
        }
        ++grads_out[static_cast<std::size_t>(op.unit)];
        break;
      case SlideOpKind::kGpuUpdate:
        if (!has_slot_unit || sliding(op.unit) || !finished[static_cast<std::size_t>(op.unit)]) {
          return fail(i, op, "updates a unit that is not resident or not finished");
        }
        ++gpu_updates[static_cast<std::size_t>(op.unit)];
        break;
      case SlideOpKind::kNorm:
        for (int u = 0; u < num_units; ++u) {
          if (!finished[static_cast<std::size_t>(u)]) return fail(i, op, "before every unit finished");
        }
        if (norm) return fail(i, op, "twice");
        norm = true;
        break;
    }
  }
  if (begin_steps != 1 || !norm) return absl::InternalError("slide program: no BeginStep or no norm");
  for (int u = 0; u < num_units; ++u) {
    for (int mb = 0; mb < M; ++mb) {
      if (u + 1 < num_units && forwards.count({u, mb}) == 0) {
        return absl::InternalError(absl::StrCat("slide program: no forward of unit ", u, " mb ", mb));
      }
      if (backwards.count({u, mb}) == 0) {
        return absl::InternalError(absl::StrCat("slide program: no backward of unit ", u, " mb ", mb));
      }
      if (IsCheckpointed(u, num_units) && (saves.count({u, mb}) == 0 || loads.count({u, mb}) == 0)) {
        return absl::InternalError(absl::StrCat("slide program: checkpoint of unit ", u, " mb ", mb,
                                                " not saved and loaded"));
      }
    }
    const int expected_out = sliding(u) ? 1 : 0;
    const int expected_gpu = sliding(u) ? 0 : 1;
    if (grads_out[static_cast<std::size_t>(u)] != expected_out ||
        gpu_updates[static_cast<std::size_t>(u)] != expected_gpu) {
      return absl::InternalError(absl::StrCat("slide program: unit ", u, " is updated ",
                                              grads_out[static_cast<std::size_t>(u)] +
                                                  gpu_updates[static_cast<std::size_t>(u)],
                                              " times, not once"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal
