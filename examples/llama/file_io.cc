// POSIX plumbing behind file_io.h. Only errno-to-Status mapping and retry loops live here.
#include "examples/llama/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama {
namespace {

// Large enough that syscall overhead vanishes against the copy, small enough that one call
// never asks the kernel for more than it will hand back at once (Linux caps a read at ~2 GiB).
constexpr std::int64_t kIoPieceBytes = std::int64_t{64} << 20;

std::string ErrnoText(int error) { return std::strerror(error); }

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<ReadOnlyFile> OpenRegularFile(const std::string& path, std::string_view what,
                                             std::int64_t max_bytes) {
  const std::string role(what);
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot stat ", role), path);
  }
  if (!S_ISREG(before.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(role, " '", path, "' is ", FileKind(before.st_mode), ", not a regular file"));
  }
  // O_NONBLOCK: if a FIFO replaced the file after stat, open returns at once instead of
  // waiting for a writer; the fstat check below then rejects it.
  const int raw_fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (raw_fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", role), path);
  ReadOnlyFile file;
  file.fd = UniqueFd(raw_fd);
  struct stat after {};
  if (::fstat(file.fd.get(), &after) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot stat ", role), path);
  }
  if (!S_ISREG(after.st_mode) || after.st_dev != before.st_dev || after.st_ino != before.st_ino) {
    return absl::InvalidArgumentError(
        absl::StrCat(role, " '", path, "' changed while being opened (now ",
                     S_ISREG(after.st_mode) ? "another file" : FileKind(after.st_mode), ")"));
  }
  file.size = static_cast<std::int64_t>(after.st_size);
  if (max_bytes >= 0 && file.size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(role, " '", path, "' has ", file.size,
                                                     " bytes, more than the limit of ", max_bytes));
  }
  return file;
}

absl::Status PreadFully(int fd, std::int64_t offset, std::span<char> out, const std::string& path) {
  std::size_t done = 0;
  while (done < out.size()) {
    const std::size_t want = static_cast<std::size_t>(
        std::min<std::int64_t>(kIoPieceBytes, static_cast<std::int64_t>(out.size() - done)));
    const std::int64_t at = offset + static_cast<std::int64_t>(done);
    const ssize_t got = ::pread(fd, out.data() + done, want, static_cast<off_t>(at));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat("read of '", path, "' at byte ", at, " failed: ", ErrnoText(errno)));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat("'", path, "' ends at byte ", at, ", before the ",
                                              out.size() - done, " bytes still expected"));
    }
    done += static_cast<std::size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status WriteFully(int fd, std::span<const char> data, const std::string& path) {
  std::size_t done = 0;
  while (done < data.size()) {
    const std::size_t want = static_cast<std::size_t>(
        std::min<std::int64_t>(kIoPieceBytes, static_cast<std::int64_t>(data.size() - done)));
    const ssize_t put = ::write(fd, data.data() + done, want);
    if (put < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot write", path);
    }
    done += static_cast<std::size_t>(put);
  }
  return absl::OkStatus();
}

absl::Status SyncFd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoStatus(errno, "cannot fsync", path);
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int raw_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (raw_fd < 0) return ErrnoStatus(errno, "cannot open directory", dir);
  UniqueFd fd(raw_fd);
  PO_RETURN_IF_ERROR(SyncFd(fd.get(), dir));
  return fd.Close(dir);
}

std::string TemporarySibling(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  return absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  const std::string temp = TemporarySibling(path);
  const int raw_fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (raw_fd < 0) return ErrnoStatus(errno, "cannot create", temp);
  UniqueFd fd(raw_fd);
  absl::Status status = WriteFully(fd.get(), contents, temp);
  if (status.ok()) status = SyncFd(fd.get(), temp);
  if (status.ok()) status = fd.Close(temp);
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("cannot rename '", temp, "' to"), path);
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(DirName(path));
}

std::string DirName(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, std::string(name));
  return absl::StrCat(dir, "/", std::string(name));
}

}  // namespace pipeoffload::llama
