// MeasureNvmeBandwidth (nvme_store.h): sequential write, then read, of a whole NvmeStore
// through the path the engine uses (same backend, O_DIRECT choice, fixed buffers), with every
// 4 KiB block stamped with its offset so a read that returns the wrong data fails.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/slide/nvme_store.h"

namespace pipeoffload {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kBlock = NvmeStore::kAlignment;
constexpr std::int64_t kMinChunkBytes = std::int64_t{64} << 20;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

void Stamp(std::byte* chunk, std::int64_t bytes, std::int64_t file_offset) {
  for (std::int64_t at = 0; at < bytes; at += kBlock) {
    const std::int64_t value = file_offset + at;
    std::memcpy(chunk + at, &value, sizeof(value));
  }
}

absl::Status CheckStamps(const std::byte* chunk, std::int64_t bytes, std::int64_t file_offset) {
  for (std::int64_t at = 0; at < bytes; at += kBlock) {
    std::int64_t value = 0;
    std::memcpy(&value, chunk + at, sizeof(value));
    if (value != file_offset + at) {
      return absl::DataLossError(absl::StrCat("NVMe bandwidth check: the block at offset ",
                                              file_offset + at, " read back stamp ", value));
    }
  }
  return absl::OkStatus();
}

// Runs the whole file through `buffers` in chunks, two requests in flight at once: the chunk
// i + 1 transfers while chunk i - 1's buffer is refilled (write) or checked (read).
absl::Status Pass(NvmeStore& store, bool write, std::vector<AlignedBuffer>& buffers,
                  std::int64_t chunk_bytes) {
  const std::int64_t total = store.capacity_bytes();
  std::vector<std::int64_t> tickets(buffers.size(), 0);
  std::vector<std::int64_t> offsets(buffers.size(), -1);
  auto finish = [&](std::size_t b) -> absl::Status {
    if (tickets[b] == 0) return absl::OkStatus();
    PO_RETURN_IF_ERROR(store.Wait(tickets[b]));
    tickets[b] = 0;
    if (write) return absl::OkStatus();
    const std::int64_t bytes = std::min(chunk_bytes, total - offsets[b]);
    return CheckStamps(buffers[b].get(), bytes, offsets[b]);
  };
  std::size_t b = 0;
  for (std::int64_t offset = 0; offset < total; offset += chunk_bytes) {
    PO_RETURN_IF_ERROR(finish(b));
    const std::int64_t bytes = std::min(chunk_bytes, total - offset);
    offsets[b] = offset;
    if (write) {
      Stamp(buffers[b].get(), bytes, offset);
      PO_ASSIGN_OR_RETURN(tickets[b], store.SubmitWrite(offset, buffers[b].get(), bytes));
    } else {
      PO_ASSIGN_OR_RETURN(tickets[b], store.SubmitRead(offset, buffers[b].get(), bytes));
    }
    b = (b + 1) % buffers.size();
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) PO_RETURN_IF_ERROR(finish(i));
  return absl::OkStatus();
}

double GbPerSecond(std::int64_t bytes, Clock::duration elapsed) {
  const double seconds = std::chrono::duration<double>(elapsed).count();
  return seconds > 0.0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

}  // namespace

absl::StatusOr<NvmeBandwidth> MeasureNvmeBandwidth(const NvmeStoreOptions& options) {
  // Enough bytes per request to keep the whole queue busy. (Declared before the store, which
  // must go first: its destructor waits for pieces still moving into them.)
  const std::int64_t chunk_bytes = std::min(
      options.capacity_bytes,
      std::max(kMinChunkBytes, options.request_bytes * options.queue_depth));
  std::vector<AlignedBuffer> buffers;
  std::vector<std::span<std::byte>> spans;
  for (int i = 0; i < 2; ++i) {
    buffers.emplace_back(static_cast<std::byte*>(std::aligned_alloc(kBlock, chunk_bytes)));
    if (buffers.back() == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("NVMe bandwidth: cannot allocate a buffer of ", chunk_bytes, " bytes"));
    }
    // Touch every page now, so the first pass does not pay for page faults.
    std::memset(buffers.back().get(), 0x5a, chunk_bytes);
    spans.emplace_back(buffers.back().get(), chunk_bytes);
  }
  PO_ASSIGN_OR_RETURN(std::unique_ptr<NvmeStore> store, NvmeStore::Create(options));
  PO_RETURN_IF_ERROR(store->RegisterBuffers(spans));

  NvmeBandwidth result;
  result.bytes = options.capacity_bytes;
  const Clock::time_point write_start = Clock::now();
  PO_RETURN_IF_ERROR(Pass(*store, /*write=*/true, buffers, chunk_bytes));
  PO_RETURN_IF_ERROR(store->Sync());  // with buffered I/O, count the write-back too
  result.write_gb_per_s = GbPerSecond(result.bytes, Clock::now() - write_start);
  for (AlignedBuffer& buffer : buffers) std::memset(buffer.get(), 0, chunk_bytes);
  const Clock::time_point read_start = Clock::now();
  PO_RETURN_IF_ERROR(Pass(*store, /*write=*/false, buffers, chunk_bytes));
  result.read_gb_per_s = GbPerSecond(result.bytes, Clock::now() - read_start);
  result.direct_io = store->direct_io();
  result.backend = std::string(store->backend_name());
  result.description = store->Describe();
  return result;
}

}  // namespace pipeoffload
