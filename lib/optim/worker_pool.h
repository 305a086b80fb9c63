// A fixed set of worker threads that run one parallel loop at a time: CpuAdam's threads, and the
// benchmark's STREAM-like passes (so both measure the same threads).
//
// Invariants: the workers are created once, in the constructor, and joined in the destructor;
// between Run calls they sleep on a condition variable. Run is a fork-join: it returns only
// after every participating worker has finished `work`, so `work` may capture locals by
// reference. The calling thread is worker 0 and does its share itself. For each Run the workers
// adopt the caller's floating-point control state (x86 MXCSR: rounding, FTZ/DAZ), so a result
// never depends on which thread computed an element.
#ifndef PIPEOFFLOAD_LIB_OPTIM_WORKER_POOL_H_
#define PIPEOFFLOAD_LIB_OPTIM_WORKER_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pipeoffload::internal {

class WorkerPool {
 public:
  // REQUIRES: threads >= 1. Starts threads - 1 workers.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return size_; }

  // Calls work(i) for every i in [0, active) on worker i (i = 0 on the calling thread) and
  // returns when all calls have returned. REQUIRES: 1 <= active <= size(); one Run at a time.
  void Run(int active, const std::function<void(int)>& work);

 private:
  void WorkerLoop(int index);

  const int size_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;      // workers wait here for a new generation
  std::condition_variable finished_;  // Run waits here for pending_ == 0
  std::uint64_t generation_ = 0;      // bumped by each Run (guarded by mu_)
  int active_ = 0;                    // workers [1, active_) take part (guarded by mu_)
  int pending_ = 0;                   // workers still running this generation (guarded by mu_)
  unsigned fp_control_ = 0;           // the caller's MXCSR for this generation (guarded by mu_)
  bool stop_ = false;                 // (guarded by mu_)
  const std::function<void(int)>* work_ = nullptr;  // (guarded by mu_)
};

// Splits [0, count) into `parts` contiguous ranges whose inner boundaries fall on multiples of
// `align` elements counted from `first_aligned` (the first index whose address is aligned), so
// no two threads write the same cache line. Returns parts + 1 boundaries, first 0, last count;
// ranges may be empty. REQUIRES: parts >= 1, align >= 1, 0 <= first_aligned < align.
std::vector<std::int64_t> AlignedSplit(std::int64_t count, int parts, std::int64_t align,
                                       std::int64_t first_aligned);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_OPTIM_WORKER_POOL_H_
