// The CUDA backend under the contract suite (tests/backend/backend_contract.h): device 0;
// Occupy launches the spin kernel (test_kernels.h) on the queue's own stream, so the copy
// engines stay free and only the queue's order holds later work back. No fault injection.
#include "lib/backend/cuda/cuda_check.h"
#include "pipeoffload/cuda_stream.h"
#include "tests/backend/backend_contract.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/test_kernels.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {
namespace {

class CudaBackendUnderTest final : public BackendUnderTest {
 public:
  std::string kind() const override { return "cuda"; }
  std::unique_ptr<Backend> Create(const ContractSetup&) override { return NewCudaBackend(0); }
  void Occupy(Backend&, Queue queue, double seconds) override {
    absl::StatusOr<cudaStream_t> stream = CudaQueueStream(queue);
    INFO(stream.status().ToString());
    REQUIRE(stream.ok());
    PO_CUDA_CHECK(LaunchSpin(*stream, seconds));
  }
};

}  // namespace

BackendUnderTest& TheBackendUnderTest() {
  static CudaBackendUnderTest fixture;
  return fixture;
}

}  // namespace pipeoffload::testing
