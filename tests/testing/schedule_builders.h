// Short constructors for hand-built schedules in tests: F(mb, chunk), SendF(mb, peer, chunk), ...
// Make(p, m, v, split, programs) for a Schedule whose stage d runs programs[d], MakeSpec,
// Timed for the ops of hand-built timelines, and HandTimedCosts to time them by hand.
#ifndef PIPEOFFLOAD_TESTS_TESTING_SCHEDULE_BUILDERS_H_
#define PIPEOFFLOAD_TESTS_TESTING_SCHEDULE_BUILDERS_H_

#include <utility>
#include <vector>

#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::testing {

// A spec with the fields tests vary most; everything else keeps PipelineSpec's defaults.
inline PipelineSpec MakeSpec(Family family, int p, int m, int v, int g = 0, bool split = false,
                             OffloadPolicy offload = OffloadPolicy::kNone) {
  PipelineSpec spec;
  spec.family = family;
  spec.num_stages = p;
  spec.num_microbatches = m;
  spec.chunks_per_stage = v;
  spec.group_size = g;
  spec.split_backward = split;
  spec.offload = offload;
  return spec;
}

// An op of `kind` (microbatch 0, chunk 0) on `stage` that ran from `start` to `end`.
inline TimedOp Timed(int stage, OpKind kind, double start, double end, int peer = -1) {
  TimedOp timed;
  timed.stage = stage;
  timed.op = Op{kind, 0, 0, peer};
  timed.start = start;
  timed.end = end;
  return timed;
}

inline Op F(int mb, int c = 0) { return {OpKind::kForward, mb, c, -1}; }
inline Op B(int mb, int c = 0) { return {OpKind::kBackward, mb, c, -1}; }
inline Op W(int mb, int c = 0) { return {OpKind::kBackwardWeight, mb, c, -1}; }
inline Op SendF(int mb, int peer, int c = 0) { return {OpKind::kSendActivation, mb, c, peer}; }
inline Op RecvF(int mb, int peer, int c = 0) { return {OpKind::kRecvActivation, mb, c, peer}; }
inline Op SendB(int mb, int peer, int c = 0) { return {OpKind::kSendGrad, mb, c, peer}; }
inline Op RecvB(int mb, int peer, int c = 0) { return {OpKind::kRecvGrad, mb, c, peer}; }
inline Op Offload(int mb, int c = 0) { return {OpKind::kOffload, mb, c, -1}; }
inline Op Release(int mb, int c = 0) { return {OpKind::kRelease, mb, c, -1}; }
inline Op Reload(int mb, int c = 0) { return {OpKind::kReload, mb, c, -1}; }
inline Op Barrier(int peer) { return {OpKind::kBarrier, -1, -1, peer}; }
inline Op RecomputeFull(int mb, int c = 0) { return {OpKind::kRecompute, mb, c, -1}; }
inline Op RecomputeLean(int mb, int c = 0) { return {OpKind::kRecomputeLean, mb, c, -1}; }

inline Schedule Make(int p, int m, int v, bool split, std::vector<std::vector<Op>> programs) {
  Schedule schedule;
  schedule.spec.num_stages = p;
  schedule.spec.num_microbatches = m;
  schedule.spec.chunks_per_stage = v;
  schedule.spec.split_backward = split;
  for (int d = 0; d < static_cast<int>(programs.size()); ++d) {
    schedule.stages.push_back({d, std::move(programs[static_cast<std::size_t>(d)])});
  }
  return schedule;
}

// Costs easy to time by hand: F = 1, an unsplit B = 1 (0.5 + 0.5), 10-byte entries over a
// 10 B/s link each way alone, 5 B/s each way at once, free P2P.
inline CostModel HandTimedCosts() {
  CostModel cost;
  cost.forward_time = 1.0;
  cost.backward_time = 0.5;
  cost.weight_time = 0.5;
  cost.activation_bytes = 10;
  cost.d2h_bandwidth = 10.0;
  cost.h2d_bandwidth = 10.0;
  cost.duplex_bandwidth = 5.0;
  cost.p2p_latency = 0.0;
  cost.p2p_bandwidth = 1e30;
  return cost;
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_TESTING_SCHEDULE_BUILDERS_H_
