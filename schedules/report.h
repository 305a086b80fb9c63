// Human-readable reports of po-schedule: one schedule's per-stage table, and the comparison of
// every policy side by side. Formatting only; the caller compiles.
#ifndef PIPEOFFLOAD_SCHEDULES_REPORT_H_
#define PIPEOFFLOAD_SCHEDULES_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::cli {

// How to print times and memory: unit costs print times in units and memory in units of one
// chunk's activation at the cost model's v (`unit_bytes`), otherwise milliseconds and GiB.
struct ReportUnits {
  bool unit_costs = false;
  std::int64_t unit_bytes = 1;
};

// Spec line, step time, bubble, collisions, then one row per stage: ops, busy time, peak with
// and without offload, host memory, bytes offloaded; then the planner's warnings.
// REQUIRES: schedule.predictions is set.
std::string FormatScheduleTable(const Schedule& schedule, ReportUnits units);

struct ComparisonRow {
  std::string label;  // e.g. "po-f (group-interleaved)"
  PipelineSpec spec;
  absl::StatusOr<Schedule> result;  // an error is shown in its row, not fatal
};

// The specs `po-schedule compare` weighs for `base` (p, m, v, g, split backward, offload
// options taken from it):
// 1f1b, interleaved, group-interleaved, po-h, po-f on group-interleaved, po-f on 1f1b,
// recompute full and lean on 1f1b, zbv / dualpipev, selective, and auto (with
// base.memory_budget_bytes, or half of the largest 1F1B peak when none is given:
// `auto_budget_bytes`).
std::vector<ComparisonRow> ComparisonRows(const PipelineSpec& base,
                                          std::int64_t auto_budget_bytes);

// The pipeline line and a note on which rows split W from B (and why compare's default
// does), the side-by-side table (time, vs 1f1b, bubble, peak stage 0, max peak, host,
// offloaded, collisions), then peak memory per stage per policy, then warnings and errors by row.
std::string FormatComparison(const std::vector<ComparisonRow>& rows, ReportUnits units);

}  // namespace pipeoffload::cli

#endif  // PIPEOFFLOAD_SCHEDULES_REPORT_H_
