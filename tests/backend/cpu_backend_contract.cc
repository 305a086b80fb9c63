// The CPU backend under the contract suite (backend_contract.h). Occupy enqueues one small copy
// between buffers of its own: the backend was made with copy delays of exactly the busy time,
// so that copy holds the queue that long.
#include <map>
#include <mutex>

#include "pipeoffload/backend.h"
#include "tests/backend/backend_contract.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {
namespace {

class CpuBackendUnderTest final : public BackendUnderTest {
 public:
  std::string kind() const override { return "cpu"; }

  std::unique_ptr<Backend> Create(const ContractSetup& setup) override {
    CpuBackendOptions options;
    if (setup.busy_seconds > 0.0) {
      options.min_copy_delay_seconds = options.max_copy_delay_seconds = setup.busy_seconds;
    } else {
      options.max_copy_delay_seconds = setup.max_random_delay_seconds;
    }
    options.fault_seed = setup.seed;
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(options);
    INFO(backend.status().ToString());
    REQUIRE(backend.ok());
    std::lock_guard<std::mutex> lock(mu_);
    busy_seconds_[backend->get()] = setup.busy_seconds;
    return std::move(*backend);
  }

  void Occupy(Backend& backend, Queue queue, double seconds) override {
    REQUIRE(queue.kind() != QueueKind::kCompute);  // CPU compute queues are the caller's thread
    {
      std::lock_guard<std::mutex> lock(mu_);
      REQUIRE(busy_seconds_[&backend] == seconds);
    }
    // Static: queued copies may outlive the test case's buffers, never these.
    static std::uint32_t from = 0, to = 0;
    REQUIRE(backend.CopyAsync(queue, &to, &from, sizeof(from)).ok());
  }

 private:
  std::mutex mu_;
  std::map<const Backend*, double> busy_seconds_;  // by backend made here (addresses may recur)
};

}  // namespace

BackendUnderTest& TheBackendUnderTest() {
  static CpuBackendUnderTest fixture;
  return fixture;
}

}  // namespace pipeoffload::testing
