// GatedStepLowerBound (gated_step_bound.h): earliest starts by a forward pass (Kahn) over the
// compute chains (compute_chains.h), a gated F's D2H holding its stage's next op.
#include "schedules/gated_step_bound.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "schedules/compute_chains.h"

namespace pipeoffload::internal {

double GatedStepLowerBound(const Schedule& lowered, const Timeline& times, const CostModel& cost,
                           const std::vector<std::vector<int>>& gated) {
  const PipelineSpec& spec = lowered.spec;
  const int p = spec.num_stages;
  if (static_cast<int>(times.stages.size()) != p || static_cast<int>(gated.size()) != p) {
    return 0.0;
  }
  const ComputeChains all = CollectComputeChains(times, spec);
  const int n = all.size();
  // What a gated F's D2H adds before its stage's next op (its whole entry at d2h_bandwidth).
  std::vector<double> gap(n, 0.0);
  const VirtualStageMap map = spec.stage_map();
  for (int s = 0; s < p; ++s) {
    std::vector<char> is_gated(times.stages[s].size(), 0);
    for (const int i : gated[s]) {
      if (i < 0 || i >= static_cast<int>(is_gated.size())) return 0.0;
      is_gated[static_cast<std::size_t>(i)] = 1;
    }
    for (int k = all.first[s]; k < all.first[s + 1]; ++k) {
      if (is_gated[static_cast<std::size_t>(all.program_index[k])] == 0) continue;
      gap[k] = static_cast<double>(cost.ActivationBytes(s, all.ops[k].chunk, map)) /
               cost.d2h_bandwidth;
    }
  }
  const double p2p = cost.p2p_latency +
                     static_cast<double>(cost.boundary_bytes) / cost.p2p_bandwidth;
  std::vector<int> pending(n, 0);
  for (int i = 0; i < n; ++i) {
    if (all.next(i) >= 0) ++pending[all.next(i)];
    if (all.fed[i] >= 0) ++pending[all.fed[i]];
  }
  std::vector<double> start(n, 0.0);  // earliest start, final once the op is ready
  std::vector<int> ready;
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  double step = 0.0;
  int done = 0;
  while (!ready.empty()) {
    const int i = ready.back();
    ready.pop_back();
    ++done;
    const double end = start[i] + all.duration[i];
    step = std::max(step, end + gap[i]);  // a gated F's D2H is an op of the step too
    const auto relax = [&](int to, double at) {
      if (to < 0) return;
      start[to] = std::max(start[to], at);
      if (--pending[to] == 0) ready.push_back(to);
    };
    relax(all.next(i), end + gap[i]);
    const int to = all.fed[i];
    relax(to, to >= 0 && all.stage_of[to] == all.stage_of[i] ? end : end + p2p);
  }
  return done == n ? step : 0.0;
}

}  // namespace pipeoffload::internal
