// Executes a Schedule under a CostModel and predicts time, memory and traffic.
//
// Semantics (DESIGN.md section 4), matching the runtime's executor: each stage issues its ops in
// program order. Engines per stage: one compute engine, a send and a recv engine for P2P, a D2H
// and an H2D copy engine (one shared engine when CostModel::shared_copy_engine).
//  - A SEND or RECV is *posted* at its issue time (the start of the latest op before it that
//    started; posts do not count) and does not hold up the ops after it: the runtime posts a
//    non-blocking request and moves on. Its transfer starts at max(send posted, recv posted,
//    the end of the F/B that produced the data, the sender's send engine free, the receiver's
//    recv engine free) and takes p2p_latency + bytes / p2p_bandwidth; each stage's sends, and
//    its receives, move in program order. A TimedOp of a SEND/RECV is its transfer.
//  - F and B wait for the transfer of the RECV that brings their input. A compute op starts no
//    earlier than the previous compute op ends and the previous op (of any kind but SEND/RECV)
//    starts. B and W of an offloaded entry wait for its RELOAD to finish.
//  - OFFLOAD and RELOAD start when issued, their F done (OFFLOAD) and their copy engine free;
//    RELEASE waits for its OFFLOAD to finish, and the ops after it wait for the RELEASE; BARRIER
//    is a rendezvous with its partner and gates the ops after it.
// Memory, two ways:
//  - StagePrediction::peak_* follow program order: +entry at F and RELOAD, -entry at RELEASE and
//    at B (unsplit) or W (split). That is the runtime's logical stash count, and its physical
//    one too: the runtime's RELOAD makes its H2D wait for the compute issued before it
//    (activation_stash.cc, reload_ready), so the block a B frees can go to the next RELOAD.
//  - Timeline::memory and PeaksInTime follow the simulated timeline: an entry holds memory from
//    the start of the op that allocates it (F's start, RELOAD's copy start) to the end of the
//    op that frees it (RELEASE, which starts once its OFFLOAD's copy ended; B's or W's end).
//    At one instant, frees come before allocations: the op that frees has ended, and an op
//    starting then may take its memory (an F right after a B reuses the B's block). Instants
//    are compared exactly as the simulator computes them (an op starting when another ends is
//    given that end time). The simulator starts a RELOAD's copy when it is issued, so the
//    timeline count can exceed the program-order one (by the entries of B/Ws still running
//    when a RELOAD after them starts), never fall below it.
// Validate's deadlock check is stricter (blocking rendezvous for SEND/RECV too), so a schedule
// that passes Validate never hangs here.
#ifndef PIPEOFFLOAD_SIMULATE_H_
#define PIPEOFFLOAD_SIMULATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload {

// Where an op ran. P2P ops use kSend/kRecv; OFFLOAD uses kD2H, RELOAD kH2D; RELEASE and BARRIER
// occupy no engine (kNone).
enum class Engine : std::uint8_t { kCompute, kSend, kRecv, kD2H, kH2D, kNone };
inline constexpr int kNumEngines = 5;  // engines that appear as trace tracks
std::string_view EngineName(Engine engine);  // "compute", "send", "recv", "D2H", "H2D", "none"

// The engine an op of `kind` occupies, in the simulator and in measured runs alike.
inline Engine EngineOf(OpKind kind) {
  switch (kind) {
    case OpKind::kForward:
    case OpKind::kBackward:
    case OpKind::kBackwardWeight:
    case OpKind::kRecompute:
    case OpKind::kRecomputeLean:
      return Engine::kCompute;
    case OpKind::kSendActivation:
    case OpKind::kSendGrad:
      return Engine::kSend;
    case OpKind::kRecvActivation:
    case OpKind::kRecvGrad:
      return Engine::kRecv;
    case OpKind::kOffload:
      return Engine::kD2H;
    case OpKind::kReload:
      return Engine::kH2D;
    default:
      return Engine::kNone;
  }
}

struct TimedOp {
  int stage = 0;
  int index = 0;  // position in the stage's program
  Op op;
  Engine engine = Engine::kNone;
  double start = 0.0;
  double end = 0.0;
  std::int64_t bytes = 0;  // bytes moved (P2P, OFFLOAD, RELOAD), else 0
};

// Device activation memory on one stage after each change.
struct MemorySample {
  double time = 0.0;
  std::int64_t bytes = 0;
  std::int64_t units = 0;
};

struct Timeline {
  std::vector<std::vector<TimedOp>> stages;             // [stage][program index]
  std::vector<std::vector<MemorySample>> memory;         // [stage], in time order (see above)
  Predictions predictions;
};

// The most device activation memory one stage holds at any instant of the timeline.
struct PeakInTime {
  std::int64_t units = 0;  // stash entries
  std::int64_t bytes = 0;  // may be reached at another instant than `units` (chunks differ)
};

// Per stage, the peaks of timeline.memory (the time-ordered count above). Each is at least the
// stage's StagePrediction peak of the same timeline.
std::vector<PeakInTime> PeaksInTime(const Timeline& timeline);

// Simulates `schedule` (which should already pass Validate). The predictions' *_without_offload
// fields are filled by simulating the same programs with the offload ops removed.
// Errors: FailedPrecondition with the step x stage grid when the programs hang.
[[nodiscard]] absl::StatusOr<Timeline> Simulate(const Schedule& schedule,
                                                const CostModel& cost);

// Counts pairs of transfers that overlap in time in the same direction of the same link
// (a stage group's host link, per CostModel::host_link_group_size; P2P counts against host
// links only when p2p_shares_host_link).
int CountCollisions(const Timeline& timeline, const CostModel& cost, int num_stages);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_SIMULATE_H_
