// The NVMe store's scratch file (nvme_io.h): directory checks, a unique name, O_DIRECT with a
// buffered fallback, unlink-at-once, free-space check and preallocation. Every error path
// closes what it opened and leaves no name in the directory.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/slide/nvme_io.h"

namespace pipeoffload::internal {

std::string ErrnoText(std::string_view what, int error) {
  return absl::StrCat(std::string(what), ": ", std::strerror(error), " (errno ", error, ")");
}

namespace {

absl::StatusOr<std::int64_t> FreeBytes(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) {
    return absl::InternalError(ErrnoText(absl::StrCat("statvfs(", dir, ")"), errno));
  }
  // f_bavail, not f_bfree: the blocks reserved for root are not ours to fill.
  return static_cast<std::int64_t>(fs.f_bavail) * static_cast<std::int64_t>(fs.f_frsize);
}

absl::Status NotEnoughSpace(const std::string& dir, std::int64_t needed, std::int64_t free) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "NVMe store needs ", needed, " bytes in ", dir, " but its filesystem has ", free,
      " bytes free"));
}

absl::Status CheckDirectory(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("NVMe directory is empty");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("NVMe directory ", dir, " does not exist"));
    }
    return absl::FailedPreconditionError(ErrnoText(absl::StrCat("NVMe directory ", dir), error));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe directory ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

// Opens a new file under a name no other store (of this or another process) uses, and unlinks
// it. With O_DIRECT, a filesystem without direct I/O may create the file and then fail the open
// with EINVAL, so that case removes the name before trying again without it.
absl::StatusOr<ScratchFile> OpenUnlinked(const std::string& dir, NvmeDirectIo direct_io) {
  static std::atomic<std::int64_t> counter{0};
  ScratchFile file;
  bool try_direct = direct_io != NvmeDirectIo::kOff;
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::string path = absl::StrCat(dir, "/pipeoffload-nvme-", ::getpid(), "-",
                                          counter.fetch_add(1), ".tmp");
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (try_direct ? O_DIRECT : 0);
    const int fd = ::open(path.c_str(), flags, 0600);
    if (fd < 0) {
      const int error = errno;
      if (error == EEXIST) continue;
      if (error == EINVAL && try_direct) {
        ::unlink(path.c_str());  // ENOENT when the filesystem refused before creating it
        if (direct_io == NvmeDirectIo::kRequired) {
          return absl::FailedPreconditionError(
              ErrnoText(absl::StrCat("NVMe directory ", dir, " refuses O_DIRECT"), error));
        }
        try_direct = false;
        file.note = ErrnoText("O_DIRECT refused at open, using buffered I/O", error);
        continue;
      }
      return absl::FailedPreconditionError(ErrnoText(
          absl::StrCat("NVMe directory ", dir, " is read-only or not writable"), error));
    }
    file.fd = UniqueFd(fd);
    if (::unlink(path.c_str()) != 0) {
      return absl::InternalError(ErrnoText(absl::StrCat("unlink(", path, ")"), errno));
    }
    file.direct_io = try_direct;
    return file;
  }
  return absl::InternalError(absl::StrCat("no unused file name in ", dir, " after 64 tries"));
}

// Some filesystems accept O_DIRECT at open and refuse the I/O itself (EINVAL): try one block,
// and fall back to buffered I/O on the same descriptor (F_SETFL may clear O_DIRECT).
absl::Status ProbeDirectIo(const std::string& dir, NvmeDirectIo direct_io, ScratchFile& file) {
  constexpr std::size_t kBlock = NvmeStore::kAlignment;
  std::unique_ptr<void, decltype(&std::free)> block(std::aligned_alloc(kBlock, kBlock),
                                                    &std::free);
  if (block == nullptr) return absl::ResourceExhaustedError("NVMe probe: no 4 KiB block");
  std::memset(block.get(), 0, kBlock);
  const ssize_t written = ::pwrite(file.fd.get(), block.get(), kBlock, 0);
  const int error = written < 0 ? errno : 0;
  if (written == static_cast<ssize_t>(kBlock)) return absl::OkStatus();
  if (error != EINVAL) {
    return absl::InternalError(ErrnoText(absl::StrCat("NVMe probe write in ", dir), error));
  }
  if (direct_io == NvmeDirectIo::kRequired) {
    return absl::FailedPreconditionError(
        ErrnoText(absl::StrCat("NVMe directory ", dir, " refuses O_DIRECT I/O"), error));
  }
  const int flags = ::fcntl(file.fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(file.fd.get(), F_SETFL, flags & ~O_DIRECT) != 0) {
    return absl::InternalError(ErrnoText("fcntl(F_SETFL, ~O_DIRECT)", errno));
  }
  file.direct_io = false;
  file.note = ErrnoText("O_DIRECT I/O refused, using buffered I/O", error);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScratchFile> CreateScratchFile(const std::string& dir,
                                              std::int64_t capacity_bytes,
                                              NvmeDirectIo direct_io) {
  PO_RETURN_IF_ERROR(CheckDirectory(dir));
  // Open before the free-space check: a read-only directory should say so, not that it is full
  // (read-only filesystems such as /proc report no free space).
  PO_ASSIGN_OR_RETURN(ScratchFile file, OpenUnlinked(dir, direct_io));
  PO_ASSIGN_OR_RETURN(const std::int64_t free_bytes, FreeBytes(dir));
  if (capacity_bytes > free_bytes) return NotEnoughSpace(dir, capacity_bytes, free_bytes);
  if (::fallocate(file.fd.get(), 0, 0, capacity_bytes) != 0) {
    const int error = errno;
    if (error == ENOSPC) {
      PO_ASSIGN_OR_RETURN(const std::int64_t now_free, FreeBytes(dir));
      return NotEnoughSpace(dir, capacity_bytes, now_free);
    }
    if (error != EOPNOTSUPP) {
      return absl::InternalError(ErrnoText(absl::StrCat("fallocate(", capacity_bytes,
                                                        " bytes) in ", dir), error));
    }
    // No preallocation on this filesystem: a sparse file, which may run out of space later
    // (the writes then fail with ResourceExhausted).
    if (::ftruncate(file.fd.get(), capacity_bytes) != 0) {
      return absl::InternalError(ErrnoText(absl::StrCat("ftruncate in ", dir), errno));
    }
    absl::StrAppend(&file.note, file.note.empty() ? "" : "; ",
                    "no fallocate on this filesystem: the file is sparse");
  }
  if (file.direct_io) PO_RETURN_IF_ERROR(ProbeDirectIo(dir, direct_io, file));
  return file;
}

}  // namespace pipeoffload::internal
