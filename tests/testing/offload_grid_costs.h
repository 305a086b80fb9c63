// The cost models the offload bounds' grid tests run over (offload_bounds_test.cc,
// gated_step_bound_test.cc): unit costs at two link speeds, a slow link per stage, four stages
// on one copy engine, P2P on the host links, and the GPT estimate.
#ifndef PIPEOFFLOAD_TESTS_TESTING_OFFLOAD_GRID_COSTS_H_
#define PIPEOFFLOAD_TESTS_TESTING_OFFLOAD_GRID_COSTS_H_

#include <vector>

#include "pipeoffload/cost_model.h"

namespace pipeoffload::testing {

inline std::vector<CostModel> OffloadGridCosts() {
  CostModel slow_link = UnitCostModel(1.0);
  slow_link.host_link_group_size = 1;
  CostModel shared = UnitCostModel(0.25);
  shared.shared_copy_engine = true;
  shared.host_link_group_size = 4;
  CostModel p2p_on_link = UnitCostModel(0.25);
  p2p_on_link.p2p_shares_host_link = true;
  p2p_on_link.boundary_bytes = 1 << 18;
  p2p_on_link.p2p_bandwidth = 1 << 20;
  return {UnitCostModel(0.25), UnitCostModel(0.5), slow_link, shared, p2p_on_link,
          EstimateGptCostModel(GptShape{})};
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_TESTING_OFFLOAD_GRID_COSTS_H_
