// The optimizer-offload engine tests on the CPU backend (offload_engine_backend.h), with random
// seeded delays of up to half a millisecond before every copy, so that the engine's copies on
// its four lanes finish in ever different orders and only its events keep the bits right.
#include "pipeoffload/backend.h"
#include "tests/backend/backend_test_util.h"
#include "tests/optim/offload_engine_backend.h"

namespace pipeoffload::testing {

std::string EngineBackendKind() { return "cpu"; }

std::unique_ptr<Backend> NewEngineBackend(std::uint64_t seed) {
  CpuBackendOptions options;
  options.max_copy_delay_seconds = 0.0005;
  options.fault_seed = seed;
  return NewCpuBackend(options);
}

}  // namespace pipeoffload::testing
