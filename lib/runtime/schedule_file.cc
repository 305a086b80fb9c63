// LoadScheduleFile and ScheduleFingerprint (planning.h).
#include "absl/strings/str_cat.h"
#include "lib/base/bounded_file.h"
#include "lib/base/fnv1a.h"
#include "lib/base/status_macros.h"
#include "lib/ir/declared_offload.h"
#include "pipeoffload/planning.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/validate.h"

namespace pipeoffload {

absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path) {
  absl::StatusOr<std::string> text =
      ReadBoundedFile(path, {"schedule file", kMaxScheduleFileBytes, /*text=*/true});
  if (!text.ok()) {
    return Annotate(text.status(), absl::StrCat("cannot read schedule file ", path));
  }
  absl::StatusOr<Schedule> schedule = ParseScheduleJson(*text);
  if (!schedule.ok()) {
    return Annotate(schedule.status(), absl::StrCat("schedule file ", path, " is corrupted"));
  }
  if (absl::Status declared = internal::CheckDeclaredOffload(*schedule); !declared.ok()) {
    return Annotate(declared, absl::StrCat("schedule file ", path, " is corrupted"));
  }
  if (absl::Status valid = Validate(*schedule); !valid.ok()) {
    return Annotate(valid, absl::StrCat("schedule file ", path, " is not a valid schedule"));
  }
  return schedule;
}

std::uint64_t ScheduleFingerprint(const Schedule& schedule) {
  const std::string json = ScheduleToJson(schedule);
  return internal::Fnv1a64(json.data(), static_cast<std::int64_t>(json.size()));
}

}  // namespace pipeoffload
