// offload_table --shared-links (shared_links_table.h). Peaks come from the plans' predictions
// (chunk units), the bound from the lowered order's own timeline (every plan the planner makes
// outside a gated warm-up keeps it; a gated one may beat it, which the table then shows as a
// peak below the bound).
#include "bench/shared_links_table.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"
#include "schedules/peak_bound.h"

namespace pipeoffload::bench {
namespace {

struct Config {
  int p = 0, v = 0, g = 0, chunks = 0;
  double k = 0.0;
};

// One way of linking the stages: its plan's per-stage peaks and step, or why it failed.
struct Planned {
  std::vector<std::int64_t> peaks;
  double step = 0.0;
  std::string error;
};

struct Row {
  Config config;
  Planned shared, separate;
  std::vector<int> bound;
  int link_bound = 0;    // the largest GroupLeastMaxPeak over the pairs
  std::int64_t gap = 0;  // the largest shared - separate peak over the stages
};

PipelineSpec SpecOf(const Config& c) {
  PipelineSpec spec;
  spec.family = Family::kGroupInterleaved;
  spec.num_stages = c.p;
  spec.num_microbatches = 4 * c.p;
  spec.chunks_per_stage = c.v;
  spec.group_size = c.g;
  spec.split_backward = true;
  spec.offload = OffloadPolicy::kSelective;
  spec.offload_chunks = c.chunks;
  return spec;
}

CostModel CostOf(const Config& c, int link_group) {
  CostModel cost = UnitCostModel(c.k);
  cost.host_link_group_size = link_group;
  return cost;
}

Planned Plan(const Config& c, int link_group) {
  Planned out;
  const absl::StatusOr<Schedule> schedule = Compile(SpecOf(c), CostOf(c, link_group));
  if (!schedule.ok()) {
    out.error = std::string(schedule.status().message());
    return out;
  }
  for (const StagePrediction& s : schedule->predictions->stages) out.peaks.push_back(s.peak_units);
  out.step = schedule->predictions->step_time;
  return out;
}

// Each stage's least peak with every entry of the policy's chunks offloadable (empty when the
// order does not simulate), and into *link_bound the largest over the pairs that share a link
// of the least largest peak of the two (GroupLeastMaxPeak).
std::vector<int> Bound(const Config& c, int* link_bound) {
  const PipelineSpec spec = SpecOf(c);
  const CostModel cost = CostOf(c, 1);  // the bound books no link: any sharing gives the same
  const absl::StatusOr<PipelineSpec> resolved = ResolveSpec(spec);
  if (!resolved.ok()) return {};
  const absl::StatusOr<Schedule> order = BuildComputeOrder(*resolved, cost);
  if (!order.ok()) return {};
  const absl::StatusOr<Schedule> lowered = LowerCommunication(*order);
  if (!lowered.ok()) return {};
  const absl::StatusOr<Timeline> timeline = Simulate(*lowered, cost);
  if (!timeline.ok()) return {};
  std::vector<int> out;
  const int entries = spec.num_microbatches * spec.chunks_per_stage;
  for (int d = 0; d < c.p; ++d) {
    out.push_back(internal::LeastPeak(
        internal::TimedWindows(timeline->stages[d], cost, true, d, c.chunks), entries));
  }
  *link_bound = 0;
  for (int first = 0; first < c.p; first += 2) {
    std::vector<const std::vector<TimedOp>*> pair;
    for (int d = first; d < std::min(c.p, first + 2); ++d) pair.push_back(&timeline->stages[d]);
    *link_bound = std::max(*link_bound,
                           internal::GroupLeastMaxPeak(pair, cost, true, first, c.chunks));
  }
  return out;
}

template <typename T>
std::string Joined(const std::vector<T>& values) {
  std::string out;
  for (const T& x : values) {
    if (!out.empty()) out += "/";
    out += std::to_string(x);
  }
  return out;
}

template <typename T>
T Max(const std::vector<T>& values) {
  return values.empty() ? T{} : *std::max_element(values.begin(), values.end());
}

void PrintHeader() {
  std::printf(
      "| p | v | g | chunks | k | max shared | max separate | max bound | pair bound | gap | "
      "shared peaks | separate peaks | bound | step shared | step separate |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

void PrintRow(const Row& r) {
  const Config& c = r.config;
  std::printf("| %d | %d | %d | %d | %.2f | ", c.p, c.v, c.g, c.chunks, c.k);
  if (!r.shared.error.empty() || !r.separate.error.empty()) {
    std::printf("error: %s | | | | | | | | | |\n",
                (r.shared.error.empty() ? r.separate.error : r.shared.error).c_str());
    return;
  }
  std::printf("%lld | %lld | %d | %d | %lld | %s | %s | %s | %.6g | %.6g |\n",
              static_cast<long long>(Max(r.shared.peaks)),
              static_cast<long long>(Max(r.separate.peaks)), Max(r.bound), r.link_bound,
              static_cast<long long>(r.gap), Joined(r.shared.peaks).c_str(),
              Joined(r.separate.peaks).c_str(), Joined(r.bound).c_str(), r.shared.step,
              r.separate.step);
}

}  // namespace

void PrintSharedLinksTable(int worst) {
  std::vector<Row> rows;
  for (const int p : {4, 8, 16}) {
    for (const int v : {1, 2, 4}) {
      for (int g = (p + 1) / 2; g <= p; ++g) {
        for (int chunks = 1; chunks <= v; ++chunks) {
          for (const double k : {0.25, 0.5, 0.75, 1.0}) {
            Row row;
            row.config = Config{p, v, g, chunks, k};
            row.shared = Plan(row.config, 2);
            row.separate = Plan(row.config, 1);
            row.bound = Bound(row.config, &row.link_bound);
            if (row.shared.error.empty() && row.separate.error.empty()) {
              row.gap = std::numeric_limits<std::int64_t>::min();
              for (int d = 0; d < p; ++d) {
                row.gap = std::max(row.gap, row.shared.peaks[d] - row.separate.peaks[d]);
              }
            }
            rows.push_back(std::move(row));
          }
        }
      }
    }
  }
  int within = 0, errors = 0, steps_differ = 0, below_bound = 0, max_within = 0;
  int below_link_bound = 0;  // largest shared peak under the pair bound: a gated warm-up
  int within_link_bound = 0;  // max shared peak <= pair bound + 1
  int out_of_reach = 0;       // separate max + 1 < pair bound: no plan keeping the timeline meets
                              // the target
  std::int64_t worst_excess = 0;  // max shared peak over the larger bound
  const Row* worst_excess_row = nullptr;
  const Row* worst_row = nullptr;
  for (const Row& r : rows) {
    if (!r.shared.error.empty() || !r.separate.error.empty()) {
      ++errors;
      continue;
    }
    within += r.gap <= 1 ? 1 : 0;
    max_within += Max(r.shared.peaks) <= Max(r.separate.peaks) + 1 ? 1 : 0;
    const std::int64_t excess = Max(r.shared.peaks) - std::max(r.link_bound, Max(r.bound));
    within_link_bound += excess <= 1 ? 1 : 0;
    out_of_reach += Max(r.separate.peaks) + 1 < r.link_bound ? 1 : 0;
    below_link_bound += Max(r.shared.peaks) < r.link_bound ? 1 : 0;
    if (worst_excess_row == nullptr || excess > worst_excess) {
      worst_excess = excess;
      worst_excess_row = &r;
    }
    steps_differ += r.shared.step != r.separate.step ? 1 : 0;
    for (int d = 0; d < r.config.p && !r.bound.empty(); ++d) {
      below_bound += r.shared.peaks[d] < r.bound[d] ? 1 : 0;
    }
    if (worst_row == nullptr || r.gap > worst_row->gap) worst_row = &r;
  }
  const int planned = static_cast<int>(rows.size()) - errors;
  std::printf(
      "Unit costs, group-interleaved, m = 4p, split backward, selective offload of chunks "
      "[0, chunks); shared: two stages per host link, separate: one. Peaks in chunk units; gap: "
      "the largest shared - separate peak over the stages.\n\n");
  std::printf("- configs: %zu (%d failed to plan)\n", rows.size(), errors);
  std::printf("- within one unit on every stage: %d of %d; max peak within one unit: %d of %d\n",
              within, planned, max_within, planned);
  if (worst_row != nullptr) {
    std::printf("- worst gap: %lld (p=%d v=%d g=%d chunks=%d k=%.2f)\n",
                static_cast<long long>(worst_row->gap), worst_row->config.p,
                worst_row->config.v, worst_row->config.g, worst_row->config.chunks,
                worst_row->config.k);
  }
  std::printf("- max shared peak within one unit of the larger bound (pair, stage): %d of %d\n",
              within_link_bound, planned);
  if (worst_excess_row != nullptr) {
    const Config& c = worst_excess_row->config;
    std::printf("- most above it: %lld (p=%d v=%d g=%d chunks=%d k=%.2f)\n",
                static_cast<long long>(worst_excess), c.p, c.v, c.g, c.chunks, c.k);
  }
  std::printf("- max separate peak + 1 below the pair bound (the target out of reach without "
              "moving ops): %d of %d\n",
              out_of_reach, planned);
  std::printf("- steps that differ between shared and separate: %d\n", steps_differ);
  std::printf("- stages planned below their stage bound: %d; configs whose largest shared peak is "
              "below the pair bound (a gated warm-up: it moves ops): %d\n\n",
              below_bound, below_link_bound);
  std::vector<const Row*> shown;
  for (const Row& r : rows) shown.push_back(&r);
  if (worst >= 0) {
    std::stable_sort(shown.begin(), shown.end(),
                     [](const Row* a, const Row* b) { return a->gap > b->gap; });
    shown.resize(std::min<std::size_t>(shown.size(), static_cast<std::size_t>(worst)));
  }
  PrintHeader();
  for (const Row* r : shown) PrintRow(*r);
}

}  // namespace pipeoffload::bench
