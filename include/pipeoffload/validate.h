// Checks a Schedule against every invariant of DESIGN.md section 3, without timing.
#ifndef PIPEOFFLOAD_VALIDATE_H_
#define PIPEOFFLOAD_VALIDATE_H_

#include "absl/status/status.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload {

// Returns OK when `schedule` satisfies every invariant:
//  1. shape: one program per stage, in order; every op's mb, chunk and peer in range;
//  2. completeness: each stage runs F and B (and W when split) of every (mb, chunk) exactly once;
//  3. local order: F < B < W of the same (mb, chunk) on its stage;
//  4. dataflow: F of virtual stage l > 0 is preceded by a RECV_F from the stage of l-1 (or by the
//     local F of l-1 when both virtual stages live on this stage); B of l < L-1 likewise by RECV_B
//     or the local B of l+1; every SEND follows the op that produces its data;
//  5. matching: every SEND_* has exactly one matching RECV_* on its peer (and vice versa), every
//     BARRIER one matching BARRIER on its peer;
//  6. deadlock freedom under blocking rendezvous semantics (every P2P op and BARRIER blocks until
//     its partner is reached), checked by simulation;
//  7. offload life cycle per entry: F < OFFLOAD < RELEASE < RELOAD < B (< W), each at most once,
//     all three or none; nothing left in the stash or the host pool at the end;
//  8. recompute life cycle per entry: at most one RECOMPUTE or RECOMPUTE_LEAN, F < it < B; when
//     the entry is offloaded too (its retained block goes to the host), RELOAD < it.
// Errors: FailedPrecondition naming the invariant, the stage, the op index and the op, followed
// by the step x stage grid around the violation (for deadlocks: the grid where every stage
// hangs, each stage's blocked op marked).
[[nodiscard]] absl::Status Validate(const Schedule& schedule);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_VALIDATE_H_
