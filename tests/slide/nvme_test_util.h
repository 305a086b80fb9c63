// Helpers of the NVMe store tests: a fresh directory under the build tree per test (removed
// afterwards, so no test leaves files), 4 KiB-aligned buffers, and reproducible random bytes.
#ifndef PIPEOFFLOAD_TESTS_SLIDE_NVME_TEST_UTIL_H_
#define PIPEOFFLOAD_TESTS_SLIDE_NVME_TEST_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>

#include "lib/slide/nvme_store.h"

namespace pipeoffload::testing {

// A new empty directory, by default under the directory of the test binary (the build tree);
// PO_NVME_TEST_DIR=<dir> puts it there instead (e.g. on the drive the trainer will use).
class TestDir {
 public:
  TestDir() {
    std::filesystem::path base;
    if (const char* env = std::getenv("PO_NVME_TEST_DIR"); env != nullptr && *env != '\0') {
      base = env;
    } else {
      base = std::filesystem::read_symlink("/proc/self/exe").parent_path();
    }
    static int counter = 0;
    path_ = base / ("nvme_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TestDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;

  std::string path() const { return path_.string(); }
  // Names of the directory's entries.
  std::set<std::string> Entries() const {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }

 private:
  std::filesystem::path path_;
};

// `bytes` bytes at a 4 KiB boundary, filled with `fill`.
class AlignedBytes {
 public:
  explicit AlignedBytes(std::int64_t bytes, std::byte fill = std::byte{0})
      : bytes_(bytes),
        data_(static_cast<std::byte*>(std::aligned_alloc(NvmeStore::kAlignment, Rounded(bytes)))) {
    std::memset(data_.get(), static_cast<int>(fill), Rounded(bytes));
  }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  std::int64_t size() const { return bytes_; }
  std::span<std::byte> span() { return {data_.get(), static_cast<std::size_t>(bytes_)}; }

 private:
  static std::size_t Rounded(std::int64_t bytes) {
    const std::int64_t a = NvmeStore::kAlignment;
    return static_cast<std::size_t>(std::max<std::int64_t>(a, (bytes + a - 1) / a * a));
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::int64_t bytes_;
  std::unique_ptr<std::byte[], Free> data_;
};

inline void FillRandom(std::byte* data, std::int64_t bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < bytes; i += 8) {
    const std::uint64_t word = rng();
    std::memcpy(data + i, &word, std::min<std::int64_t>(8, bytes - i));
  }
}

// Index of the first byte where a and b differ, or -1.
inline std::int64_t FirstDifference(const std::byte* a, const std::byte* b, std::int64_t bytes) {
  for (std::int64_t i = 0; i < bytes; ++i) {
    if (a[i] != b[i]) return i;
  }
  return -1;
}

inline NvmeStoreOptions SmallStore(const std::string& dir, std::int64_t capacity_bytes) {
  NvmeStoreOptions options;
  options.dir = dir;
  options.capacity_bytes = capacity_bytes;
  options.queue_depth = 8;
  options.request_bytes = 64 << 10;
  options.timeout_seconds = 60.0;
  return options;
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_SLIDE_NVME_TEST_UTIL_H_
