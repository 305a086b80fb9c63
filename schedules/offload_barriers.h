// BARRIER placement between stages that share a host link (issue 3, "staggering"). Header-only
// so it can be tested alone; pure computation, no I/O.
//
// Why barriers go where they go. The planner books every transfer of a link group on one
// timeline per direction, so in the simulator no two transfers of one direction overlap without
// any barrier at all. A real run drifts from the plan, though, and the stages of a group issue
// their copies independently. What keeps their copies from running into each other is the
// order of the hand-overs: whenever the link passes, in one direction, from a transfer Y of
// stage b to a transfer X of stage a (a != b), stage a must not issue X before stage b has
// reached the point of its program planned for X's start (which lies after Y's planned end).
// A BARRIER pair expresses exactly that. Both BARRIERs of the pair go at the same cut of the
// planned timeline: on each stage, after every op whose time is before X's planned start t and
// before every op at or after it (a SEND/RECV's time is its transfer's: offload_stage_plan.h).
// On stage a, X itself is placed after every op at t (offload_stage_plan.h), so the BARRIER
// guards it; on stage b, the cut lies after Y's RELEASE when Y is an OFFLOAD ending at t (a
// RELEASE waits for its D2H, so when X was timed to start as Y ends, the BARRIER is what makes
// it wait for Y in the simulator and in a real run alike). Ops at exactly t stay behind the
// BARRIER on both stages: on a timeline where some op waited for a copy or a BARRIER until t,
// it keeps waiting. Because each SEND/RECV pair is at one time (its transfer's start) on both
// of its stages, no pair straddles such a cut, so the programs with the BARRIERs still run
// through under blocking rendezvous: deadlock-free. (A cut that put the ops at exactly t
// before the BARRIER on one stage and after it on the other could deadlock against a
// SEND/RECV at t.) Copies marked `fixed` come ordered already (the planner's gated warm-up
// keeps the BARRIERs that ordered them), so no BARRIER goes between two of them.
// Consecutive transfers of one stage need no BARRIER (its copy engine serialises them), and
// neither do zero-time transfers.
//
// The pair's BARRIERs are zero-time rendezvous that never delay the planned timeline: each is
// issued by both stages no later than t, and the ops after it start at t or later. They are
// emitted in (t, sequence) order on every stage, so the k-th BARRIER of a with peer b is the
// k-th of b with peer a; two hand-overs of one pair planned for the same instant share one.
#ifndef PIPEOFFLOAD_SCHEDULES_OFFLOAD_BARRIERS_H_
#define PIPEOFFLOAD_SCHEDULES_OFFLOAD_BARRIERS_H_

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "schedules/offload_stage_plan.h"

namespace pipeoffload::internal {

// A transfer kept in the final plan, as the barrier pass sees it.
struct PlannedTransfer {
  int member = 0;   // index of its stage in the link group
  bool d2h = true;  // OFFLOAD (true) or RELOAD (false)
  double start = 0.0;
  double end = 0.0;
  int mb = 0;
  int chunk = 0;
  // A copy whose hand-overs to other fixed copies have BARRIERs already (the planner's gated
  // warm-up copies, warmup_gating.h): no BARRIER here between two fixed copies.
  bool fixed = false;
};

// Returns, for each member of a link group (`plans[i]` is member i; its stage number is
// plans[i]->stage()), the BARRIER ops to insert, each side of a pair's k-th BARRIER with the
// same key seq (k-th in (time, seq) order on both).
inline std::vector<std::vector<InsertedOp>> PlanBarriers(
    const std::vector<const StagePlan*>& plans, const std::vector<PlannedTransfer>& transfers) {
  struct HandOver {
    int low = 0;   // the pair, low < high member index
    int high = 0;
    double time = 0.0;
    int active = 0;  // member that starts the transfer
    int mb = 0;
    int chunk = 0;
  };
  std::vector<HandOver> hand_overs;
  for (const bool d2h : {true, false}) {
    std::vector<const PlannedTransfer*> line;
    for (const PlannedTransfer& t : transfers) {
      if (t.d2h == d2h && t.end > t.start) line.push_back(&t);
    }
    std::sort(line.begin(), line.end(), [](const PlannedTransfer* a, const PlannedTransfer* b) {
      return std::tie(a->start, a->end, a->member) < std::tie(b->start, b->end, b->member);
    });
    for (std::size_t i = 1; i < line.size(); ++i) {
      const PlannedTransfer& before = *line[i - 1];
      const PlannedTransfer& x = *line[i];
      if (before.member == x.member || (before.fixed && x.fixed)) continue;
      hand_overs.push_back(HandOver{std::min(before.member, x.member),
                                    std::max(before.member, x.member), x.start, x.member, x.mb,
                                    x.chunk});
    }
  }
  std::sort(hand_overs.begin(), hand_overs.end(), [](const HandOver& a, const HandOver& b) {
    return std::tie(a.low, a.high, a.time, a.active) < std::tie(b.low, b.high, b.time, b.active);
  });

  std::vector<std::vector<InsertedOp>> barriers(plans.size());
  std::int64_t seq = 0;
  for (std::size_t i = 0; i < hand_overs.size();) {
    std::size_t j = i;
    while (j < hand_overs.size() && hand_overs[j].low == hand_overs[i].low &&
           hand_overs[j].high == hand_overs[i].high && hand_overs[j].time == hand_overs[i].time) {
      ++j;
    }
    const HandOver& first = hand_overs[i];
    for (const int member : {first.low, first.high}) {
      const int peer = member == first.low ? first.high : first.low;
      InsertedOp barrier;
      barrier.op = Op{OpKind::kBarrier, -1, -1, plans[peer]->stage()};
      barrier.key = ProgramKey{plans[member]->FirstGapAtOrAfter(first.time), false, first.time,
                               kRankBarrier, seq};
      // Name the transfer it guards on the stage that starts one.
      for (std::size_t k = i; k < j; ++k) {
        if (hand_overs[k].active != member) continue;
        barrier.op.mb = hand_overs[k].mb;
        barrier.op.chunk = hand_overs[k].chunk;
        break;
      }
      barriers[member].push_back(barrier);
    }
    ++seq;
    i = j;
  }
  return barriers;
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_SCHEDULES_OFFLOAD_BARRIERS_H_
