#include "examples/gpt/cuda/kernels_args.h"

#include "absl/strings/str_cat.h"

namespace pipeoffload::gpt::cuda::internal {

ArgCheck& ArgCheck::Range(const char* name, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (status_.ok() && (value < lo || value > hi)) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat(function_, ": ", name, " = ", value, " is out of range [", lo, ", ", hi, "]"));
  }
  return *this;
}

ArgCheck& ArgCheck::NotNull(const char* name, const void* pointer) {
  if (status_.ok() && pointer == nullptr) {
    status_ = absl::InvalidArgumentError(absl::StrCat(function_, ": ", name, " is null"));
  }
  return *this;
}

ArgCheck& ArgCheck::Require(bool ok, const std::string& message) {
  if (status_.ok() && !ok) {
    status_ = absl::InvalidArgumentError(absl::StrCat(function_, ": ", message));
  }
  return *this;
}

absl::Status Launched(const char* kernel, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, ": launch failed: ", cudaGetErrorName(error),
                                          ": ", cudaGetErrorString(error)));
}

}  // namespace pipeoffload::gpt::cuda::internal
