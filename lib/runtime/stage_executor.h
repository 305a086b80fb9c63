// StageExecutor: the Executor of one stage (Executor::Create makes it). Its methods live in two
// files: executor.cc (program order, compute ops, the stash, the iteration's start and end) and
// executor_p2p.cc (P2P messages, BARRIER, and the waits of the P2P plan).
//
// Invariants:
//  - Ops are issued strictly in program order on the calling thread. The only concurrency is
//    the backend's copy engines and the peers behind the transport, reached through events and
//    requests; every wait on them is bounded by the watchdog.
//  - Buffers: every P2P buffer is an arena block (category kP2P) with exactly one owner at a
//    time: a posted receive (receives_) until the op that consumes it (F or B) takes it and
//    frees it after the model call; an F output / B input-gradient (activations_ / grads_)
//    until its SEND posts it (sends_) or, when p = 1, the next local chunk consumes it; a send
//    until its request finishes. Stash entries belong to the ActivationStash.
//  - Memory accounting follows program order, as the compiler models it: the stash's LOGICAL
//    bytes grow at F and RELOAD and shrink at RELEASE and at B (unsplit) / W (split); an entry
//    recomputed is its retained block from F, and at its RECOMPUTE* the full entry is added
//    before the retained block is freed (ActivationStash::Regrow / DropRetained); so the
//    measured stash high-water (the stash's own counter) equals the predicted peak exactly.
//  - RELEASE does not block the stage's thread: the entry leaves the logical count at once, but
//    its device block stays allocated (PHYSICALLY, arena category kStash) until its D2H copy has
//    finished (activation_stash.cc). Blocks come back to the arena (i) after every op, those
//    whose copy is done (ReclaimReleased(kFinished), never blocking); (ii) when an allocation
//    (stash F / RELOAD, or a P2P buffer here) finds the arena full: the oldest pending copy is
//    host-waited and its block returned, until the request fits or nothing is pending; (iii) at
//    the end of Run, all of them (kAll) before the end-of-iteration checks. A block returned
//    only after its copy completed may go to anyone (compute, an H2D reload, a RECV that a
//    transport writes): nothing reads it any more, and its poison fill (compute queue) lands
//    after the copy. Physical stash bytes >= logical; both fit the arena budget. Host time in
//    those waits is release_wait_seconds (part of wait_seconds).
//    ActivationStashOptions::wait_for_copy_at_release restores the blocking RELEASE.
//  - Events: before a send posts a buffer written by compute, the transport is ordered after
//    the compute queue. When it can do that on the device (Transport::CanOrderAfter, NCCL on
//    the stage's GPU) OrderAfter makes its stream wait and the host goes on; otherwise
//    compute_done_ is recorded on the compute queue and host-waited (a no-op on the CPU
//    backend, required on asynchronous ones: a transport such as local or MPI may read the
//    buffer from any thread). The stash owns the copy events (activation_stash.cc).
//  - Device memory the host cannot touch (CUDA) is only accepted with a transport that moves
//    it (Transport::AcceptsDeviceMemory); the executor itself never reads stash or P2P bytes
//    then (the stash's poison scan skips such backends).
//  - P2P buffers freed right after a model call may still be read by compute work enqueued on
//    an asynchronous backend, and the next owner of such a block may be a receive, which a
//    transport writes from another stream or thread. So on those backends a RECV first orders
//    the transport after the compute queue too, the same way (cheap when it host-waits: a SEND
//    just before has usually waited already).
//  - P2P plan (ExecutorOptions::p2p_guarantee_points, from AnalyzeP2P): before op j, every
//    posted send whose guarantee point is <= j is waited for and its block freed, so live P2P
//    blocks follow WalkP2P's walk and never exceed its peak. Such a wait cannot deadlock: the
//    peer posted the matching receive before anything that led here. But some transports move
//    a message only while its RECEIVER tests or waits (the local transport with copiers), so
//    with a plan every blocking wait of the executor (a send at its guarantee point, a receive
//    in TakeInput) tests the awaited transfer and all posted receives in turn, sleeping briefly
//    between rounds (never a short Transport Wait: on NCCL a timed-out Wait aborts the
//    communicator): a stage blocked here still lets its peers' sends finish. A BARRIER wait
//    does not (it is one Transport call); AnalyzeP2P puts a send's guarantee point past the
//    receiver's last BARRIER before the message's consumer for that reason.
//  - End of Run: no receive, unsent output, send, stash entry or host slot may remain; after an
//    error Reset frees everything the iteration held, so Run can be called again.
#ifndef PIPEOFFLOAD_LIB_RUNTIME_STAGE_EXECUTOR_H_
#define PIPEOFFLOAD_LIB_RUNTIME_STAGE_EXECUTOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/runtime/program_check.h"
#include "lib/runtime/watchdog.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::internal {

// The stash's options: reclaim waits bounded by the watchdog's timeout, and released blocks
// held back only while the stash stays within its predicted peak (plus the slack asked for).
ActivationStashOptions StashOptions(const ExecutorOptions& options,
                                    std::int64_t predicted_peak_bytes);

class StageExecutor final : public Executor {
 public:
  StageExecutor(const PipelineSpec& spec, const StageProgram& program, StageModel& model,
                Backend& backend, DeviceArena& arena, Transport& transport,
                const ExecutorOptions& options, std::unique_ptr<HostPool> host_pool,
                Event compute_done, std::int64_t predicted_peak_bytes, RecomputePlan recompute)
      : spec_(spec),
        program_(program),
        place_(spec.stage_map()),
        stage_(program.stage),
        model_(model),
        backend_(backend),
        arena_(arena),
        transport_(transport),
        options_(options),
        watchdog_(program.stage, options.wait_timeout_seconds),
        host_pool_(std::move(host_pool)),
        stash_(backend, arena, *host_pool_, StashOptions(options, predicted_peak_bytes)),
        compute_done_(compute_done),
        recompute_(std::move(recompute)) {
    for (int chunk = 0; chunk < spec.chunks_per_stage; ++chunk) {
      saved_bytes_.push_back(model.SavedBytes(chunk, spec.split_backward));
    }
    boundary_bytes_ = model.BoundaryBytes();
  }

  ~StageExecutor() override {
    Reset();
    backend_.DestroyEvent(compute_done_);
  }

  absl::StatusOr<IterationStats> Run() override;
  const HostPool& host_pool() const override { return *host_pool_; }

 private:
  using Key = std::pair<int, int>;  // (mb, chunk)
  struct Message {
    std::unique_ptr<TransferRequest> request;
    void* buffer = nullptr;  // arena P2P block, freed once the message is done with
    int op_index = -1;
    bool finished = false;
  };
  using RecvKey = std::tuple<bool, int, int>;  // (is_grad, mb, chunk)

  absl::Status RunOp(int index, const Op& op);
  absl::Status Forward(int index, const Op& op);
  absl::Status Backward(int index, const Op& op);
  absl::Status BackwardWeight(int index, const Op& op);
  // RECOMPUTE / RECOMPUTE_LEAN: the full entry from the retained block (StageModel::
  // RecomputeSaved), timed and counted like the other compute ops (and in recompute_seconds).
  absl::Status RecomputeEntry(int index, const Op& op);
  absl::Status Send(int index, const Op& op);
  absl::Status Recv(int index, const Op& op);
  absl::Status Release(int index, const Op& op);
  absl::Status Barrier(int index, const Op& op);
  // Makes the transport's next posts start after the compute work enqueued so far: on the
  // device when it can (Transport::OrderAfter), else compute_done_ is recorded on the compute
  // queue and host-waited (bounded by the watchdog). Counted in p2p_device_orders /
  // p2p_compute_waits.
  absl::Status OrderAfterCompute(int index, const Op& op);
  absl::StatusOr<void*> TakeInput(int index, const Op& op, bool activation);
  // The entry B, W or a RECOMPUTE* reads: a reloading entry is ordered before the compute work
  // (no host wait); FinishReloadAfter, right after the model call, host-waits its copy and
  // returns the host slot, so the host blocks only while the GPU already has the op queued.
  absl::StatusOr<void*> ReadyEntry(int index, const Op& op);
  absl::Status FinishReloadAfter(int index, const Op& op);
  // Bytes the entry of `op` holds before its RECOMPUTE* (what its OFFLOAD and RELOAD move): the
  // retained block of a recomputed entry, else the saved entry.
  std::int64_t EntryBytes(const Op& op) const {
    const Recompute mode = recompute_.ModeOf(op.mb, op.chunk);
    return mode == Recompute::kNone ? saved_bytes_[static_cast<std::size_t>(op.chunk)]
                                    : recompute_.Retained(op.chunk, mode);
  }
  absl::StatusOr<void*> AllocateP2P(int index, const Op& op);
  // With a plan: waits for every posted send whose guarantee point is <= `index` and frees its
  // block (before op `index` runs).
  absl::Status WaitGuaranteedSends(int index, const Op& op);
  // Waits for `request` (watchdog-bounded, errors as watchdog_.Check makes them). With a plan,
  // in slices, testing the posted receives in between; without, one Wait.
  absl::Status WaitFor(TransferRequest& request, const Op& waited_for, const Op& current,
                       int index);
  void PollReceives();
  absl::Status CallModel(int index, const absl::Status& result);
  void Poll();
  absl::Status Finish();
  void Reset();
  void SampleMemory();
  void Time(int index, double start, double end);
  double Now() const { return backend_.NowSeconds(); }
  std::string Where(int index, const Op& op) const { return watchdog_.Where(op, index); }

  const PipelineSpec spec_;
  const StageProgram program_;
  const VirtualStageMap place_;
  const int stage_;
  StageModel& model_;
  Backend& backend_;
  DeviceArena& arena_;
  Transport& transport_;
  const ExecutorOptions options_;
  const internal::Watchdog watchdog_;
  std::unique_ptr<HostPool> host_pool_;
  ActivationStash stash_;
  const Event compute_done_;
  const RecomputePlan recompute_;          // which entries F keeps only a retained block of
  std::vector<std::int64_t> saved_bytes_;  // per chunk
  std::int64_t boundary_bytes_ = 0;

  // Per-iteration state.
  IterationStats stats_;
  std::map<RecvKey, Message> receives_;
  std::vector<Message> sends_;
  std::map<Key, void*> activations_;  // F outputs not yet sent / consumed
  std::map<Key, void*> grads_;        // B input gradients not yet sent / consumed
  std::map<Key, int> offload_ops_;    // op index of each entry's OFFLOAD, for its timing
  std::map<Key, int> reload_ops_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_RUNTIME_STAGE_EXECUTOR_H_
