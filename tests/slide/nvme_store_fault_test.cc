// The NVMe store's request table against a scripted backend (nvme_io.h's injectable backend):
// queue depth and order, short transfers, EAGAIN, EIO / ENOSPC / EBADF / end of file, timeouts,
// the overlap rule and fixed-buffer lookup, each made to happen deterministically. The backend
// runs pieces inline on the calling thread (or holds them until released), still moving real
// bytes through the store's file.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/slide/nvme_io.h"
#include "absl/strings/string_view.h"
#include "lib/slide/nvme_store.h"
#include "tests/slide/nvme_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using internal::IoBackend;
using internal::IoPiece;
using internal::IoQueue;
using testing::AlignedBytes;
using testing::FillRandom;
using testing::FirstDifference;
using testing::SmallStore;
using testing::TestDir;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// Moves at most `limit` bytes of the piece through the file for real.
std::int64_t RealIo(int fd, const IoPiece& piece, std::int64_t limit) {
  const std::int64_t bytes = std::min(piece.bytes, limit);
  const ssize_t moved = piece.write ? ::pwrite(fd, piece.buffer, bytes, piece.offset)
                                    : ::pread(fd, piece.buffer, bytes, piece.offset);
  return moved < 0 ? -errno : moved;
}

class ScriptedBackend final : public IoBackend {
 public:
  // The result a piece reports (bytes moved or -errno); the default moves it whole.
  using Script = std::function<std::int64_t(int fd, const IoPiece& piece)>;

  ScriptedBackend(int fd, IoQueue& queue) : fd_(fd), queue_(queue) {}
  std::string_view name() const override { return "scripted"; }
  void Wake() override { Drain(); }
  absl::Status RegisterBuffers(std::span<const iovec> buffers) override {
    registered_ = static_cast<int>(buffers.size());
    return refuse_registration_ ? absl::UnavailableError("scripted refusal") : absl::OkStatus();
  }

  void set_script(Script script) { script_ = std::move(script); }
  void set_hold(bool hold) { hold_ = hold; }
  void set_refuse_registration(bool refuse) { refuse_registration_ = refuse; }
  // Completes the held pieces (oldest first), then runs whatever the store hands out next.
  void Release() {
    hold_ = false;
    std::vector<IoPiece> held = std::move(held_);
    held_.clear();
    for (const IoPiece& piece : held) Run(piece);
    Drain();
  }
  const std::vector<IoPiece>& held() const { return held_; }
  const std::vector<IoPiece>& log() const { return log_; }
  int registered() const { return registered_; }

 private:
  void Drain() {
    IoPiece piece;
    while (queue_.NextPiece(/*wait=*/false, &piece)) {
      log_.push_back(piece);
      if (hold_) {
        held_.push_back(piece);
      } else {
        Run(piece);
      }
    }
  }
  void Run(const IoPiece& piece) {
    queue_.CompletePiece(piece, script_ ? script_(fd_, piece) : RealIo(fd_, piece, piece.bytes));
  }

  const int fd_;
  IoQueue& queue_;
  Script script_;
  bool hold_ = false;
  bool refuse_registration_ = false;
  int registered_ = 0;
  std::vector<IoPiece> held_;
  std::vector<IoPiece> log_;
};

struct Scripted {
  std::unique_ptr<NvmeStore> store;
  ScriptedBackend* backend = nullptr;  // owned by store
};

Scripted MakeScripted(NvmeStoreOptions options) {
  Scripted s;
  absl::StatusOr<std::unique_ptr<NvmeStore>> store = internal::CreateNvmeStoreWithBackend(
      options, [&s](int fd, int, IoQueue& queue)
                   -> absl::StatusOr<std::unique_ptr<IoBackend>> {
        auto backend = std::make_unique<ScriptedBackend>(fd, queue);
        s.backend = backend.get();
        return std::unique_ptr<IoBackend>(std::move(backend));
      });
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  s.store = *std::move(store);
  return s;
}

NvmeStoreOptions FourKiBPieces(const std::string& dir, int queue_depth) {
  NvmeStoreOptions options = SmallStore(dir, 1 << 20);
  options.request_bytes = 4096;
  options.queue_depth = queue_depth;
  return options;
}

std::vector<std::int64_t> Offsets(const std::vector<IoPiece>& pieces) {
  std::vector<std::int64_t> offsets;
  for (const IoPiece& piece : pieces) offsets.push_back(piece.offset);
  return offsets;
}

TEST_CASE("at most queue_depth pieces are in flight, the oldest request first", "[nvme]") {
  TestDir dir;
  Scripted s = MakeScripted(FourKiBPieces(dir.path(), 3));
  AlignedBytes buffer(64 << 10);
  s.backend->set_hold(true);
  absl::StatusOr<std::int64_t> a = s.store->SubmitWrite(0, buffer.data(), 12 << 10);
  absl::StatusOr<std::int64_t> b = s.store->SubmitRead(32 << 10, buffer.data() + (32 << 10),
                                                        16 << 10);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(Offsets(s.backend->held()) == std::vector<std::int64_t>{0, 4096, 8192});
  CHECK_FALSE(s.store->Poll(*a));
  CHECK_FALSE(s.store->Poll(*b));
  s.backend->Release();
  CHECK(s.store->Poll(*a));
  CHECK(s.store->Poll(*b));
  CHECK(Offsets(s.backend->log()) ==
        std::vector<std::int64_t>{0, 4096, 8192, 32768, 36864, 40960, 45056});
  for (const IoPiece& piece : s.backend->log()) CHECK(piece.bytes == 4096);
  CHECK(s.store->Wait(*a).ok());
  CHECK(s.store->Wait(*b).ok());
  CHECK(s.store->Stats().pieces == 7);
}

TEST_CASE("short transfers and EAGAIN are resubmitted for the rest", "[nvme]") {
  const NvmeDirectIo direct = GENERATE(NvmeDirectIo::kPreferred, NvmeDirectIo::kOff);
  TestDir dir;
  NvmeStoreOptions options = SmallStore(dir.path(), 1 << 20);
  options.request_bytes = 16 << 10;
  options.direct_io = direct;
  Scripted s = MakeScripted(options);
  // O_DIRECT stops at block boundaries; buffered I/O may stop anywhere.
  const std::int64_t limit = direct == NvmeDirectIo::kOff ? 1000 : 4096;
  bool again = true;
  s.backend->set_script([&](int fd, const IoPiece& piece) -> std::int64_t {
    again = !again;
    return again ? -EAGAIN : RealIo(fd, piece, limit);
  });
  AlignedBytes source(64 << 10);
  AlignedBytes target(64 << 10, std::byte{0xcd});
  FillRandom(source.data(), source.size(), 5);
  absl::StatusOr<std::int64_t> write = s.store->SubmitWrite(8192, source.data(), 64 << 10);
  REQUIRE(write.ok());
  REQUIRE(s.store->Wait(*write).ok());
  again = true;
  absl::StatusOr<std::int64_t> read = s.store->SubmitRead(8192, target.data(), 64 << 10);
  REQUIRE(read.ok());
  REQUIRE(s.store->Wait(*read).ok());
  CHECK(FirstDifference(source.data(), target.data(), 64 << 10) == -1);
  const NvmeStats stats = s.store->Stats();
  CHECK(stats.bytes_written == 64 << 10);
  CHECK(stats.bytes_read == 64 << 10);
  // Per direction: 4 pieces of 16 KiB, each moved in ceil(16 KiB / limit) calls, with an EAGAIN
  // between every two moving calls (the script alternates, starting with a move).
  const std::int64_t moving = 4 * (((16 << 10) + limit - 1) / limit);
  CHECK(stats.pieces == 2 * (2 * moving - 1));
  CHECK(stats.retried_pieces == stats.pieces - 8);
}

TEST_CASE("the first failing piece ends its request with its errno, naming it", "[nvme]") {
  struct Case {
    int error;
    absl::StatusCode code;
    const char* text;
  };
  const Case c = GENERATE(Case{EIO, absl::StatusCode::kDataLoss, "Input/output error (errno 5)"},
                          Case{ENOSPC, absl::StatusCode::kResourceExhausted, "(errno 28)"},
                          Case{EBADF, absl::StatusCode::kInternal, "(errno 9)"},
                          Case{0, absl::StatusCode::kDataLoss, "transferred nothing (end of"});
  CAPTURE(c.error);
  TestDir dir;
  Scripted s = MakeScripted(FourKiBPieces(dir.path(), 1));
  s.backend->set_script([&](int fd, const IoPiece& piece) -> std::int64_t {
    return piece.offset == 8192 + 4096 ? -c.error : RealIo(fd, piece, piece.bytes);
  });
  AlignedBytes buffer(32 << 10);
  absl::StatusOr<std::int64_t> ticket = s.store->SubmitRead(8192, buffer.data(), 32 << 10);
  REQUIRE(ticket.ok());
  const absl::Status status = s.store->Wait(*ticket);
  INFO(status.ToString());
  CHECK(status.code() == c.code);
  CHECK(Contains(status.message(), "NVMe read of 32768 bytes at offset 8192 in " + dir.path()));
  CHECK(Contains(status.message(), "piece of 4096 bytes at offset 12288"));
  CHECK(Contains(status.message(), c.text));
  // Depth 1: the pieces after the failing one were never started.
  CHECK(Offsets(s.backend->log()) == std::vector<std::int64_t>{8192, 12288});
  CHECK(s.store->Stats().bytes_read == 4096);
  // The store goes on serving other requests.
  absl::StatusOr<std::int64_t> next = s.store->SubmitWrite(0, buffer.data(), 4096);
  REQUIRE(next.ok());
  CHECK(s.store->Wait(*next).ok());
}

TEST_CASE("Wait past the timeout is DeadlineExceeded and the request lives on", "[nvme]") {
  TestDir dir;
  NvmeStoreOptions options = FourKiBPieces(dir.path(), 4);
  options.timeout_seconds = 0.02;
  Scripted s = MakeScripted(options);
  AlignedBytes buffer(8192);
  s.backend->set_hold(true);
  absl::StatusOr<std::int64_t> ticket = s.store->SubmitRead(4096, buffer.data(), 8192);
  REQUIRE(ticket.ok());
  const absl::Status late = s.store->Wait(*ticket);
  INFO(late.ToString());
  CHECK(late.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Contains(late.message(), "NVMe read of 8192 bytes at offset 4096"));
  CHECK(Contains(late.message(), "did not finish within 0.020 s: 0 of 8192 bytes done, 2 "
                                 "pieces in flight on scripted"));
  CHECK_FALSE(s.store->Poll(*ticket));
  s.backend->Release();
  CHECK(s.store->Poll(*ticket));
  CHECK(s.store->Wait(*ticket).ok());
}

TEST_CASE("requests may not overlap an unfinished write", "[nvme]") {
  TestDir dir;
  Scripted s = MakeScripted(FourKiBPieces(dir.path(), 8));
  AlignedBytes buffer(64 << 10);
  s.backend->set_hold(true);
  absl::StatusOr<std::int64_t> write = s.store->SubmitWrite(16 << 10, buffer.data(), 16 << 10);
  REQUIRE(write.ok());
  absl::StatusOr<std::int64_t> overlapping =
      s.store->SubmitRead(28 << 10, buffer.data() + (16 << 10), 8 << 10);
  INFO(overlapping.status().ToString());
  CHECK(overlapping.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(overlapping.status().message(),
                 "SubmitRead of [28672, 36864) overlaps unfinished NVMe write of 16384 bytes at "
                 "offset 16384"));
  CHECK(Contains(overlapping.status().message(), "(ticket " + std::to_string(*write) + ")"));
  // Adjacent ranges and reads over reads are fine; a write over an unfinished read is not.
  absl::StatusOr<std::int64_t> before = s.store->SubmitRead(0, buffer.data(), 16 << 10);
  absl::StatusOr<std::int64_t> same = s.store->SubmitRead(0, buffer.data(), 4 << 10);
  REQUIRE(before.ok());
  REQUIRE(same.ok());
  CHECK(s.store->SubmitWrite(8 << 10, buffer.data(), 4 << 10).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(s.store->RegisterBuffers({buffer.span()}).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(s.store->Sync().code() == absl::StatusCode::kFailedPrecondition);
  s.backend->Release();
  CHECK(s.store->Wait(*write).ok());
  CHECK(s.store->Wait(*before).ok());
  CHECK(s.store->Wait(*same).ok());
  absl::StatusOr<std::int64_t> after = s.store->SubmitRead(28 << 10, buffer.data(), 8 << 10);
  REQUIRE(after.ok());
  CHECK(s.store->Wait(*after).ok());
}

TEST_CASE("pieces inside a registered buffer carry its index, in parts of 1 GiB", "[nvme]") {
  TestDir dir;
  NvmeStoreOptions options = SmallStore(dir.path(), 1 << 20);
  options.request_bytes = 8192;
  Scripted s = MakeScripted(options);
  // 3 GiB of address space, never touched: the scripted backend moves no bytes.
  const std::int64_t gib = std::int64_t{1} << 30;
  void* space = ::mmap(nullptr, 3 * gib, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
  REQUIRE(space != MAP_FAILED);
  auto* base = static_cast<std::byte*>(space);
  AlignedBytes small(8192);
  REQUIRE(s.store->RegisterBuffers({std::span<std::byte>(base, 3 * gib), small.span()}).ok());
  CHECK(s.backend->registered() == 4);
  CHECK(s.store->fixed_buffers());
  s.backend->set_script([](int, const IoPiece& piece) { return piece.bytes; });
  AlignedBytes unregistered(8192);
  for (std::byte* buffer : {base, base + gib - 4096, base + gib + 4096, base + 3 * gib - 8192,
                            small.data(), unregistered.data()}) {
    absl::StatusOr<std::int64_t> ticket = s.store->SubmitRead(0, buffer, 8192);
    REQUIRE(ticket.ok());
    REQUIRE(s.store->Wait(*ticket).ok());
  }
  std::vector<int> indices;
  for (const IoPiece& piece : s.backend->log()) indices.push_back(piece.fixed_index);
  // The piece straddling the first 1 GiB boundary takes the plain path.
  CHECK(indices == std::vector<int>{0, -1, 1, 2, 3, -1});
  CHECK(s.store->Stats().fixed_pieces == 4);
  s.backend->set_refuse_registration(true);
  REQUIRE(s.store->RegisterBuffers({small.span()}).ok());
  CHECK_FALSE(s.store->fixed_buffers());
  CHECK(Contains(s.store->Describe(), "fixed buffers refused (scripted refusal)"));
  ::munmap(space, 3 * gib);
}

}  // namespace
}  // namespace pipeoffload
