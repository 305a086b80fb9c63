// The share bound: the least peak a plan can have when its policy lets each stage offload only
// part of its activation volume (po-h: half, selective: a fraction, or only some chunks), for
// `auto` (issue 15) to rule out a share without planning it. Pure computation on a lowered
// schedule; no I/O.
//
// Why it holds. Memory counts in program order (simulate.h): after a stage's F_j the device
// holds X_j (what the order holds there without offload) less the entries that are off the
// device then. An entry can be off only between its F and its B: its RELEASE comes after its F
// and its RELOAD before its B. So over any run W of the stage's forwards, the entry lowers the
// sum of those X_j by at most its bytes times the number of W's forwards strictly between its F
// and its B (its reach in W). The planner offloads at most RequestedBytes (offload_policy.h) of
// each stage and only entries of candidate chunks (PrepareChoices, offload_choice.cc), so the
// most any plan can take off W's sum is the best choice of entries under that cap: a
// fractional knapsack by reach, largest first. The peak is at least the average of what is
// left over W. It holds whatever the timing, so it binds where the link has time but the
// policy keeps too much on the device.
#ifndef PIPEOFFLOAD_SCHEDULES_SHARE_BOUND_H_
#define PIPEOFFLOAD_SCHEDULES_SHARE_BOUND_H_

#include <cstdint>
#include <vector>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// Per stage (index: stage), a lower bound in bytes on that stage's peak_bytes in the offload
// plan of `lowered` (a schedule without offload or recompute ops) under `spec`'s offload fields
// (its policy, fraction and chunks; `lowered`'s own spec gives the order). Each stage's bound
// holds on its own: it counts that stage's forwards and entries only. Without a cap (po-f,
// selective by chunks) it still counts what the entries' spans cannot cover. All 0 for no
// offload or auto, or a schedule with recompute ops.
std::vector<std::int64_t> ShareLeastPeaks(const Schedule& lowered, const PipelineSpec& spec,
                                          const CostModel& cost);

// The largest of ShareLeastPeaks: a lower bound on the plan's largest per-stage peak_bytes.
std::int64_t ShareLeastPeak(const Schedule& lowered, const PipelineSpec& spec,
                            const CostModel& cost);

// ShareLeastPeaks of one lowered order, computed once per offload policy asked of it: `auto`
// asks it of a share to rule the share out before planning it (auto_plan.cc), and the planner
// asks it again as it plans that share (NeverAtMostTwoEntries, offload_planner.cc); both reach
// one memo through the order (LoweredOrder, offload_planner.h). Not thread-safe.
class ShareBoundMemo {
 public:
  // ShareLeastPeaks(lowered, spec, cost), computed on the first call with spec's offload fields
  // (the only part of `spec` it reads). REQUIRES: the same order (`lowered`, whose spec may
  // differ in its offload fields only) and the same `cost` on every call. The reference is
  // valid until the next call.
  const std::vector<std::int64_t>& PerStage(const Schedule& lowered, const PipelineSpec& spec,
                                            const CostModel& cost);
  // The largest of PerStage: ShareLeastPeak.
  std::int64_t Largest(const Schedule& lowered, const PipelineSpec& spec, const CostModel& cost);
  // How many policies' bounds it has computed.
  int computed() const { return static_cast<int>(known_.size()); }

 private:
  struct Known {
    OffloadPolicy offload;
    double fraction;
    int chunks;
    std::vector<std::int64_t> least;
  };
  std::vector<Known> known_;  // one per policy asked: a handful (auto's shares)
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_SHARE_BOUND_H_
