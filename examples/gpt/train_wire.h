// What gpt_train's ranks tell each other over the TrainGroup, as bytes: a Status, a phase's
// setup facts, a step's losses and measured stats, parameter hashes. Every rank runs the same
// binary on the same host, so trivially copyable values travel as their bytes; a reader that
// runs short fails (DataLoss) instead of reading garbage.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_WIRE_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_params.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload::gpt {

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
  std::string Take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

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
    std::uint64_t n = 0;
    if (!Get(&n) || n > (bytes_.size() - pos_) / sizeof(T)) return ok_ = false;
    values->resize(n);
    std::memcpy(values->data(), bytes_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return true;
  }
  bool GetString(std::string* text) {
    std::uint64_t n = 0;
    if (!Get(&n) || n > bytes_.size() - pos_) return ok_ = false;
    text->assign(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // DataLoss naming `what` when any read ran short or bytes are left over.
  [[nodiscard]] absl::Status Finish(std::string_view what) const;

 private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

void PutStatus(ByteWriter& writer, const absl::Status& status);
bool GetStatus(ByteReader& reader, absl::Status* status);

// One rank's account of one step: whether its iteration ran, the losses it computed (the
// stage holding the last virtual stage; empty elsewhere) and its measured stats. The stats'
// per-op timeline and memory samples travel only when `with_timeline` (the trace's step).
struct StepReport {
  absl::Status status;
  std::vector<double> losses;
  IterationStats stats;
};
std::string EncodeStepReport(const StepReport& report, bool with_timeline);
[[nodiscard]] absl::StatusOr<StepReport> DecodeStepReport(std::string_view bytes);

// Hashes of a rank's parameter tensors plus the bytes of its model state.
std::string EncodeHashes(const std::vector<TensorHash>& hashes, std::int64_t model_state_bytes);
[[nodiscard]] absl::Status DecodeHashes(std::string_view bytes, std::vector<TensorHash>* hashes,
                                        std::int64_t* model_state_bytes);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_WIRE_H_
