// POSIX file plumbing shared by the Llama example's readers and writers (token data,
// safetensors, checkpoints): opening regular files without ever blocking on a FIFO, positioned
// reads in large pieces, and all-or-nothing writes (temporary name + fsync + rename).
// Every error names the path; nothing here knows about tensors or tokens.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_FILE_IO_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_FILE_IO_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/base/unique_fd.h"

namespace pipeoffload::llama {

// A regular file opened read-only, with its size at open time.
struct ReadOnlyFile {
  UniqueFd fd;
  std::int64_t size = 0;
};

// Opens `path` for reading. stat(2) first and refuses anything but a regular file (FIFOs,
// sockets, devices, directories: InvalidArgument), then opens with O_NONBLOCK so that a FIFO
// swapped in between the two calls cannot block either, and checks with fstat(2) that the
// opened file is the one that was stat'ed. `max_bytes` >= 0 bounds the size (ResourceExhausted).
// `what` names the file's role in messages ("data file", "safetensors file").
// Errors: NotFound (no such file), PermissionDenied, InvalidArgument, ResourceExhausted.
[[nodiscard]] absl::StatusOr<ReadOnlyFile> OpenRegularFile(const std::string& path,
                                                           std::string_view what,
                                                           std::int64_t max_bytes = -1);

// Reads exactly out.size() bytes at `offset` with pread(2), in pieces of at most 64 MiB,
// retrying EINTR and short reads. Thread-safe for concurrent calls on one fd (pread does not
// move the file offset). Errors: DataLoss naming `path` and the offset when the file ends early
// or a read fails.
[[nodiscard]] absl::Status PreadFully(int fd, std::int64_t offset, std::span<char> out,
                                      const std::string& path);

// Writes all of `data` to `fd` at its current offset, retrying EINTR and short writes.
// Errors: ResourceExhausted (ENOSPC, EDQUOT) or Internal, naming `path`.
[[nodiscard]] absl::Status WriteFully(int fd, std::span<const char> data, const std::string& path);

// fsync(2) of a file or directory. Errors: Internal naming `path`.
[[nodiscard]] absl::Status SyncFd(int fd, const std::string& path);
[[nodiscard]] absl::Status SyncDirectory(const std::string& dir);

// A name in `path`'s directory that no other writer uses: "<path>.tmp.<pid>.<counter>".
std::string TemporarySibling(const std::string& path);

// Writes `contents` to `path` all-or-nothing: a temporary sibling, fsync, rename(2) over
// `path`, fsync of the directory. On error the temporary file is removed and `path` is left as
// it was. Errors as WriteFully / SyncFd, or Internal when the rename fails.
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

// The directory part of `path` ("." when there is none).
std::string DirName(const std::string& path);
// `dir` + "/" + `name`.
std::string JoinPath(const std::string& dir, std::string_view name);

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_FILE_IO_H_
