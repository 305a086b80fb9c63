// StageArenaNeed (planning.h): the exact need comes from the executor's own walks, so what is
// sized here is what Executor::Create checks.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/runtime/program_check.h"
#include "pipeoffload/planning.h"

namespace pipeoffload {
namespace {

// A StageModel that has sizes and nothing else, for the executor's program walk.
class SizesOnlyModel final : public StageModel {
 public:
  SizesOnlyModel(const ModelSizes& sizes, int stage, const VirtualStageMap& map)
      : sizes_(sizes), stage_(stage), map_(map) {}
  std::int64_t SavedBytes(int chunk, bool) const override {
    return sizes_.saved_bytes[static_cast<std::size_t>(map_.virtual_stage(stage_, chunk))];
  }
  std::int64_t BoundaryBytes() const override { return sizes_.boundary_bytes; }
  std::int64_t RetainedBytes(int chunk, Recompute mode, bool) const override {
    const std::vector<std::int64_t>& bytes =
        mode == Recompute::kFull ? sizes_.retained_full_bytes : sizes_.retained_lean_bytes;
    const auto l = static_cast<std::size_t>(map_.virtual_stage(stage_, chunk));
    return mode == Recompute::kNone || l >= bytes.size() ? -1 : bytes[l];
  }
  bool BackwardReadsRetained(int chunk, Recompute mode, bool) const override {
    const auto l = static_cast<std::size_t>(map_.virtual_stage(stage_, chunk));
    return mode == Recompute::kLean && l < sizes_.lean_rebuild_bytes.size() &&
           sizes_.lean_rebuild_bytes[l] == 0;
  }
  absl::Status Forward(int, int, const void*, void*, void*) override { return Unused(); }
  absl::Status Backward(int, int, const void*, void*, void*, bool) override { return Unused(); }
  absl::Status BackwardWeight(int, int, void*) override { return Unused(); }

 private:
  static absl::Status Unused() { return absl::InternalError("SizesOnlyModel computes nothing"); }
  const ModelSizes& sizes_;
  const int stage_;
  const VirtualStageMap map_;
};

}  // namespace

absl::StatusOr<ArenaNeed> StageArenaNeed(const Schedule& schedule, int stage,
                                         const ModelSizes& sizes, P2PReserve reserve,
                                         const P2PLifetimes* p2p, const ArenaSizing& sizing) {
  const PipelineSpec& spec = schedule.spec;
  const std::int64_t alignment = sizing.alignment;
  if (stage < 0 || stage >= spec.num_stages ||
      schedule.stages.size() != static_cast<std::size_t>(spec.num_stages)) {
    return absl::InvalidArgumentError(absl::StrCat("arena sizing: stage ", stage, " of a ",
                                                   schedule.stages.size(), "-program schedule"));
  }
  if (sizes.saved_bytes.size() != static_cast<std::size_t>(spec.num_virtual_stages())) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena sizing: ", sizes.saved_bytes.size(), " stash sizes for ",
                     spec.num_virtual_stages(), " virtual stages"));
  }
  if (alignment < 4 || (alignment & (alignment - 1)) != 0 || !(sizing.fragmentation_share >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena sizing: alignment ", alignment, " (a power of two >= 4) and ",
                     "fragmentation share ", sizing.fragmentation_share, " (>= 0)"));
  }
  if (reserve == P2PReserve::kPlanned && p2p == nullptr) {
    return absl::InvalidArgumentError("arena sizing: a planned P2P reserve needs the lifetimes");
  }
  const StageProgram& program = schedule.stages[static_cast<std::size_t>(stage)];
  const SizesOnlyModel model(sizes, stage, spec.stage_map());
  PO_ASSIGN_OR_RETURN(const internal::ProgramNeeds needs,
                      internal::CheckStageProgram(spec, program, model, alignment));
  P2PLifetimes worst;
  if (reserve == P2PReserve::kWorstCase) {
    // Every send held to the end of the step: what an executor without a plan may hold.
    std::vector<int> at_end(program.ops.size(), -1);
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      if (IsSend(program.ops[i].kind)) at_end[i] = static_cast<int>(program.ops.size());
    }
    PO_ASSIGN_OR_RETURN(worst, WalkP2P(spec, program, at_end));
    p2p = &worst;
  }
  const auto aligned = [&](std::int64_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  };
  ArenaNeed need;
  need.stash_bytes = needs.stash_peak_aligned_bytes;
  need.p2p_blocks = p2p->peak_blocks;
  need.p2p_bytes =
      P2PBoundBytes(*p2p, std::max<std::int64_t>(sizes.boundary_bytes, 1), alignment);
  for (int c = 0; c < spec.chunks_per_stage; ++c) {
    const std::int64_t entry = aligned(model.SavedBytes(c, spec.split_backward));
    need.largest_entry_bytes = std::max(need.largest_entry_bytes, entry);
    need.smallest_entry_bytes =
        c == 0 ? entry : std::min(need.smallest_entry_bytes, entry);
  }
  if (sizing.budget_bytes > 0) {
    need.budget_bytes = sizing.budget_bytes;
    return need;
  }
  const std::int64_t exact = need.exact();
  const auto headroom = static_cast<std::int64_t>(
      std::ceil(sizing.fragmentation_share * static_cast<double>(exact)));
  need.budget_bytes =
      aligned(std::max<std::int64_t>(1, exact + headroom +
                                            (sizing.spare_largest_entry ? need.largest_entry_bytes
                                                                        : 0)));
  return need;
}

}  // namespace pipeoffload
