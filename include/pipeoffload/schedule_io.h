// Reading and writing schedules: canonical JSON, a compact text form and PyTorch pipelining CSV.
// Pure functions of their inputs (no files); the CLI does the file I/O.
#ifndef PIPEOFFLOAD_SCHEDULE_IO_H_
#define PIPEOFFLOAD_SCHEDULE_IO_H_

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
// W = weight grad), one row per rank, no header, actions "<virtual stage><TYPE><mb>" with virtual
// stage = chunk * p + rank. Offload ops and BARRIERs are stripped. With split backward our B
// becomes I. kComputeOnly writes F/I/B/W only; kComputeComms also the SEND/RECV actions.
enum class CsvFlavor { kComputeOnly, kComputeComms };
std::string ScheduleToPyTorchCsv(const Schedule& schedule, CsvFlavor flavor);
// Reads such a CSV into a Schedule for a pipeline with `num_stages` ranks (the file does not
// carry it). Infers m and v from the actions, the family from `family_hint`, split_backward
// from the presence of I/W. A compute_only file comes back without comm ops (run it through
// LowerCommunication, compiler.h); a compute_comms file comes back as it is. An "I" followed
// later by "W" of the same action is our B + W; a "B" when other rows split is an error.
// Errors: InvalidArgument naming row, column and cell.
[[nodiscard]] absl::StatusOr<Schedule> ParsePyTorchCsv(std::string_view csv, int num_stages,
                                                       Family family_hint);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_SCHEDULE_IO_H_
