// The CPU side of layer sliding: one thread that runs CpuAdam on sliding units as their
// gradients land in pinned host memory, writing the fp32 master, m, v and the device-format
// upload copy in one pass (adam.h), and the NVMe reads and writes of units whose m, v live there.
//
// Invariants:
//  - A task names a unit, the engine step it belongs to, its host gradients and the D2H events
//    of its chunks. The worker host-waits each chunk's event before reading it, so it reads
//    only landed bytes.
//  - A task runs once its step's scalars are known (SetScalars: at the step's start without
//    clipping, at the norm with it). With scalars "skip" (a non-finite norm under clipping) the
//    worker still waits the task's copies and marks the unit done, writing nothing.
//  - Among runnable tasks the lowest unit index whose next chunk has landed goes first (the
//    lowest overall when none has landed): during the backward that is the order gradients
//    land; after it, it is the next step's forward order (the earliest deadline). A task is
//    preempted between chunks when a lower unit's next chunk has landed, so a unit with a late
//    deadline (the LM head, whose gradients land first) fills the CPU's idle time instead of
//    delaying the layers below it. Only the highest sliding unit's task is preempted, and only
//    when its gradients are parked or at least 3 landing buffers exist (a deferred task keeps
//    its landing buffer; the layers below need the others). Units with m, v on NVMe hold a
//    staging set and are never preempted.
//  - updated_step(u) only grows; it is the last step whose update of u has finished (or was
//    skipped). The engine's first upload of u in step s waits for updated_step(u) >= s - 1, so
//    no step reads parameters an update is still writing, and no update is ever stale.
//  - A landing buffer is lent by AcquireLanding and returned when its task finishes, so a D2H
//    copy never overwrites gradients still being read.
//  - Errors are sticky: the first one is kept, the thread stops taking tasks, and every wait
//    returns it.
#ifndef PIPEOFFLOAD_LIB_SLIDE_UPDATE_WORKER_H_
#define PIPEOFFLOAD_LIB_SLIDE_UPDATE_WORKER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/slide/recorder.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::internal {

class NvmeTier;

// A sliding unit's host state (`upload` null for resident units). exp_avg / exp_avg_sq are
// param_count floats (null when they live on NVMe); `upload` is the device-format copy the next
// forward uploads. The fp32 master is `master` for fp32 models (and `upload` is the master
// itself); for bf16 models it is split (adam.h's SplitMaster): `upload` holds its high halves
// and `master_lo` its low halves (null on NVMe, which then holds them with m and v), `master`
// is null.
struct UnitHostState {
  std::string name;
  std::int64_t count = 0;
  float* master = nullptr;
  std::uint16_t* master_lo = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* upload = nullptr;
  // The unit's elements in runs of equal weight decay, covering [0, count) in order.
  std::vector<std::pair<ParamRange, bool>> runs;
  bool nvme = false;
};

struct UpdateChunk {
  Event landed;  // recorded on the D2H queue after the chunk's copy
  std::int64_t begin = 0;
  std::int64_t count = 0;
};

struct UpdateTask {
  int unit = 0;
  std::int64_t step = 0;
  const void* grads = nullptr;  // host wire gradients of the whole unit (landing or parked)
  int landing = -1;             // the landing buffer to return, or -1 (parked)
  std::vector<UpdateChunk> chunks;
  std::size_t next_chunk = 0;   // chunks before it are done (the task was preempted)
};

// Scalars of one step: for weight-decayed runs and for the others.
struct StepScalars {
  AdamStepScalars decay;
  AdamStepScalars no_decay;
};

class UpdateWorker {
 public:
  // `units` (indexed by unit; only sliding units get tasks), `adam`, `backend`, `nvme` (may be
  // null) and `recorder` must outlive the worker. Starts the thread.
  UpdateWorker(Backend& backend, CpuAdam& adam, SlideDtype dtype,
               std::vector<UnitHostState>& units, int landing_buffers, double timeout_seconds,
               NvmeTier* nvme, SlideRecorder& recorder);
  // Finishes the running task, drops the others, joins the thread.
  ~UpdateWorker();
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // The scalars of `step`'s tasks, or nullopt: skip them (non-finite norm under clipping).
  void SetScalars(std::int64_t step, std::optional<StepScalars> scalars);
  void Submit(UpdateTask task);
  // A free landing buffer's index. Errors: DeadlineExceeded; the sticky error.
  [[nodiscard]] absl::StatusOr<int> AcquireLanding();
  // Until unit `unit`'s update of `step` (or a later one) is done. Errors as AcquireLanding,
  // naming the unit.
  [[nodiscard]] absl::Status WaitUpdated(int unit, std::int64_t step);
  // Until every submitted task is done.
  [[nodiscard]] absl::Status Drain();
  [[nodiscard]] absl::Status status() const;

  // Host seconds spent in CpuAdam since the last call, and the seconds waited for chunks.
  double TakeAdamSeconds();
  std::vector<std::int64_t> update_counts() const;

 private:
  void Run();
  // Runs `task`'s chunks from next_chunk on, advancing it; returns early (task unfinished)
  // when a lower unit's task becomes ready.
  absl::Status Process(UpdateTask& task, const std::optional<StepScalars>& scalars);
  // Whether `task`'s next chunk has landed. Under mu_.
  bool NextChunkLanded(const UpdateTask& task);
  // Whether a runnable task of a unit below `unit` has its next chunk landed. Locks mu_.
  bool LowerTaskReady(int unit);
  absl::Status WaitFor(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
                       std::string_view what);

  Backend& backend_;
  CpuAdam& adam_;
  const SlideDtype dtype_;
  std::vector<UnitHostState>& units_;
  const double timeout_seconds_;
  const int top_sliding_unit_;  // the highest sliding unit (-1: none)
  NvmeTier* const nvme_;
  SlideRecorder& recorder_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<UpdateTask> tasks_;
  std::map<std::int64_t, std::optional<StepScalars>> scalars_;
  std::vector<bool> landing_free_;
  std::vector<std::int64_t> updated_step_;
  std::vector<std::int64_t> update_counts_;
  int running_ = 0;  // tasks taken but not finished
  double adam_seconds_ = 0.0;
  absl::Status error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_UPDATE_WORKER_H_
