// Layer sliding (SlideFormer; reference/offload-systems.md section 2, DESIGN.md section 5.2):
// full fine-tuning of a model several times larger than the GPU's memory budget on one GPU.
//
// The model is cut into units (embedding, layers, head). The GPU holds a ring of pre-allocated
// slots (device parameters + wire gradients of the units that slide through it), one fp32
// gradient accumulator, the activations of one unit boundary per microbatch and one call's
// workspace; the fp32 master weights and Adam m, v of sliding units live in host memory
// (optionally m, v and some activation checkpoints on NVMe). Per step:
//   forward   units ascend; unit u+1's parameters upload while u computes; each unit's input
//             (its checkpoint) goes to pinned host memory asynchronously;
//   backward  units descend; unit u-1's parameters and checkpoints are prefetched while u
//             recomputes its forward from its checkpoint and runs its backward over every
//             microbatch (gradient accumulation happens inside the unit, so parameters cross
//             PCIe once per step and direction); u's gradients go D2H in chunks, and the CPU
//             updates u (exact synchronous Adam/AdamW, producing the bf16 upload copy in the
//             same pass) while the GPU works on u-1 and uploads u-2.
// Units the plan makes RESIDENT stay on the GPU with their optimizer state and are updated by
// the GPU Adam (the budget decides how many: the CPU update is what binds sliding). The next
// step's upload of a unit waits for its update: no delayed or stale update.
//
// bf16 models keep every fp32 master split (adam.h's SplitMaster): its high half, the bf16
// nearest to it (ties away from zero), is the parameter the device computes with, and its low
// half is stored beside it. A sliding unit then takes 12 B per parameter of host memory (high
// half pinned for the upload, low half, m, v pageable) and a resident one 14 B of device memory,
// and a unit gets the same bits whichever side updates it.
//
// Gradient clipping (max_grad_norm > 0) stays exact: the global norm is the sum of every unit's
// sum of squares of its wire gradients, known once the backward ends. Updates then wait for it
// (gradients of sliding units are parked in pinned host memory meanwhile) and run overlapped
// with the next step's forward, which waits for each unit's update. Without clipping, units
// are updated as their gradients land. (Speculative update with rollback would overlap the
// clipped update with the backward too, at 12 B/param of rollback copies; see docs/sliding.md.)
//
// The same engine runs on the CPU backend (threads as copy engines, fp32 "device" parameters),
// which is how CI proves its ordering, overlap and byte counts; on CUDA it runs bf16
// parameters with bf16 wire gradients.
#ifndef PIPEOFFLOAD_LAYER_SLIDING_H_
#define PIPEOFFLOAD_LAYER_SLIDING_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {

// Element type of parameters (and wire gradients) on the device.
enum class SlideDtype : std::uint8_t { kFp32, kBf16 };
std::string_view SlideDtypeName(SlideDtype dtype);  // "fp32", "bf16"
inline std::int64_t SlideDtypeBytes(SlideDtype dtype) { return dtype == SlideDtype::kFp32 ? 4 : 2; }

// A run of elements of a unit's flat parameter array.
struct ParamRange {
  std::int64_t offset = 0;
  std::int64_t count = 0;
  friend bool operator==(const ParamRange&, const ParamRange&) = default;
};

// What the planner and the engine know of one unit.
struct SlidingUnitShape {
  std::string name;                  // "embed", "layer.3", "head": for errors and traces
  std::int64_t param_count = 0;      // own parameters, > 0
  // The unit whose parameters this one also reads (a tied LM head reads the embedding's), or
  // -1. The borrowed parameters follow the own ones in the unit's device view, and their
  // gradients are added to the owner's before the owner is updated. The owner must come
  // earlier in the forward (a lower index) and borrow nothing itself.
  int borrowed_unit = -1;
  std::vector<ParamRange> decay;     // own ranges that take weight decay; sorted, disjoint
  std::int64_t workspace_bytes = 0;  // device scratch one Forward or Backward call needs
};

struct SlidingModelShape {
  std::vector<SlidingUnitShape> units;  // >= 2: unit 0 reads tokens, the last one computes loss
  SlideDtype param_dtype = SlideDtype::kFp32;
  std::int64_t activation_bytes = 0;    // one microbatch's activation between units, > 0
  std::int64_t model_device_bytes = 0;  // what the model allocates itself (tokens, loss, handles)
};
// OK, or InvalidArgument naming the unit and field.
[[nodiscard]] absl::Status ValidateSlidingModelShape(const SlidingModelShape& shape);

// One call of the engine into the model. Pointers are device memory of the engine's backend
// (host memory on the CPU backend); the model reads and writes nothing else of the engine's and
// keeps no pointer past the call.
struct UnitCall {
  int unit = 0;
  int mb = 0;                // microbatch, in [0, num_microbatches)
  int num_microbatches = 1;  // of this step
  // own parameters, then the borrowed unit's (param_dtype), valid for the call
  const void* params = nullptr;
  // Forward: the unit's input activation (null for unit 0, which reads its tokens) and its
  // output (every unit but the last). Backward: the same input (restored from the checkpoint).
  const void* input = nullptr;
  void* output = nullptr;
  // Backward only: the gradient of the unit's output (null on the last unit, which starts from
  // its loss), the gradient of its input to write (null on unit 0), and the fp32 accumulator of
  // the parameter gradients (own then borrowed, param_count [+ borrowed] floats), to which the
  // call ADDS this microbatch's gradient. The loss is the mean over all tokens of the step, so
  // the last unit scales each microbatch's token gradients by 1 / (tokens of the step).
  const void* grad_output = nullptr;
  void* grad_input = nullptr;
  float* grad_accum = nullptr;
  void* workspace = nullptr;  // SlidingUnitShape::workspace_bytes, contents undefined
};

// A model cut into units, as the engine drives it.
//
// Stream semantics: every call enqueues its work on the backend's compute queue (on CUDA: the
// stream of CudaComputeStream(backend)) and may return before it has run; the engine orders its
// copies against that queue with events. On the CPU backend calls run synchronously.
// Calls come from one engine thread, one at a time.
class SlidingModel {
 public:
  virtual ~SlidingModel() = default;

  virtual const SlidingModelShape& Shape() const = 0;

  // Before step `step`'s first call: stage the tokens and targets of its microbatches.
  [[nodiscard]] virtual absl::Status BeginStep(std::int64_t step, int num_microbatches) = 0;
  // Forward of units 0 .. last-1 (the last unit's forward happens inside its Backward).
  [[nodiscard]] virtual absl::Status Forward(const UnitCall& call) = 0;
  // Backward of every unit, descending: recomputes the unit's forward from `input` when it
  // needs its activations, then accumulates gradients (the last unit: loss and its gradient
  // in one pass).
  [[nodiscard]] virtual absl::Status Backward(const UnitCall& call) = 0;
  // Mean loss over the step's tokens. REQUIRES: the step's work has finished (the engine's Step
  // returned).
  [[nodiscard]] virtual absl::StatusOr<double> StepLoss() = 0;
};

// The checks every SlidingModel makes of a call before running it (for implementers): OK, or
// FailedPrecondition when `num_microbatches` is 0 (no BeginStep yet), or InvalidArgument
// "<model>: unit U mb M: <why>" for a unit out of range, a Forward of the last unit, a
// num_microbatches other than BeginStep's, an mb out of range, and a null params / input
// (units > 0) / output (Forward) / workspace (units with one) / grad_output (below the last
// unit) / grad_input (units > 0) / grad_accum (Backward).
[[nodiscard]] absl::Status CheckUnitCall(const SlidingModelShape& shape, const UnitCall& call,
                                         bool backward, int num_microbatches,
                                         std::string_view model);

// Where a unit lives.
enum class UnitPlace : std::uint8_t {
  kSliding,   // host master / m / v, CPU Adam; slides through the GPU's ring of slots
  kResident,  // parameters, wire gradients and fp32 master / m / v stay on the GPU; GPU Adam
};
std::string_view UnitPlaceName(UnitPlace place);  // "sliding", "resident"

// When sliding units are updated.
enum class UpdateTiming : std::uint8_t {
  kOverlapped,     // as gradients land (SlideFormer); after the norm when clipping
  kAfterBackward,  // ZeRO-Offload style: every CPU update after the whole backward, serially
};

struct SlidingOptions {
  // Everything the engine and the model allocate on the device (the model's own share is
  // SlidingModelShape::model_device_bytes). > 0.
  std::int64_t gpu_memory_budget_bytes = 0;
  int num_microbatches = 1;  // gradient accumulation steps per optimizer step, >= 1
  // 0: as many slots as the budget allows, at most 3 (one computing, two in flight: enough to
  // hide an upload behind a unit's compute); >= 2 otherwise.
  int num_slots = 0;
  // Per unit; empty: the planner makes units resident while the budget allows, the lowest first
  // (their updates gate the next step's first forwards), or the head first when that leaves
  // fewer sliding parameters below the top sliding unit (whose update is deferred into the
  // next forward, off the critical path); plan.cc says why.
  std::vector<UnitPlace> placement;
  // Every unit resident (the all-on-GPU baseline of the same binary).
  bool all_resident = false;
  UpdateTiming update_timing = UpdateTiming::kOverlapped;
  AdamOptions adam;        // learning_rate is overridden per step
  double max_grad_norm = 0.0;  // <= 0: no clipping
  CpuAdamOptions cpu;
  // Elements per D2H gradient chunk (the CPU Adam consumes chunks as they land). > 0.
  std::int64_t grad_chunk_elements = std::int64_t{1} << 25;
  // Pinned landing buffers for sliding units' gradients in flight (each holds the largest
  // sliding unit's wire gradients). 0: 3 (the top sliding unit's update is deferred into the
  // next forward and keeps one; the layers below stream through the others). Clipping parks
  // every sliding unit's gradients instead.
  int landing_buffers = 0;
  // NVMe tier for Adam m and v: empty dir: none. `nvme_fraction` of the sliding units (the
  // highest layers first, whose updates have the most slack; outsized units such as the head
  // last, as the staging is sized for the largest unit on the tier) keep m, v (and, bf16 models, the
  // low halves of their split masters: 2 B per parameter stay on the host, the pinned high
  // halves) in a file there, read before and written after their update (io_uring, O_DIRECT).
  std::string nvme_dir;
  double nvme_fraction = 0.0;
  // Activation checkpoints on the NVMe tier: this share of the checkpointed units (units 1 ..
  // last-2, whose inputs go to the host in the forward and come back in the backward), the
  // LOWEST first: they are saved first in the forward and loaded last in the backward, so their
  // drive writes and reads have the most slack. Their checkpoints live in one O_DIRECT file in
  // nvme_dir instead of pinned host memory (M x activation_bytes per unit), staged through a
  // small ring of pinned buffers (SlidingPlan::checkpoint_staging_buffers). In [0, 1]; > 0
  // needs nvme_dir.
  double nvme_checkpoint_fraction = 0.0;
  // Record every engine's work (compute, H2D, D2H, CPU Adam, NVMe) of each step.
  bool record_trace = false;
  double timeout_seconds = 600.0;  // bound on every wait
};

// What the planner decided, with every byte counted.
struct SlidingPlan {
  std::vector<UnitPlace> placement;   // per unit
  std::vector<bool> nvme;             // per unit: m, v on NVMe
  std::vector<bool> nvme_checkpoints;  // per unit: its input's checkpoints on NVMe
  // Pinned buffers the checkpoints on NVMe pass through (0 when none): a save's D2H lands in
  // one and its drive write starts from it; a load's drive read lands in one and its H2D
  // starts from it. Each holds one checkpoint, rounded up to 4 KiB.
  int checkpoint_staging_buffers = 0;
  std::vector<std::int64_t> slot_elements;  // capacity of each ring slot, in elements
  int landing_buffers = 0;
  // Device bytes by purpose; `device_total_bytes` <= the budget.
  std::int64_t device_slot_bytes = 0;        // the ring: parameters + wire gradients
  std::int64_t device_accumulator_bytes = 0;  // fp32 gradient accumulator
  std::int64_t device_activation_bytes = 0;   // unit boundary activations and their gradients
  std::int64_t device_workspace_bytes = 0;    // one call's workspace (the largest unit's)
  std::int64_t device_resident_bytes = 0;     // resident units: params, grads, master, m, v
  std::int64_t device_engine_bytes = 0;       // sums of squares, scalars, alignment slack
  std::int64_t device_model_bytes = 0;        // SlidingModelShape::model_device_bytes
  std::int64_t device_total_bytes = 0;
  // Host bytes: pageable (m, v of sliding units, and their fp32 masters or, bf16, the masters'
  // low halves), pinned (the device-format upload copies, gradient landing / parking,
  // checkpoints kept on the host, NVMe staging of the state and of the checkpoints), and on
  // NVMe (the state file and the checkpoint file, each record rounded up to 4 KiB).
  std::int64_t host_pageable_bytes = 0;
  std::int64_t host_pinned_bytes = 0;
  std::int64_t nvme_bytes = 0;
  int resident_units() const;
  // One paragraph for --dry-run: slots, placement, every tier's bytes.
  std::string Describe(const SlidingModelShape& shape) const;
};

// Plans slots and placement for `shape` under `options`. Pure: no device, no allocation.
// Errors: InvalidArgument for bad options (naming the field) or shape; ResourceExhausted when
// the budget cannot hold even one unit's slot pair, naming the minimum budget it needs.
[[nodiscard]] absl::StatusOr<SlidingPlan> PlanSliding(const SlidingModelShape& shape,
                                                      const SlidingOptions& options);

struct SlidingStepOptions {
  float learning_rate = 1e-4f;
};

// One engine's work in a step, for traces. Times are on the backend's clock.
enum class SlideEngineKind : std::uint8_t { kCompute, kH2D, kD2H, kCpuAdam, kNvme };
inline constexpr int kNumSlideEngines = 5;
std::string_view SlideEngineName(SlideEngineKind engine);  // "compute", "H2D", ...
struct SlideRecord {
  SlideEngineKind engine = SlideEngineKind::kCompute;
  std::string name;  // "F layer.3 mb1", "upload layer.4", "adam layer.30 [0, 33554432)"
  int unit = -1;
  int mb = -1;
  double start = 0.0;
  double end = 0.0;
  std::int64_t bytes = 0;
};

struct SlidingStepResult {
  std::int64_t step = 0;      // optimizer steps applied so far (Adam's t)
  bool applied = false;       // false when the gradient norm was not finite: nothing updated
  double grad_norm = 0.0;     // global L2 norm of the wire gradients
  float clip_coefficient = 1.0f;
  double step_seconds = 0.0;  // host wall time of Step
  double compute_busy_seconds = 0.0;
  double cpu_adam_seconds = 0.0;  // summed over CPU update work
  double gpu_wait_seconds = 0.0;  // host time the engine thread blocked on updates and buffers
  std::int64_t h2d_bytes = 0;
  std::int64_t d2h_bytes = 0;
  // Bytes the checkpoints on NVMe moved to and from the drive in this step (each checkpoint
  // written once and read once, rounded up to 4 KiB). Every such read and write of a step has
  // finished when Step returns.
  std::int64_t nvme_checkpoint_bytes = 0;
  std::int64_t device_high_water_bytes = 0;  // the engine's arena
  std::vector<SlideRecord> records;  // with SlidingOptions::record_trace
};

// Perfetto / Chrome trace JSON of records: one process ("sliding engine"), one thread per
// engine in SlideEngineKind order, one "X" event per record; the layout of the pipeline
// runtime's traces (trace.h).
std::string SlideRecordsToTraceJson(const std::vector<SlideRecord>& records);

// What creating an engine cost (pinning large buffers is slow: cudaHostAlloc maps and locks
// every page).
struct SlidingSetupStats {
  double seconds = 0.0;          // all of Create
  double pin_seconds = 0.0;      // allocating pinned host memory
  double pageable_seconds = 0.0;
  std::int64_t pinned_bytes = 0;
  std::int64_t pageable_bytes = 0;
  std::int64_t device_bytes = 0;  // the engine's arena
  std::string nvme;               // the NVMe tier's I/O path, or empty
};

class LayerSlidingEngine {
 public:
  // Plans (PlanSliding), then allocates everything once: one DeviceArena of the planned device
  // bytes (no device allocation afterwards), the host state (fp32 master zero, m = v = 0), the
  // pinned buffers, the NVMe files, the CPU Adam. Parameters start at zero: load them with
  // SetUnitParams before the first Step. `backend` and `model` must outlive the engine.
  // Errors: PlanSliding's; FailedPrecondition when the backend's device memory is not
  // host-accessible and it is not a CUDA backend; ResourceExhausted when an allocation fails
  // (naming the tier and bytes); the NVMe store's (missing, read-only or full directory).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> Create(
      Backend& backend, SlidingModel& model, const SlidingOptions& options);
  virtual ~LayerSlidingEngine() = default;

  // The fp32 values of unit `unit`'s own parameters (param_count floats): its master, and the
  // device copy the next forward uses. Between steps (waits for pending updates first).
  // Errors: InvalidArgument for a bad unit or size.
  [[nodiscard]] virtual absl::Status SetUnitParams(int unit, std::span<const float> values) = 0;
  // Reads the fp32 master of `unit` (param_count floats), wherever it lives.
  [[nodiscard]] virtual absl::Status GetUnitParams(int unit, std::span<float> values) = 0;
  // Reads Adam's m and v of `unit` (param_count floats each; tests and checkpoints).
  [[nodiscard]] virtual absl::Status GetUnitOptimizerState(int unit, std::span<float> exp_avg,
                                                           std::span<float> exp_avg_sq) = 0;

  // One optimizer step: the model's BeginStep, forward and backward of every microbatch, and
  // the update of every unit. Returns once the backward has finished on the device and the
  // gradient norm is known (so the model's StepLoss is valid); the CPU updates of sliding units
  // may still be running then (with UpdateTiming::kOverlapped): they overlap the next Step's
  // forward, whose upload of each unit waits for that unit's update. Errors: the model's,
  // annotated with the unit and microbatch; DeadlineExceeded naming the engine and unit waited
  // for; the backend's. After an error the engine must be destroyed.
  [[nodiscard]] virtual absl::StatusOr<SlidingStepResult> Step(
      const SlidingStepOptions& options) = 0;
  // Waits until every update of the last Step has finished (its CPU time is in the next
  // Step's result when that one calls it itself). Get/SetUnit* call it first.
  [[nodiscard]] virtual absl::Status Flush() = 0;

  virtual const SlidingPlan& plan() const = 0;
  virtual SlidingSetupStats setup_stats() const = 0;
  // How many times each unit's parameters were updated (written back) so far: every unit once
  // per applied step.
  virtual std::vector<std::int64_t> unit_update_counts() const = 0;
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LAYER_SLIDING_H_
