// CollectComputeChains (compute_chains.h).
#include "schedules/compute_chains.h"

#include <cstddef>
#include <vector>

namespace pipeoffload::internal {

ComputeChains CollectComputeChains(const Timeline& times, const PipelineSpec& spec) {
  const VirtualStageMap map = spec.stage_map();
  const int m = spec.num_microbatches;
  const int v = spec.chunks_per_stage;
  const int virtual_stages = map.num_virtual_stages();
  ComputeChains out;
  // Op numbers of F and B per (virtual stage, mb), -1 where absent.
  const std::size_t slots = static_cast<std::size_t>(virtual_stages) * m;
  std::vector<int> forward(slots, -1), backward(slots, -1);
  const auto slot = [&](int s, const Op& op) {
    return static_cast<std::size_t>(map.virtual_stage(s, op.chunk)) * m + op.mb;
  };
  const auto in_grid = [&](const Op& op) {
    return op.mb >= 0 && op.mb < m && op.chunk >= 0 && op.chunk < v;
  };
  for (int s = 0; s < static_cast<int>(times.stages.size()); ++s) {
    out.first.push_back(out.size());
    const std::vector<TimedOp>& stage = times.stages[s];
    for (int i = 0; i < static_cast<int>(stage.size()); ++i) {
      const TimedOp& t = stage[i];
      if (!IsCompute(t.op.kind)) continue;
      if (in_grid(t.op) && t.op.kind == OpKind::kForward) forward[slot(s, t.op)] = out.size();
      if (in_grid(t.op) && t.op.kind == OpKind::kBackward) backward[slot(s, t.op)] = out.size();
      out.ops.push_back(t.op);
      out.stage_of.push_back(s);
      out.program_index.push_back(i);
      out.duration.push_back(t.end - t.start);
    }
  }
  out.first.push_back(out.size());
  out.fed.assign(out.ops.size(), -1);
  for (int i = 0; i < out.size(); ++i) {
    const Op& op = out.ops[i];
    if (!in_grid(op)) continue;
    const int vs = map.virtual_stage(out.stage_of[i], op.chunk);
    if (op.kind == OpKind::kForward && vs + 1 < virtual_stages) {
      out.fed[i] = forward[static_cast<std::size_t>(vs + 1) * m + op.mb];
    } else if (op.kind == OpKind::kBackward && vs > 0) {
      out.fed[i] = backward[static_cast<std::size_t>(vs - 1) * m + op.mb];
    }
  }
  return out;
}

}  // namespace pipeoffload::internal
