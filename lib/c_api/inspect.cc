// Reading a po_schedule: its spec, its stages' ops as plain C structs, and the ops' names and
// short forms. Read-only on an immutable handle, hence safe from any number of threads.
#include <algorithm>
#include <string>

#include "lib/base/status_macros.h"
#include "lib/c_api/c_api_internal.h"

namespace pipeoffload::c_api {
namespace {

// po_op's kinds are OpKind's numbers (c_api.h), so an op crosses the boundary by casts alone.
static_assert(PO_OP_FORWARD == static_cast<int>(OpKind::kForward));
static_assert(PO_OP_BACKWARD == static_cast<int>(OpKind::kBackward));
static_assert(PO_OP_BACKWARD_WEIGHT == static_cast<int>(OpKind::kBackwardWeight));
static_assert(PO_OP_SEND_ACTIVATION == static_cast<int>(OpKind::kSendActivation));
static_assert(PO_OP_RECV_ACTIVATION == static_cast<int>(OpKind::kRecvActivation));
static_assert(PO_OP_SEND_GRAD == static_cast<int>(OpKind::kSendGrad));
static_assert(PO_OP_RECV_GRAD == static_cast<int>(OpKind::kRecvGrad));
static_assert(PO_OP_OFFLOAD == static_cast<int>(OpKind::kOffload));
static_assert(PO_OP_RELEASE == static_cast<int>(OpKind::kRelease));
static_assert(PO_OP_RELOAD == static_cast<int>(OpKind::kReload));
static_assert(PO_OP_BARRIER == static_cast<int>(OpKind::kBarrier));
static_assert(PO_OP_RECOMPUTE == static_cast<int>(OpKind::kRecompute));
static_assert(PO_OP_RECOMPUTE_LEAN == static_cast<int>(OpKind::kRecomputeLean));
static_assert(PO_OP_RECOMPUTE_LEAN + 1 == kNumOpKinds, "a new OpKind needs its PO_OP_ enumerator");

bool KnownKind(std::int32_t kind) { return kind >= 0 && kind < kNumOpKinds; }

absl::StatusOr<const StageProgram*> ProgramOf(const po_schedule* schedule, std::int32_t stage) {
  PO_RETURN_IF_ERROR(NotNull(schedule, "schedule"));
  PO_RETURN_IF_ERROR(CheckIndex(stage, schedule->schedule.stages.size(), "stage"));
  return &schedule->schedule.stages[static_cast<std::size_t>(stage)];
}

absl::Status GetSpec(const po_schedule* schedule, po_spec* out) {
  PO_RETURN_IF_ERROR(NotNull(schedule, "schedule"));
  return WriteVersioned(FromPipelineSpec(schedule->schedule.spec), out, kSpecSizeV1, "po_spec");
}

absl::Status GetNumStages(const po_schedule* schedule, std::int32_t* out) {
  PO_RETURN_IF_ERROR(NotNull(schedule, "schedule"));
  PO_RETURN_IF_ERROR(NotNull(out, "out"));
  *out = static_cast<std::int32_t>(schedule->schedule.stages.size());
  return absl::OkStatus();
}

absl::Status GetNumOps(const po_schedule* schedule, std::int32_t stage, std::size_t* out) {
  PO_ASSIGN_OR_RETURN(const StageProgram* program, ProgramOf(schedule, stage));
  PO_RETURN_IF_ERROR(NotNull(out, "out"));
  *out = program->ops.size();
  return absl::OkStatus();
}

absl::Status GetOps(const po_schedule* schedule, std::int32_t stage, std::size_t first,
                    std::size_t count, po_op* ops) {
  PO_ASSIGN_OR_RETURN(const StageProgram* program, ProgramOf(schedule, stage));
  const std::size_t size = program->ops.size();
  if (first > size || count > size - first) {  // written so that first + count cannot wrap
    return absl::OutOfRangeError(absl::StrCat("ops [", first, ", ", first, " + ", count,
                                              ") are outside stage ", stage, "'s ", size,
                                              " ops"));
  }
  if (count > 0) PO_RETURN_IF_ERROR(NotNull(ops, "ops"));
  std::transform(program->ops.begin() + static_cast<std::ptrdiff_t>(first),
                 program->ops.begin() + static_cast<std::ptrdiff_t>(first + count), ops,
                 [](const Op& op) {
                   return po_op{static_cast<std::int32_t>(op.kind), op.mb, op.chunk, op.peer};
                 });
  return absl::OkStatus();
}

absl::Status FormatOp(const po_op* op, char* buffer, std::size_t capacity, std::size_t* length) {
  PO_RETURN_IF_ERROR(NotNull(op, "op"));
  PO_RETURN_IF_ERROR(NotNull(length, "length"));
  if (!KnownKind(op->kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("op kind ", op->kind, " is unknown; kinds are 0..", kNumOpKinds - 1));
  }
  const std::string text =
      OpToString(Op{static_cast<OpKind>(op->kind), op->mb, op->chunk, op->peer});
  *length = text.size();
  if (capacity <= text.size()) {
    return absl::OutOfRangeError(absl::StrCat("buffer of ", capacity, " bytes cannot hold \"",
                                              text, "\" and its NUL"));
  }
  PO_RETURN_IF_ERROR(NotNull(buffer, "buffer"));
  std::copy(text.begin(), text.end(), buffer);
  buffer[text.size()] = '\0';
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipeoffload::c_api

namespace c_api = pipeoffload::c_api;

extern "C" {

const char* po_op_kind_name(int32_t kind) {
  if (!c_api::KnownKind(kind)) return nullptr;
  // OpKindName's names are string literals (schedule.cc): static and NUL-terminated.
  return pipeoffload::OpKindName(static_cast<pipeoffload::OpKind>(kind)).data();
}

po_status po_op_format(const po_op* op, char* buffer, size_t capacity, size_t* length) {
  return c_api::Boundary(__func__,
                         [&] { return c_api::FormatOp(op, buffer, capacity, length); });
}

po_status po_schedule_spec(const po_schedule* schedule, po_spec* out) {
  return c_api::Boundary(__func__, [&] { return c_api::GetSpec(schedule, out); });
}

po_status po_schedule_num_stages(const po_schedule* schedule, int32_t* out) {
  return c_api::Boundary(__func__, [&] { return c_api::GetNumStages(schedule, out); });
}

po_status po_schedule_num_ops(const po_schedule* schedule, int32_t stage, size_t* out) {
  return c_api::Boundary(__func__, [&] { return c_api::GetNumOps(schedule, stage, out); });
}

po_status po_schedule_ops(const po_schedule* schedule, int32_t stage, size_t first,
                          size_t count, po_op* ops) {
  return c_api::Boundary(__func__,
                         [&] { return c_api::GetOps(schedule, stage, first, count, ops); });
}

}  // extern "C"
