// CpuAdam (adam.h): the chosen ISA's kernels over a persistent WorkerPool.
//
// Update cuts the span into one contiguous range per thread with inner boundaries on 64-byte
// boundaries of `param` (16 floats), so no two threads write the same cache line of param, m or
// v when those share param's alignment; with a split master (no param) on 64-byte boundaries of
// param_bf16 (32 elements, which are also 2 lines of m and v). Every element goes through the
// same kernel, and the kernels' blocks only group elementwise work, so the bits never depend on
// the thread count. SumOfSquares (and SumOfSquaresBf16, the same with the bf16 block kernel)
// sums fixed blocks of kSumBlock elements (counted from x[0]) into one slot each, and then the
// slots in block order on the calling thread: the cut into threads only decides who fills which
// slot.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/optim/adam_kernels.h"
#include "lib/optim/worker_pool.h"
#include "pipeoffload/adam.h"

#if defined(__linux__)
#include <sched.h>
#endif

namespace pipeoffload {
namespace {

// Below this many elements per thread, waking another thread costs more than it saves (a wake-up
// is ~10 us; 64 Ki elements are ~2 MB of Adam traffic).
constexpr std::int64_t kMinElementsPerThread = std::int64_t{1} << 16;
// Same for the sum of squares, in blocks (8 blocks = 256 KiB of reads).
constexpr std::int64_t kMinBlocksPerThread = 8;
// 64-byte cache lines, in floats and in bf16 halves.
constexpr std::int64_t kLineFloats = 16;
constexpr std::int64_t kLineHalves = 32;
// More threads than this is a mistake (and thread creation failure would throw).
constexpr int kMaxThreads = 1024;
// Prefetching further ahead than this only evicts what it fetched before use.
constexpr int kMaxPrefetchBytes = 1 << 16;

// prefetch_bytes = -1 (adam.h): software prefetch 2 KiB ahead on Intel, where it measured
// +5-30% at 16 threads on the H200 host's Xeon (docs/benchmarks.md); none elsewhere (10-20%
// slower on the AMD Zen 4 build machine, which its hardware prefetchers already keep busy).
int DefaultPrefetch() {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_is("intel")) return 2048;
#endif
  return 0;
}

// CPUs this process may run on (the affinity mask: containers and taskset restrict it, and
// hardware_concurrency does not see that).
int AvailableCpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

class CpuAdamImpl final : public CpuAdam {
 public:
  CpuAdamImpl(CpuIsa isa, int threads, std::int64_t prefetch_bytes)
      : isa_(isa),
        prefetch_bytes_(prefetch_bytes),
        pool_(threads),
        adam_(internal::AdamKernelFor(isa)),
        sum_block_(internal::SumOfSquaresBlockKernelFor(isa)),
        sum_bf16_block_(internal::SumOfSquaresBf16BlockKernelFor(isa)) {}

  CpuIsa isa() const override { return isa_; }
  int threads() const override { return pool_.size(); }
  int prefetch_bytes() const override { return static_cast<int>(prefetch_bytes_); }

  absl::Status Update(const AdamStepScalars& scalars, const AdamSpan& span) override {
    PO_RETURN_IF_ERROR(Annotate(CheckAdamSpan(span), "CpuAdam::Update"));
    if (span.count == 0) return absl::OkStatus();
    const std::int64_t by_size = (span.count + kMinElementsPerThread - 1) / kMinElementsPerThread;
    const int parts = static_cast<int>(std::min<std::int64_t>(pool_.size(), by_size));
    if (parts == 1) {
      adam_(scalars, span, prefetch_bytes_);
      return absl::OkStatus();
    }
    // Cut on the lines of the master's first array: param, or a split master's high halves.
    const bool split = span.param_lo != nullptr;
    const auto address = split ? reinterpret_cast<std::uintptr_t>(span.param_bf16)
                               : reinterpret_cast<std::uintptr_t>(span.param);
    const std::size_t element = split ? sizeof(std::uint16_t) : sizeof(float);
    const std::int64_t first_aligned =
        address % element != 0 ? 0 : static_cast<std::int64_t>((64 - address % 64) % 64 / element);
    const std::vector<std::int64_t> bounds = internal::AlignedSplit(
        span.count, parts, split ? kLineHalves : kLineFloats, first_aligned);
    pool_.Run(parts, [&](int part) {
      const std::int64_t begin = bounds[static_cast<std::size_t>(part)];
      const std::int64_t end = bounds[static_cast<std::size_t>(part) + 1];
      if (begin == end) return;
      AdamSpan piece;
      // param is null for a split master (CheckAdamSpan), param_lo null otherwise.
      piece.param = span.param == nullptr ? nullptr : span.param + begin;
      piece.exp_avg = span.exp_avg + begin;
      piece.exp_avg_sq = span.exp_avg_sq + begin;
      // Exactly one of the two gradients is set (CheckAdamSpan).
      piece.grad = span.grad == nullptr ? nullptr : span.grad + begin;
      piece.grad_bf16 = span.grad_bf16 == nullptr ? nullptr : span.grad_bf16 + begin;
      piece.param_bf16 = span.param_bf16 == nullptr ? nullptr : span.param_bf16 + begin;
      piece.param_lo = span.param_lo == nullptr ? nullptr : span.param_lo + begin;
      piece.count = end - begin;
      adam_(scalars, piece, prefetch_bytes_);
    });
    return absl::OkStatus();
  }

  double SumOfSquares(const float* x, std::int64_t count) override {
    return SumOfSquaresOf(x, count, sum_block_);
  }

  double SumOfSquaresBf16(const std::uint16_t* x, std::int64_t count) override {
    return SumOfSquaresOf(x, count, sum_bf16_block_);
  }

 private:
  // Both sums: the same blocks, slots and order, only the block kernel's input type differs.
  template <typename T>
  double SumOfSquaresOf(const T* x, std::int64_t count, double (*sum_block)(const T*,
                                                                            std::int64_t)) {
    if (count <= 0) return 0.0;
    if (x == nullptr) return std::numeric_limits<double>::quiet_NaN();
    const std::int64_t blocks = (count + internal::kSumBlock - 1) / internal::kSumBlock;
    block_sums_.assign(static_cast<std::size_t>(blocks), 0.0);
    const std::int64_t by_size = (blocks + kMinBlocksPerThread - 1) / kMinBlocksPerThread;
    const int parts = static_cast<int>(std::min<std::int64_t>(pool_.size(), by_size));
    auto sum_blocks = [&](int part) {
      const std::int64_t first = blocks * part / parts;
      const std::int64_t last = blocks * (part + 1) / parts;
      for (std::int64_t b = first; b < last; ++b) {
        const std::int64_t begin = b * internal::kSumBlock;
        const std::int64_t n = std::min(internal::kSumBlock, count - begin);
        block_sums_[static_cast<std::size_t>(b)] = sum_block(x + begin, n);
      }
    };
    if (parts == 1) {
      sum_blocks(0);
    } else {
      pool_.Run(parts, sum_blocks);
    }
    double total = 0.0;
    for (const double s : block_sums_) total += s;
    return total;
  }

  const CpuIsa isa_;
  const std::int64_t prefetch_bytes_;
  internal::WorkerPool pool_;
  const internal::AdamKernel adam_;
  const internal::SumOfSquaresBlockKernel sum_block_;
  const internal::SumOfSquaresBf16BlockKernel sum_bf16_block_;
  std::vector<double> block_sums_;  // one per kSumBlock block of the last SumOfSquares
};

}  // namespace

absl::StatusOr<std::unique_ptr<CpuAdam>> CpuAdam::Create(const CpuAdamOptions& options) {
  if (options.threads < 0 || options.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("CpuAdam: threads = ", options.threads,
                                                   " must be in [0, ", kMaxThreads,
                                                   "] (0: every CPU this process may use)"));
  }
  CpuIsa isa = options.isa;
  if (options.pick_best_isa) {
    isa = BestCpuIsa();
  } else if (!CpuSupports(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("CpuAdam: instruction set ", std::string(CpuIsaName(isa)),
                     " is not supported by this CPU or build (best here: ",
                     std::string(CpuIsaName(BestCpuIsa())), ")"));
  }
  if (options.prefetch_bytes < -1 || options.prefetch_bytes > kMaxPrefetchBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CpuAdam: prefetch_bytes = ", options.prefetch_bytes, " must be in [0, ",
        kMaxPrefetchBytes, "], or -1 to pick by CPU vendor"));
  }
  const int prefetch = options.prefetch_bytes >= 0 ? options.prefetch_bytes : DefaultPrefetch();
  const int threads = options.threads == 0 ? AvailableCpus() : options.threads;
  return std::unique_ptr<CpuAdam>(new CpuAdamImpl(isa, threads, prefetch));
}

}  // namespace pipeoffload
