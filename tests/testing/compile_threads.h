// ScopedCompileThreads: sets PO_COMPILE_THREADS (lib/base/parallel_for.h) for one scope and puts
// back what was there, for tests of what the compiler does on one thread or several.
#ifndef PIPEOFFLOAD_TESTS_TESTING_COMPILE_THREADS_H_
#define PIPEOFFLOAD_TESTS_TESTING_COMPILE_THREADS_H_

#include <cstdlib>
#include <optional>
#include <string>

namespace pipeoffload::testing {

class ScopedCompileThreads {
 public:
  explicit ScopedCompileThreads(const char* threads) {
    if (const char* before = std::getenv(kName); before != nullptr) saved_ = before;
    ::setenv(kName, threads, 1);
  }
  ~ScopedCompileThreads() {
    if (saved_) {
      ::setenv(kName, saved_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }
  ScopedCompileThreads(const ScopedCompileThreads&) = delete;
  ScopedCompileThreads& operator=(const ScopedCompileThreads&) = delete;

 private:
  static constexpr const char* kName = "PO_COMPILE_THREADS";
  std::optional<std::string> saved_;
};

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_TESTING_COMPILE_THREADS_H_
