// Checks that a CostModel can time a pipeline of a spec's p stages, m microbatches and v chunks:
// durations finite and >= 0, bandwidths > 0, per-stage and per-virtual-stage tables empty or of
// the right size, a host link group of at least one stage, and bytes whose sums over the whole
// step fit an int64 (so no byte total in the simulator or the planner can overflow). And, over a
// schedule's ops, that their durations add up to a finite total (so no time can become inf or
// NaN). Private to lib/sim and the compiler, which checks before it plans; header-only because
// the build lists no source for it.
#ifndef PIPEOFFLOAD_LIB_SIM_SIM_COST_CHECK_H_
#define PIPEOFFLOAD_LIB_SIM_SIM_COST_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/checked_math.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// Largest sum of a schedule's op durations that Simulate accepts, in the cost model's time unit.
// Every simulated time is at most this sum, and below it a double still resolves an eighth of a
// unit, so times compare and print as they should; far above it "finite but huge" inputs reach
// inf and NaN (step inf ms, bubble -nan%).
inline constexpr double kMaxTotalOpTime = 1e15;

// OK, or InvalidArgument "cost model: <field> ..." naming the first bad field and its value.
inline absl::Status CheckCostModel(const CostModel& cost, const PipelineSpec& spec) {
  const int p = spec.num_stages, v = spec.chunks_per_stage;
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
  // Every byte count the simulator and planner add up (device and host peaks, offloaded bytes,
  // link traffic) is a sum over at most p*m*v entries of at most the largest entry and 2*p*m*v
  // messages: bounding that total bounds them all.
  std::int64_t largest_entry = cost.activation_bytes;
  for (std::int64_t bytes : cost.activation_bytes_per_virtual_stage) {
    largest_entry = std::max(largest_entry, bytes);
  }
  const std::optional<std::int64_t> pm =
      CheckedMul(spec.num_stages, spec.num_microbatches);
  const std::optional<std::int64_t> entries = pm ? CheckedMul(*pm, v) : std::nullopt;
  const std::optional<std::int64_t> entry_bytes =
      entries ? CheckedMul(*entries, largest_entry) : std::nullopt;
  const std::optional<std::int64_t> messages = entries ? CheckedMul(*entries, 2) : std::nullopt;
  const std::optional<std::int64_t> message_bytes =
      messages ? CheckedMul(*messages, cost.boundary_bytes) : std::nullopt;
  if (!entry_bytes || !message_bytes || !CheckedAdd(*entry_bytes, *message_bytes)) {
    return bad(absl::StrCat(
        "the step's bytes overflow a 64-bit integer: p*m*v = ", spec.num_stages, "*",
        spec.num_microbatches, "*", v, " entries of up to ", largest_entry,
        " bytes (activation_bytes) and twice as many P2P messages of ", cost.boundary_bytes,
        " bytes (boundary_bytes) must add up to at most 2^63 - 1"));
  }
  return absl::OkStatus();
}

// OK when the durations of `schedule`'s ops, each timed as long as the simulator may time it
// (a transfer at the slowest host-link bandwidth), add up to at most kMaxTotalOpTime. Errors:
// InvalidArgument naming the total and the cost fields that make it. REQUIRES: CheckCostModel
// passed for the schedule's spec.
inline absl::Status CheckTotalOpTime(const Schedule& schedule, const CostModel& cost) {
  const bool split = schedule.spec.split_backward;
  const double slowest_link =
      std::min({cost.d2h_bandwidth, cost.h2d_bandwidth, cost.duplex_bandwidth});
  double message = cost.p2p_latency + static_cast<double>(cost.boundary_bytes) / cost.p2p_bandwidth;
  if (cost.p2p_shares_host_link) {
    message = std::max(message, static_cast<double>(cost.boundary_bytes) / slowest_link);
  }
  double total = 0.0;
  for (const StageProgram& program : schedule.stages) {
    const int s = program.stage;
    for (const Op& op : program.ops) {
      switch (op.kind) {
        case OpKind::kForward: total += cost.ForwardTime(s); break;
        case OpKind::kBackward: total += cost.BackwardTime(s, split); break;
        case OpKind::kBackwardWeight: total += cost.WeightTime(s); break;
        case OpKind::kRecompute: total += cost.RecomputeTime(s, Recompute::kFull); break;
        case OpKind::kRecomputeLean: total += cost.RecomputeTime(s, Recompute::kLean); break;
        case OpKind::kOffload:
        case OpKind::kReload: {
          // The entry, or its retained block when the program recomputes it: the larger.
          const int chunk = std::max(op.chunk, 0);
          const VirtualStageMap map = schedule.spec.stage_map();
          const std::int64_t bytes =
              std::max({cost.ActivationBytes(s, chunk, map),
                        cost.RetainedBytes(s, chunk, map, Recompute::kLean),
                        cost.RetainedBytes(s, chunk, map, Recompute::kFull)});
          total += static_cast<double>(bytes) / slowest_link;
          break;
        }
        default:
          if (IsP2P(op.kind)) total += message;
          break;
      }
    }
  }
  // Negated so that NaN fails too.
  if (!(total <= kMaxTotalOpTime)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost model: the schedule's ops take ", total, " time units in all, more than the ",
        kMaxTotalOpTime,
        " a simulation can time exactly; lower forward_time, backward_time, weight_time, "
        "p2p_latency or the bytes, or raise the bandwidths (the slowest host link moves ",
        slowest_link, " bytes per unit)"));
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SIM_SIM_COST_CHECK_H_
