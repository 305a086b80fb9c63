// Internals of the NVMe store (nvme_store.h): the scratch file, and the interface between the
// store's request table (nvme_store.cc) and the backends that move pieces (nvme_uring.cc,
// nvme_threads.cc, and the scripted backend of the tests). Backends do one system call per
// piece and report its raw result; splitting, retries, errors and accounting are the store's.
#ifndef PIPEOFFLOAD_LIB_SLIDE_NVME_IO_H_
#define PIPEOFFLOAD_LIB_SLIDE_NVME_IO_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/base/unique_fd.h"
#include "lib/slide/nvme_store.h"

namespace pipeoffload::internal {

// "<what>: <strerror(error)> (errno <error>)".
std::string ErrnoText(std::string_view what, int error);

// The store's file: created in a directory, already unlinked, preallocated.
struct ScratchFile {
  UniqueFd fd;
  bool direct_io = false;
  std::string note;  // why O_DIRECT or preallocation was not used; empty when they were
};
// Creates it as NvmeStore::Create documents (the directory, writability, O_DIRECT and free
// space checks with their error codes). REQUIRES: capacity_bytes > 0, a multiple of 4096.
[[nodiscard]] absl::StatusOr<ScratchFile> CreateScratchFile(const std::string& dir,
                                                            std::int64_t capacity_bytes,
                                                            NvmeDirectIo direct_io);

// One system call's worth of a request.
struct IoPiece {
  std::int64_t ticket = 0;  // the request it belongs to
  bool write = false;
  std::int64_t offset = 0;  // in the file
  std::byte* buffer = nullptr;
  std::int64_t bytes = 0;   // > 0, at most request_bytes
  int fixed_index = -1;     // registered buffer holding [buffer, buffer + bytes), or -1
};

// The store's side, called by backends. Thread-safe.
class IoQueue {
 public:
  virtual ~IoQueue() = default;
  // Takes the next piece to run. False when none may start now (queue depth reached, nothing
  // pending) or, with `wait`, only once the store is shutting down: `wait` blocks until a piece
  // may start.
  virtual bool NextPiece(bool wait, IoPiece* piece) = 0;
  // Reports a piece's outcome: bytes transferred (>= 0) or -errno. Every piece taken is
  // completed exactly once. Never calls back into the backend.
  virtual void CompletePiece(const IoPiece& piece, std::int64_t result) = 0;
};

// Moves pieces. Protocol: after Wake() and after every CompletePiece, the backend calls
// NextPiece until it returns false. The store destroys the backend only after NextPiece has
// started returning false for good and every piece taken has been completed.
class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual std::string_view name() const = 0;
  // Pieces may be ready (called by the store after queueing a request, without its lock).
  virtual void Wake() = 0;
  // Replaces the fixed buffers (an empty list unregisters). Called with no piece in flight.
  // An error says why registration is not possible; the store then sends fixed_index -1.
  [[nodiscard]] virtual absl::Status RegisterBuffers(std::span<const iovec> buffers) = 0;
};

// io_uring with an eventfd for wake-ups, one thread; Unavailable when the ring cannot be set up
// or lacks the opcodes used (naming the call and errno).
[[nodiscard]] absl::StatusOr<std::unique_ptr<IoBackend>> StartUringBackend(int fd,
                                                                           int queue_depth,
                                                                           IoQueue& queue);
// min(queue_depth, 16) threads doing pread / pwrite.
[[nodiscard]] absl::StatusOr<std::unique_ptr<IoBackend>> StartThreadBackend(int fd,
                                                                            int queue_depth,
                                                                            IoQueue& queue);

// For tests (an injectable environment in leveldb's manner): builds the store with the backend
// `start` returns instead of the one options.backend names. `start` gets the file and the
// store's queue; the backend it returns is destroyed before the file is closed.
using IoBackendStarter = std::function<absl::StatusOr<std::unique_ptr<IoBackend>>(
    int fd, int queue_depth, IoQueue& queue)>;
[[nodiscard]] absl::StatusOr<std::unique_ptr<NvmeStore>> CreateNvmeStoreWithBackend(
    const NvmeStoreOptions& options, const IoBackendStarter& start);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_NVME_IO_H_
