// The NVMe store's fallback backend (nvme_io.h): a few threads, each taking one piece at a time
// from the store and moving it with pread / pwrite. For where io_uring is not allowed (seccomp
// profiles, kernel.io_uring_disabled); it needs one thread per piece in flight, so its queue is
// shallower than the ring's.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <thread>
#include <vector>

#include "lib/slide/nvme_io.h"

namespace pipeoffload::internal {
namespace {

// More threads than this buy little on one drive (DeepSpeed aio's intra_op_parallelism is 1 by
// default, each with its own libaio queue) and cost a stack each.
constexpr int kMaxThreads = 16;

class ThreadBackend final : public IoBackend {
 public:
  ThreadBackend(int fd, int queue_depth, IoQueue& queue) : fd_(fd), queue_(queue) {
    const int count = std::min(queue_depth, kMaxThreads);
    threads_.reserve(count);
    for (int i = 0; i < count; ++i) threads_.emplace_back([this] { Run(); });
  }
  // The store has shut down its queue, so every thread's NextPiece returns false.
  ~ThreadBackend() override {
    for (std::thread& thread : threads_) thread.join();
  }

  std::string_view name() const override { return "threads"; }
  // The threads sleep in NextPiece(wait=true), which the store wakes itself.
  void Wake() override {}
  absl::Status RegisterBuffers(std::span<const iovec> buffers) override {
    if (buffers.empty()) return absl::OkStatus();
    return absl::UnimplementedError("the threads backend has no fixed buffers");
  }

 private:
  void Run() {
    IoPiece piece;
    while (queue_.NextPiece(/*wait=*/true, &piece)) {
      const ssize_t moved =
          piece.write ? ::pwrite(fd_, piece.buffer, piece.bytes, piece.offset)
                      : ::pread(fd_, piece.buffer, piece.bytes, piece.offset);
      queue_.CompletePiece(piece, moved < 0 ? -errno : moved);
    }
  }

  const int fd_;
  IoQueue& queue_;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoBackend>> StartThreadBackend(int fd, int queue_depth,
                                                              IoQueue& queue) {
  return std::unique_ptr<IoBackend>(std::make_unique<ThreadBackend>(fd, queue_depth, queue));
}

}  // namespace pipeoffload::internal
