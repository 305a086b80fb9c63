// CostModel accessors and the unit-cost model used to compare plans with published numbers.
#include "pipeoffload/cost_model.h"

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
  return cost;
}

}  // namespace pipeoffload
