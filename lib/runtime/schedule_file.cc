// LoadScheduleFile and ScheduleFingerprint (planning.h).
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "lib/base/fnv1a.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/planning.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/validate.h"

namespace pipeoffload {

absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string why =
        absl::StrCat("cannot read schedule file ", path, ": ", std::strerror(error));
    return error == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<Schedule> schedule = ParseScheduleJson(text.str());
  if (!schedule.ok()) {
    return Annotate(schedule.status(), absl::StrCat("schedule file ", path, " is corrupted"));
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
