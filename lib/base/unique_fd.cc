#include "lib/base/unique_fd.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pipeoffload {

absl::Status ErrnoStatus(int error, std::string_view what, const std::string& path) {
  const std::string message =
      absl::StrCat(std::string(what), " '", path, "': ", std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = other.Release();
  }
  return *this;
}

int UniqueFd::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

// POSIX leaves the descriptor's state unspecified after EINTR; Linux always frees it, so a
// retry could close a descriptor another thread has opened since. Never retry.
void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status UniqueFd::Close(const std::string& path) {
  if (fd_ < 0) return absl::OkStatus();
  if (::close(Release()) != 0) return ErrnoStatus(errno, "cannot close", path);
  return absl::OkStatus();
}

}  // namespace pipeoffload
