// LinkRateLeastPeak (link_rate_bound.h): latest starts by a backward pass over the compute
// chains, then each host link's stages swept in order of those latest starts.
#include "schedules/link_rate_bound.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <vector>

#include "schedules/compute_chains.h"

namespace pipeoffload::internal {
namespace {

// Latest starts (the file comment of the header): LS = max_step - duration for an op nothing
// follows; else the least of its successors' LS less its duration. Successors: the next op of
// its stage, and the op its output feeds on another virtual stage (compute_chains.h). Empty
// when the ops do not form a DAG that way (then nothing binds).
std::vector<double> LatestStarts(const ComputeChains& all, double max_step) {
  const int n = all.size();
  // Reverse topological order (Kahn): an op is done once its successors are.
  std::vector<int> feeder(n, -1), pending(n, 0);
  for (int i = 0; i < n; ++i) {
    pending[i] = (all.next(i) >= 0) + (all.fed[i] >= 0);
    if (all.fed[i] >= 0) feeder[all.fed[i]] = i;
  }
  std::vector<double> latest(n, max_step);
  std::vector<int> ready;
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  int done = 0;
  while (!ready.empty()) {
    const int i = ready.back();
    ready.pop_back();
    ++done;
    latest[i] -= all.duration[i];  // now its own latest start: its successors' are final
    const auto relax = [&](int before) {
      if (before < 0) return;
      latest[before] = std::min(latest[before], latest[i]);
      if (--pending[before] == 0) ready.push_back(before);
    };
    if (i > all.first[all.stage_of[i]]) relax(i - 1);
    relax(feeder[i]);
  }
  if (done != n) return {};
  return latest;
}

}  // namespace

std::int64_t LinkRateLeastPeak(const Schedule& lowered, const Timeline& times,
                               const CostModel& cost, double max_step) {
  const PipelineSpec& spec = lowered.spec;
  const int p = spec.num_stages;
  // P2P on the host links: the order's own transfers collide there, so Check's rule does not
  // keep a plan's copies one at a time (the header comment).
  if (cost.p2p_shares_host_link) return 0;
  if (static_cast<int>(times.stages.size()) != p || spec.num_microbatches < 1) return 0;
  const ComputeChains all = CollectComputeChains(times, spec);
  for (const Op& op : all.ops) {
    if (IsRecompute(op.kind)) return 0;
  }
  const std::vector<double> latest = LatestStarts(all, max_step);
  if (latest.empty()) return 0;
  const VirtualStageMap map = spec.stage_map();
  const OpKind frees = spec.split_backward ? OpKind::kBackwardWeight : OpKind::kBackward;
  const double bandwidth = std::max(cost.d2h_bandwidth, cost.duplex_bandwidth);
  const int group = std::max(1, cost.host_link_group_size);

  // Per F: its latest start, its stage (within the link's group) and X (bytes held after it).
  struct Point {
    double latest;
    int member;
    std::int64_t held;
  };
  double bound = 0.0;
  for (int first = 0; first < p; first += group) {
    const int members = std::min(group, p - first);
    std::vector<Point> points;
    for (int k = 0; k < members; ++k) {
      const int s = first + k;
      std::int64_t held = 0;
      for (int i = all.first[s]; i < all.first[s + 1]; ++i) {
        const Op& op = all.ops[i];
        const std::int64_t bytes = cost.ActivationBytes(s, std::max(op.chunk, 0), map);
        if (op.kind == OpKind::kForward) {
          held += bytes;
          points.push_back({latest[i], k, held});
        } else if (op.kind == frees) {
          held -= bytes;
        }
      }
    }
    std::stable_sort(points.begin(), points.end(),
                     [](const Point& a, const Point& b) { return a.latest < b.latest; });
    // What the overlaps CountCollisions takes for rounding can carry besides: up to its epsilon
    // (1e-9 of a horizon no longer than max_step, at least 1) per copy, one copy per entry.
    const double rounding = static_cast<double>(points.size()) * 1e-9 *
                            std::max(1.0, max_step) * bandwidth;
    std::vector<std::int64_t> most(members, 0);  // M_s(T) of each member so far
    std::vector<std::int64_t> sorted(members);
    for (std::size_t i = 0; i < points.size(); ++i) {
      most[points[i].member] = std::max(most[points[i].member], points[i].held);
      if (i + 1 < points.size() && points[i + 1].latest == points[i].latest) continue;
      const double carried = bandwidth * std::max(points[i].latest, 0.0) + rounding;
      sorted = most;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      double sum = 0.0;
      for (int k = 0; k < members; ++k) {
        sum += static_cast<double>(sorted[k]);
        bound = std::max(bound, (sum - carried) / (k + 1));
      }
    }
  }
  // A peak is a whole number of bytes at or above the exact bound, so it is at or above the
  // floor of any value within a byte of it (the rounding above is far below one).
  return static_cast<std::int64_t>(std::floor(bound));
}

}  // namespace pipeoffload::internal
