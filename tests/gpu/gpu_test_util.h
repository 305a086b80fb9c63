// Helpers shared by the GPU tests: a CUDA backend, and (backend_test_util.h) events, drains and
// RAII blocks of its memory.
#ifndef PIPEOFFLOAD_TESTS_GPU_GPU_TEST_UTIL_H_
#define PIPEOFFLOAD_TESTS_GPU_GPU_TEST_UTIL_H_

#include <memory>

#include "pipeoffload/backend.h"
#include "pipeoffload/cuda.h"
#include "tests/backend/backend_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {

inline std::unique_ptr<Backend> NewCudaBackend(int device = 0) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend({device});
  INFO(backend.status().ToString());
  REQUIRE(backend.ok());
  return std::move(*backend);
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_GPU_GPU_TEST_UTIL_H_
