// The layer-sliding engine's per-step program: the ordered list of operations one engine thread
// issues in a step (uploads into ring slots, forwards, checkpoint saves and loads, backwards,
// gradient hand-over, the norm), built once from the shape and the plan. Pure: no device.
//
// Uses. A step visits the units in the order F0, F1, ..., F(U-2), B(U-1), ..., B0 ("uses"; the
// last unit has no forward of its own). A sliding use needs its unit's parameters in a slot of
// the ring: uploaded for it, or still there from an earlier use of the same step (the turn from
// forward to backward keeps the top units). Slots hold nothing valid at a step's start: every
// unit's parameters changed in the last update.
//
// Uploads are placed `upload_distance` uses ahead of their use when a slot is free then (else
// closer), into the slot whose occupant is needed furthest in the future (Belady), never one a
// use in between needs, never one whose gradients have not been handed out yet. Issue order on
// the H2D queue is use order.
//
// Activations: act[s][mb], s = unit % 2, holds unit `unit`'s input (unit 0 reads tokens), and
// grad[s][mb] the gradient of it. Unit u's input is checkpointed (saved D2H after F(u-1), loaded
// back H2D before B(u)) for 1 <= u <= U-3; the inputs of units U-2 and U-1 are still on the device
// when the backward begins. A load into act[s] is issued right after the backward use that last
// read act[s] (B(u+2)), so it overlaps B(u+1). A checkpoint on the NVMe tier
// (SlidingPlan::nvme_checkpoints) is loaded one microbatch at a time instead, (u, mb) right
// after B(u+1, mb): its H2D waits on the host for a read from the drive, and issuing it after
// that compute work is enqueued keeps the device busy while the engine thread waits.
#ifndef PIPEOFFLOAD_LIB_SLIDE_PROGRAM_H_
#define PIPEOFFLOAD_LIB_SLIDE_PROGRAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::internal {

enum class SlideOpKind : std::uint8_t {
  kBeginStep,       // model BeginStep
  kUpload,          // unit's parameters (own, then borrowed) -> slot, on H2D; `wait_update`
                    // (the unit's first upload of the step): first host-wait the unit's
                    // update of the previous step (and, for a borrower, its owner's)
  kForward,         // unit, mb: reads act[unit%2][mb], writes act[(unit+1)%2][mb]
  kSaveCheckpoint,  // unit, mb: D2H of act[unit%2][mb] (unit's input) to the host store
  kLoadCheckpoint,  // unit, mb: H2D of the host store back into act[unit%2][mb]
  kBeginGrads,      // unit: zero the accumulator; unit 0 of a tied model: fill its own part
                    // with the borrower's saved gradients instead
  kBackward,        // unit, mb
  kFinishGrads,     // unit: accumulator -> wire gradients (slot or resident) + sum of squares;
                    // a borrower's borrowed part is saved D2H for its owner
  kEndUse,          // slot: the use's compute work on the slot is enqueued (record its event)
  kGradsOut,        // unit: D2H of the slot's wire gradients to host; queue the CPU update
  kGpuUpdate,       // resident unit: GPU Adam
  kNorm,            // read every unit's sum of squares; the norm; deferred updates may start
};
std::string_view SlideOpKindName(SlideOpKind kind);

struct SlideOp {
  SlideOpKind kind = SlideOpKind::kBeginStep;
  int unit = -1;
  int mb = -1;
  int slot = -1;             // kUpload, kForward, kBackward, kFinishGrads, kEndUse, kGradsOut
  bool wait_update = false;  // kUpload: the unit's first upload in the step
};

struct SlideProgramOptions {
  int num_microbatches = 1;
  // How many uses ahead an upload is issued, at most (0: right before its use).
  int upload_distance = 1;
  // Where gradient hand-over is issued: 1 = right after the unit's backward use (the D2H
  // copies then overlap the next use on an asynchronous device); 2 = after the next use's
  // compute work is enqueued too (so a host wait for a landing buffer cannot starve the GPU).
  int grads_out_distance = 1;
  // Updates wait for the norm (clipping, or UpdateTiming::kAfterBackward): resident units'
  // kGpuUpdate ops come after kNorm instead of after their kFinishGrads.
  bool defer_updates = false;
};

struct SlideProgram {
  std::vector<SlideOp> ops;
  std::vector<int> grads_out_order;  // sliding units in the order their gradients go out
  int uploads = 0;                   // kUpload ops per step
  std::int64_t upload_elements = 0;  // parameters uploaded per step (own + borrowed)
  std::string ToString() const;      // one op per line, for tests and --dry-run --verbose
};

// REQUIRES: ValidateSlidingModelShape(shape).ok() and `plan` from PlanSliding(shape, ...).
// Errors: InvalidArgument for bad options; FailedPrecondition when a use finds no slot that fits
// (a plan whose slots cannot hold a unit).
[[nodiscard]] absl::StatusOr<SlideProgram> BuildSlideProgram(const SlidingModelShape& shape,
                                                             const SlidingPlan& plan,
                                                             const SlideProgramOptions& options);

// The invariants every program must keep, checked by walking it (tests, and the engine in debug
// builds): every use's unit is in its slot, uploaded for this step, with no later upload into
// that slot before the use; uploads never evict a unit whose gradients are still to go out;
// every sliding unit's gradients go out exactly once and every resident unit is updated
// exactly once, after its kFinishGrads (and after kNorm when deferred); every checkpointed
// (unit, mb) is saved in the forward, after the forward that produced it, and loaded before its
// backward, after the backward that last read its buffer; kNorm comes after every kFinishGrads.
// Errors: Internal naming the op index and the broken rule.
[[nodiscard]] absl::Status CheckSlideProgram(const SlidingModelShape& shape,
                                             const SlidingPlan& plan, int num_microbatches,
                                             const SlideProgram& program);

// Whether unit `unit`'s input is checkpointed (1 <= unit <= num_units - 3).
inline bool IsCheckpointed(int unit, int num_units) { return unit >= 1 && unit <= num_units - 3; }

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_PROGRAM_H_
