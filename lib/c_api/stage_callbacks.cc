// po_pipeline's callbacks as a StageModel (stage_callbacks.h), and po_callback_error_set and
// po_stage_callbacks_init of c_api.h.
#include "lib/c_api/stage_callbacks.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::c_api {
namespace {

// The last canonical code (UNAUTHENTICATED): po_status values up to it are absl's own.
constexpr po_status kLastCanonicalCode = 16;

// "F3.1", as po_op_format prints a compute op.
std::string OpLabel(OpKind kind, int mb, int chunk) {
  return absl::StrCat(std::string(OpKindName(kind)), mb, ".", chunk);
}

// A callback's status, or Internal when it threw (a C++ callback; C cannot).
template <typename Invoke>
absl::Status Guarded(std::string_view where, const Invoke& invoke) {
  po_callback_error error;
  po_status code = PO_OK;
  try {
    code = invoke(&error);
  } catch (...) {
    return absl::InternalError(absl::StrCat(
        std::string(where), ": threw a C++ exception (callbacks must return a po_status)"));
  }
  return CallbackStatus(code, error, where);
}

}  // namespace

absl::Status CallbackStatus(po_status code, const po_callback_error& error,
                            std::string_view where) {
  if (code == PO_OK) return absl::OkStatus();
  const bool canonical = code > 0 && code <= kLastCanonicalCode;
  std::string message =
      error.message.empty()
          ? absl::StrCat("failed with ", po_status_name(code),
                         " and no message (po_callback_error_set gives one)")
          : error.message;
  if (!canonical) absl::StrAppend(&message, " (status ", code, ", not a po_status)");
  return absl::Status(canonical ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
                      absl::StrCat(std::string(where), ": ", message));
}

void CallbackFailures::Record(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!first_.has_value()) first_ = status;
  any_.store(true, std::memory_order_release);
}

std::optional<absl::Status> CallbackFailures::first() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return first_;
}

void CallbackStageModel::Prepare(std::uint64_t stream, bool split_backward,
                                 int chunks_per_stage) {
  stream_ = stream;
  split_backward_ = split_backward;
  saved_bytes_.clear();
  for (int c = 0; c < chunks_per_stage; ++c) saved_bytes_.push_back(SavedBytes(c, split_backward));
}

std::int64_t CallbackStageModel::SavedBytes(int chunk, bool split_backward) const {
  const std::int64_t bytes =
      callbacks_.saved_bytes(callbacks_.user, stage_, chunk, split_backward ? 1 : 0);
  if (bytes <= 0) {
    failures_.Record(absl::InvalidArgumentError(absl::StrCat(
        "stage ", stage_, ": saved_bytes callback returned ", bytes, " for chunk ", chunk,
        " (split_backward ", split_backward ? 1 : 0, "); a stash entry must be > 0 bytes")));
  }
  return bytes;
}

po_compute_args CallbackStageModel::Args(std::int32_t kind, int mb, int chunk,
                                         void* saved) const {
  po_compute_args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = sizeof(args);
  args.kind = kind;
  args.stage = stage_;
  args.mb = mb;
  args.chunk = chunk;
  args.saved = saved;
  args.boundary_bytes = callbacks_.boundary_bytes;
  const auto c = static_cast<std::size_t>(chunk);
  args.saved_bytes = c < saved_bytes_.size() ? saved_bytes_[c] : 0;
  args.stream = stream_;
  return args;
}

absl::Status CallbackStageModel::Call(po_compute_fn function, const po_compute_args& args,
                                      std::string_view name) {
  if (failures_.any()) {
    return absl::CancelledError("not called: another stage's callback failed first");
  }
  const std::string where =
      absl::StrCat("stage ", stage_, ", ", OpLabel(static_cast<OpKind>(args.kind), args.mb,
                                                   args.chunk),
                   ": ", std::string(name), " callback");
  const absl::Status status = Guarded(where, [&](po_callback_error* error) {
    return function(callbacks_.user, &args, error);
  });
  if (!status.ok()) failures_.Record(status);
  return status;
}

absl::Status CallbackStageModel::Forward(int mb, int chunk, const void* input, void* output,
                                         void* saved) {
  read_in_place_.erase({mb, chunk});  // a full entry this time
  po_compute_args args = Args(PO_OP_FORWARD, mb, chunk, saved);
  args.input = input;
  args.output = output;
  return Call(callbacks_.forward, args, "forward");
}

absl::Status CallbackStageModel::Backward(int mb, int chunk, const void* grad_output,
                                          void* grad_input, void* saved,
                                          bool with_weight_grad) {
  po_compute_args args = Args(PO_OP_BACKWARD, mb, chunk, saved);
  args.input = grad_output;
  args.output = grad_input;
  args.with_weight_grad = with_weight_grad ? 1 : 0;
  MarkReadInPlace(args);
  if (with_weight_grad) read_in_place_.erase({mb, chunk});
  return Call(callbacks_.backward, args, "backward");
}

void CallbackStageModel::MarkReadInPlace(po_compute_args& args) const {
  const auto it = read_in_place_.find({args.mb, args.chunk});
  if (it == read_in_place_.end()) return;
  args.recompute = static_cast<std::int32_t>(it->second);
  args.retained = args.saved;
  args.retained_bytes = RetainedBytes(args.chunk, it->second, split_backward_);
}

absl::Status CallbackStageModel::BackwardWeight(int mb, int chunk, void* saved) {
  // Open refuses a split schedule without backward_weight, so this is a bug if it happens.
  if (callbacks_.backward_weight == nullptr) {
    return absl::InternalError("BackwardWeight called without a backward_weight callback");
  }
  po_compute_args args = Args(PO_OP_BACKWARD_WEIGHT, mb, chunk, saved);
  MarkReadInPlace(args);
  read_in_place_.erase({mb, chunk});
  return Call(callbacks_.backward_weight, args, "backward_weight");
}

std::int64_t CallbackStageModel::RetainedBytes(int chunk, Recompute mode,
                                               bool split_backward) const {
  if (callbacks_.retained_bytes == nullptr || mode == Recompute::kNone) return -1;
  return callbacks_.retained_bytes(callbacks_.user, stage_, chunk, static_cast<std::int32_t>(mode),
                                   split_backward ? 1 : 0);
}

po_compute_args CallbackStageModel::RecomputeArgs(std::int32_t kind, int mb, int chunk,
                                                  void* saved, const void* retained,
                                                  Recompute mode) const {
  po_compute_args args = Args(kind, mb, chunk, saved);
  args.recompute = static_cast<std::int32_t>(mode);
  // The C struct has one non-const pointer for both directions; recompute only reads it.
  args.retained = const_cast<void*>(retained);
  args.retained_bytes = RetainedBytes(chunk, mode, split_backward_);
  return args;
}

absl::Status CallbackStageModel::ForwardRetaining(int mb, int chunk, const void* input,
                                                  void* output, void* retained,
                                                  Recompute mode) {
  // The runtime asks only for modes RetainedBytes offered, so the callbacks are set.
  if (callbacks_.forward_retaining == nullptr) {
    return absl::InternalError("ForwardRetaining called without a forward_retaining callback");
  }
  po_compute_args args =
      RecomputeArgs(PO_OP_FORWARD, mb, chunk, /*saved=*/nullptr, retained, mode);
  args.input = input;
  args.output = output;
  if (BackwardReadsRetained(chunk, mode, split_backward_)) {
    read_in_place_[{mb, chunk}] = mode;
  } else {
    read_in_place_.erase({mb, chunk});
  }
  return Call(callbacks_.forward_retaining, args, "forward_retaining");
}

bool CallbackStageModel::BackwardReadsRetained(int chunk, Recompute mode,
                                               bool split_backward) const {
  if (callbacks_.backward_reads_retained == nullptr || mode == Recompute::kNone) return false;
  return callbacks_.backward_reads_retained(callbacks_.user, stage_, chunk,
                                            static_cast<std::int32_t>(mode),
                                            split_backward ? 1 : 0) != 0;
}

absl::Status CallbackStageModel::RecomputeSaved(int mb, int chunk, const void* retained,
                                                void* saved, Recompute mode) {
  if (callbacks_.recompute == nullptr) {
    return absl::InternalError("RecomputeSaved called without a recompute callback");
  }
  const std::int32_t kind = mode == Recompute::kLean ? PO_OP_RECOMPUTE_LEAN : PO_OP_RECOMPUTE;
  return Call(callbacks_.recompute, RecomputeArgs(kind, mb, chunk, saved, retained, mode),
              "recompute");
}

absl::Status CallIterationCallback(po_iteration_fn function, void* user,
                                   std::int32_t iteration) {
  return Guarded("on_iteration callback", [&](po_callback_error* error) {
    return function(user, iteration, error);
  });
}

}  // namespace pipeoffload::c_api

extern "C" {

void po_callback_error_set(po_callback_error* error, const char* message) {
  if (error == nullptr || message == nullptr) return;
  try {
    error->message = message;
  } catch (...) {
    // Out of memory: the callback's code still fails the run, with the no-message text.
  }
}

void po_stage_callbacks_init(po_stage_callbacks* callbacks) {
  if (callbacks == nullptr) return;
  std::memset(callbacks, 0, sizeof(*callbacks));
  callbacks->struct_size = sizeof(*callbacks);
}

}  // extern "C"
