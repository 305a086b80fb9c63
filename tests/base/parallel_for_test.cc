// ParallelFor: every iteration exactly once whatever the thread cap, nothing for an empty loop,
// nested loops within the outer loop's cap (and on the threads it leaves idle), max_threads, a
// body's exception rethrown, small ParallelForSized loops on the calling thread, and
// PO_COMPILE_THREADS read as a cap only when it is a positive integer.
#include "lib/base/parallel_for.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <new>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

// Sets PO_COMPILE_THREADS (or unsets it) for one scope, restoring what was there.
class ThreadsVariable {
 public:
  explicit ThreadsVariable(const char* value) {
    if (const char* old = ::getenv("PO_COMPILE_THREADS")) saved_ = old;
    if (value == nullptr) {
      ::unsetenv("PO_COMPILE_THREADS");
    } else {
      ::setenv("PO_COMPILE_THREADS", value, 1);
    }
  }
  ~ThreadsVariable() {
    if (saved_) {
      ::setenv("PO_COMPILE_THREADS", saved_->c_str(), 1);
    } else {
      ::unsetenv("PO_COMPILE_THREADS");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST_CASE("ParallelFor runs every iteration exactly once under any thread cap", "[base]") {
  for (const char* cap : {"1", "2", "3", "8", "64"}) {
    ThreadsVariable threads(cap);
    for (const int count : {1, 2, 7, 100}) {
      std::vector<std::atomic<int>> runs(count);
      std::mutex mu;
      std::set<std::thread::id> ids;
      internal::ParallelFor(count, [&](int i) {
        runs[i].fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      });
      for (int i = 0; i < count; ++i) {
        INFO("cap " << cap << ", count " << count << ", iteration " << i);
        CHECK(runs[i].load() == 1);
      }
      // Never more threads than the cap or the iterations.
      CHECK(static_cast<int>(ids.size()) <= std::min(count, std::stoi(cap)));
      if (std::string(cap) == "1") CHECK(ids == std::set{std::this_thread::get_id()});
    }
  }
}

TEST_CASE("ParallelFor with no iterations calls nothing", "[base]") {
  int calls = 0;
  internal::ParallelFor(0, [&](int) { ++calls; });
  internal::ParallelFor(-3, [&](int) { ++calls; });
  CHECK(calls == 0);
}

TEST_CASE("ParallelForSized runs small loops in order on the calling thread", "[base]") {
  ThreadsVariable threads("8");
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<int> order;
  std::set<std::thread::id> small_ids;
  internal::ParallelForSized(50, internal::kItemsWorthThreads - 1, [&](int i) {
    small_ids.insert(std::this_thread::get_id());
    order.push_back(i);  // unsynchronised: a second thread here would be a data race (TSan)
  });
  std::vector<int> expected(50);
  for (int i = 0; i < 50; ++i) expected[i] = i;
  CHECK(order == expected);
  CHECK(small_ids == std::set{caller});
  // At the threshold it is ParallelFor: its two iterations wait for each other, which only
  // two threads can do (on one, the first would give up after its 10 s).
  std::atomic<int> arrived{0};
  std::atomic<bool> met{true};
  internal::ParallelForSized(2, internal::kItemsWorthThreads, [&](int) {
    arrived.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    if (arrived.load() < 2) met = false;
  });
  CHECK(met.load());
}

// Waits (up to 10 s) until `threads` callers have arrived; false when they never did, which
// means fewer threads ran the callers at once.
bool Meet(std::atomic<int>& arrived, int threads) {
  arrived.fetch_add(1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (arrived.load() < threads && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  return arrived.load() >= threads;
}

TEST_CASE("Loops nested in a ParallelFor's bodies share its thread cap", "[base]") {
  ThreadsVariable threads("4");
  std::mutex mu;
  std::set<std::thread::id> outer_ids;
  std::atomic<int> inner_runs{0}, busy{0}, most_busy{0};
  internal::ParallelFor(8, [&](int) {
    {
      std::lock_guard<std::mutex> lock(mu);
      outer_ids.insert(std::this_thread::get_id());
    }
    internal::ParallelFor(16, [&](int) {
      // Each inner body in progress holds a thread of its own: at most the cap at once.
      const int now = busy.fetch_add(1) + 1;
      int most = most_busy.load();
      while (now > most && !most_busy.compare_exchange_weak(most, now)) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      inner_runs.fetch_add(1);
      busy.fetch_sub(1);
    });
  });
  CHECK(inner_runs.load() == 8 * 16);
  CHECK(most_busy.load() <= 4);
  CHECK(static_cast<int>(outer_ids.size()) <= 4);
  // After the loop the calling thread may start threads again.
  std::set<std::thread::id> again;
  std::atomic<int> arrived{0};
  std::atomic<bool> met{true};
  internal::ParallelFor(2, [&](int) {
    if (!Meet(arrived, 2)) met = false;
    std::lock_guard<std::mutex> lock(mu);
    again.insert(std::this_thread::get_id());
  });
  CHECK(met.load());
  CHECK(again.size() == 2);
}

TEST_CASE("max_threads caps a loop and leaves the other threads to the loops in its bodies",
          "[base]") {
  ThreadsVariable threads("4");
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex mu;
  std::set<std::thread::id> outer_ids;
  std::atomic<bool> met{true};
  internal::ParallelFor(
      3,
      [&](int) {
        {
          std::lock_guard<std::mutex> lock(mu);
          outer_ids.insert(std::this_thread::get_id());
        }
        // The outer loop runs on the caller alone, so its body's loop may use the three other
        // threads: its four iterations meet, which only four threads can do.
        std::atomic<int> arrived{0};
        internal::ParallelFor(4, [&](int) {
          if (!Meet(arrived, 4)) met = false;
        });
      },
      /*max_threads=*/1);
  CHECK(outer_ids == std::set{caller});
  CHECK(met.load());
  std::set<std::thread::id> ids;
  internal::ParallelFor(
      100,
      [&](int) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      },
      /*max_threads=*/2);
  CHECK(ids.size() <= 2);
}

TEST_CASE("ParallelFor rethrows a body's exception on the calling thread", "[base]") {
  for (const char* cap : {"1", "4"}) {
    ThreadsVariable threads(cap);
    INFO("cap " << cap);
    std::atomic<int> runs{0};
    CHECK_THROWS_AS(internal::ParallelFor(1000,
                                          [&](int i) {
                                            runs.fetch_add(1);
                                            if (i == 3) throw std::bad_alloc();
                                          }),
                    std::bad_alloc);
    // Nothing more is handed out once a body has thrown (each other thread may finish the one
    // iteration it had taken).
    CHECK(runs.load() >= 4);
    CHECK(runs.load() < 1000);
    // And the threads that ran the loop are usable again: the next loop runs to the end.
    std::atomic<int> after{0};
    internal::ParallelFor(100, [&](int) { after.fetch_add(1); });
    CHECK(after.load() == 100);
  }
}

TEST_CASE("PO_COMPILE_THREADS caps the threads only as a positive integer", "[base]") {
  const int hardware = std::max(1u, std::thread::hardware_concurrency());
  {
    ThreadsVariable threads(nullptr);
    CHECK(internal::CompileThreads() == hardware);
  }
  {
    ThreadsVariable threads("5");
    CHECK(internal::CompileThreads() == 5);
  }
  {
    ThreadsVariable threads("100000");
    CHECK(internal::CompileThreads() == 1024);
  }
  for (const char* ignored : {"0", "-2", "two", "3x", ""}) {
    ThreadsVariable threads(ignored);
    INFO("PO_COMPILE_THREADS=\"" << ignored << "\"");
    CHECK(internal::CompileThreads() == hardware);
  }
}

}  // namespace
}  // namespace pipeoffload
