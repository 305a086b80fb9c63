// The update-phase model (lib/optim/update_model.h): placement, hand-computed timelines,
// invariances and bounds, and the optimality of the chosen share. Tags: [gpuadam][model].
#include "lib/optim/update_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using Catch::Approx;

constexpr double kInf = std::numeric_limits<double>::infinity();

// One param of state per second on every engine: a subgroup of one parameter moves its 12 state
// bytes in 1 s, its 2 bf16 bytes in 1/6 s; the GPU is free.
UpdateRates UnitRates() {
  UpdateRates r;
  r.cpu_adam = 1.0;
  r.cpu_adam_with_pcie = 1.0;
  r.gpu_adam = kInf;
  r.h2d = r.d2h = r.h2d_duplex = r.d2h_duplex = 12.0;
  r.pcie_factor_with_cpu = 1.0;
  r.upcast = kInf;
  return r;
}

UpdatePrediction Predict(const UpdateRates& rates, std::int64_t params, std::int64_t subgroup,
                         OffloadMode mode, double share) {
  auto p = PredictUpdate(rates, SubgroupLayout{params, subgroup}, mode, share);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *p;
}

TEST_CASE("SpreadEvenly marks k of n evenly, the last one included", "[gpuadam][model]") {
  CHECK(SpreadEvenly(4, 2) == std::vector<bool>{false, true, false, true});
  CHECK(SpreadEvenly(5, 2) == std::vector<bool>{false, false, true, false, true});
  CHECK(SpreadEvenly(3, 0) == std::vector<bool>{false, false, false});
  CHECK(SpreadEvenly(3, 3) == std::vector<bool>{true, true, true});
  for (std::int64_t n = 1; n <= 40; ++n) {
    for (std::int64_t k = 0; k <= n; ++k) {
      CAPTURE(n, k);
      const std::vector<bool> marked = SpreadEvenly(n, k);
      REQUIRE(std::count(marked.begin(), marked.end(), true) == k);
      if (k > 0) CHECK(marked.back());
      // Gaps between consecutive marks differ by at most one (even spacing).
      std::vector<std::int64_t> gaps;
      std::int64_t last = -1;
      for (std::int64_t i = 0; i < n; ++i) {
        if (marked[static_cast<std::size_t>(i)]) {
          gaps.push_back(i - last);
          last = i;
        }
      }
      if (!gaps.empty()) {
        const auto [lo, hi] = std::minmax_element(gaps.begin(), gaps.end());
        CHECK(*hi - *lo <= 1);
      }
    }
  }
}

TEST_CASE("shares round to whole subgroups and place like the engine", "[gpuadam][model]") {
  CHECK(SubgroupsForShare(10, 0.3) == 3);
  CHECK(SubgroupsForShare(6, 0.3) == 2);  // 1.8
  CHECK(SubgroupsForShare(3, 0.5) == 2);  // 1.5: halves away from zero
  CHECK(SubgroupsForShare(7, 1.0) == 7);
  using P = SubgroupPlace;
  CHECK(PlaceSubgroups(OffloadMode::kStatic, 4, 0.5) ==
        std::vector<P>{P::kCpu, P::kCpu, P::kGpuResident, P::kGpuResident});
  CHECK(PlaceSubgroups(OffloadMode::kInterleaved, 4, 0.5) ==
        std::vector<P>{P::kCpu, P::kGpuStaged, P::kCpu, P::kGpuStaged});
  CHECK(PlaceSubgroups(OffloadMode::kCpu, 2, 0.7) == std::vector<P>{P::kCpu, P::kCpu});
  CHECK(PlaceSubgroups(OffloadMode::kGpu, 2, 0.0) ==
        std::vector<P>{P::kGpuResident, P::kGpuResident});
}

TEST_CASE("hand-computed timelines", "[gpuadam][model]") {
  SECTION("cpu only: three CPU updates, the last upload drains") {
    // C0 [0,1] C1 [1,2] C2 [2,3]; U_i = 2 B / 12 B/s after C_i; U2 ends at 3 + 1/6.
    const UpdatePrediction p = Predict(UnitRates(), 3, 1, OffloadMode::kCpu, 0.0);
    CHECK(p.seconds == Approx(19.0 / 6.0).epsilon(1e-12));
    CHECK(p.cpu_busy_seconds == Approx(3.0).epsilon(1e-12));
    CHECK(p.h2d_busy_seconds == Approx(0.5).epsilon(1e-12));
    CHECK(p.h2d_bytes == 6.0);
    CHECK(p.d2h_bytes == 0.0);
    CHECK(p.gpu_subgroups == 0);
    CHECK(p.gpu_state_bytes == 0.0);
  }
  SECTION("all staged, links as fast in duplex: start-up 1 s, then one subgroup per second") {
    // P0 [0,1]; W0 and P1 [1,2]; W1 and P2 [2,3]; W2 [3,4].
    const UpdatePrediction p = Predict(UnitRates(), 3, 1, OffloadMode::kInterleaved, 1.0);
    CHECK(p.seconds == Approx(4.0).epsilon(1e-12));
    CHECK(p.h2d_bytes == 36.0);
    CHECK(p.d2h_bytes == 36.0);
    CHECK(p.gpu_state_bytes == 24.0);  // two staging sets
    CHECK(p.gpu_grad_bytes == 12.0);
  }
  SECTION("all staged, duplex halves each direction") {
    // P0 alone [0,1]; W0 and P1 share [1,3]; W1 and P2 [3,5]; W2 alone [5,6].
    UpdateRates r = UnitRates();
    r.h2d_duplex = r.d2h_duplex = 6.0;
    const UpdatePrediction p = Predict(r, 3, 1, OffloadMode::kInterleaved, 1.0);
    CHECK(p.seconds == Approx(6.0).epsilon(1e-12));
    CHECK(p.h2d_busy_seconds == Approx(5.0).epsilon(1e-12));
    CHECK(p.d2h_busy_seconds == Approx(5.0).epsilon(1e-12));
  }
  SECTION("C G with an upload sharing the duplex link") {
    // C0 [0,1] and P1 [0,1]; at 1: U0 (2 B at 6 B/s duplex) [1,4/3], W1 moves 2 B by 4/3 then
    // 10 B alone at 12 B/s: ends 4/3 + 5/6 = 13/6.
    UpdateRates r = UnitRates();
    r.h2d_duplex = r.d2h_duplex = 6.0;
    const UpdatePrediction p = Predict(r, 2, 1, OffloadMode::kInterleaved, 0.5);
    CHECK(p.seconds == Approx(13.0 / 6.0).epsilon(1e-12));
  }
  SECTION("C G with DRAM contention: PCIe at half rate while the CPU runs") {
    // P1 at 6 B/s while C0 runs [0,1] (6 B done); then U0 and P1 share 12 B/s: U0 ends at 4/3,
    // P1 has 4 B left, alone at 12 B/s: ends 5/3; W1 [5/3, 8/3].
    UpdateRates r = UnitRates();
    r.pcie_factor_with_cpu = 0.5;
    const UpdatePrediction p = Predict(r, 2, 1, OffloadMode::kInterleaved, 0.5);
    CHECK(p.seconds == Approx(8.0 / 3.0).epsilon(1e-12));
  }
  SECTION("C G with the CPU slowed by PCIe traffic") {
    // C0 at 0.5/s while P1 [0,1] and W1 [1,2] run: ends 2; U0 [2, 13/6].
    UpdateRates r = UnitRates();
    r.cpu_adam_with_pcie = 0.5;
    const UpdatePrediction p = Predict(r, 2, 1, OffloadMode::kInterleaved, 0.5);
    CHECK(p.seconds == Approx(13.0 / 6.0).epsilon(1e-12));
    CHECK(p.cpu_busy_seconds == Approx(2.0).epsilon(1e-12));
  }
  SECTION("static and gpu") {
    UpdateRates r = UnitRates();
    r.gpu_adam = 2.0;
    // C0 [0,1], R1 [0,0.5] on the GPU, U0 [1, 7/6].
    const UpdatePrediction s = Predict(r, 2, 1, OffloadMode::kStatic, 0.5);
    CHECK(s.seconds == Approx(7.0 / 6.0).epsilon(1e-12));
    CHECK(s.gpu_state_bytes == 12.0);
    const UpdatePrediction g = Predict(r, 3, 1, OffloadMode::kGpu, 0.0);
    CHECK(g.seconds == Approx(1.5).epsilon(1e-12));
    CHECK(g.h2d_bytes == 0.0);
  }
  SECTION("uneven last subgroup") {
    // 5 params in subgroups 2, 2, 1, all on the CPU: 5 s of Adam, then the last 2-byte upload.
    const UpdatePrediction p = Predict(UnitRates(), 5, 2, OffloadMode::kCpu, 0.0);
    CHECK(p.seconds == Approx(5.0 + 2.0 / 12.0).epsilon(1e-12));
  }
}

UpdateRates RandomRates(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> f(0.3, 3.0);
  UpdateRates r;
  r.cpu_adam = 3e9 * f(rng);
  r.cpu_adam_with_pcie = r.cpu_adam * std::min(1.0, f(rng) / 3.0 + 0.2);
  r.gpu_adam = 1e11 * f(rng);
  r.h2d = 5e10 * f(rng);
  r.d2h = 5e10 * f(rng);
  r.h2d_duplex = r.h2d * std::min(1.0, 0.5 + f(rng) / 6.0);
  r.d2h_duplex = r.d2h * std::min(1.0, 0.5 + f(rng) / 6.0);
  r.pcie_factor_with_cpu = std::min(1.0, 0.5 + f(rng) / 6.0);
  r.upcast = 2e11 * f(rng);
  return r;
}

TEST_CASE("model invariances and bounds over random rates", "[gpuadam][model]") {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    const UpdateRates r = RandomRates(rng);
    const std::int64_t s = std::int64_t{1} << 24;
    const std::int64_t n = s * (1 + static_cast<std::int64_t>(rng() % 40)) +
                           static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s));
    const double share = static_cast<double>(rng() % 1001) / 1000.0;
    CAPTURE(trial, n, share, FormatUpdateRates(r));
    const UpdatePrediction p = Predict(r, n, s, OffloadMode::kInterleaved, share);
    // Twice every rate: half the time (no fixed latencies in the model).
    UpdateRates fast = r;
    for (double* x : {&fast.cpu_adam, &fast.cpu_adam_with_pcie, &fast.gpu_adam, &fast.h2d,
                      &fast.d2h, &fast.h2d_duplex, &fast.d2h_duplex, &fast.upcast}) {
      *x *= 2.0;
    }
    CHECK(Predict(fast, n, s, OffloadMode::kInterleaved, share).seconds ==
          Approx(p.seconds / 2.0).epsilon(1e-9));
    // Each lane is a lower bound at its best rate; the sum of every task at its worst rate an
    // upper bound.
    const double host = static_cast<double>(n) * (1.0 - p.share);
    const double gpu_params = static_cast<double>(n) - host;
    CHECK(p.seconds >= p.cpu_busy_seconds);
    CHECK(p.cpu_busy_seconds >= host / r.cpu_adam * (1 - 1e-9) - 1.0 * s / r.cpu_adam);
    CHECK(p.seconds >= p.h2d_bytes / r.h2d * (1 - 1e-9));
    CHECK(p.seconds >= p.d2h_bytes / r.d2h * (1 - 1e-9));
    const double serial = (host + 1.0 * s) / r.cpu_adam_with_pcie + gpu_params / r.gpu_adam +
                          p.h2d_bytes / (r.h2d_duplex * r.pcie_factor_with_cpu) +
                          p.d2h_bytes / (r.d2h_duplex * r.pcie_factor_with_cpu);
    CHECK(p.seconds <= serial * (1 + 1e-9));
    // Share 0 is the cpu mode.
    CHECK(Predict(r, n, s, OffloadMode::kInterleaved, 0.0).seconds ==
          Predict(r, n, s, OffloadMode::kCpu, 0.3).seconds);
    // GPU state: two staging sets at most.
    CHECK(p.gpu_state_bytes <= 2.0 * kStateBytesPerParam * static_cast<double>(s));
  }
}

TEST_CASE("cpu-only time grows with the parameter count", "[gpuadam][model]") {
  std::mt19937_64 rng(3);
  const UpdateRates r = RandomRates(rng);
  double previous = 0.0;
  for (std::int64_t n = 1000; n < 200000; n += 7919) {
    const double t = Predict(r, n, 4096, OffloadMode::kCpu, 0.0).seconds;
    CHECK(t > previous);
    previous = t;
  }
}

TEST_CASE("the chosen share is the best of a fine sweep of the model", "[gpuadam][model]") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    const UpdateRates r = RandomRates(rng);
    const std::int64_t s = std::int64_t{1} << 24;
    const std::int64_t n = s * (3 + trial * 5) + 12345;
    CAPTURE(trial, n, FormatUpdateRates(r));
    auto best = BestInterleavedShare(r, SubgroupLayout{n, s});
    REQUIRE(best.ok());
    double sweep_best = kInf;
    for (int i = 0; i <= 1000; ++i) {
      const double t = Predict(r, n, s, OffloadMode::kInterleaved, i / 1000.0).seconds;
      CHECK(best->seconds <= t);
      sweep_best = std::min(sweep_best, t);
    }
    CHECK(best->seconds == sweep_best);
    // The chosen share, predicted again, gives the same time.
    CHECK(Predict(r, n, s, OffloadMode::kInterleaved, best->share).seconds == best->seconds);
  }
}

TEST_CASE("on H200-like rates the model prefers a mixed share", "[gpuadam][model]") {
  // reference/hardware.md: 55 GB/s each way alone, 44.6 in duplex; CPU Adam ~2.8 G/s (DRAM
  // bound); GPU Adam 116 G/s. PCIe and CPU Adam share DRAM: assume 20% off each.
  UpdateRates r;
  r.cpu_adam = 2.8e9;
  r.cpu_adam_with_pcie = 2.24e9;
  r.gpu_adam = 1.16e11;
  r.h2d = r.d2h = 55e9;
  r.h2d_duplex = r.d2h_duplex = 44.6e9;
  r.pcie_factor_with_cpu = 0.8;
  r.upcast = 4e11;
  const SubgroupLayout layout{std::int64_t{2} << 30, std::int64_t{1} << 24};
  auto best = BestInterleavedShare(r, layout);
  REQUIRE(best.ok());
  const UpdatePrediction cpu =
      Predict(r, layout.num_params, layout.subgroup_size, OffloadMode::kCpu, 0.0);
  const UpdatePrediction gpu =
      Predict(r, layout.num_params, layout.subgroup_size, OffloadMode::kInterleaved, 1.0);
  CAPTURE(best->share, best->seconds, cpu.seconds, gpu.seconds);
  CHECK(best->share > 0.1);
  CHECK(best->share < 0.9);
  CHECK(best->seconds < cpu.seconds);
  CHECK(best->seconds < gpu.seconds);
}

TEST_CASE("fitting to two measured steps recovers the scale of each lane", "[gpuadam][model]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    const UpdateRates base = RandomRates(rng);
    std::uniform_real_distribution<double> f(0.2, 5.0);
    const double cpu_scale = f(rng), pcie_scale = f(rng);
    UpdateRates truth = base;
    truth.cpu_adam *= cpu_scale;
    truth.cpu_adam_with_pcie *= cpu_scale;
    for (double* x : {&truth.h2d, &truth.d2h, &truth.h2d_duplex, &truth.d2h_duplex}) {
      *x *= pcie_scale;
    }
    const std::int64_t s = std::int64_t{1} << 24;
    const std::int64_t n = s * (2 + trial) + 777;
    const double cpu_only = Predict(truth, n, s, OffloadMode::kCpu, 0.0).seconds;
    const double staged = Predict(truth, n, s, OffloadMode::kInterleaved, 1.0).seconds;
    auto fit = FitRatesToSteps(base, SubgroupLayout{n, s}, cpu_only, staged);
    INFO(fit.status().ToString());
    REQUIRE(fit.ok());
    CAPTURE(trial, cpu_scale, pcie_scale);
    CHECK(fit->cpu_adam == Approx(truth.cpu_adam).epsilon(1e-6));
    CHECK(fit->cpu_adam_with_pcie == Approx(truth.cpu_adam_with_pcie).epsilon(1e-6));
    CHECK(fit->h2d == Approx(truth.h2d).epsilon(1e-6));
    CHECK(fit->d2h_duplex == Approx(truth.d2h_duplex).epsilon(1e-6));
    CHECK(fit->gpu_adam == base.gpu_adam);
    CHECK(fit->pcie_factor_with_cpu == base.pcie_factor_with_cpu);
    // Every other share is predicted from the fitted rates as from the truth.
    CHECK(Predict(*fit, n, s, OffloadMode::kInterleaved, 0.5).seconds ==
          Approx(Predict(truth, n, s, OffloadMode::kInterleaved, 0.5).seconds).epsilon(1e-6));
  }
  // With a mixed step the contention factor is recovered too.
  for (int trial = 0; trial < 10; ++trial) {
    const UpdateRates base = RandomRates(rng);
    std::uniform_real_distribution<double> f(0.5, 2.0), factor(0.3, 0.95);
    UpdateRates truth = base;
    truth.cpu_adam *= f(rng);
    truth.cpu_adam_with_pcie = truth.cpu_adam * 0.7;
    truth.h2d *= f(rng);
    truth.pcie_factor_with_cpu = factor(rng);
    const std::int64_t s = std::int64_t{1} << 24;
    const std::int64_t n = s * 60 + 4321;
    const MeasuredStep mixed{0.5, Predict(truth, n, s, OffloadMode::kInterleaved, 0.5).seconds};
    UpdateRates start = truth;  // the ratios the fit keeps; levels and factor are off
    start.cpu_adam *= 1.3;
    start.cpu_adam_with_pcie *= 1.3;
    start.h2d *= 0.8;
    start.d2h *= 0.8;
    start.h2d_duplex *= 0.8;
    start.d2h_duplex *= 0.8;
    start.pcie_factor_with_cpu = 0.7;
    auto fit = FitRatesToSteps(
        start, SubgroupLayout{n, s}, Predict(truth, n, s, OffloadMode::kCpu, 0.0).seconds,
        Predict(truth, n, s, OffloadMode::kInterleaved, 1.0).seconds, &mixed);
    INFO(fit.status().ToString());
    REQUIRE(fit.ok());
    CAPTURE(trial, truth.pcie_factor_with_cpu, fit->pcie_factor_with_cpu);
    CHECK(fit->pcie_factor_with_cpu == Approx(truth.pcie_factor_with_cpu).margin(1e-4));
    CHECK(fit->cpu_adam == Approx(truth.cpu_adam).epsilon(1e-4));
    CHECK(fit->h2d == Approx(truth.h2d).epsilon(1e-4));
    for (double share : {0.2, 0.5, 0.8}) {
      CHECK(Predict(*fit, n, s, OffloadMode::kInterleaved, share).seconds ==
            Approx(Predict(truth, n, s, OffloadMode::kInterleaved, share).seconds).epsilon(1e-4));
    }
  }
  const UpdateRates r = UnitRates();
  CHECK(FitRatesToSteps(r, SubgroupLayout{3, 1}, 1e6, 4.0).status().code() ==
        absl::StatusCode::kInvalidArgument);  // 1e6 s is beyond a factor 64
  CHECK(FitRatesToSteps(r, SubgroupLayout{3, 1}, -1.0, 4.0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("bad model input names the field", "[gpuadam][model]") {
  UpdateRates r = UnitRates();
  r.h2d_duplex = 0.0;
  auto p = PredictUpdate(r, SubgroupLayout{10, 1}, OffloadMode::kCpu, 0.0);
  CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(p.status().message().find("h2d_duplex") != std::string_view::npos);
  r = UnitRates();
  r.pcie_factor_with_cpu = 1.5;
  CHECK(PredictUpdate(r, SubgroupLayout{10, 1}, OffloadMode::kCpu, 0.0)
            .status()
            .message()
            .find("pcie_factor_with_cpu") != std::string_view::npos);
  CHECK(PredictUpdate(UnitRates(), SubgroupLayout{10, 0}, OffloadMode::kCpu, 0.0)
            .status()
            .message()
            .find("subgroup_size") != std::string_view::npos);
  CHECK(PredictUpdate(UnitRates(), SubgroupLayout{10, 1}, OffloadMode::kInterleaved, 1.5)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload
