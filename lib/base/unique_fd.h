// An owned POSIX file descriptor, shared by every reader and writer of files in the project
// (the NVMe store, the Llama example's token data and safetensors).
#ifndef PIPEOFFLOAD_LIB_BASE_UNIQUE_FD_H_
#define PIPEOFFLOAD_LIB_BASE_UNIQUE_FD_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace pipeoffload {

// "<what> '<path>': <strerror(error)>" with the code that fits the errno: NotFound (ENOENT,
// ENOTDIR), PermissionDenied (EACCES, EPERM), ResourceExhausted (ENOSPC, EDQUOT), else Internal.
[[nodiscard]] absl::Status ErrnoStatus(int error, std::string_view what, const std::string& path);

// Closes its descriptor on destruction and on Reset, ignoring the result there: callers that
// wrote through it and must know whether the write reached the file use Close().
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives the descriptor up (the caller owns it) and leaves this empty.
  int Release();
  void Reset();
  // close(2) with its result: ErrnoStatus naming `path` when it fails (a write may be lost).
  [[nodiscard]] absl::Status Close(const std::string& path);

 private:
  int fd_ = -1;
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_BASE_UNIQUE_FD_H_
