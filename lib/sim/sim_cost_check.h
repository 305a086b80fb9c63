// Checks that a CostModel can time a pipeline of p stages and v chunks: durations finite and
// >= 0, bandwidths > 0, per-stage and per-virtual-stage tables empty or of the right size, a
// host link group of at least one stage. Private to lib/sim (and usable by the compiler before
// it plans with a cost model); header-only because the build lists no source for it.
#ifndef PIPEOFFLOAD_LIB_SIM_SIM_COST_CHECK_H_
#define PIPEOFFLOAD_LIB_SIM_SIM_COST_CHECK_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "pipeoffload/cost_model.h"

namespace pipeoffload::internal {

// OK, or InvalidArgument "cost model: <field> ..." naming the first bad field and its value.
inline absl::Status CheckCostModel(const CostModel& cost, int p, int v) {
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("cost model: " + what);
  };
  const auto non_negative = [](double x) { return std::isfinite(x) && x >= 0.0; };
  const auto positive = [](double x) { return !std::isnan(x) && x > 0.0; };
  const std::pair<const char*, double> times[] = {{"forward_time", cost.forward_time},
                                                  {"backward_time", cost.backward_time},
                                                  {"weight_time", cost.weight_time},
                                                  {"p2p_latency", cost.p2p_latency}};
  for (const auto& [name, value] : times) {
    if (!non_negative(value)) {
      return bad(std::string(name) + " must be finite and >= 0 (got " + std::to_string(value) +
                 ")");
    }
  }
  const std::pair<const char*, double> bandwidths[] = {{"d2h_bandwidth", cost.d2h_bandwidth},
                                                       {"h2d_bandwidth", cost.h2d_bandwidth},
                                                       {"duplex_bandwidth", cost.duplex_bandwidth},
                                                       {"p2p_bandwidth", cost.p2p_bandwidth}};
  for (const auto& [name, value] : bandwidths) {
    if (!positive(value)) {
      return bad(std::string(name) + " must be > 0 (got " + std::to_string(value) + ")");
    }
  }
  if (!cost.stage_time_scale.empty() &&
      cost.stage_time_scale.size() != static_cast<std::size_t>(p)) {
    return bad("stage_time_scale has " + std::to_string(cost.stage_time_scale.size()) +
               " entries; it needs one per stage (" + std::to_string(p) + ") or none");
  }
  for (double scale : cost.stage_time_scale) {
    if (!non_negative(scale)) return bad("stage_time_scale entries must be finite and >= 0");
  }
  const std::size_t num_virtual = static_cast<std::size_t>(p) * static_cast<std::size_t>(v);
  if (!cost.activation_bytes_per_virtual_stage.empty() &&
      cost.activation_bytes_per_virtual_stage.size() != num_virtual) {
    return bad("activation_bytes_per_virtual_stage has " +
               std::to_string(cost.activation_bytes_per_virtual_stage.size()) +
               " entries; it needs p*v = " + std::to_string(num_virtual) + " or none");
  }
  for (std::int64_t bytes : cost.activation_bytes_per_virtual_stage) {
    if (bytes < 0) return bad("activation_bytes_per_virtual_stage entries must be >= 0");
  }
  if (cost.activation_bytes < 0) return bad("activation_bytes must be >= 0");
  if (cost.boundary_bytes < 0) return bad("boundary_bytes must be >= 0");
  if (cost.host_link_group_size < 1) {
    return bad("host_link_group_size must be >= 1 (got " +
               std::to_string(cost.host_link_group_size) + ")");
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SIM_SIM_COST_CHECK_H_
