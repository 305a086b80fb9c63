// The NVMe store on this machine's filesystem, through both real backends (io_uring where the
// kernel allows it, the thread pool always) with and without O_DIRECT: bitwise round trips of
// many requests in flight at once, piece counts, and every error Create and Submit* document.
// Each test works in a fresh directory under the build tree and checks that none of its files
// is left (or even visible while the store lives).
#include <sys/mman.h>
#include <sys/statvfs.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "lib/slide/nvme_store.h"
#include "tests/slide/nvme_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::AlignedBytes;
using testing::FillRandom;
using testing::FirstDifference;
using testing::SmallStore;
using testing::TestDir;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// Creates a store; when io_uring was asked for and this kernel or sandbox refuses it, warns and
// returns null, unless PO_NVME_REQUIRE_IO_URING=1 (a run meant to cover io_uring then fails).
std::unique_ptr<NvmeStore> CreateOrSkip(const NvmeStoreOptions& options) {
  absl::StatusOr<std::unique_ptr<NvmeStore>> store = NvmeStore::Create(options);
  if (!store.ok() && store.status().code() == absl::StatusCode::kUnavailable &&
      options.backend == NvmeBackend::kIoUring) {
    const char* require = std::getenv("PO_NVME_REQUIRE_IO_URING");
    INFO(store.status().ToString());
    CHECK_FALSE((require != nullptr && std::string(require) == "1"));
    WARN("io_uring unavailable here, its cases are not run: " << store.status().ToString());
    return nullptr;
  }
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  std::cout << "slide_nvme_tests: " << (*store)->Describe() << "\n";
  return *std::move(store);
}

std::int64_t PiecesOf(std::int64_t bytes, std::int64_t request_bytes) {
  return (bytes + request_bytes - 1) / request_bytes;
}

TEST_CASE("many requests in flight round-trip random bytes bitwise", "[nvme]") {
  const NvmeBackend backend = GENERATE(NvmeBackend::kIoUring, NvmeBackend::kThreads);
  const NvmeDirectIo direct = GENERATE(NvmeDirectIo::kPreferred, NvmeDirectIo::kOff);
  CAPTURE(NvmeBackendName(backend), static_cast<int>(direct));
  TestDir dir;
  NvmeStoreOptions options = SmallStore(dir.path(), 16 << 20);
  options.backend = backend;
  options.direct_io = direct;
  // Sizes below, at and above request_bytes (64 KiB), at 4 KiB granularity; a 4 KiB gap
  // between regions that must read back as the file's initial zeros.
  const std::vector<std::int64_t> sizes = {4 << 10,   60 << 10,  64 << 10, 68 << 10,
                                           1 << 20,   (1 << 20) + (4 << 10), 3 << 20,
                                           128 << 10, 8 << 10,   (2 << 20) - (4 << 10)};
  AlignedBytes source(16 << 20);
  AlignedBytes target(16 << 20, std::byte{0xcd});  // poisoned: unread bytes cannot pass
  FillRandom(source.data(), source.size(), 20240611);
  std::unique_ptr<NvmeStore> store = CreateOrSkip(options);
  if (store == nullptr) return;
  REQUIRE(store->backend_name() == NvmeBackendName(backend));
  if (direct == NvmeDirectIo::kOff) CHECK_FALSE(store->direct_io());
  REQUIRE(store->RegisterBuffers({source.span(), target.span()}).ok());
  CHECK(store->fixed_buffers() == (backend == NvmeBackend::kIoUring));
  std::cout << "slide_nvme_tests: registered: " << store->Describe() << "\n";

  std::vector<std::int64_t> offsets;
  std::int64_t offset = 0;
  std::int64_t pieces = 0;
  std::int64_t bytes = 0;
  for (std::int64_t size : sizes) {
    offsets.push_back(offset);
    offset += size + (4 << 10);
    pieces += PiecesOf(size, options.request_bytes);
    bytes += size;
  }
  REQUIRE(offset <= options.capacity_bytes);
  std::vector<std::int64_t> tickets;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    absl::StatusOr<std::int64_t> ticket =
        store->SubmitWrite(offsets[i], source.data() + offsets[i], sizes[i]);
    REQUIRE(ticket.ok());
    tickets.push_back(*ticket);
  }
  // Waited newest first: completion order must not matter.
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {
    const absl::Status status = store->Wait(*it);
    INFO(status.ToString());
    REQUIRE(status.ok());
  }
  tickets.clear();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    absl::StatusOr<std::int64_t> ticket =
        store->SubmitRead(offsets[i], target.data() + offsets[i], sizes[i]);
    REQUIRE(ticket.ok());
    tickets.push_back(*ticket);
  }
  const std::int64_t gap = offsets[1] - (4 << 10);  // the gap after the first region
  absl::StatusOr<std::int64_t> gap_ticket = store->SubmitRead(gap, target.data() + gap, 4 << 10);
  REQUIRE(gap_ticket.ok());
  for (std::int64_t ticket : tickets) REQUIRE(store->Wait(ticket).ok());
  REQUIRE(store->Wait(*gap_ticket).ok());

  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::int64_t at = FirstDifference(source.data() + offsets[i],
                                            target.data() + offsets[i], sizes[i]);
    INFO("region " << i << " at offset " << offsets[i] << " of " << sizes[i]
                   << " bytes: first difference at byte " << at);
    CHECK(at == -1);
  }
  const AlignedBytes zeros(4 << 10);
  CHECK(FirstDifference(zeros.data(), target.data() + gap, 4 << 10) == -1);
  const NvmeStats stats = store->Stats();
  CHECK(stats.bytes_written == bytes);
  CHECK(stats.bytes_read == bytes + (4 << 10));
  CHECK(stats.pieces == 2 * pieces + 1 + stats.retried_pieces);
  CHECK(stats.fixed_pieces == (store->fixed_buffers() ? stats.pieces : 0));
  CHECK(stats.write_busy_seconds > 0.0);
  CHECK(stats.read_busy_seconds > 0.0);
  CHECK(dir.Entries().empty());
}

TEST_CASE("a request larger than request_bytes goes in request_bytes pieces", "[nvme]") {
  TestDir dir;
  NvmeStoreOptions options = SmallStore(dir.path(), 8 << 20);
  options.request_bytes = 1 << 20;
  options.queue_depth = 2;
  std::unique_ptr<NvmeStore> store = CreateOrSkip(options);
  const std::int64_t bytes = (5 << 20) + (12 << 10);
  AlignedBytes source(bytes);
  AlignedBytes target(bytes, std::byte{0xcd});
  FillRandom(source.data(), bytes, 7);
  absl::StatusOr<std::int64_t> write = store->SubmitWrite(1 << 20, source.data(), bytes);
  REQUIRE(write.ok());
  REQUIRE(store->Wait(*write).ok());
  CHECK(store->Stats().pieces == 6 + store->Stats().retried_pieces);
  absl::StatusOr<std::int64_t> read = store->SubmitRead(1 << 20, target.data(), bytes);
  REQUIRE(read.ok());
  REQUIRE(store->Wait(*read).ok());
  CHECK(FirstDifference(source.data(), target.data(), bytes) == -1);
  CHECK(store->Stats().bytes_read == bytes);
  CHECK(store->Stats().bytes_written == bytes);
}

TEST_CASE("unaligned or out-of-capacity requests are InvalidArgument", "[nvme]") {
  TestDir dir;
  std::unique_ptr<NvmeStore> store = CreateOrSkip(SmallStore(dir.path(), 1 << 20));
  AlignedBytes buffer(64 << 10);
  struct Case {
    std::int64_t offset;
    std::int64_t buffer_shift;
    std::int64_t bytes;
    const char* names;
  };
  for (const Case& c : {Case{512, 0, 4096, "offset 512"}, Case{0, 0, 4000, "bytes 4000"},
                        Case{0, 8, 4096, "buffer"}, Case{0, 0, 0, "bytes 0"},
                        Case{-4096, 0, 4096, "offset -4096"}}) {
    for (bool write : {false, true}) {
      std::byte* data = buffer.data() + c.buffer_shift;
      absl::StatusOr<std::int64_t> ticket = write ? store->SubmitWrite(c.offset, data, c.bytes)
                                                  : store->SubmitRead(c.offset, data, c.bytes);
      INFO(ticket.status().ToString());
      REQUIRE(ticket.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(Contains(ticket.status().message(), c.names));
      CHECK(Contains(ticket.status().message(), "multiples of 4096"));
    }
  }
  absl::StatusOr<std::int64_t> null = store->SubmitRead(0, nullptr, 4096);
  CHECK(null.status().code() == absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::int64_t> past = store->SubmitRead((1 << 20) - 4096, buffer.data(), 8192);
  INFO(past.status().ToString());
  REQUIRE(past.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(past.status().message(), "offset 1044480 + bytes 8192 exceeds the capacity of "
                                          "1048576 bytes"));
  absl::StatusOr<std::int64_t> last = store->SubmitWrite((1 << 20) - 4096, buffer.data(), 4096);
  REQUIRE(last.ok());
  CHECK(store->Wait(*last).ok());
  CHECK(store->Stats().pieces == 1 + store->Stats().retried_pieces);  // the refused never ran
}

TEST_CASE("bad options are InvalidArgument naming the field", "[nvme]") {
  TestDir dir;
  struct Case {
    NvmeStoreOptions options;
    const char* field;
  };
  const NvmeStoreOptions good = SmallStore(dir.path(), 1 << 20);
  auto with = [&](const char* field, auto edit) {
    Case c{good, field};
    edit(c.options);
    return c;
  };
  const std::vector<Case> cases = {
      with("capacity_bytes", [](NvmeStoreOptions& o) { o.capacity_bytes = (1 << 20) + 512; }),
      with("capacity_bytes", [](NvmeStoreOptions& o) { o.capacity_bytes = 0; }),
      with("queue_depth", [](NvmeStoreOptions& o) { o.queue_depth = 0; }),
      with("request_bytes", [](NvmeStoreOptions& o) { o.request_bytes = 1000; }),
      with("timeout_seconds", [](NvmeStoreOptions& o) { o.timeout_seconds = -1.0; }),
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<NvmeStore>> store = NvmeStore::Create(c.options);
    INFO(store.status().ToString());
    REQUIRE(store.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(store.status().message(), c.field));
  }
  CHECK(dir.Entries().empty());
}

TEST_CASE("a missing directory is NotFound, a regular file FailedPrecondition", "[nvme]") {
  TestDir dir;
  absl::StatusOr<std::unique_ptr<NvmeStore>> missing =
      NvmeStore::Create(SmallStore(dir.path() + "/absent", 1 << 20));
  INFO(missing.status().ToString());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(Contains(missing.status().message(), dir.path() + "/absent does not exist"));

  const std::string file = dir.path() + "/plain";
  std::FILE* plain = std::fopen(file.c_str(), "w");
  REQUIRE(plain != nullptr);
  std::fclose(plain);
  absl::StatusOr<std::unique_ptr<NvmeStore>> not_dir =
      NvmeStore::Create(SmallStore(file, 1 << 20));
  INFO(not_dir.status().ToString());
  CHECK(not_dir.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(not_dir.status().message(), file + " is not a directory"));
  CHECK(dir.Entries() == std::set<std::string>{"plain"});
}

// Root ignores permission bits, so "not writable" is tested on a filesystem nobody may create
// files in.
TEST_CASE("a directory nobody may create files in is FailedPrecondition", "[nvme]") {
  absl::StatusOr<std::unique_ptr<NvmeStore>> store =
      NvmeStore::Create(SmallStore("/proc/self", 1 << 20));
  INFO(store.status().ToString());
  CHECK(store.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(store.status().message(), "/proc/self is read-only or not writable: "));
}

TEST_CASE("a capacity above the free space is ResourceExhausted and leaves nothing", "[nvme]") {
  TestDir dir;
  struct statvfs fs {};
  REQUIRE(::statvfs(dir.path().c_str(), &fs) == 0);
  const std::int64_t free_bytes = static_cast<std::int64_t>(fs.f_bavail) * fs.f_frsize;
  const std::int64_t needed = (free_bytes / 4096 + (std::int64_t{1} << 28)) * 4096;  // +1 TiB
  absl::StatusOr<std::unique_ptr<NvmeStore>> store =
      NvmeStore::Create(SmallStore(dir.path(), needed));
  INFO(store.status().ToString());
  REQUIRE(store.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(store.status().message());
  CHECK(Contains(message, "needs " + std::to_string(needed) + " bytes in " + dir.path()));
  const std::size_t has = message.find(" has ");
  REQUIRE(has != std::string::npos);
  CHECK(Contains(message, " bytes free"));
  // Other processes write meanwhile: the number reported is the free space of that moment.
  const double reported = std::stod(message.substr(has + 5));
  CHECK(std::abs(reported - static_cast<double>(free_bytes)) < 0.1 * free_bytes + (1 << 30));
  CHECK(dir.Entries().empty());
}

TEST_CASE("the file is unlinked while the store lives", "[nvme]") {
  const NvmeBackend backend = GENERATE(NvmeBackend::kIoUring, NvmeBackend::kThreads);
  TestDir dir;
  NvmeStoreOptions options = SmallStore(dir.path(), 4 << 20);
  options.backend = backend;
  std::unique_ptr<NvmeStore> store = CreateOrSkip(options);
  if (store == nullptr) return;
  CHECK(dir.Entries().empty());
  AlignedBytes buffer(1 << 20, std::byte{0x11});
  absl::StatusOr<std::int64_t> ticket = store->SubmitWrite(0, buffer.data(), 1 << 20);
  REQUIRE(ticket.ok());
  REQUIRE(store->Wait(*ticket).ok());
  REQUIRE(store->Sync().ok());
  CHECK(dir.Entries().empty());
  store.reset();
  CHECK(dir.Entries().empty());
}

TEST_CASE("tickets are waited once; Poll of an unknown ticket is true", "[nvme]") {
  TestDir dir;
  std::unique_ptr<NvmeStore> store = CreateOrSkip(SmallStore(dir.path(), 1 << 20));
  AlignedBytes buffer(4096);
  absl::StatusOr<std::int64_t> ticket = store->SubmitRead(0, buffer.data(), 4096);
  REQUIRE(ticket.ok());
  CHECK(*ticket > 0);
  REQUIRE(store->Wait(*ticket).ok());
  CHECK(store->Poll(*ticket));
  const absl::Status again = store->Wait(*ticket);
  CHECK(again.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(again.message(), "unknown ticket " + std::to_string(*ticket)));
  CHECK(store->Wait(12345).code() == absl::StatusCode::kInvalidArgument);
  CHECK(store->Poll(12345));
}

TEST_CASE("refused fixed-buffer registration falls back to plain I/O", "[nvme]") {
  TestDir dir;
  NvmeStoreOptions options = SmallStore(dir.path(), 1 << 20);
  options.backend = NvmeBackend::kIoUring;
  std::unique_ptr<NvmeStore> store = CreateOrSkip(options);
  if (store == nullptr) return;
  AlignedBytes source(256 << 10);
  AlignedBytes target(256 << 10, std::byte{0xcd});
  FillRandom(source.data(), source.size(), 99);
  // The kernel cannot pin pages that may not be accessed, so it refuses the whole table.
  void* no_access = ::mmap(nullptr, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(no_access != MAP_FAILED);
  const absl::Status registered = store->RegisterBuffers(
      {source.span(), std::span<std::byte>(static_cast<std::byte*>(no_access), 1 << 20)});
  CHECK(registered.ok());
  CHECK_FALSE(store->fixed_buffers());
  INFO(store->Describe());
  CHECK(Contains(store->Describe(), "fixed buffers refused (io_uring_register_buffers: "));
  absl::StatusOr<std::int64_t> write = store->SubmitWrite(0, source.data(), source.size());
  REQUIRE(write.ok());
  REQUIRE(store->Wait(*write).ok());
  absl::StatusOr<std::int64_t> read = store->SubmitRead(0, target.data(), target.size());
  REQUIRE(read.ok());
  REQUIRE(store->Wait(*read).ok());
  CHECK(FirstDifference(source.data(), target.data(), source.size()) == -1);
  CHECK(store->Stats().fixed_pieces == 0);
  CHECK(store->RegisterBuffers({std::span<std::byte>()}).code() ==
        absl::StatusCode::kInvalidArgument);
  ::munmap(no_access, 1 << 20);
}

TEST_CASE("a store destroyed with requests unwaited finishes or drops them", "[nvme]") {
  TestDir dir;
  AlignedBytes buffer(4 << 20, std::byte{0x22});  // outlives the store, as the contract asks
  {
    std::unique_ptr<NvmeStore> store = CreateOrSkip(SmallStore(dir.path(), 4 << 20));
    for (int i = 0; i < 4; ++i) {
      REQUIRE(store->SubmitWrite(std::int64_t{i} << 20, buffer.data() + (i << 20), 1 << 20).ok());
    }
  }
  CHECK(dir.Entries().empty());
}

TEST_CASE("MeasureNvmeBandwidth writes and reads back through the store", "[nvme]") {
  TestDir dir;
  NvmeStoreOptions options = SmallStore(dir.path(), 8 << 20);
  absl::StatusOr<NvmeBandwidth> bandwidth = MeasureNvmeBandwidth(options);
  INFO(bandwidth.status().ToString());
  REQUIRE(bandwidth.ok());
  std::cout << "slide_nvme_tests: " << bandwidth->description << ": write "
            << bandwidth->write_gb_per_s << " GB/s, read " << bandwidth->read_gb_per_s
            << " GB/s (8 MiB; not a benchmark)\n";
  CHECK(bandwidth->bytes == 8 << 20);
  CHECK(std::isfinite(bandwidth->write_gb_per_s));
  CHECK(bandwidth->write_gb_per_s > 0.0);
  CHECK(std::isfinite(bandwidth->read_gb_per_s));
  CHECK(bandwidth->read_gb_per_s > 0.0);
  CHECK((bandwidth->backend == "io_uring" || bandwidth->backend == "threads"));
  CHECK(Contains(bandwidth->description, bandwidth->direct_io ? "O_DIRECT" : "buffered I/O"));
  CHECK(dir.Entries().empty());
  options.dir = dir.path() + "/absent";
  CHECK(MeasureNvmeBandwidth(options).status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pipeoffload
