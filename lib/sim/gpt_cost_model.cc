// A cost model estimated from a GPT layer stack's shape (DESIGN.md section 6), for planning
// before any timing has been measured.
#include "pipeoffload/cost_model.h"

#include "lib/base/checked_math.h"

namespace pipeoffload {

CostModel EstimateGptCostModel(const GptShape& shape) {
  const double h = shape.hidden;
  const double s = shape.sequence;
  const double layers = shape.layers_per_chunk;
  // One pass (forward, input-grad or weight-grad) of one layer: 24 h^2 s + 4 s^2 h FLOP.
  const double pass_flops = layers * (24.0 * h * h * s + 4.0 * s * s * h);
  const double pass_time = pass_flops / shape.flops_per_second;

  CostModel cost;
  cost.forward_time = pass_time;
  cost.backward_time = pass_time;
  cost.weight_time = pass_time;
  // Saturated: a huge shape fails the byte-total check (sim_cost_check.h) instead of wrapping.
  cost.activation_bytes = SaturatedInt64(layers * 34.0 * h * s);
  cost.boundary_bytes = SaturatedInt64(2.0 * h * s);
  cost.d2h_bandwidth = shape.pcie_bandwidth;
  cost.h2d_bandwidth = shape.pcie_bandwidth;
  cost.duplex_bandwidth = shape.pcie_duplex_bandwidth;
  cost.p2p_bandwidth = shape.p2p_bandwidth;
  cost.p2p_latency = shape.p2p_latency;
  // Recompute: full re-runs the forward and keeps the chunk's input (one boundary message);
  // lean recomputes the LayerNorm and GELU outputs (4 h s + 8 h s of the 34 h s per layer).
  cost.recompute_full_time = pass_time;
  cost.retained_full_bytes = cost.boundary_bytes;
  cost.retained_lean_bytes = SaturatedInt64(layers * 22.0 * h * s);
  cost.recompute_lean_time = layers * 24.0 * h * s / shape.memory_bandwidth;
  return cost;
}

}  // namespace pipeoffload
