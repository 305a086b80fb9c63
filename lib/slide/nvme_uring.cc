// The NVMe store's io_uring backend (nvme_io.h): one thread owns the ring, both its submission
// and completion sides, so the ring needs no lock. The store wakes it through an eventfd whose
// read is always armed in the ring, so the thread sleeps in one place (io_uring_wait_cqe) for
// both completions and new work.
//
// Invariants: slots_[i] is in use iff its piece has been prepared and its completion not yet
// reaped; in-use slots <= queue_depth (the store never hands out more pieces), so the ring's
// queue_depth + 1 entries (one for the eventfd read) never run out and its completion queue
// (twice as long) never overflows.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/check.h"
#include "lib/slide/nvme_io.h"

namespace pipeoffload::internal {
namespace {

constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};

class UringBackend final : public IoBackend {
 public:
  UringBackend(int fd, int queue_depth, IoQueue& queue)
      : fd_(fd), queue_(queue), slots_(queue_depth) {
    for (int i = queue_depth - 1; i >= 0; --i) free_slots_.push_back(i);
  }
  ~UringBackend() override;

  absl::Status Init();
  std::string_view name() const override { return "io_uring"; }
  void Wake() override;
  absl::Status RegisterBuffers(std::span<const iovec> buffers) override;

 private:
  void Run();
  void ArmWake();
  io_uring_sqe* Sqe();
  void Prepare(const IoPiece& piece);
  void Reap(io_uring_cqe* cqe);

  const int fd_;
  IoQueue& queue_;
  io_uring ring_{};
  bool ring_ready_ = false;
  UniqueFd wake_fd_;
  std::uint64_t wake_value_ = 0;  // the armed eventfd read lands here
  bool registered_ = false;
  std::vector<IoPiece> slots_;
  std::vector<int> free_slots_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

absl::Status UringBackend::Init() {
  const int entries = static_cast<int>(slots_.size()) + 1;
  const int init = io_uring_queue_init(entries, &ring_, 0);
  if (init < 0) {
    return absl::UnavailableError(ErrnoText(absl::StrCat("io_uring_queue_init(", entries, ")"),
                                            -init));
  }
  ring_ready_ = true;
  // IORING_OP_READ / WRITE came in Linux 5.6; older kernels set the ring up and then fail
  // every piece.
  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  const bool supported = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ) &&
                         io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
                         io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
                         io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!supported) {
    return absl::UnavailableError("io_uring lacks IORING_OP_READ / WRITE (Linux < 5.6)");
  }
  wake_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC));
  if (wake_fd_.get() < 0) return absl::UnavailableError(ErrnoText("eventfd", errno));
  ArmWake();
  const int submitted = io_uring_submit(&ring_);
  if (submitted < 0) return absl::UnavailableError(ErrnoText("io_uring_submit", -submitted));
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

UringBackend::~UringBackend() {
  if (thread_.joinable()) {
    stop_.store(true);
    Wake();
    thread_.join();
  }
  // Cancels the armed eventfd read; no piece is in flight (the store's contract).
  if (ring_ready_) io_uring_queue_exit(&ring_);
}

void UringBackend::Wake() {
  const std::uint64_t one = 1;
  // The counter cannot overflow (the armed read drains it), so only EINTR can interrupt.
  while (::write(wake_fd_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

absl::Status UringBackend::RegisterBuffers(std::span<const iovec> buffers) {
  // Unregister first: the kernel refuses a second table (EBUSY).
  if (registered_) {
    io_uring_unregister_buffers(&ring_);
    registered_ = false;
  }
  if (buffers.empty()) return absl::OkStatus();
  const int result =
      io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(buffers.size()));
  if (result < 0) return absl::UnavailableError(ErrnoText("io_uring_register_buffers", -result));
  registered_ = true;
  return absl::OkStatus();
}

io_uring_sqe* UringBackend::Sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  // Cannot be null: at most queue_depth + 1 operations exist (invariants above) and each
  // prepared one is submitted before the thread sleeps.
  PO_CHECK(sqe != nullptr);
  return sqe;
}

void UringBackend::ArmWake() {
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_read(sqe, wake_fd_.get(), &wake_value_, sizeof(wake_value_), 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

void UringBackend::Prepare(const IoPiece& piece) {
  PO_CHECK(!free_slots_.empty());
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[slot] = piece;
  io_uring_sqe* sqe = Sqe();
  const auto bytes = static_cast<unsigned>(piece.bytes);
  if (piece.fixed_index >= 0) {
    if (piece.write) {
      io_uring_prep_write_fixed(sqe, fd_, piece.buffer, bytes, piece.offset, piece.fixed_index);
    } else {
      io_uring_prep_read_fixed(sqe, fd_, piece.buffer, bytes, piece.offset, piece.fixed_index);
    }
  } else if (piece.write) {
    io_uring_prep_write(sqe, fd_, piece.buffer, bytes, piece.offset);
  } else {
    io_uring_prep_read(sqe, fd_, piece.buffer, bytes, piece.offset);
  }
  io_uring_sqe_set_data64(sqe, static_cast<std::uint64_t>(slot));
}

void UringBackend::Reap(io_uring_cqe* cqe) {
  const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
  const int result = cqe->res;
  io_uring_cqe_seen(&ring_, cqe);
  if (tag == kWakeTag) {
    ArmWake();
    return;
  }
  const int slot = static_cast<int>(tag);
  const IoPiece piece = slots_[slot];
  free_slots_.push_back(slot);
  queue_.CompletePiece(piece, result);
}

void UringBackend::Run() {
  while (!stop_.load()) {
    IoPiece piece;
    while (!free_slots_.empty() && queue_.NextPiece(/*wait=*/false, &piece)) Prepare(piece);
    if (io_uring_sq_ready(&ring_) > 0) {
      const int submitted = io_uring_submit(&ring_);
      // EAGAIN / EBUSY: the kernel is short of resources until completions are reaped; the
      // entries stay queued and go with the next submit.
      PO_CHECK_MSG(submitted >= 0 || submitted == -EAGAIN || submitted == -EBUSY ||
                       submitted == -EINTR,
                   ErrnoText("io_uring_submit", -submitted));
    }
    io_uring_cqe* cqe = nullptr;
    const int waited = io_uring_wait_cqe(&ring_, &cqe);
    if (waited == -EINTR || waited == -EAGAIN) continue;
    // Any other failure leaves us unable to tell whether the kernel still writes into the
    // caller's buffers, so going on (or failing the requests) would be unsafe.
    PO_CHECK_MSG(waited == 0, ErrnoText("io_uring_wait_cqe", -waited));
    do {
      Reap(cqe);
    } while (io_uring_peek_cqe(&ring_, &cqe) == 0);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<IoBackend>> StartUringBackend(int fd, int queue_depth,
                                                             IoQueue& queue) {
  auto backend = std::make_unique<UringBackend>(fd, queue_depth, queue);
  absl::Status init = backend->Init();
  if (!init.ok()) return init;
  return std::unique_ptr<IoBackend>(std::move(backend));
}

}  // namespace pipeoffload::internal
