// The update-rate calibration (lib/optim/update_calibration.h) on the CPU backend, where what a
// GPU cannot show is controlled: a fixed delay before every copy (CpuBackendOptions) bounds the
// copy rates from above, and a wrapper (GatedBackend) that counts live blocks and events and
// fails the k-th allocation proves every path gives everything back. Tags: [offload][calibrate].
#include <cstdint>
#include <memory>
#include <string>

#include "lib/optim/update_calibration.h"
#include "pipeoffload/backend.h"
#include "tests/backend/backend_test_util.h"
#include "tests/backend/gated_backend.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

constexpr std::int64_t kParams = 8192 + 11;

CalibrationOptions SmallOptions() {
  CalibrationOptions o;
  o.params = kParams;
  o.repeats = 3;
  o.cpu.threads = 1;
  return o;
}

TEST_CASE("calibration: copy rates reflect a fixed delay before every copy",
          "[offload][calibrate]") {
  // Each copy rate is two copies of one fp32 buffer over the seconds between events around
  // them on their queue; with d before each copy those seconds are >= 2 d, so the rate is
  // <= buffer / d (about 16 MB/s here, where a plain memcpy of the 32 KB buffer would give GB/s:
  // timing the enqueue, or the host's return from CopyAsync, instead fails this).
  constexpr double kDelay = 0.002;
  CpuBackendOptions options;
  options.min_copy_delay_seconds = kDelay;
  options.max_copy_delay_seconds = kDelay;
  const std::unique_ptr<Backend> backend = testing::NewCpuBackend(options);
  const absl::StatusOr<UpdateRates> rates = CalibrateUpdateRates(*backend, SmallOptions());
  INFO(rates.status().ToString());
  REQUIRE(rates.ok());
  INFO(FormatUpdateRates(*rates));
  const double bound = 4.0 * static_cast<double>(kParams) / kDelay;
  CHECK(rates->h2d <= bound);
  CHECK(rates->d2h <= bound);
  CHECK(rates->h2d_duplex <= bound);
  CHECK(rates->d2h_duplex <= bound);
}

TEST_CASE("calibration: a failed allocation at any point leaves nothing allocated",
          "[offload][calibrate]") {
  const std::unique_ptr<Backend> cpu = testing::NewCpuBackend();
  testing::GatedBackend backend(*cpu);
  // 15 buffers (update_calibration_test.cc checks the count): fail each in turn, then none.
  constexpr int kBuffers = 15;
  for (int k = 0; k < kBuffers; ++k) {
    INFO("allocation " << k << " fails");
    backend.FailAllocationsAfter(k);
    const absl::StatusOr<UpdateRates> rates = CalibrateUpdateRates(backend, SmallOptions());
    INFO(rates.status().ToString());
    CHECK(rates.status().code() == absl::StatusCode::kResourceExhausted);
    const std::string message(rates.status().message());
    CHECK(message.rfind("calibration: cannot allocate ", 0) == 0);
    CHECK(message.find("gated backend: injected failure") != std::string::npos);
    if (k == 0) {
      CHECK(message.find("allocate 32812 bytes (32.81 kB) of host memory for host fp32 params: ") !=
            std::string::npos);
    }
    if (k == kBuffers - 1) {
      CHECK(message.find("of device memory for sum-of-squares partials: ") != std::string::npos);
    }
    CHECK(backend.live_device_blocks() == 0);
    CHECK(backend.live_host_blocks() == 0);
    CHECK(backend.live_events() == 0);
  }
  backend.FailAllocationsAfter(-1);
  const absl::StatusOr<UpdateRates> rates = CalibrateUpdateRates(backend, SmallOptions());
  INFO(rates.status().ToString());
  CHECK(rates.ok());
  CHECK(backend.live_device_blocks() == 0);
  CHECK(backend.live_host_blocks() == 0);
  CHECK(backend.live_events() == 0);
}

}  // namespace
}  // namespace pipeoffload
