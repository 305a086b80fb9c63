// The update-rate calibration (lib/optim/update_calibration.h) on a backend, written once for
// every backend (offload_engine_backend.h: the CPU backend with injected copy delays in
// optim_offload_tests, a CUDA backend in optim_gpu_tests): every rate is finite and > 0, the
// memory comes from the backend (exactly its 8 device and 7 host buffers, nothing outside it),
// a second calibration on the same backend works as the first, and bad options are refused
// before anything is allocated. Tags: [offload][calibrate].
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "lib/optim/update_calibration.h"
#include "lib/optim/update_model.h"
#include "pipeoffload/backend.h"
#include "tests/optim/offload_engine_backend.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

// Odd, and not a multiple of the sum's 8192-element block: the bf16 arrays' rounding to whole
// fill words and the short last block are both exercised.
constexpr std::int64_t kParams = 3 * 8192 + 1001;

CalibrationOptions SmallOptions() {
  CalibrationOptions o;
  o.params = kParams;
  o.repeats = 3;
  o.cpu.threads = 2;
  return o;
}

void CheckFinitePositive(const UpdateRates& r) {
  const struct {
    const char* name;
    double value;
  } fields[] = {{"cpu_adam", r.cpu_adam},       {"cpu_adam_with_pcie", r.cpu_adam_with_pcie},
                {"gpu_adam", r.gpu_adam},       {"h2d", r.h2d},
                {"d2h", r.d2h},                 {"h2d_duplex", r.h2d_duplex},
                {"d2h_duplex", r.d2h_duplex},   {"upcast", r.upcast},
                {"pcie_factor_with_cpu", r.pcie_factor_with_cpu}};
  for (const auto& field : fields) {
    INFO(field.name << " = " << field.value);
    CHECK(std::isfinite(field.value));
    CHECK(field.value > 0.0);
  }
  CHECK(r.pcie_factor_with_cpu <= 1.0);
  CHECK(CheckUpdateRates(r).ok());
}

TEST_CASE("calibration: every rate finite and > 0, its buffers the backend's",
          "[offload][calibrate]") {
  INFO("backend " << testing::EngineBackendKind());
  const std::unique_ptr<Backend> backend = testing::NewEngineBackend(7);
  for (int run = 0; run < 2; ++run) {  // the second finds nothing left over from the first
    INFO("run " << run);
    const BackendStats before = backend->Stats();
    absl::StatusOr<UpdateRates> rates = CalibrateUpdateRates(*backend, SmallOptions());
    INFO(rates.status().ToString());
    REQUIRE(rates.ok());
    INFO(FormatUpdateRates(*rates));
    CheckFinitePositive(*rates);
    // p, m, v, grads and a copy buffer each way, in fp32, plus bf16: 7 host arrays; the same 7
    // on the device and the sum's partials. All of it through the backend (pinned on CUDA).
    const BackendStats after = backend->Stats();
    CHECK(after.host_allocations - before.host_allocations == 7);
    CHECK(after.device_allocations - before.device_allocations == 8);
    // Every copy moves one fp32 buffer on the H2D or D2H queue: per direction the warm-up's 1,
    // 4 per repeat alone and in duplex, then per repeat at least 2 under CpuAdam (as many as
    // outlast it), the 1 that drains them and 2 beside CpuAdam's thread: >= 1 + 9 * repeats.
    const std::int64_t buffer = 4 * kParams;
    for (const std::int64_t moved :
         {after.bytes_h2d - before.bytes_h2d, after.bytes_d2h - before.bytes_d2h}) {
      INFO(moved << " bytes in one direction");
      CHECK(moved % buffer == 0);
      CHECK(moved >= (1 + 9 * SmallOptions().repeats) * buffer);
    }
  }
}

TEST_CASE("calibration: bad options are refused before any allocation", "[offload][calibrate]") {
  const std::unique_ptr<Backend> backend = testing::NewEngineBackend(3);
  const BackendStats before = backend->Stats();
  struct Case {
    std::int64_t params;
    int repeats;
    std::string message;
  };
  const Case cases[] = {
      {0, 3, "calibration: params = 0 must be in (0, 1099511627776] (kMaxCalibrationParams)"},
      {-5, 3, "calibration: params = -5 must be in (0, 1099511627776]"},
      {kMaxCalibrationParams + 1, 3, "calibration: params = 1099511627777 must be in (0, "},
      {kParams, 0, "calibration: repeats = 0 must be > 0"},
      {kParams, -1, "calibration: repeats = -1 must be > 0"},
  };
  for (const Case& c : cases) {
    CalibrationOptions o = SmallOptions();
    o.params = c.params;
    o.repeats = c.repeats;
    const absl::StatusOr<UpdateRates> rates = CalibrateUpdateRates(*backend, o);
    INFO(rates.status().ToString());
    CHECK(rates.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(rates.status().message()).find(c.message) != std::string::npos);
  }
  // CpuAdam's own check, reached before the backend is touched.
  CalibrationOptions o = SmallOptions();
  o.cpu.threads = -1;
  const absl::StatusOr<UpdateRates> rates = CalibrateUpdateRates(*backend, o);
  INFO(rates.status().ToString());
  CHECK(rates.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(rates.status().message()).rfind("calibration: ", 0) == 0);
  const BackendStats after = backend->Stats();
  CHECK(after.host_allocations == before.host_allocations);
  CHECK(after.device_allocations == before.device_allocations);
  CHECK(after.copies == before.copies);
}

}  // namespace
}  // namespace pipeoffload
