// Whole-file reads and writes for po_schedule_load / po_schedule_write, on the project's
// UniqueFd so that every failure (open, read, write, close) comes back as a Status naming the
// path and errno, as the C ABI promises, rather than as a stream's silent fail bit. Reads go
// through ReadBoundedFile: a regular file, at most kMaxScheduleFileBytes, no NUL byte.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "lib/base/bounded_file.h"
#include "lib/base/unique_fd.h"
#include "lib/c_api/c_api_internal.h"

namespace pipeoffload::c_api {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  return ReadBoundedFile(path, {"schedule file", kMaxScheduleFileBytes, /*text=*/true});
}

absl::Status WriteWholeFile(const std::string& path, std::string_view text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus(errno, "cannot create", path);
  while (!text.empty()) {
    const ssize_t wrote = ::write(fd.get(), text.data(), text.size());
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) return ErrnoStatus(errno, "cannot write", path);
    text.remove_prefix(static_cast<std::size_t>(wrote));
  }
  return fd.Close(path);
}

}  // namespace pipeoffload::c_api
