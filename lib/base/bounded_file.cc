#include "lib/base/bounded_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "lib/base/unique_fd.h"

namespace pipeoffload {
namespace {

std::string_view FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, const FileLimits& limits) {
  const std::string what(limits.what);
  // Failures of the system calls read as everywhere else (ErrnoStatus: "cannot open '<path>':
  // No such file or directory"); refusals name the file, the rule and the limit.
  const auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", std::string(why)));
  };
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; on a
  // regular file the flag changes nothing.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return ErrnoStatus(errno, "cannot open", path);
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (!S_ISREG(info.st_mode)) {
    return refuse(absl::StrCat("is not a regular file (", std::string(FileKind(info.st_mode)),
                               "); a ", what, " must be one"));
  }
  const auto too_large = [&] {
    return refuse(absl::StrCat("has more than ", limits.max_bytes, " bytes, the limit for a ",
                               what));
  };
  if (info.st_size > limits.max_bytes) return too_large();
  std::string text;
  text.reserve(static_cast<std::size_t>(info.st_size));
  // Reads until end of file, but no further than one byte past the limit: st_size is only a
  // hint (files in /proc report 0, and a file may grow while it is read).
  char buffer[1 << 16];
  for (;;) {
    const std::int64_t room = limits.max_bytes + 1 - static_cast<std::int64_t>(text.size());
    const std::size_t want =
        static_cast<std::size_t>(std::min<std::int64_t>(room, sizeof(buffer)));
    const ssize_t got = ::read(fd.get(), buffer, want);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus(errno, "cannot read", path);
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
    if (static_cast<std::int64_t>(text.size()) > limits.max_bytes) return too_large();
  }
  if (limits.text) {
    if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
      return refuse(absl::StrCat("holds a NUL byte at offset ", nul, "; a ", what, " is text"));
    }
  }
  return text;
}

}  // namespace pipeoffload
