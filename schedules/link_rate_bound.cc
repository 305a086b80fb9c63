// LinkRateLeastPeak (link_rate_bound.h): latest starts by a backward pass over the compute
// chains, then each host link's stages swept in order of those latest starts.
#include "schedules/link_rate_bound.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <vector>

namespace pipeoffload::internal {
namespace {

// The compute ops of every stage, in program order, numbered stage after stage.
struct ComputeOps {
  std::vector<int> first;  // [stage]: number of its first op; first[p] = total
  std::vector<Op> ops;
  std::vector<double> duration;
};

ComputeOps Collect(const Timeline& times) {
  ComputeOps out;
  for (const std::vector<TimedOp>& stage : times.stages) {
    out.first.push_back(static_cast<int>(out.ops.size()));
    for (const TimedOp& t : stage) {
      if (!IsCompute(t.op.kind)) continue;
      out.ops.push_back(t.op);
      out.duration.push_back(t.end - t.start);
    }
  }
  out.first.push_back(static_cast<int>(out.ops.size()));
  return out;
}

// Latest starts (the file comment of the header): LS = max_step - duration for an op nothing
// follows; else the least of its successors' LS less its duration. Successors: the next op of
// its stage, and the op its output feeds on another virtual stage (F to the next one's F, B to
// the previous one's B). Empty when the ops do not form a DAG that way (then nothing binds).
std::vector<double> LatestStarts(const ComputeOps& all, const PipelineSpec& spec,
                                 double max_step) {
  const VirtualStageMap map = spec.stage_map();
  const int p = spec.num_stages;
  const int m = spec.num_microbatches;
  const int virtual_stages = map.num_virtual_stages();
  const int n = static_cast<int>(all.ops.size());
  // Op numbers of F and B per (virtual stage, mb), -1 where absent.
  const std::size_t slots = static_cast<std::size_t>(virtual_stages) * m;
  std::vector<int> forward(slots, -1), backward(slots, -1);
  std::vector<int> stage_of(n);
  for (int s = 0; s < p; ++s) {
    for (int i = all.first[s]; i < all.first[s + 1]; ++i) {
      stage_of[i] = s;
      const Op& op = all.ops[i];
      if (op.mb < 0 || op.mb >= m || op.chunk < 0 || op.chunk >= spec.chunks_per_stage) continue;
      const std::size_t slot =
          static_cast<std::size_t>(map.virtual_stage(s, op.chunk)) * m + op.mb;
      if (op.kind == OpKind::kForward) forward[slot] = i;
      if (op.kind == OpKind::kBackward) backward[slot] = i;
    }
  }
  // The op fed by op i on another virtual stage, or -1.
  const auto fed = [&](int i) {
    const Op& op = all.ops[i];
    if (op.mb < 0 || op.mb >= m || op.chunk < 0 || op.chunk >= spec.chunks_per_stage) return -1;
    const int vs = map.virtual_stage(stage_of[i], op.chunk);
    if (op.kind == OpKind::kForward && vs + 1 < virtual_stages) {
      return forward[static_cast<std::size_t>(vs + 1) * m + op.mb];
    }
    if (op.kind == OpKind::kBackward && vs > 0) {
      return backward[static_cast<std::size_t>(vs - 1) * m + op.mb];
    }
    return -1;
  };
  // Reverse topological order (Kahn): an op is done once its successors are.
  std::vector<int> feeder(n, -1), pending(n, 0);
  for (int i = 0; i < n; ++i) {
    const int next = i + 1 < all.first[stage_of[i] + 1] ? i + 1 : -1;
    const int to = fed(i);
    pending[i] = (next >= 0) + (to >= 0);
    if (to >= 0) feeder[to] = i;
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
    if (i > all.first[stage_of[i]]) relax(i - 1);
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
  const ComputeOps all = Collect(times);
  for (const Op& op : all.ops) {
    if (IsRecompute(op.kind)) return 0;
  }
  const std::vector<double> latest = LatestStarts(all, spec, max_step);
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
