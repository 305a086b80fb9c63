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

// True on a thread while it runs ParallelFor iterations: a nested ParallelFor then stays on it,
// so one loop's threads never multiply past the cap.
thread_local bool in_parallel_for = false;

}  // namespace

void ParallelFor(int count, const std::function<void(int)>& body) {
  if (count <= 0) return;
  if (in_parallel_for) {
    for (int i = 0; i < count; ++i) body(i);
    return;
  }
  const int threads = std::min(count, CompileThreads());
  std::atomic<int> next{0};
  std::mutex error_mu;
  std::exception_ptr error;  // the first exception a body threw
  const auto work = [&] {
    in_parallel_for = true;
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
    in_parallel_for = false;
  };
  std::vector<std::thread> helpers;
  helpers.reserve(static_cast<std::size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // the threads already started, and this one, take the rest
    }
  }
  work();
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
