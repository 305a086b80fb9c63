// Optimizer-state offload (Deep Optimizer States, reference/offload-systems.md section 1): fp32
// master parameters and Adam's m and v live in pinned host memory, cut into subgroups; each step
// a planned share of subgroups is pulled to the GPU, updated there and written back while the
// CPU updates the others (CpuAdam), so the CPU, the GPU and both PCIe directions work at once.
// The bf16 parameters and gradients stay on the GPU in buffers the caller owns.
//
// The engine runs on a Backend (backend.h), like the runtime: its memory comes from the
// backend, its work goes to queues of the backend, and its own arithmetic has a CPU and a CUDA
// implementation, so on the CPU backend it runs (and is tested bit for bit) without a GPU. No
// CUDA types appear here. Target: pipeoffload::optim_offload (po_optim_offload; with CUDA it
// also runs on CUDA backends).
#ifndef PIPEOFFLOAD_OPTIMIZER_OFFLOAD_H_
#define PIPEOFFLOAD_OPTIMIZER_OFFLOAD_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {

// Where the optimizer state lives and who updates it.
enum class OffloadMode : std::uint8_t {
  // ZeRO-Offload style: all state on the host, every subgroup updated by the CPU.
  kCpu,
  // Deep Optimizer States: all state on the host; a share r in [0, 1] of the subgroups (spaced
  // evenly, Bresenham-style) is prefetched to the GPU, updated there and written back each
  // step, through two staging sets (GPU optimizer state <= two subgroups' worth).
  kInterleaved,
  // TwinFlow style: the last share of subgroups keeps its state on the GPU for good (updated
  // there, never copied); the CPU updates the rest from host state.
  kStatic,
  // Everything on the GPU (the no-offload baseline, where it fits).
  kGpu,
};
std::string_view OffloadModeName(OffloadMode mode);  // "cpu", "interleaved", "static", "gpu"
// Errors: InvalidArgument naming the accepted names.
[[nodiscard]] absl::StatusOr<OffloadMode> ParseOffloadMode(std::string_view name);

struct OptimizerOffloadOptions {
  std::int64_t num_params = 0;                         // > 0
  std::int64_t subgroup_size = std::int64_t{1} << 24;  // params per subgroup, > 0 (last: rest)
  OffloadMode mode = OffloadMode::kInterleaved;
  // kInterleaved: the share of subgroups updated on the GPU each step (rounded to a whole
  // number of subgroups: round(share * num_subgroups)). kStatic: the resident share.
  // Ignored by kCpu (0) and kGpu (1). In [0, 1].
  double gpu_share = 0.5;
  // kInterleaved only: the largest share SetGpuShare may choose later; it sizes the fp32
  // gradient buffers of GPU subgroups on the device. < 0: gpu_share. In [gpu_share, 1] else.
  double max_gpu_share = -1.0;
  AdamOptions adam;
  double max_grad_norm = 0.0;  // clip the global gradient norm to this; <= 0: no clipping
  CpuAdamOptions cpu;          // the CPU Adam's threads and instruction set
  // Pinned host bytes the engine may take; 0: the host's available memory (MemAvailable of
  // /proc/meminfo). Create fails with ResourceExhausted before allocating when the state
  // needs more.
  std::int64_t host_memory_limit_bytes = 0;
  // Elements per gradient upcast chunk (device staging for the D2H of CPU subgroups' fp32
  // gradients; two chunks are allocated). > 0.
  std::int64_t grad_chunk = std::int64_t{1} << 22;
  // Bound on every host wait of the engine (DeadlineExceeded past it). > 0.
  double timeout_seconds = 600.0;
};

// Where one subgroup's state lives and who updates it (this step).
enum class SubgroupPlace : std::uint8_t {
  kCpu,          // host state, CPU Adam, bf16 uploaded H2D
  kGpuStaged,    // host state, prefetched into a staging set, GPU Adam, written back D2H
  kGpuResident,  // device state for good (kStatic, kGpu)
};

struct OptimizerStepResult {
  // False when the global gradient norm was not finite (a loss-scale overflow): nothing was
  // updated, the gradients were dropped, and the step counter did not advance.
  bool applied = false;
  std::int64_t step = 0;    // updates applied so far (Adam's t after this call)
  double grad_norm = 0.0;   // global L2 norm of the gradients divided by loss_scale
  float grad_scale = 1.0f;  // what multiplied every gradient: clip coefficient / loss_scale
};

// Measurements of the last Step (host wall clock).
struct OptimizerStepStats {
  double step_seconds = 0.0;      // the whole Step call
  double update_seconds = 0.0;    // from the step's scalars being known to every subgroup done
  double cpu_adam_seconds = 0.0;  // time the CPU spent in CpuAdam::Update
  std::int64_t h2d_bytes = 0;     // copied host to device during the update (state + bf16)
  std::int64_t d2h_bytes = 0;     // copied device to host during the update (state)
  int cpu_subgroups = 0;
  int gpu_staged_subgroups = 0;
  int gpu_resident_subgroups = 0;
};

struct OptimizerMemory {
  std::int64_t pinned_host_bytes = 0;     // fp32 p, m, v (+ grads of host subgroups) + bf16 slots
  std::int64_t device_state_bytes = 0;    // fp32 p, m, v on the GPU: staging sets or resident
  std::int64_t device_grad_bytes = 0;     // fp32 gradients kept on the GPU
  std::int64_t device_scratch_bytes = 0;  // upcast staging and reduction scratch
};

// One engine per parameter set (a pipeline stage offloads its own). Not thread-safe: one
// thread calls it (the engine's CPU Adam has its own worker threads).
//
// Queues and ordering (the contract with the caller): the caller's queue is the backend's
// built-in compute queue, backend.queue(QueueKind::kCompute), where a StageModel enqueues its
// kernels (stage_model.h) and so where the bf16 gradients are produced and the bf16 parameters
// read. The engine works on four queues of its own, made at Create with Backend::CreateQueue:
// a compute lane (sum of squares, upcast, GPU Adam; separate from the caller's so the update
// overlaps it), a D2H lane (fp32 gradients of host subgroups, write-back of staged state), an
// H2D lane (prefetch of staged state) and a second H2D lane (bf16 uploads of host subgroups,
// which must not queue behind prefetches that wait on write-backs). So:
//  - AddGradients orders the engine's reads of `grads` after the work enqueued on the caller's
//    queue so far, and the caller's later work there after those reads;
//  - Step orders every write of the bf16 parameters after the work enqueued on the caller's
//    queue before the call, and returns only when every lane has finished, so any later work
//    sees the new parameters;
//  - the engine never synchronizes the backend (Synchronize) and never allocates after Create.
// On the CPU backend every compute queue is the caller's thread, so the engine's compute work
// runs inside its calls; its copies run on the lanes' worker threads.
// Each engine takes 1 compute, 1 D2H and 2 H2D queues of its backend, which holds at most
// kMaxQueuesPerKind of a kind: up to 15 engines per backend.
class OptimizerOffload {
 public:
  // Allocates everything once (host state with Backend::AllocateHost, pinned on CUDA; device
  // staging or resident state, scratch with AllocateDevice; events; queues; CpuAdam), copies
  // `initial_params` into the fp32 masters (m = v = 0) and writes their bf16 values into
  // `device_params_bf16`, which the engine updates in place at every Step.
  // `initial_params` is host memory; `device_params_bf16` is device memory of `backend`; both
  // `backend` and `device_params_bf16` must outlive the engine. Returns once the initial bf16
  // copy has landed.
  // Errors (nothing stays allocated or queued then; lanes already made stay with the backend,
  // idle): InvalidArgument for bad options (naming
  // the field), a null buffer, or a buffer whose size is not options.num_params;
  // ResourceExhausted naming the bytes needed and available when the host limit is too small,
  // naming the buffer and its bytes when an allocation fails, or when the backend has no queue
  // left; FailedPrecondition for a backend that is neither a CUDA backend nor one with
  // host-accessible device memory; DeadlineExceeded past options.timeout_seconds.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<OptimizerOffload>> Create(
      Backend& backend, const OptimizerOffloadOptions& options,
      std::span<const float> initial_params, std::span<std::uint16_t> device_params_bf16);
  // Waits (bounded by options.timeout_seconds) for the engine's queued work, which may still
  // read the gradients or write its buffers, before freeing them.
  virtual ~OptimizerOffload() = default;

  // Hands over the final bf16 gradients of parameters [offset, offset + count): `grads` is
  // device memory holding `count` bf16 values, produced on the caller's queue. Enqueues (after
  // that queue's work so far) their sum of squares, the upcast to fp32 and, for host-updated
  // subgroups, the D2H copy into host memory, then makes the caller's queue wait for the
  // engine's reads: the caller may overwrite `grads` with later work there. Returns at once
  // (on the CPU backend, once the engine's compute work is done). Every parameter must
  // get its gradient exactly once per step, in any order and any cut into ranges; the sum of
  // squares depends on the cut (it is exactly reproducible for the same cut).
  // Errors (nothing enqueued): InvalidArgument for a null pointer, count <= 0, a range outside
  // [0, num_params), or a range that overlaps gradients already given this step.
  [[nodiscard]] virtual absl::Status AddGradients(const std::uint16_t* grads,
                                                  std::int64_t offset, std::int64_t count) = 0;

  // Blocks until the work of every AddGradients so far has finished (the gradient path's time,
  // which belongs to backward, kept out of Step's update timing).
  [[nodiscard]] virtual absl::Status WaitForGradients() = 0;

  // One optimizer step over all parameters: reads the global gradient norm, then updates every
  // subgroup where the placement says (all lanes at once), writes the new bf16 parameters into
  // the caller's buffer and every subgroup's new state back to its home. Returns when all of
  // it has finished. `loss_scale` divides the gradients (and the norm) and must be finite > 0.
  // Work enqueued on the caller's queue before the call is finished before a parameter is
  // written. Errors: InvalidArgument for a bad loss_scale; FailedPrecondition naming the first
  // subgroup whose gradients are incomplete (nothing updated; the gradients are kept);
  // DeadlineExceeded past options.timeout_seconds; the backend's errors (CUDA: Internal).
  [[nodiscard]] virtual absl::StatusOr<OptimizerStepResult> Step(float loss_scale = 1.0f) = 0;

  // The learning rate of the next Step on (a trainer's warm-up and decay), any time between
  // steps; options().adam.learning_rate reads it back. Errors: InvalidArgument for a rate that
  // is negative or not finite (nothing changes then).
  [[nodiscard]] virtual absl::Status SetLearningRate(float learning_rate) = 0;

  // kInterleaved only, between steps: the share of subgroups updated on the GPU from the next
  // step on. Errors: FailedPrecondition for other modes or with gradients pending;
  // InvalidArgument outside [0, options.max_gpu_share].
  [[nodiscard]] virtual absl::Status SetGpuShare(double share) = 0;

  // Copies the fp32 state of parameters [offset, offset + count) into host arrays (any may be
  // null to skip it), from wherever it lives. Not for the steady state (it synchronizes).
  // Errors: InvalidArgument for a range outside [0, num_params) or count <= 0.
  [[nodiscard]] virtual absl::Status ReadState(std::int64_t offset, std::int64_t count,
                                               float* param, float* exp_avg,
                                               float* exp_avg_sq) = 0;

  virtual const OptimizerOffloadOptions& options() const = 0;
  virtual std::int64_t num_subgroups() const = 0;
  // Placement of each subgroup for the next step.
  virtual std::vector<SubgroupPlace> placement() const = 0;
  virtual OptimizerMemory memory() const = 0;
  virtual OptimizerStepStats last_step_stats() const = 0;
  // Host and device allocations the engine has made through its backend (all at Create: tests
  // check the steady state adds none).
  virtual std::int64_t allocations() const = 0;
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_OPTIMIZER_OFFLOAD_H_
