// The runtime's executor: runs one stage's StageProgram per iteration against the trainer's
// StageModel, a Backend (through a DeviceArena, a HostPool and an ActivationStash) and a
// Transport, and measures every op (DESIGN.md section 5).
//
// Op semantics are the simulator's (simulate.h): ops are issued strictly in program order;
//   F       waits for its RECV_F data (or the local F of the previous virtual stage when p = 1),
//           allocates its stash entry and calls StageModel::Forward;
//   SEND_F  posts a non-blocking send of F's output buffer; RECV_F posts a receive into a P2P
//           buffer of the arena (SEND_B / RECV_B likewise for input gradients);
//   B       waits for its RECV_B data and, when the entry was offloaded, for its reload; calls
//           Backward(with_weight_grad = !split_backward) and frees the entry when unsplit;
//   W       calls BackwardWeight and frees the entry;
//   OFFLOAD starts the D2H copy of the entry; RELEASE drops the device copy from the stash
//           without waiting (its block returns to the arena once the copy has finished; see
//           ActivationStash::FinishOffload);
//   RELOAD  allocates device memory and starts the H2D copy; BARRIER meets `peer`.
// Every wait is bounded by ExecutorOptions::wait_timeout_seconds (the watchdog): on expiry Run
// returns DeadlineExceeded naming the stage, the op waited for and its peer, e.g.
// "stage 2 waited 10.0 s for RECV_B3.1<-3 (before B3.1, op 17)". Nothing hangs.
#ifndef PIPEOFFLOAD_RUNTIME_H_
#define PIPEOFFLOAD_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/stage_model.h"
#include "pipeoffload/transport.h"

namespace pipeoffload {

struct ExecutorOptions {
  // Bound on every wait: receive, send completion, copy, reload, barrier.
  double wait_timeout_seconds = 60.0;
  // The stash's options (see ActivationStashOptions): unsafe_release_without_wait is a testing
  // hook; wait_for_copy_at_release selects the blocking RELEASE (A/B benchmarks, fallback).
  // reclaim_timeout_seconds is overridden by wait_timeout_seconds.
  ActivationStashOptions stash;
  // The stash's physical cap (ActivationStashOptions::physical_limit_bytes) is the program's
  // predicted stash peak plus this many bytes; negative: no cap. 0 keeps the measured physical
  // peak equal to the prediction; slack lets copies lag further behind without a wait, at that
  // much more device memory.
  std::int64_t stash_physical_slack_bytes = 0;
  // The stage's P2P plan: one entry per op of its program, for each SEND its guarantee point
  // (the first op by which the peer has surely posted the matching receive; ops.size() = the
  // end of the step), -1 for every other op. Computed for the whole schedule by AnalyzeP2P
  // (pipeoffload/p2p_lifetimes.h: AnalyzeP2P(schedule)[stage].guarantee_point). Empty: no plan;
  // a send's buffer is freed whenever the transport reports it finished, so P2P memory is
  // bounded only by the program's P2P op count. With a plan, before op j the executor waits
  // (watchdog-bounded, while serving its own posted receives) for every posted send whose
  // guarantee point is <= j, so live P2P blocks never exceed the plan's peak (WalkP2P), and
  // Create checks that the arena holds the aligned stash peak plus that many aligned boundary
  // blocks (ResourceExhausted otherwise; InvalidArgument for a plan that does not fit the
  // program).
  std::vector<int> p2p_guarantee_points;
};

// One stage's measured iteration. Times are on the backend's clock (seconds).
struct IterationStats {
  int stage = 0;
  double start_time = 0.0;
  double end_time = 0.0;
  // Device memory, in requested bytes. The stash's LOGICAL high-water mark (program order,
  // ActivationStash::device_high_water_bytes) is the quantity the compiler predicts
  // (StagePrediction::peak_bytes), exactly.
  std::int64_t stash_high_water_bytes = 0;
  // The arena's kStash high-water mark: also counts released blocks whose D2H copy was still
  // running. >= stash_high_water_bytes, <= the arena budget.
  std::int64_t stash_physical_high_water_bytes = 0;
  std::int64_t stash_high_water_entries = 0;
  std::int64_t p2p_high_water_bytes = 0;
  std::int64_t other_high_water_bytes = 0;  // weights and anything else the trainer keeps
  std::int64_t host_high_water_bytes = 0;   // host pool slots in use (requested bytes)
  std::int64_t offloaded_bytes = 0;         // D2H bytes this iteration
  std::int64_t reloaded_bytes = 0;          // H2D bytes this iteration
  double compute_seconds = 0.0;  // inside StageModel calls
  double wait_seconds = 0.0;     // blocked on receives, copies, reloads and barriers
  // Of wait_seconds: host time waiting for D2H copies of released stash blocks (an allocation
  // under pressure, the end of the iteration, or RELEASE itself with wait_for_copy_at_release).
  double release_wait_seconds = 0.0;
  // Of compute_seconds: the RECOMPUTE / RECOMPUTE_LEAN ops (StageModel::RecomputeSaved; about
  // zero for those the model's B reads in place, StageModel::BackwardReadsRetained).
  double recompute_seconds = 0.0;
  // SEND and RECV posts that had to be ordered after the compute queue (every SEND, and every
  // RECV on a backend whose memory the host cannot touch): on the device by the transport
  // (Transport::OrderAfter, no host wait), or by host-waiting the compute queue when the
  // transport cannot (local, MPI). The waits are not in wait_seconds.
  std::int64_t p2p_device_orders = 0;
  std::int64_t p2p_compute_waits = 0;
  std::vector<TimedOp> ops;            // [program index], engine and times filled
  std::vector<MemorySample> memory;    // stash bytes / entries after each change
};

// Runs one stage. Not thread-safe; one executor per stage (stages may run on threads of one
// process, each with its own Backend, DeviceArena and Transport endpoint).
class Executor {
 public:
  // Checks once, at the boundary, that the program can run here (FailedPrecondition or
  // InvalidArgument naming the op or the number): the spec is sane; program.stage equals
  // transport.rank() and spec.num_stages equals transport.size(); every op's mb, chunk and
  // peer fit the spec and the loop placement (SEND_F of virtual stage l goes to the stage of
  // l + 1, and so on); the model's SavedBytes and BoundaryBytes are positive; the backend's
  // device memory is host-accessible, or the transport moves device memory itself
  // (Transport::AcceptsDeviceMemory: NCCL, or local with copiers; host-buffer transports such as
  // MPI need host-accessible memory until staging lands);
  // and (ResourceExhausted) the program's stash peak, aligned as the arena aligns it, fits the
  // arena's free bytes. Creates the HostPool, sized exactly for the program's offloads.
  // `model`, `backend`, `arena` and `transport` must outlive the executor.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Executor>> Create(
      const PipelineSpec& spec, const StageProgram& program, StageModel& model, Backend& backend,
      DeviceArena& arena, Transport& transport, const ExecutorOptions& options = {});

  virtual ~Executor() = default;

  // Runs one iteration of the program. At its end the stash, the host pool and every P2P
  // buffer must be empty, else FailedPrecondition listing what is left. Errors: the model's,
  // annotated with the stage and op; DeadlineExceeded from the watchdog; FailedPrecondition
  // for an illegal stash transition (e.g. "B3.0 ... stash entry (mb 3, chunk 0) is ON_HOST");
  // DataLoss when poisoning is on and B or W finds the poison pattern in its stash entry (a
  // read after release); ResourceExhausted from the arena. After an error everything the
  // iteration held is freed, and Run may be called again.
  [[nodiscard]] virtual absl::StatusOr<IterationStats> Run() = 0;

  virtual const HostPool& host_pool() const = 0;
};

// Lays the stages' measured iterations side by side as one Timeline (the simulator's layout,
// for TimelineToTraceJson): stats[d] must be stage d's; times are shifted so that the earliest
// start is 0. The predictions hold what was measured: step_time, bubble_ratio, and per stage
// peak_bytes / peak_units (stash high-water), host_bytes, offloaded_bytes, busy_time, end_time.
// Errors: InvalidArgument when stats is empty or stats[d].stage != d.
[[nodiscard]] absl::StatusOr<Timeline> MeasuredTimeline(const std::vector<IterationStats>& stats);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_RUNTIME_H_
