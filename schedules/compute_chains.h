// The compute ops of a timed schedule as the chains the offload bounds walk (link_rate_bound.h,
// gated_step_bound.h): each stage's compute ops in program order, and the edge from an op to
// the op its output feeds on another virtual stage (F to the next one's F, B to the previous
// one's B). Pure function of a timeline; no I/O.
#ifndef PIPEOFFLOAD_SCHEDULES_COMPUTE_CHAINS_H_
#define PIPEOFFLOAD_SCHEDULES_COMPUTE_CHAINS_H_

#include <vector>

#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::internal {

// Ops are numbered stage after stage, in program order.
struct ComputeChains {
  std::vector<int> first;          // [stage]: number of its first op; first[p] = total
  std::vector<int> stage_of;       // [op]
  std::vector<int> program_index;  // [op]: its index in its stage's timeline (program order)
  std::vector<Op> ops;
  std::vector<double> duration;
  std::vector<int> fed;  // [op]: the op its output feeds on another virtual stage, or -1

  int size() const { return static_cast<int>(ops.size()); }
  // The op after op i on its stage, or -1.
  int next(int i) const { return i + 1 < first[stage_of[i] + 1] ? i + 1 : -1; }
};

// The compute ops of `times` (a timeline of a schedule with `spec`, one row per stage).
ComputeChains CollectComputeChains(const Timeline& times, const PipelineSpec& spec);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_COMPUTE_CHAINS_H_
