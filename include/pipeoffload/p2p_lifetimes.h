// P2P buffer lifetimes across all stages of a Schedule, and from them a tight, safe bound on
// each stage's P2P arena blocks (issue 5). Pure: no backend, no transport.
//
// Happens-before (vector clocks over all stages' programs): program order (d, j-1) -> (d, j);
// a message sent by SEND (q, s) and taken as input by the F or B op (d, c) that consumes the
// matching RECV gives (q, s) -> (d, c) (the executor waits for a receive only there, in
// TakeInput); a BARRIER pair merges: each side happens after everything before the other.
// SEND/RECV pairs are matched as the executor's tags and Validate match them (ScheduleIndex:
// per (pair, MessageKind, mb, chunk), one message each).
//
// A SEND S of stage d, matched by RECV (q, r), has its guarantee point g(S): the first op j of
// stage d whose clock has seen op r of stage q, i.e. q has posted the receive before anything
// that led to d's op j. (For a BARRIER j, the clock before it: its partner's side is known
// only once the barrier returns, and the executor waits before j.) From op g(S) on, waiting
// for S cannot deadlock: both sides are posted.
// (P2PGuarantee::kMessageConsumed: op r is replaced by the F/B that consumes the message, a
// guarantee that holds whatever order a transport runs its transfers in.)
// None: the end of the step (programs[d].ops.size()). One refinement: when q runs a BARRIER
// between r and the F/B that consumes the message, the clock must have seen q's last such
// BARRIER instead of r. A stage blocked inside Transport::Barrier serves none of its receives,
// and some transports move a message only while its receiver tests or waits (the local
// transport with copiers); past that BARRIER, q only runs or waits while serving its receives.
//
// The bound walks the program as the executor allocates (executor_p2p.cc): a RECV allocates a
// block; F (not the last virtual stage) allocates its output and B (not the first) its input
// gradient before the model call, while the input block it consumes is still held and freed
// after; SEND hands the output block to the send, which holds it until max(g(S), s + 1) (an
// executor that waits for every posted send whose guarantee point <= j before op j). The live
// count during op j is blocks held before j plus those j allocates; the peak is its maximum.
// With p = 1 there are no messages: an F/B consumes the neighbouring chunk's output block.
#ifndef PIPEOFFLOAD_P2P_LIFETIMES_H_
#define PIPEOFFLOAD_P2P_LIFETIMES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload {

struct P2PLifetimes {
  int stage = 0;
  // Most P2P blocks (each one boundary buffer) live at once during one op, and the first op
  // that reaches it (-1 when the stage never holds a block, e.g. p = 1 with v = 1).
  int peak_blocks = 0;
  int peak_op = -1;
  // [op index]: blocks live during that op (held before it plus those it allocates).
  std::vector<int> live_blocks;
  // [op index]: for a SEND op, its guarantee point g(S) in [0, ops.size()] (ops.size(): the end
  // of the step); -1 for every other op. g(S) may be <= the SEND's own index when the peer's
  // receive was already known to be posted; the send is then waitable right after it posts.
  std::vector<int> guarantee_point;
};

// When a send may be waited for without risk of deadlock.
enum class P2PGuarantee : std::uint8_t {
  // Once its receiver is known to have POSTED the matching receive. Sound where posted requests
  // progress independently of the rank's other transfers (the local and MPI transports).
  kReceivePosted,
  // Once its receiver is known to have CONSUMED the message (the F/B that took it ran), so the
  // transfer is complete on both sides whatever the transport does; later, so the bound is
  // looser. Sound over NCCL too, which runs a rank's transfers in posting order on one stream
  // (a posted receive may still wait behind the receiver's own sends there).
  kMessageConsumed,
};

// Analyzes every stage of `schedule`; result[d] is stage d's. Errors (FailedPrecondition, naming
// the stage, op index and op): a malformed schedule (sizes, peers, a duplicate or unmatched
// SEND/RECV/BARRIER, a received message that no later F/B consumes, an F/B without its input, a
// SEND without its output); and messages that cannot be ordered (a cycle of waits: the schedule
// would deadlock), naming the blocked op of each stage and what it waits for.
[[nodiscard]] absl::StatusOr<std::vector<P2PLifetimes>> AnalyzeP2P(
    const Schedule& schedule, P2PGuarantee guarantee = P2PGuarantee::kReceivePosted);

// The walk alone, for one stage given its SENDs' guarantee points (P2PLifetimes::
// guarantee_point, e.g. from AnalyzeP2P): what an executor holding that plan needs, computed
// from its own program only. Errors: InvalidArgument when `guarantee_points` does not hold one
// entry per op (-1, or for a SEND an index in [0, ops.size()]); FailedPrecondition for an F/B
// without its input, a SEND without its output, a RECV posted twice or never consumed, an
// output never sent.
[[nodiscard]] absl::StatusOr<P2PLifetimes> WalkP2P(const PipelineSpec& spec,
                                                   const StageProgram& program,
                                                   const std::vector<int>& guarantee_points);

// Device bytes the stage's P2P blocks need at most: peak_blocks blocks of `boundary_bytes`, each
// rounded up to `alignment` as the arena rounds it (alignment a power of two >= 1).
std::int64_t P2PBoundBytes(const P2PLifetimes& lifetimes, std::int64_t boundary_bytes,
                           std::int64_t alignment);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_P2P_LIFETIMES_H_
