// Writing a po_schedule in every format the C++ side writes (schedule_io.h, trace.h,
// timeline_svg.h), to library-owned text (po_schedule_format, released with po_free) or to a
// file.
#include <cstdlib>
#include <cstring>
#include <string>

#include "lib/base/status_macros.h"
#include "lib/c_api/c_api_internal.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/timeline_svg.h"
#include "pipeoffload/trace.h"

namespace pipeoffload::c_api {

absl::StatusOr<std::string> Render(const po_schedule& schedule, std::int32_t format) {
  switch (format) {
    case PO_FORMAT_JSON:
      return ScheduleToJson(schedule.schedule);
    case PO_FORMAT_TEXT:
      return ScheduleToText(schedule.schedule);
    case PO_FORMAT_PYTORCH_CSV:
      return ScheduleToPyTorchCsv(schedule.schedule, CsvFlavor::kComputeOnly);
    case PO_FORMAT_PYTORCH_CSV_COMMS:
      return ScheduleToPyTorchCsv(schedule.schedule, CsvFlavor::kComputeComms);
    case PO_FORMAT_TRACE:
    case PO_FORMAT_SVG: {
      // Pictures of the timeline under the schedule's own cost model, as po-schedule draws them.
      PO_ASSIGN_OR_RETURN(const Timeline timeline, Simulate(schedule.schedule, schedule.cost));
      if (format == PO_FORMAT_SVG) {
        return TimelineToSvg(schedule.schedule, timeline, SvgOptions{schedule.unit_costs});
      }
      // po-schedule's scale: unit costs read best as 1 unit = 1 ms, measured ones are seconds.
      return TimelineToTraceJson(schedule.schedule, timeline, schedule.unit_costs ? 1000.0 : 1e6);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown format ", format,
          "; expected PO_FORMAT_JSON (0), _TEXT (1), _PYTORCH_CSV (2), _PYTORCH_CSV_COMMS (3), "
          "_TRACE (4) or _SVG (5)"));
  }
}

namespace {

absl::Status FormatSchedule(const po_schedule* schedule, std::int32_t format, char** text,
                            std::size_t* size) {
  PO_RETURN_IF_ERROR(NotNull(schedule, "schedule"));
  PO_RETURN_IF_ERROR(NotNull(text, "text"));
  PO_RETURN_IF_ERROR(NotNull(size, "size"));
  PO_ASSIGN_OR_RETURN(const std::string rendered, Render(*schedule, format));
  // malloc, not new[]: po_free releases it with free (boundary.cc).
  char* copy = static_cast<char*>(std::malloc(rendered.size() + 1));
  if (copy == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for ", rendered.size() + 1, " bytes of text"));
  }
  std::memcpy(copy, rendered.c_str(), rendered.size() + 1);
  *text = copy;
  *size = rendered.size();
  return absl::OkStatus();
}

absl::Status WriteSchedule(const po_schedule* schedule, std::int32_t format, const char* path) {
  PO_RETURN_IF_ERROR(NotNull(schedule, "schedule"));
  PO_RETURN_IF_ERROR(NotNull(path, "path"));
  PO_ASSIGN_OR_RETURN(const std::string rendered, Render(*schedule, format));
  return WriteWholeFile(path, rendered);
}

}  // namespace
}  // namespace pipeoffload::c_api

namespace c_api = pipeoffload::c_api;

extern "C" {

po_status po_schedule_format(const po_schedule* schedule, int32_t format, char** text,
                             size_t* size) {
  return c_api::Boundary(__func__,
                         [&] { return c_api::FormatSchedule(schedule, format, text, size); });
}

po_status po_schedule_write(const po_schedule* schedule, int32_t format, const char* path) {
  return c_api::Boundary(__func__,
                         [&] { return c_api::WriteSchedule(schedule, format, path); });
}

}  // extern "C"
