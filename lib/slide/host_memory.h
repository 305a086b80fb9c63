// Host memory of the layer-sliding engine: pageable blocks (anonymous mappings, zero, huge pages
// advised: the fp32 master, m and v only the CPU touches) and pinned blocks (the backend's host
// memory: what the copy engines read and write), each carved into per-unit arrays whose starts
// are staggered modulo 4 KiB as adam.h asks (arrays at the same page offset run ~30% slower).
#ifndef PIPEOFFLOAD_LIB_SLIDE_HOST_MEMORY_H_
#define PIPEOFFLOAD_LIB_SLIDE_HOST_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"

namespace pipeoffload::internal {

// Which of the five streams CpuAdam reads and writes an array is: its start is staggered by
// 832 bytes per kind modulo 4 KiB (cpu_adam_bench's default skew, docs/benchmarks.md).
enum class ArrayKind : int { kMaster = 0, kExpAvg = 1, kExpAvgSq = 2, kGrads = 3, kUpload = 4 };

// Bytes a carve of `bytes` takes: rounded up to 4 KiB plus room for the largest stagger.
std::int64_t CarvedBytes(std::int64_t bytes);

// A block of host memory and a bump allocator over it.
class HostBlock {
 public:
  HostBlock() = default;
  // Pageable: an anonymous private mapping (zero pages, taken lazily by the kernel) with
  // MADV_HUGEPAGE. Errors: ResourceExhausted naming `what` and the bytes.
  [[nodiscard]] static absl::StatusOr<HostBlock> Pageable(std::int64_t bytes, std::string what);
  // Pinned: Backend::AllocateHost (cudaHostAlloc on CUDA), zero-filled. Errors: the backend's,
  // annotated with `what` and the bytes.
  [[nodiscard]] static absl::StatusOr<HostBlock> Pinned(Backend& backend, std::int64_t bytes,
                                                        std::string what);
  ~HostBlock();
  HostBlock(HostBlock&& other) noexcept;
  HostBlock& operator=(HostBlock&& other) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  // The next `bytes` (> 0) of the block, starting 4 KiB-aligned plus the kind's stagger.
  // REQUIRES: the block was sized with CarvedBytes for every carve.
  void* Carve(std::int64_t bytes, ArrayKind kind);
  std::int64_t bytes() const { return bytes_; }
  double allocate_seconds() const { return allocate_seconds_; }

 private:
  Backend* backend_ = nullptr;  // null: pageable
  std::byte* data_ = nullptr;
  std::int64_t bytes_ = 0;
  std::int64_t used_ = 0;
  double allocate_seconds_ = 0.0;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_SLIDE_HOST_MEMORY_H_
