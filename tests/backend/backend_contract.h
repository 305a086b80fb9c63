// The Backend contract suite (backend_contract_test.cc, and backend_contract_lanes_test.cc for
// the extra queues of CreateQueue; ggml's test-backend-ops is the spirit): one set of
// assertions about include/pipeoffload/backend.h, compiled into one test binary per backend,
// each of which links the one BackendUnderTest below that makes its backends:
//   backend_tests (label cpu, CI)        cpu_backend_contract.cc      backend_tests "[contract]"
//   gpu_tests     (label gpu, GPU box)   tests/gpu/cuda_backend_contract.cc  gpu_tests "[contract]"
// What only one backend does (the CPU compute queue being the caller's thread, CUDA's pinned
// memory and event clock) is tested beside its fixture, not here.
#ifndef PIPEOFFLOAD_TESTS_BACKEND_BACKEND_CONTRACT_H_
#define PIPEOFFLOAD_TESTS_BACKEND_BACKEND_CONTRACT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "pipeoffload/backend.h"

namespace pipeoffload::testing {

// How a test wants its backend.
struct ContractSetup {
  // > 0: Occupy will be called with this many seconds. (The CPU backend can only delay every
  // copy, so on it each copy of this backend then takes this long.)
  double busy_seconds = 0.0;
  // > 0: random, seeded delays before each copy up to this long, where the backend can inject
  // faults (the CPU backend); a backend without fault injection ignores it and the test still
  // holds, it only probes less.
  double max_random_delay_seconds = 0.0;
  std::uint64_t seed = 1;
};

class BackendUnderTest {
 public:
  virtual ~BackendUnderTest() = default;
  // "cpu", "cuda": for messages.
  virtual std::string kind() const = 0;
  // A fresh backend as `setup` asks (REQUIREs success).
  virtual std::unique_ptr<Backend> Create(const ContractSetup& setup) = 0;
  // Enqueues on `backend`'s copy queue `queue` (D2H or H2D, any lane) work that keeps it busy for
  // at least `seconds` and touches no memory of the test's: what comes after it on that queue
  // waits. REQUIRES: `backend` came from Create with busy_seconds == seconds.
  virtual void Occupy(Backend& backend, Queue queue, double seconds) = 0;
  // The built-in queue of `kind`.
  void Occupy(Backend& backend, QueueKind kind, double seconds) {
    Occupy(backend, backend.queue(kind), seconds);
  }
};

// Defined by the fixture file linked into the binary (one per binary).
BackendUnderTest& TheBackendUnderTest();

// A fresh backend of the binary's kind, as `setup` asks.
inline std::unique_ptr<Backend> Make(const ContractSetup& setup = {}) {
  return TheBackendUnderTest().Create(setup);
}

// Whether `status`'s message holds `text` (the contract names what a message must mention).
inline bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_BACKEND_BACKEND_CONTRACT_H_
