// Host-side argument checks shared by the entry points of kernels_cuda.h, and the Status of a
// failed launch. Internal to po_gpt_cuda_kernels.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_ARGS_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_ARGS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace pipeoffload::gpt::cuda::internal {

// The longest row (C, OC, V) a row-wise kernel takes: its slabs of columns index grid.y, and
// 2^22 keeps them far below that dimension's limit of 65535 blocks.
inline constexpr std::int64_t kMaxRowLength = std::int64_t{1} << 22;
// The most rows (N = B * T): one block each along grid.x, and the sizes are ints.
inline constexpr std::int64_t kMaxRows = 2147483647;

inline bool IsAligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Collects the first failed check of one call, as InvalidArgument prefixed by the function's
// name: "LayerNormForward: C = 0 is out of range [1, 4194304]".
class ArgCheck {
 public:
  explicit ArgCheck(const char* function) : function_(function) {}

  ArgCheck& Range(const char* name, std::int64_t value, std::int64_t lo, std::int64_t hi);
  ArgCheck& Positive(const char* name, std::int64_t value) {
    return Range(name, value, 1, kMaxRows);
  }
  ArgCheck& Rows(const char* name, std::int64_t value) { return Range(name, value, 1, kMaxRows); }
  ArgCheck& Channels(const char* name, std::int64_t value) {
    return Range(name, value, 1, kMaxRowLength);
  }
  // An element count of an elementwise kernel: 0 is allowed (nothing is enqueued).
  ArgCheck& Count(const char* name, std::int64_t value) {
    return Range(name, value, 0, INT64_MAX / 16);
  }
  ArgCheck& NotNull(const char* name, const void* pointer);
  // Fails with `message` unless `ok`.
  ArgCheck& Require(bool ok, const std::string& message);

  absl::Status status() const { return status_; }

 private:
  const char* function_;
  absl::Status status_;
};

// OK for cudaSuccess, else Internal "<kernel>: launch failed: <CUDA error name>: <text>".
absl::Status Launched(const char* kernel, cudaError_t error);

}  // namespace pipeoffload::gpt::cuda::internal

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_KERNELS_ARGS_H_
