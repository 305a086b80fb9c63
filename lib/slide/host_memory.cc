// HostBlock: pageable mappings and pinned backend memory, carved with staggered starts.
#include "lib/slide/host_memory.h"

#include <sys/mman.h>

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::internal {
namespace {

constexpr std::int64_t kPage = 4096;
constexpr std::int64_t kStagger = 832;  // bytes per ArrayKind, modulo 4 KiB
constexpr std::int64_t kMaxStagger = 4 * kStagger;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::int64_t CarvedBytes(std::int64_t bytes) {
  return (bytes + kMaxStagger + kPage - 1) / kPage * kPage;
}

absl::StatusOr<HostBlock> HostBlock::Pageable(std::int64_t bytes, std::string what) {
  HostBlock block;
  if (bytes <= 0) return block;
  const double start = Now();
  void* data = mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("layer sliding: cannot map ", bytes,
                                                     " bytes of host memory for ", what, ": ",
                                                     std::strerror(errno)));
  }
  // Huge pages cut the TLB misses of CpuAdam's five streams; a refusal only costs speed.
  madvise(data, static_cast<std::size_t>(bytes), MADV_HUGEPAGE);
  block.data_ = static_cast<std::byte*>(data);
  block.bytes_ = bytes;
  block.allocate_seconds_ = Now() - start;
  return block;
}

absl::StatusOr<HostBlock> HostBlock::Pinned(Backend& backend, std::int64_t bytes,
                                            std::string what) {
  HostBlock block;
  if (bytes <= 0) return block;
  const double start = Now();
  absl::StatusOr<void*> data = backend.AllocateHost(bytes);
  if (!data.ok()) {
    return Annotate(data.status(), absl::StrCat("layer sliding: ", bytes,
                                                " bytes of pinned host memory for ", what));
  }
  std::memset(*data, 0, static_cast<std::size_t>(bytes));
  block.backend_ = &backend;
  block.data_ = static_cast<std::byte*>(*data);
  block.bytes_ = bytes;
  block.allocate_seconds_ = Now() - start;
  return block;
}

HostBlock::~HostBlock() {
  if (data_ == nullptr) return;
  if (backend_ != nullptr) {
    backend_->FreeHost(data_);
  } else {
    munmap(data_, static_cast<std::size_t>(bytes_));
  }
}

HostBlock::HostBlock(HostBlock&& other) noexcept { *this = std::move(other); }

HostBlock& HostBlock::operator=(HostBlock&& other) noexcept {
  if (this == &other) return *this;
  this->~HostBlock();
  backend_ = other.backend_;
  data_ = other.data_;
  bytes_ = other.bytes_;
  used_ = other.used_;
  allocate_seconds_ = other.allocate_seconds_;
  other.data_ = nullptr;
  other.bytes_ = 0;
  other.used_ = 0;
  return *this;
}

void* HostBlock::Carve(std::int64_t bytes, ArrayKind kind) {
  const std::int64_t start = (used_ + kPage - 1) / kPage * kPage;
  const std::int64_t offset = start + static_cast<int>(kind) * kStagger;
  PO_CHECK_MSG(offset + bytes <= bytes_,
               absl::StrCat("host block of ", bytes_, " bytes overrun: ", offset, " + ", bytes));
  used_ = offset + bytes;
  return data_ + offset;
}

}  // namespace pipeoffload::internal
