// ShareLeastPeaks (share_bound.h): per stage, a few runs of its forwards, each with the best
// fractional choice of entries under the policy's cap.
#include "schedules/share_bound.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "schedules/offload_policy.h"

namespace pipeoffload::internal {
namespace {

// One stage's forwards in program order: what the order holds after each, and per entry the
// run of forwards it can be off the device for.
struct StageForwards {
  std::vector<std::int64_t> held;  // X_j after the j-th forward
  struct Entry {
    std::int64_t bytes;
    int first, last;  // forwards strictly between its F and its B: [first, last], maybe empty
    bool candidate;   // the policy lets it go
  };
  std::vector<Entry> entries;
  std::int64_t total_bytes = 0;
};

StageForwards Forwards(const StageProgram& program, const PipelineSpec& spec,
                       const CostModel& cost) {
  const VirtualStageMap map = spec.stage_map();
  const OpKind frees = spec.split_backward ? OpKind::kBackwardWeight : OpKind::kBackward;
  StageForwards out;
  std::map<std::pair<int, int>, std::size_t> open;  // (mb, chunk) -> its entry, until its B
  std::int64_t held = 0;
  for (const Op& op : program.ops) {
    if (!IsCompute(op.kind)) continue;
    const std::int64_t bytes = cost.ActivationBytes(program.stage, std::max(op.chunk, 0), map);
    const int forwards = static_cast<int>(out.held.size());
    if (op.kind == OpKind::kForward) {
      held += bytes;
      out.held.push_back(held);
      open[{op.mb, op.chunk}] = out.entries.size();
      out.entries.push_back({bytes, forwards + 1, -1, Candidate(spec, op.chunk) && bytes > 0});
      out.total_bytes += bytes;
    }
    if (op.kind == OpKind::kBackward) {
      const auto it = open.find({op.mb, op.chunk});
      if (it != open.end()) {
        out.entries[it->second].last = forwards - 1;
        open.erase(it);
      }
    }
    if (op.kind == frees) held -= bytes;
  }
  return out;
}

// The least average of X - (what is off) over forwards [a, b], with at most `cap` bytes of
// candidate entries offloaded: sum X less the best fractional knapsack by reach in [a, b].
double LeastAverage(const StageForwards& stage, int a, int b, double cap) {
  double sum = 0.0;
  for (int j = a; j <= b; ++j) sum += static_cast<double>(stage.held[j]);
  std::vector<std::pair<int, std::int64_t>> reach;  // (forwards in [a, b], bytes)
  for (const StageForwards::Entry& e : stage.entries) {
    if (!e.candidate || e.last < e.first) continue;
    const int count = std::min(b, e.last) - std::max(a, e.first) + 1;
    if (count > 0) reach.push_back({count, e.bytes});
  }
  std::sort(reach.begin(), reach.end(), std::greater<>());
  for (const auto& [count, bytes] : reach) {
    // An OFFLOAD moves a whole entry, so what is left of the cap below a byte (its rounding
    // slack) takes none.
    if (cap < 1.0) break;
    const double taken = std::min(cap, static_cast<double>(bytes));
    sum -= taken * count;
    cap -= taken;
  }
  return sum / (b - a + 1);
}

}  // namespace

std::vector<std::int64_t> ShareLeastPeaks(const Schedule& lowered, const PipelineSpec& spec,
                                          const CostModel& cost) {
  std::vector<std::int64_t> least(lowered.stages.size(), 0);
  if (spec.offload == OffloadPolicy::kNone || spec.offload == OffloadPolicy::kAuto) return least;
  for (const StageProgram& program : lowered.stages) {
    for (const Op& op : program.ops) {
      if (IsRecompute(op.kind)) return least;
    }
  }
  for (std::size_t s = 0; s < lowered.stages.size(); ++s) {
    const StageForwards stage = Forwards(lowered.stages[s], lowered.spec, cost);
    const int n = static_cast<int>(stage.held.size());
    if (n == 0) continue;
    const double requested = RequestedBytes(spec, stage.total_bytes);
    // The planner's cap, with the slack it allows for rounding (PrepareChoices).
    const double cap = std::isinf(requested) ? requested : requested * (1.0 + 1e-9);
    // The whole run, and its middle half and quarter: a warm-up and a cool-down hold less, and
    // a run of the steady state binds where the whole one is pulled down by them.
    double bound = 0.0;
    for (const auto& [from, to] : {std::pair{0, n - 1}, std::pair{n / 4, n - 1 - n / 4},
                                  std::pair{3 * n / 8, n - 1 - 3 * n / 8}}) {
      if (from > to) continue;
      bound = std::max(bound, LeastAverage(stage, from, to, cap));
    }
    // A peak is whole bytes at or above the exact bound (the rounding here is far below a byte).
    least[s] = static_cast<std::int64_t>(std::floor(bound));
  }
  return least;
}

namespace {

// The largest of per-stage bounds: the floor of the largest exact bound is the largest of their
// floors (floor is monotone), so this is the bound on the largest peak, bit for bit.
std::int64_t LargestOf(const std::vector<std::int64_t>& least) {
  return least.empty() ? 0 : *std::max_element(least.begin(), least.end());
}

}  // namespace

std::int64_t ShareLeastPeak(const Schedule& lowered, const PipelineSpec& spec,
                            const CostModel& cost) {
  return LargestOf(ShareLeastPeaks(lowered, spec, cost));
}

const std::vector<std::int64_t>& ShareBoundMemo::PerStage(const Schedule& lowered,
                                                          const PipelineSpec& spec,
                                                          const CostModel& cost) {
  for (const Known& known : known_) {
    if (known.offload == spec.offload && known.fraction == spec.offload_fraction &&
        known.chunks == spec.offload_chunks) {
      return known.least;
    }
  }
  known_.push_back({spec.offload, spec.offload_fraction, spec.offload_chunks,
                    ShareLeastPeaks(lowered, spec, cost)});
  return known_.back().least;
}

std::int64_t ShareBoundMemo::Largest(const Schedule& lowered, const PipelineSpec& spec,
                                     const CostModel& cost) {
  return LargestOf(PerStage(lowered, spec, cost));
}

}  // namespace pipeoffload::internal
