// The backend the optimizer-offload engine tests (optimizer_offload_test.cc) run on, one per
// test binary: optim_offload_tests links cpu_engine_backend.cc (the CPU backend with copy-delay
// fault injection: a missing event wait in the engine shows up as wrong bits), optim_gpu_tests
// links cuda/optimizer_offload_gpu_test.cc (a CUDA backend of device 0).
#ifndef PIPEOFFLOAD_TESTS_OPTIM_OFFLOAD_ENGINE_BACKEND_H_
#define PIPEOFFLOAD_TESTS_OPTIM_OFFLOAD_ENGINE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "pipeoffload/backend.h"

namespace pipeoffload::testing {

// "cpu", "cuda" (for messages).
std::string EngineBackendKind();
// A fresh backend; `seed` varies the injected delays where there are any. REQUIREs success.
std::unique_ptr<Backend> NewEngineBackend(std::uint64_t seed);

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_OPTIM_OFFLOAD_ENGINE_BACKEND_H_
