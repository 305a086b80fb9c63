// The NVMe tier of layer sliding (layer_sliding.h: SlidingOptions::nvme_dir): one scratch file
// on a local drive that holds Adam m, v (or activation checkpoints) of some units, moved to and
// from the engine's pinned host buffers asynchronously so that the transfers overlap compute
// and the CPU update. Owns the file (unlinked at creation: nothing outlives the process) and
// its I/O threads; never the buffers. Knows nothing of units or layouts: offsets are the
// caller's (reference/offload-systems.md sections 2.8 and 3.4 for how others do it).
#ifndef PIPEOFFLOAD_LIB_SLIDE_NVME_STORE_H_
#define PIPEOFFLOAD_LIB_SLIDE_NVME_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload {

// How requests reach the drive.
enum class NvmeBackend : std::uint8_t {
  kAuto,     // io_uring when the kernel lets us (not in every sandbox), else kThreads
  kIoUring,  // io_uring or Unavailable
  kThreads,  // a few threads doing pread / pwrite: works everywhere, one request per thread
};
std::string_view NvmeBackendName(NvmeBackend backend);  // "auto", "io_uring", "threads"

// Whether the file bypasses the page cache.
enum class NvmeDirectIo : std::uint8_t {
  kPreferred,  // O_DIRECT; buffered I/O where the filesystem refuses it (direct_io() says so)
  kRequired,   // O_DIRECT or FailedPrecondition
  kOff,        // buffered I/O (the page cache keeps a copy: host memory the tier meant to save)
};

struct NvmeStoreOptions {
  std::string dir;                 // an existing, writable directory on a local drive
  std::int64_t capacity_bytes = 0;  // size of the file, > 0, a multiple of kAlignment
  // Pieces in flight at once, over all requests (DeepSpeed aio: 8; TensorNVMe: 16; fast drives
  // want 32 or more). >= 1.
  int queue_depth = 32;
  // Requests are cut into pieces of this many bytes (DeepSpeed aio's block_size, 1 MiB).
  // A multiple of kAlignment, at most 1 GiB.
  std::int64_t request_bytes = std::int64_t{1} << 20;
  NvmeDirectIo direct_io = NvmeDirectIo::kPreferred;
  NvmeBackend backend = NvmeBackend::kAuto;
  double timeout_seconds = 600.0;  // bound on every Wait, >= 0
};

// Counters since Create. Busy time of a direction is wall time during which at least one of its
// requests was submitted and not yet finished, so bytes / busy seconds is the bandwidth the
// tier delivered while it was in use.
struct NvmeStats {
  std::int64_t bytes_read = 0;
  std::int64_t bytes_written = 0;
  double read_busy_seconds = 0.0;
  double write_busy_seconds = 0.0;
  std::int64_t pieces = 0;          // pieces handed to the backend, retries included
  std::int64_t fixed_pieces = 0;    // of those, through registered (fixed) buffers
  std::int64_t retried_pieces = 0;  // short transfers and EAGAIN / EINTR, resubmitted
};

// A scratch file with asynchronous reads and writes.
//
// Requests: SubmitRead / SubmitWrite return a ticket at once; the transfer runs in the
// background, cut into `request_bytes` pieces of which at most `queue_depth` are in flight over
// all requests, the oldest request first. Short transfers and EAGAIN / EINTR are resubmitted
// for the rest. Every ticket must be passed to Wait exactly once; Wait returns the request's
// status and releases it. Requests in flight at the same time run in any order, so a request
// may not overlap an unfinished write (Submit* returns FailedPrecondition), and the caller must
// not touch a buffer of an unfinished request: a read's `dst` until its Wait returns OK, a
// write's `src` until its Wait returns.
//
// The file starts as zeros (preallocated). Contents do not survive the store.
//
// Thread-safety: every method may be called from any thread (one mutex guards the request
// table; the backend threads take it once per piece). Wait on one ticket from one thread.
class NvmeStore {
 public:
  // Offsets, sizes and buffer addresses of requests are multiples of this (O_DIRECT needs the
  // logical block size; 4096 covers every drive we run on and the page size).
  static constexpr std::int64_t kAlignment = 4096;

  // Creates the file in options.dir: a unique name (pid and a counter), opened O_DIRECT unless
  // direct_io is kOff, unlinked at once (the directory holds no new entry while the store is
  // alive), then preallocated (fallocate) to capacity_bytes. Starts the backend's thread.
  // Nothing is left behind on any error.
  // Errors: InvalidArgument for bad options (naming the field); NotFound when dir does not
  // exist; FailedPrecondition when dir is not a directory, is read-only or not writable ("...
  // read-only or not writable: <errno text>"), or refuses O_DIRECT under kRequired;
  // ResourceExhausted when the filesystem has fewer free bytes than capacity_bytes (naming
  // both); Unavailable when kIoUring was asked for and io_uring cannot be set up (naming why);
  // Internal for other system-call failures (naming the call and errno).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NvmeStore>> Create(
      const NvmeStoreOptions& options);

  // Waits for the pieces in flight (unbounded: the kernel may be writing into the caller's
  // buffers until they finish), drops the requests not yet started, then closes the file,
  // which frees its space. Tickets not yet waited become invalid.
  virtual ~NvmeStore() = default;

  // Registers the caller's buffers (pinned host memory it owns, typically every staging buffer
  // it will pass to Submit*) as io_uring fixed buffers (IORING_REGISTER_BUFFERS), which spares
  // the kernel mapping their pages on every piece. Replaces an earlier registration; an empty
  // list only unregisters. Pieces that lie inside a registered buffer use it, others take the
  // plain path. When the kernel refuses (RLIMIT_MEMLOCK, a buffer it cannot pin) or the backend
  // is kThreads, this still returns OK: fixed_buffers() is false and Describe() says why.
  // REQUIRES: buffers stay allocated until the store is destroyed or registers others.
  // Errors: FailedPrecondition while a request is unfinished; InvalidArgument for an empty span.
  [[nodiscard]] virtual absl::Status RegisterBuffers(
      const std::vector<std::span<std::byte>>& buffers) = 0;

  // Starts reading `bytes` bytes at file `offset` into `dst` / writing them from `src`, and
  // returns the request's ticket (> 0). REQUIRES: the buffer stays allocated and untouched
  // until Wait (see the class comment).
  // Errors: InvalidArgument when offset, bytes or the buffer address is not a multiple of
  // kAlignment, bytes <= 0, the buffer is null, or offset + bytes > capacity_bytes (each naming
  // the values); FailedPrecondition when the range overlaps an unfinished write (or, for a
  // write, any unfinished request), naming its ticket.
  [[nodiscard]] virtual absl::StatusOr<std::int64_t> SubmitRead(std::int64_t offset, void* dst,
                                                                std::int64_t bytes) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::int64_t> SubmitWrite(std::int64_t offset,
                                                                 const void* src,
                                                                 std::int64_t bytes) = 0;

  // Blocks until request `ticket` has finished (at most timeout_seconds), then releases it and
  // returns its status. After DeadlineExceeded the request is still in flight and may be
  // waited again; its buffer is still in use.
  // Errors: InvalidArgument for a ticket never issued or already waited; DeadlineExceeded
  // naming the op, offset, bytes and how many bytes were done; DataLoss for EIO or a transfer
  // that ended early, Internal for other errno values, ResourceExhausted for ENOSPC, each naming
  // the op, the request and the failing piece's offset and errno text (the request's first
  // error; its remaining pieces are not started).
  [[nodiscard]] virtual absl::Status Wait(std::int64_t ticket) = 0;

  // True when request `ticket` has finished, so Wait will not block. Never blocks. True for a
  // ticket never issued or already waited (there is nothing to wait for; Wait says which).
  virtual bool Poll(std::int64_t ticket) = 0;

  // Writes cached data of the file back (fdatasync) and drops its clean pages from the page
  // cache, so later reads come from the drive. Useful with buffered I/O (the bandwidth probe
  // uses it); costs little with O_DIRECT. REQUIRES: no unfinished write.
  // Errors: FailedPrecondition while a write is unfinished; Internal naming the call and errno.
  [[nodiscard]] virtual absl::Status Sync() = 0;

  virtual NvmeStats Stats() const = 0;
  virtual std::int64_t capacity_bytes() const = 0;
  virtual bool direct_io() const = 0;             // O_DIRECT in use
  virtual std::string_view backend_name() const = 0;  // "io_uring" or "threads"
  virtual bool fixed_buffers() const = 0;         // RegisterBuffers took effect
  // One line for the trainer's log: directory, capacity, backend, direct or buffered I/O and
  // fixed buffers, with the reason for every fallback taken.
  virtual std::string Describe() const = 0;
};

// Sequential bandwidth of the NVMe path as the engine sees it.
struct NvmeBandwidth {
  std::int64_t bytes = 0;       // written, then read back
  double write_gb_per_s = 0.0;  // 1e9 bytes / s, fdatasync included
  double read_gb_per_s = 0.0;   // after the page cache was dropped
  bool direct_io = false;
  std::string backend;          // backend_name()
  std::string description;      // the store's Describe()
};

// Writes then reads back options.capacity_bytes bytes through an NvmeStore built from `options`
// (two aligned host buffers registered as fixed buffers, each of queue_depth pieces but at
// least 64 MiB, in flight alternately), checks a stamp in every 4 KiB block of what came back,
// and closes the file (which was never visible in options.dir). For the benchmark: timings are
// host wall clock, validated options are Create's.
// Errors: Create's; ResourceExhausted when the buffers cannot be allocated; DataLoss when the
// data read back differs from what was written; Wait's and Sync's.
[[nodiscard]] absl::StatusOr<NvmeBandwidth> MeasureNvmeBandwidth(const NvmeStoreOptions& options);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_SLIDE_NVME_STORE_H_
