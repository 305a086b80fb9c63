// Trivially copyable values, strings and Statuses as bytes, for what the ranks of one job tell
// each other over a RankGroup (set-up facts, a step's stats, hashes). Every rank runs the same
// binary on the same kind of host, so such values travel as their bytes; a reader that runs
// short fails (DataLoss) instead of reading garbage. No I/O.
#ifndef PIPEOFFLOAD_LIB_BASE_BYTE_WIRE_H_
#define PIPEOFFLOAD_LIB_BASE_BYTE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace pipeoffload::internal {

class ByteWriter {
 public:
  template <typename T>
  void Put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& values) {
    static_assert(std::is_trivially_copyable_v<T>);
    Put<std::uint64_t>(values.size());
    bytes_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  }
  void PutString(std::string_view text) {
    Put<std::uint64_t>(text.size());
    bytes_.append(text.data(), text.size());
  }
  // The code and the message.
  void PutStatus(const absl::Status& status);
  std::string Take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Every Get returns false once a read ran short (and every later one too); Finish says so.
class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* value) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!ok_ || bytes_.size() - pos_ < sizeof(T)) return ok_ = false;
    std::memcpy(value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  template <typename T>
  bool GetVector(std::vector<T>* values) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::uint64_t n = 0;
    if (!Get(&n) || n > (bytes_.size() - pos_) / sizeof(T)) return ok_ = false;
    values->resize(n);
    // An empty vector's data() may be null, and memcpy from or to null is undefined even for
    // 0 bytes (UBSan's find: a stage's empty measured costs, gathered at Open).
    if (n > 0) std::memcpy(values->data(), bytes_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return true;
  }
  bool GetString(std::string* text);
  bool GetStatus(absl::Status* status);
  // DataLoss naming `what` when any read ran short or bytes are left over.
  [[nodiscard]] absl::Status Finish(std::string_view what) const;

 private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BASE_BYTE_WIRE_H_
