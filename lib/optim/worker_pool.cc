// WorkerPool: see worker_pool.h for the invariants (fork-join, caller is worker 0, workers adopt
// the caller's MXCSR per Run).
#include "lib/optim/worker_pool.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "lib/base/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define PO_OPTIM_HAVE_MXCSR 1
#endif

namespace pipeoffload::internal {
namespace {

unsigned ReadFpControl() {
#if defined(PO_OPTIM_HAVE_MXCSR)
  return _mm_getcsr();
#else
  return 0;
#endif
}

void WriteFpControl([[maybe_unused]] unsigned value) {
#if defined(PO_OPTIM_HAVE_MXCSR)
  // Keep the sticky exception flags (bits 0-5) of this thread; take the control bits.
  _mm_setcsr((value & ~0x3Fu) | (_mm_getcsr() & 0x3Fu));
#endif
}

}  // namespace

WorkerPool::WorkerPool(int threads) : size_(threads) {
  PO_CHECK(threads >= 1);
  threads_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) threads_.emplace_back([this, i] { WorkerLoop(i); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Run(int active, const std::function<void(int)>& work) {
  PO_CHECK(active >= 1 && active <= size_);
  if (active > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    PO_CHECK_MSG(pending_ == 0, "WorkerPool::Run called while another Run is in flight");
    work_ = &work;
    active_ = active;
    pending_ = active - 1;
    fp_control_ = ReadFpControl();
    ++generation_;
  }
  if (active > 1) wake_.notify_all();
  work(0);
  if (active > 1) {
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(lock, [this] { return pending_ == 0; });
    work_ = nullptr;
  }
}

void WorkerPool::WorkerLoop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* work = nullptr;
    unsigned fp_control = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= active_) continue;  // not part of this (smaller) Run
      work = work_;
      fp_control = fp_control_;
    }
    WriteFpControl(fp_control);
    (*work)(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) finished_.notify_one();
    }
  }
}

std::vector<std::int64_t> AlignedSplit(std::int64_t count, int parts, std::int64_t align,
                                       std::int64_t first_aligned) {
  PO_CHECK(parts >= 1 && align >= 1 && first_aligned >= 0 && first_aligned < align);
  std::vector<std::int64_t> bounds(static_cast<std::size_t>(parts) + 1, count);
  bounds[0] = 0;
  if (count <= first_aligned) {
    // Everything is before the first aligned index: part 0 takes it all.
    return bounds;
  }
  const std::int64_t units = (count - first_aligned + align - 1) / align;
  for (int i = 1; i < parts; ++i) {
    // units * i fits: units <= count / align + 1 and parts is small.
    const std::int64_t unit = units * i / parts;
    bounds[static_cast<std::size_t>(i)] = std::min(count, first_aligned + unit * align);
  }
  return bounds;
}

}  // namespace pipeoffload::internal
