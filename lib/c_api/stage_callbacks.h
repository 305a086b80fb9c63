// The C callbacks of one stage as a StageModel (stage_model.h), for po_pipeline: each compute
// call becomes one po_compute_fn call, its status and message a po_status-shaped absl::Status
// naming the stage and op, and the first failure of any stage is kept (CallbackFailures) so the
// run reports it rather than the timeouts it causes on the other stages. No C++ exception
// leaves a callback call. Nothing here is exported from libpipeoffload_c.
#ifndef PIPEOFFLOAD_LIB_C_API_STAGE_CALLBACKS_H_
#define PIPEOFFLOAD_LIB_C_API_STAGE_CALLBACKS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/c_api.h"
#include "pipeoffload/stage_model.h"

// What a failing callback said (po_callback_error_set); lives for one callback call.
struct po_callback_error {
  std::string message;
};

namespace pipeoffload::c_api {

// The status a callback's code and message stand for, its message prefixed with `where`
// ("stage 1, F0.0: forward callback"). A code outside the canonical range is UNKNOWN.
absl::Status CallbackStatus(po_status code, const po_callback_error& error,
                            std::string_view where);

// The first callback failure of a pipeline, across its stages' threads.
class CallbackFailures {
 public:
  // Keeps `status` unless a failure came first.
  void Record(const absl::Status& status);
  // Whether any callback has failed (the other stages then skip their callbacks).
  bool any() const { return any_.load(std::memory_order_acquire); }
  std::optional<absl::Status> first() const;

 private:
  mutable std::mutex mutex_;
  std::optional<absl::Status> first_;  // guarded by mutex_
  std::atomic<bool> any_{false};
};

// The callbacks of po_stage_callbacks `callbacks` (as read at open) for stage `stage`.
// Thread-compatible, as StageModel is: the executor of one stage calls it from one thread.
class CallbackStageModel final : public StageModel {
 public:
  CallbackStageModel(const po_stage_callbacks& callbacks, int stage, CallbackFailures& failures)
      : callbacks_(callbacks), stage_(stage), failures_(failures) {}

  // Before the first compute call, once the schedule is known: the compute queue handed to the
  // callbacks (po_compute_args.stream), and the stash entry sizes of the schedule's chunks
  // (po_compute_args.saved_bytes), asked of saved_bytes once here.
  void Prepare(std::uint64_t stream, bool split_backward, int chunks_per_stage);

  // A size <= 0 is recorded as this stage's failure (Open then fails; its error is replaced by
  // this one, which names the chunk).
  std::int64_t SavedBytes(int chunk, bool split_backward) const override;
  std::int64_t BoundaryBytes() const override { return callbacks_.boundary_bytes; }

  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override;
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input, void* saved,
                        bool with_weight_grad) override;
  absl::Status BackwardWeight(int mb, int chunk, void* saved) override;

  // Recompute: -1 (not offered) without a retained_bytes callback (ReadCallbacks makes the
  // three callbacks all or none); the runtime refuses a program that needs an answer <= 0.
  std::int64_t RetainedBytes(int chunk, Recompute mode, bool split_backward) const override;
  absl::Status ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                void* retained, Recompute mode) override;
  absl::Status RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                              Recompute mode) override;
  // The backward_reads_retained callback's answer (false without one). Its entries reach
  // backward (and backward_weight) with the retained-block arguments (c_api.h).
  bool BackwardReadsRetained(int chunk, Recompute mode, bool split_backward) const override;

 private:
  po_compute_args Args(std::int32_t kind, int mb, int chunk, void* saved) const;
  // B / W of an entry read in place: the retained-block arguments (c_api.h).
  void MarkReadInPlace(po_compute_args& args) const;
  // Args of a recompute call: the mode, the retained block and its size.
  po_compute_args RecomputeArgs(std::int32_t kind, int mb, int chunk, void* saved,
                                const void* retained, Recompute mode) const;
  // Calls `function` unless another stage failed first (Cancelled then: the run reports the
  // first failure). Records and returns a failure.
  absl::Status Call(po_compute_fn function, const po_compute_args& args, std::string_view name);

  const po_stage_callbacks callbacks_;
  const int stage_;
  CallbackFailures& failures_;
  std::uint64_t stream_ = 0;
  std::vector<std::int64_t> saved_bytes_;  // [chunk], from Prepare
  bool split_backward_ = false;            // from Prepare: what retained_bytes is asked with
  // (mb, chunk) -> mode of the entries forward_retaining wrote whose B reads the retained block,
  // until the op that frees them (B, or W when split).
  std::map<std::pair<int, int>, Recompute> read_in_place_;
};

// Calls `function(user, iteration, &error)` (po_iteration_fn) and returns its status, the
// message prefixed with "on_iteration callback". Never throws.
absl::Status CallIterationCallback(po_iteration_fn function, void* user, std::int32_t iteration);

}  // namespace pipeoffload::c_api

#endif  // PIPEOFFLOAD_LIB_C_API_STAGE_CALLBACKS_H_
