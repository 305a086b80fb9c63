// CheckpointTier (checkpoints on NVMe through a ring of pinned staging buffers) on the CPU
// backend, driven as the engine drives it: every checkpoint comes back with its own bytes over
// several rounds with copy engines that stall at random and a ring smaller than a round (a
// buffer handed out while its write or H2D still runs would hand back another checkpoint's
// bytes); the drive bytes counted; out-of-protocol calls; a directory that is missing,
// read-only or too small; a drive read that fails mid-round is a sticky error, not a hang.
#include "lib/slide/checkpoint_tier.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/statvfs.h>

#include "absl/strings/string_view.h"
#include "lib/slide/recorder.h"
#include "pipeoffload/backend.h"
#include "tests/slide/nvme_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using internal::CheckpointTier;
using internal::CheckpointTierOptions;
using internal::IoBackend;
using internal::IoPiece;
using internal::IoQueue;
using testing::TestDir;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// Units 1..3, 3 microbatches each; the engine's load order: units descending, microbatches
// ascending.
std::vector<std::pair<int, int>> LoadOrder() {
  std::vector<std::pair<int, int>> order;
  for (int u = 3; u >= 1; --u) {
    for (int mb = 0; mb < 3; ++mb) order.emplace_back(u, mb);
  }
  return order;
}

CheckpointTierOptions Options(const std::string& dir, std::int64_t checkpoint_bytes, int staging) {
  CheckpointTierOptions o;
  o.dir = dir;
  o.checkpoint_bytes = checkpoint_bytes;
  o.load_order = LoadOrder();
  o.staging_buffers = staging;
  o.timeout_seconds = 30.0;
  o.unit_names = {"embed", "layer.0", "layer.1", "layer.2", "head"};
  return o;
}

// The bytes of checkpoint (unit, mb) in round `round`: every 4-byte word distinct.
std::vector<std::uint32_t> Pattern(int round, int unit, int mb, std::int64_t words) {
  std::vector<std::uint32_t> p(static_cast<std::size_t>(words));
  for (std::int64_t i = 0; i < words; ++i) {
    p[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(
        (round * 1000003 + unit * 10007 + mb * 101) ^ static_cast<std::uint32_t>(i * 2654435761u));
  }
  return p;
}

// One round as the engine runs it: saves (units ascending), then loads in load order, each
// through the tier's buffers and the backend's copy queues. Returns the first (unit, mb) that
// came back wrong as "unit U mb M word W", or "".
std::string Round(Backend& backend, CheckpointTier& tier, int round, std::int64_t bytes) {
  const std::int64_t words = bytes / 4;
  const Queue d2h = backend.queue(QueueKind::kD2H);
  const Queue h2d = backend.queue(QueueKind::kH2D);
  std::vector<std::vector<std::uint32_t>> device(9), back(9, std::vector<std::uint32_t>(words));
  for (int u = 1; u <= 3; ++u) {
    for (int mb = 0; mb < 3; ++mb) {
      std::vector<std::uint32_t>& src = device[static_cast<std::size_t>((u - 1) * 3 + mb)];
      src = Pattern(round, u, mb, words);
      absl::StatusOr<CheckpointTier::Lent> lent = tier.AcquireForSave(u, mb);
      REQUIRE(lent.ok());
      REQUIRE(backend.CopyAsync(d2h, lent->data, src.data(), bytes).ok());
      REQUIRE(backend.RecordEvent(lent->event, d2h).ok());
      REQUIRE(tier.SaveEnqueued(lent->buffer).ok());
    }
  }
  for (const auto& [u, mb] : LoadOrder()) {
    absl::StatusOr<CheckpointTier::Lent> lent = tier.AcquireLoaded(u, mb);
    INFO(lent.status().ToString());
    REQUIRE(lent.ok());
    REQUIRE(backend.CopyAsync(h2d, back[static_cast<std::size_t>((u - 1) * 3 + mb)].data(),
                              lent->data, bytes)
                .ok());
    REQUIRE(backend.RecordEvent(lent->event, h2d).ok());
    REQUIRE(tier.LoadEnqueued(lent->buffer).ok());
  }
  REQUIRE(backend.Synchronize(30.0).ok());
  for (int u = 1; u <= 3; ++u) {
    for (int mb = 0; mb < 3; ++mb) {
      const std::vector<std::uint32_t> want = Pattern(round, u, mb, words);
      const std::vector<std::uint32_t>& got = back[static_cast<std::size_t>((u - 1) * 3 + mb)];
      for (std::int64_t i = 0; i < words; ++i) {
        if (got[static_cast<std::size_t>(i)] != want[static_cast<std::size_t>(i)]) {
          return "unit " + std::to_string(u) + " mb " + std::to_string(mb) + " word " +
                 std::to_string(i);
        }
      }
    }
  }
  return "";
}

TEST_CASE("checkpoint tier: every checkpoint comes back with its own bytes", "[slide][ckpt_tier]") {
  // 3 KiB checkpoints (records rounded to 4 KiB), 5 rounds; rings of 1, 2 and 4 buffers for
  // 9 checkpoints a round, so every buffer is reused while others are being written or read.
  const std::int64_t bytes = 3 << 10;
  for (int staging : {1, 2, 4}) {
    for (std::uint64_t seed : {0u, 7u}) {
      INFO("staging " << staging << ", delay seed " << seed);
      CpuBackendOptions cpu;
      if (seed != 0) {
        cpu.max_copy_delay_seconds = 0.002;
        cpu.fault_seed = seed;
      }
      absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(cpu);
      REQUIRE(backend.ok());
      internal::SlideRecorder recorder(**backend, /*enabled=*/true);
      const TestDir dir;
      absl::StatusOr<std::unique_ptr<CheckpointTier>> tier =
          CheckpointTier::Create(**backend, Options(dir.path(), bytes, staging), recorder);
      INFO(tier.status().ToString());
      REQUIRE(tier.ok());
      CHECK(dir.Entries().empty());  // the file is unlinked
      CHECK((*tier)->staging_bytes() == staging * 4096 + 4096);
      for (int round = 0; round < 5; ++round) {
        INFO("round " << round);
        CHECK(Round(**backend, **tier, round, bytes).empty());
        // Each checkpoint written and read once, as whole 4 KiB records.
        CHECK((*tier)->TakeBytes() == 2 * 9 * 4096);
      }
      REQUIRE(recorder.Resolve().ok());
      const std::vector<SlideRecord> records = recorder.Take();
      int writes = 0, reads = 0;
      for (const SlideRecord& r : records) {
        CHECK(r.engine == SlideEngineKind::kNvme);
        CHECK(r.bytes == 4096);
        CHECK(r.end >= r.start);
        writes += Contains(r.name, "write checkpoint ") ? 1 : 0;
        reads += Contains(r.name, "read checkpoint ") ? 1 : 0;
      }
      CHECK(writes == 5 * 9);
      CHECK(reads == 5 * 9);
      CHECK(Contains(records.front().name, "layer."));
    }
  }
}

TEST_CASE("checkpoint tier: calls out of protocol are errors, not hangs", "[slide][ckpt_tier]") {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  internal::SlideRecorder recorder(**backend, false);
  const TestDir dir;
  absl::StatusOr<std::unique_ptr<CheckpointTier>> tier =
      CheckpointTier::Create(**backend, Options(dir.path(), 4096, 2), recorder);
  REQUIRE(tier.ok());
  // Not on the drive; a load before the round's saves.
  CHECK((*tier)->AcquireForSave(4, 0).status().code() == absl::StatusCode::kInternal);
  const absl::Status early = (*tier)->AcquireLoaded(3, 0).status();
  CHECK(early.code() == absl::StatusCode::kInternal);
  CHECK(Contains(early.message(), "saves of the round missing"));
  // Bad options.
  CheckpointTierOptions none = Options(dir.path(), 4096, 0);
  CHECK(CheckpointTier::Create(**backend, none, recorder).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("checkpoint tier: a missing, read-only or too small directory fails at creation",
          "[slide][ckpt_tier]") {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  internal::SlideRecorder recorder(**backend, false);
  const TestDir dir;
  const absl::Status missing =
      CheckpointTier::Create(**backend, Options(dir.path() + "/absent", 4096, 2), recorder).status();
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(missing.message(), "the NVMe checkpoint tier (--nvme-dir)"));
  CHECK(Contains(missing.message(), dir.path() + "/absent does not exist"));
  const absl::Status read_only =
      CheckpointTier::Create(**backend, Options("/proc/self", 4096, 2), recorder).status();
  CHECK(read_only.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(read_only.message(), "read-only or not writable"));
  // 9 checkpoints of a ninth of the free space plus 1 TiB each: more than the drive has.
  struct statvfs fs {};
  REQUIRE(::statvfs(dir.path().c_str(), &fs) == 0);
  const std::int64_t free_bytes = static_cast<std::int64_t>(fs.f_bavail) * fs.f_frsize;
  const std::int64_t huge = (free_bytes / 9 / 4096 + (std::int64_t{1} << 28)) * 4096;
  const absl::Status full =
      CheckpointTier::Create(**backend, Options(dir.path(), huge, 2), recorder).status();
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(full.message(), "the NVMe checkpoint tier (--nvme-dir)"));
  CHECK(dir.Entries().empty());
}

// Runs every piece on the submitting thread; reads fail with EIO once `fail_reads` is set.
class FailingReads final : public IoBackend {
 public:
  FailingReads(int fd, IoQueue& queue, const bool& fail_reads)
      : fd_(fd), queue_(queue), fail_reads_(fail_reads) {}
  std::string_view name() const override { return "failing reads"; }
  void Wake() override {
    IoPiece piece;
    while (queue_.NextPiece(false, &piece)) {
      std::int64_t result = -EIO;
      if (piece.write || !fail_reads_) {
        const ssize_t moved = piece.write ? ::pwrite(fd_, piece.buffer, piece.bytes, piece.offset)
                                          : ::pread(fd_, piece.buffer, piece.bytes, piece.offset);
        result = moved < 0 ? -errno : moved;
      }
      queue_.CompletePiece(piece, result);
    }
  }
  absl::Status RegisterBuffers(std::span<const iovec>) override { return absl::OkStatus(); }

 private:
  const int fd_;
  IoQueue& queue_;
  const bool& fail_reads_;
};

TEST_CASE("checkpoint tier: a drive read that fails is a sticky error naming the checkpoint",
          "[slide][ckpt_tier]") {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  internal::SlideRecorder recorder(**backend, false);
  const TestDir dir;
  bool fail_reads = false;
  const internal::IoBackendStarter start =
      [&](int fd, int, IoQueue& queue) -> absl::StatusOr<std::unique_ptr<IoBackend>> {
    return std::unique_ptr<IoBackend>(new FailingReads(fd, queue, fail_reads));
  };
  absl::StatusOr<std::unique_ptr<CheckpointTier>> tier =
      CheckpointTier::Create(**backend, Options(dir.path(), 4096, 2), recorder, &start);
  REQUIRE(tier.ok());
  CHECK(Round(**backend, **tier, 0, 4096).empty());  // a good round first
  fail_reads = true;
  std::vector<std::uint32_t> src(1024, 7);
  for (int u = 1; u <= 3; ++u) {
    for (int mb = 0; mb < 3; ++mb) {
      absl::StatusOr<CheckpointTier::Lent> lent = (*tier)->AcquireForSave(u, mb);
      REQUIRE(lent.ok());
      std::memcpy(lent->data, src.data(), 4096);
      REQUIRE((*backend)->RecordEvent(lent->event, (*backend)->queue(QueueKind::kD2H)).ok());
      REQUIRE((*tier)->SaveEnqueued(lent->buffer).ok());
    }
  }
  const absl::Status failed = (*tier)->AcquireLoaded(3, 0).status();
  INFO(failed.ToString());
  CHECK(failed.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(failed.message(), "the drive read of checkpoint layer.2 mb0"));
  // Sticky: every later call says the same.
  CHECK((*tier)->AcquireLoaded(3, 0).status() == failed);
  CHECK((*tier)->LoadEnqueued(0) == failed);
}

}  // namespace
}  // namespace pipeoffload
