// CostModel accessors and the unit-cost model used to compare plans with published numbers.
#include "pipeoffload/cost_model.h"

#include <algorithm>

namespace pipeoffload {

std::int64_t CostModel::ActivationBytes(int stage, int chunk, int num_stages) const {
  return ActivationBytes(stage, chunk, VirtualStageMap{Placement::kLoop, num_stages, chunk + 1});
}

std::int64_t CostModel::ActivationBytes(int stage, int chunk, const VirtualStageMap& map) const {
  if (activation_bytes_per_virtual_stage.empty()) return activation_bytes;
  const std::size_t index = static_cast<std::size_t>(map.virtual_stage(stage, chunk));
  return index < activation_bytes_per_virtual_stage.size()
             ? activation_bytes_per_virtual_stage[index]
             : activation_bytes;
}

static double Scale(const std::vector<double>& scale, int stage) {
  return static_cast<std::size_t>(stage) < scale.size() ? scale[stage] : 1.0;
}

double CostModel::ForwardTime(int stage) const {
  return forward_time * Scale(stage_time_scale, stage);
}

double CostModel::BackwardTime(int stage, bool split_backward) const {
  const double base = split_backward ? backward_time : backward_time + weight_time;
  return base * Scale(stage_time_scale, stage);
}

double CostModel::WeightTime(int stage) const {
  return weight_time * Scale(stage_time_scale, stage);
}

double CostModel::RecomputeTime(int stage, Recompute mode) const {
  switch (mode) {
    case Recompute::kNone: return 0.0;
    case Recompute::kFull:
      return recompute_full_time < 0 ? ForwardTime(stage)
                                     : recompute_full_time * Scale(stage_time_scale, stage);
    case Recompute::kLean:
      return recompute_lean_time < 0 ? kLeanRecomputeShare * ForwardTime(stage)
                                     : recompute_lean_time * Scale(stage_time_scale, stage);
  }
  return 0.0;
}

// `per_stage[map.virtual_stage(stage, chunk)]`, or `uniform` when the vector does not reach it.
static std::int64_t PerVirtualStage(const std::vector<std::int64_t>& per_stage,
                                    std::int64_t uniform, int stage, int chunk,
                                    const VirtualStageMap& map) {
  const std::size_t index = static_cast<std::size_t>(map.virtual_stage(stage, chunk));
  return index < per_stage.size() ? per_stage[index] : uniform;
}

std::int64_t CostModel::RetainedBytes(int stage, int chunk, const VirtualStageMap& map,
                                      Recompute mode) const {
  switch (mode) {
    case Recompute::kNone: return ActivationBytes(stage, chunk, map);
    case Recompute::kFull: {
      const std::int64_t bytes = PerVirtualStage(retained_full_bytes_per_virtual_stage,
                                                 retained_full_bytes, stage, chunk, map);
      return std::max<std::int64_t>(0, bytes < 0 ? boundary_bytes : bytes);
    }
    case Recompute::kLean:
      return std::max<std::int64_t>(0, PerVirtualStage(retained_lean_bytes_per_virtual_stage,
                                                       retained_lean_bytes, stage, chunk, map));
  }
  return 0;
}

std::int64_t CostModel::RebuildBytes(int stage, int chunk, const VirtualStageMap& map,
                                     Recompute mode) const {
  const std::int64_t full = ActivationBytes(stage, chunk, map);
  if (mode != Recompute::kLean) return full;
  const std::int64_t bytes = PerVirtualStage(lean_rebuild_bytes_per_virtual_stage,
                                             lean_rebuild_bytes, stage, chunk, map);
  return bytes < 0 ? full : bytes;
}

std::int64_t CostModel::BackwardHeldBytes(int stage, int chunk, const VirtualStageMap& map,
                                          Recompute mode) const {
  return HeldForBackward(RebuildBytes(stage, chunk, map, mode),
                         RetainedBytes(stage, chunk, map, mode));
}

bool CostModel::RecomputeOffered(int stage, int chunk, const VirtualStageMap& map,
                                 Recompute mode) const {
  return mode == Recompute::kNone || RetainedBytes(stage, chunk, map, mode) > 0;
}

CostModel UnitCostModel(double offload_ratio_k) {
  CostModel cost;
  cost.forward_time = 1.0;
  cost.backward_time = 1.0;
  cost.weight_time = 1.0;
  cost.activation_bytes = 1 << 20;
  cost.boundary_bytes = 0;
  cost.p2p_latency = 0.0;
  cost.p2p_bandwidth = 1e30;
  // One entry moves one way in k * (F + B + W) = 3k time units (pipeoffload.md section 0). The
  // reference planner's k already assumes both directions run at once, so solo and duplex
  // bandwidths are the same here.
  const double transfer_time = 3.0 * offload_ratio_k;
  const double bandwidth =
      transfer_time > 0 ? static_cast<double>(cost.activation_bytes) / transfer_time : 1e30;
  cost.d2h_bandwidth = bandwidth;
  cost.h2d_bandwidth = bandwidth;
  cost.duplex_bandwidth = bandwidth;
  cost.recompute_full_time = 1.0;
  cost.recompute_lean_time = kLeanRecomputeShare;
  cost.retained_full_bytes = cost.activation_bytes / 16;
  cost.retained_lean_bytes = cost.activation_bytes / 2;
  return cost;
}

}  // namespace pipeoffload
