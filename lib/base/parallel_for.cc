#include "lib/base/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace pipeoffload::internal {

int CompileThreads() {
  if (const char* value = std::getenv("PO_COMPILE_THREADS"); value != nullptr) {
    char* end = nullptr;
    const long threads = std::strtol(value, &end, 10);
    // Anything but a positive integer is ignored (the default applies): a knob for
    // measurements, not an input whose mistakes should stop a compile.
    if (end != value && *end == '\0' && threads >= 1) {
      return static_cast<int>(std::min<long>(threads, 1024));
    }
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

// The threads one outermost loop and the loops nested in its bodies may still start: the cap
// less the threads they run now. A helper takes one when it starts and gives it back as soon as
// its loop has no iteration left for it, so a nested loop that begins later may use it.
struct ThreadBudget {
  std::atomic<int> spare{0};

  // Takes up to `wanted` of the spare threads; returns how many it took.
  int Take(int wanted) {
    int spare_now = spare.load(std::memory_order_relaxed);
    while (wanted > 0 && spare_now > 0) {
      const int taken = std::min(wanted, spare_now);
      if (spare.compare_exchange_weak(spare_now, spare_now - taken, std::memory_order_relaxed)) {
        return taken;
      }
    }
    return 0;
  }
  void GiveBack(int threads) { spare.fetch_add(threads, std::memory_order_relaxed); }
};

// The budget of the loops this thread runs iterations of; null outside any ParallelFor.
thread_local ThreadBudget* thread_budget = nullptr;

}  // namespace

void ParallelFor(int count, const std::function<void(int)>& body, int max_threads) {
  if (count <= 0) return;
  ThreadBudget outermost;
  ThreadBudget* const outer = thread_budget;
  ThreadBudget& budget = outer != nullptr ? *outer : outermost;
  // The calling thread is one of the cap's threads, counted by the loop it runs in if any.
  if (outer == nullptr) outermost.spare.store(CompileThreads() - 1, std::memory_order_relaxed);
  const int wanted = (max_threads > 0 ? std::min(count, max_threads) : count) - 1;
  const int taken = budget.Take(wanted);
  std::atomic<int> next{0};
  std::mutex error_mu;
  std::exception_ptr error;  // the first exception a body threw
  const auto work = [&](bool helper) {
    ThreadBudget* const saved = thread_budget;
    thread_budget = &budget;
    try {
      for (int i = next.fetch_add(1, std::memory_order_relaxed); i < count;
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        body(i);
      }
    } catch (...) {
      next.store(count, std::memory_order_relaxed);  // hand out nothing more
      const std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
    }
    thread_budget = saved;
    // Nothing is left for this helper: a loop still running elsewhere in the tree may use it.
    if (helper) budget.GiveBack(1);
  };
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<std::size_t>(taken));
  for (int t = 0; t < taken; ++t) {
    try {
      helpers.emplace_back(work, true);
    } catch (const std::system_error&) {
      budget.GiveBack(taken - t);  // the threads already started, and this one, take the rest
      break;
    }
  }
  work(false);
  for (std::thread& helper : helpers) helper.join();
  if (error) std::rethrow_exception(error);
}

void ParallelForSized(int count, std::int64_t items, const std::function<void(int)>& body) {
  if (items >= kItemsWorthThreads) {
    ParallelFor(count, body);
    return;
  }
  for (int i = 0; i < count; ++i) body(i);
}

}  // namespace pipeoffload::internal
