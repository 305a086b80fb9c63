// The planner's cost models from the models' sizes and nominal or measured times, and the
// shared-GPU scaling (planning.h, whose top derives it).
#include <algorithm>

#include "pipeoffload/planning.h"

namespace pipeoffload {
namespace {

// NominalCostModel: the largest entry crosses the host link in this share of a chunk's F, a
// boundary message in kBoundaryShare.
constexpr double kTransferShare = 0.25;
constexpr double kBoundaryShare = 0.1;

}  // namespace

CostModel WithModelSizes(CostModel base, const ModelSizes& sizes) {
  base.activation_bytes_per_virtual_stage = sizes.saved_bytes;
  base.activation_bytes = *std::max_element(sizes.saved_bytes.begin(), sizes.saved_bytes.end());
  base.boundary_bytes = sizes.boundary_bytes;
  // The model's -1 (not offered) is the cost model's 0. No list: `base` keeps its own.
  const auto offered = [](const std::vector<std::int64_t>& model_bytes,
                          std::vector<std::int64_t>* bytes) {
    if (model_bytes.empty()) return;
    bytes->clear();
    for (const std::int64_t b : model_bytes) bytes->push_back(std::max<std::int64_t>(b, 0));
  };
  offered(sizes.retained_full_bytes, &base.retained_full_bytes_per_virtual_stage);
  offered(sizes.retained_lean_bytes, &base.retained_lean_bytes_per_virtual_stage);
  if (!sizes.lean_rebuild_bytes.empty()) {
    base.lean_rebuild_bytes_per_virtual_stage = sizes.lean_rebuild_bytes;
  }
  return base;
}

CostModel NominalCostModel(const ModelSizes& sizes, double chunk_time) {
  CostModel cost = WithModelSizes(CostModel{}, sizes);
  cost.forward_time = chunk_time;
  cost.backward_time = chunk_time;
  cost.weight_time = chunk_time;
  const double bandwidth =
      static_cast<double>(cost.activation_bytes) / (kTransferShare * chunk_time);
  cost.d2h_bandwidth = bandwidth;
  cost.h2d_bandwidth = bandwidth;
  cost.duplex_bandwidth = bandwidth;  // the CPU backend's two copy threads do not slow each other
  cost.p2p_bandwidth = static_cast<double>(std::max<std::int64_t>(sizes.boundary_bytes, 1)) /
                       (kBoundaryShare * chunk_time);
  cost.p2p_latency = 0.0;
  return cost;
}

CostModel MeasuredCostModel(const ModelSizes& sizes, const std::vector<StageCosts>& stages,
                            const CostModel& base) {
  std::vector<ChunkTimes> means;
  for (const StageCosts& stage : stages) means.push_back(MeanChunkTimes(stage));
  double f = means.front().forward;
  double b = means.front().backward;
  for (const ChunkTimes& mean : means) {
    f = std::min(f, mean.forward);
    b = std::min(b, mean.backward);
  }
  CostModel cost = WithModelSizes(base, sizes);
  cost.forward_time = f;
  cost.backward_time = b / 2.0;
  cost.weight_time = b / 2.0;
  cost.stage_time_scale.clear();
  for (const ChunkTimes& mean : means) {
    cost.stage_time_scale.push_back((mean.forward + mean.backward) / (f + b));
  }
  const LinkFigures link = SlowestLink(stages);
  cost.d2h_bandwidth = link.d2h;
  cost.h2d_bandwidth = link.h2d;
  cost.duplex_bandwidth = link.duplex;
  cost.host_link_group_size = 1;
  return cost;
}

CostModel ScaleComputeTimes(const CostModel& cost, double factor) {
  CostModel scaled = cost;
  scaled.forward_time *= factor;
  scaled.backward_time *= factor;
  scaled.weight_time *= factor;
  return scaled;
}

CostModel SharedGpuCostModel(const CostModel& solo, const SharedGpu& shared, int num_stages,
                             double compute_factor) {
  CostModel planner = ScaleComputeTimes(solo, compute_factor);
  // The reload margin is a cushion of real time (one B run alone, by default), not of the
  // planner's stretched B: c times longer, it would hold every reload c times earlier, and
  // with it one more entry on the device at the stage's peak (issue 16).
  planner.reload_margin_in_backward_times /= compute_factor;
  if (shared.shared_link) {
    planner.host_link_group_size = num_stages;
    return planner;
  }
  // Each stage plans on its own 1/p of the link: no BARRIER between the stage threads.
  const double p = static_cast<double>(num_stages);
  planner.host_link_group_size = 1;
  planner.d2h_bandwidth /= p;
  planner.h2d_bandwidth /= p;
  planner.duplex_bandwidth /= p;
  return planner;
}

}  // namespace pipeoffload
