// Reading and writing schedules: canonical JSON, a compact text form and PyTorch pipelining CSV.
// Pure functions of their inputs (no files); the CLI does the file I/O.
#ifndef PIPEOFFLOAD_SCHEDULE_IO_H_
#define PIPEOFFLOAD_SCHEDULE_IO_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload {

inline constexpr std::string_view kScheduleFormat = "pipeoffload.schedule/1";

// Canonical JSON: {"format": "pipeoffload.schedule/1", "spec": {...}, "stages": [{"stage": d,
// "ops": [{"op": "F", "mb": 0, "chunk": 0}, {"op": "SEND_F", ..., "peer": 1}, ...]}, ...],
// "predictions": {...}} ("predictions" only when present). ParseScheduleJson(ScheduleToJson(s))
// == s exactly, doubles included.
std::string ScheduleToJson(const Schedule& schedule);
// Errors: InvalidArgument naming the place (JSON path such as "stages[2].ops[17].op") and what
// is wrong there, or the line and column of a syntax error.
[[nodiscard]] absl::StatusOr<Schedule> ParseScheduleJson(std::string_view json);

// One row per stage: "stage 0 | F0.0 F1.0 SEND_F0.0->1 ... " (for humans; not parsed back).
std::string ScheduleToText(const Schedule& schedule);

// torch.distributed.pipelining CSV, current dialect (B = full backward, I = input grad,
// W = weight grad), one row per rank, no header, actions "<virtual stage><TYPE><mb>" with the
// virtual stage of the spec's placement (VirtualStageMap: chunk * p + rank for loop, rank or
// 2p - 1 - rank for v). Offload ops and BARRIERs are stripped, and so are RECOMPUTE and
// RECOMPUTE_LEAN (torch has no such action: there the chunk's module recomputes itself, e.g.
// under torch.utils.checkpoint, which the CSV cannot say). With split backward our B
// becomes I. kComputeOnly writes F/I/B/W only; kComputeComms also the SEND/RECV actions.
enum class CsvFlavor { kComputeOnly, kComputeComms };
std::string ScheduleToPyTorchCsv(const Schedule& schedule, CsvFlavor flavor);
// What an import knows besides the file.
struct CsvImportOptions {
  int num_stages = 0;                  // ranks; 0 = the file's rows (up to its last non-blank)
  std::optional<Placement> placement;  // nullopt = inferred from the rows
  Family family_hint = Family::k1F1B;
};
// Reads such a CSV (any schedule torch 2.11 writes: Interleaved1F1B, InterleavedZeroBubble,
// LoopedBFS, ZBVZeroBubble, DualPipeV, ...) into a Schedule. Infers m and v from the actions,
// the ranks from the rows unless given (a given count must fit the rows: fewer rows, or actions
// past it, are errors), the placement unless given (v when the rows put virtual stage l >= p on
// rank 2p - 1 - l; every action must sit on its placement's rank), the family from the hint,
// split_backward from any I/W. A compute_only file comes back without comm ops (run it through
// LowerCommunication, compiler.h); a compute_comms file comes back as it is. An "I" followed
// later by "W" of the same action is our B + W; in a split file a full "B" is our B and its W;
// OVERLAP_F_B is its sub-actions in order. Errors: InvalidArgument naming row, column and cell.
[[nodiscard]] absl::StatusOr<Schedule> ParsePyTorchCsv(std::string_view csv,
                                                       const CsvImportOptions& options);
// The same for a pipeline of `num_stages` >= 1 ranks, the placement inferred.
[[nodiscard]] absl::StatusOr<Schedule> ParsePyTorchCsv(std::string_view csv, int num_stages,
                                                       Family family_hint);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_SCHEDULE_IO_H_
