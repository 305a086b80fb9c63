// The optimizer-offload engine (include/pipeoffload/optimizer_offload.h) on a backend, written
// once for every backend (offload_engine_backend.h: the CPU backend with injected copy delays in
// optim_offload_tests, CI; a CUDA backend in optim_gpu_tests): every mode and share gives the
// bits of a host reference built from AdamUpdateScalar over 20 steps, with gradients in odd cuts,
// clipping active and the last subgroup a GPU one; SetGpuShare between steps keeps them; the
// bf16 parameters are the bf16 of the masters; the caller may overwrite its gradients right
// after AddGradients; a non-finite norm skips the step; bad input changes nothing; the steady
// state allocates nothing. Tags: [offload][engine].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/optim/update_model.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/optimizer_offload.h"
#include "tests/backend/backend_test_util.h"
#include "tests/optim/offload_engine_backend.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::Block;

// 5 full subgroups and a short last one.
constexpr std::int64_t kSubgroup = 4096 + 64;
constexpr std::int64_t kParams = 5 * kSubgroup + 123;
constexpr int kSteps = 20;
constexpr float kLossScale = 1024.0f;

struct Range {
  std::int64_t offset, count;
};
// The backward pass's cut of the gradients: uneven, not on subgroup boundaries, out of order.
const std::vector<Range>& Cut() {
  static const std::vector<Range> cut = {
      {kParams - 7000, 7000}, {3001, kParams - 7000 - 3001}, {0, 3001}};
  return cut;
}

OptimizerOffloadOptions BaseOptions(OffloadMode mode, double share) {
  OptimizerOffloadOptions o;
  o.num_params = kParams;
  o.subgroup_size = kSubgroup;
  o.mode = mode;
  o.gpu_share = share;
  o.adam.learning_rate = 1e-2f;
  o.adam.weight_decay = 0.05f;
  o.max_grad_norm = 0.5;  // active: the random gradients' norm is far larger
  o.cpu.threads = 2;
  o.grad_chunk = 1000;  // several upcast chunks per range: exercises the chunk ring
  o.timeout_seconds = 60.0;
  return o;
}

std::vector<float> InitialParams() {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> p(kParams);
  for (float& x : p) x = normal(rng);
  return p;
}

// Gradients of step t (bf16 bits, already multiplied by the loss scale).
std::vector<std::uint16_t> Gradients(int step) {
  std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> g(kParams);
  for (auto& x : g) x = FloatToBf16Bits(normal(rng) * 0.01f * kLossScale);
  return g;
}

struct Run {
  std::vector<float> param, m, v;
  std::vector<std::uint16_t> bf16;  // the device copy
  std::vector<OptimizerStepResult> results;
};

// A backend with the device buffers an engine works on: the bf16 parameters and gradients.
struct Rig {
  explicit Rig(std::uint64_t seed)
      : backend(testing::NewEngineBackend(seed)),
        bf16(*backend, kParams * 2, /*host=*/false),
        grads(*backend, kParams * 2, /*host=*/false) {}

  std::uint16_t* bf16_params() const { return static_cast<std::uint16_t*>(bf16.get()); }
  std::uint16_t* grad_bits() const { return static_cast<std::uint16_t*>(grads.get()); }

  std::unique_ptr<OptimizerOffload> Create(const OptimizerOffloadOptions& options,
                                           const std::vector<float>& initial) {
    auto engine = OptimizerOffload::Create(*backend, options, initial, {bf16_params(), kParams});
    INFO(engine.status().ToString());
    REQUIRE(engine.ok());
    return std::move(*engine);
  }

  // Copies `host` into `device` through a host block and the H2D queue, waited for (so any later
  // work of any queue sees it).
  void Upload(void* device, const void* host, std::int64_t bytes) {
    Block staging(*backend, bytes, /*host=*/true);
    std::memcpy(staging.get(), host, static_cast<std::size_t>(bytes));
    REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kH2D), device, staging.get(), bytes).ok());
    testing::Drain(*backend, QueueKind::kH2D);
  }
  std::vector<std::uint16_t> DownloadBf16(const std::uint16_t* device) {
    Block staging(*backend, kParams * 2, /*host=*/true);
    REQUIRE(backend->CopyAsync(backend->queue(QueueKind::kD2H), staging.get(), device,
                               kParams * 2)
                .ok());
    testing::Drain(*backend, QueueKind::kD2H);
    const auto* bits = static_cast<const std::uint16_t*>(staging.get());
    return std::vector<std::uint16_t>(bits, bits + kParams);
  }

  // One step's gradients in Cut()'s ranges, then Step.
  absl::StatusOr<OptimizerStepResult> Step(OptimizerOffload& engine, int step) {
    const std::vector<std::uint16_t> g = Gradients(step);
    Upload(grad_bits(), g.data(), kParams * 2);
    for (const Range& r : Cut()) {
      const absl::Status added = engine.AddGradients(grad_bits() + r.offset, r.offset, r.count);
      INFO(added.ToString());
      REQUIRE(added.ok());
    }
    // The caller's next work on its queue may overwrite the gradients at once: +inf bf16s here
    // would make the norm infinite (and the step skipped) if the engine read them later.
    REQUIRE(backend->FillAsync(backend->queue(QueueKind::kCompute), grad_bits(), 0x7F807F80u,
                               kParams * 2 / 4 * 4)  // whole words: all but the odd last one
                .ok());
    return engine.Step(kLossScale);
  }

  void ReadAll(OptimizerOffload& engine, Run& run) {
    run.param.resize(kParams);
    run.m.resize(kParams);
    run.v.resize(kParams);
    REQUIRE(engine.ReadState(0, kParams, run.param.data(), run.m.data(), run.v.data()).ok());
    run.bf16 = DownloadBf16(bf16_params());
  }

  std::unique_ptr<Backend> backend;
  Block bf16;
  Block grads;
};

// PCIe bytes of one update: 12 B/param each way for staged subgroups, a 2 B/param bf16 upload
// for host ones, nothing for resident ones.
void CheckStepBytes(const OptimizerOffload& engine) {
  std::int64_t h2d = 0, d2h = 0;
  const std::vector<SubgroupPlace> places = engine.placement();
  for (std::size_t x = 0; x < places.size(); ++x) {
    const std::int64_t size =
        std::min<std::int64_t>(kSubgroup, kParams - static_cast<std::int64_t>(x) * kSubgroup);
    if (places[x] == SubgroupPlace::kGpuStaged) {
      h2d += 12 * size;
      d2h += 12 * size;
    } else if (places[x] == SubgroupPlace::kCpu) {
      h2d += 2 * size;
    }
  }
  const OptimizerStepStats stats = engine.last_step_stats();
  CHECK(stats.h2d_bytes == h2d);
  CHECK(stats.d2h_bytes == d2h);
}

// The learning rate of step t (1-based): a trainer's schedule. Null: the options' constant.
using RateSchedule = std::function<float(int)>;

Run RunEngine(const OptimizerOffloadOptions& options, std::uint64_t seed,
              const RateSchedule& rate = nullptr) {
  Rig rig(seed);
  auto engine = rig.Create(options, InitialParams());
  const std::int64_t allocations = engine->allocations();
  const BackendStats created = rig.backend->Stats();
  Run run;
  for (int step = 1; step <= kSteps; ++step) {
    if (rate) {
      REQUIRE(engine->SetLearningRate(rate(step)).ok());
      CHECK(engine->options().adam.learning_rate == rate(step));
    }
    auto result = rig.Step(*engine, step);
    INFO(result.status().ToString());
    REQUIRE(result.ok());
    run.results.push_back(*result);
    CheckStepBytes(*engine);
  }
  // The steady state allocates nothing, by the engine's count and by the backend's.
  CHECK(engine->allocations() == allocations);
  CHECK(rig.backend->Stats().device_allocations == created.device_allocations);
  rig.ReadAll(*engine, run);
  // The test's own staging blocks are host allocations; the engine made none after Create.
  CHECK(rig.backend->Stats().device_allocations == created.device_allocations);
  return run;
}

// The same steps on the host with AdamUpdateScalar, the norm as the engine defines it (sum of
// squares per AddGradients range, in call order) and MakeAdamStepScalars.
Run Reference(const OptimizerOffloadOptions& options, int steps = kSteps,
              const RateSchedule& rate = nullptr) {
  Run run;
  run.param = InitialParams();
  run.m.assign(kParams, 0.0f);
  run.v.assign(kParams, 0.0f);
  run.bf16.assign(kParams, 0);
  auto cpu = CpuAdam::Create(CpuAdamOptions{1});
  REQUIRE(cpu.ok());
  std::vector<float> g(kParams);
  for (int step = 1; step <= steps; ++step) {
    const std::vector<std::uint16_t> bits = Gradients(step);
    for (std::int64_t i = 0; i < kParams; ++i)
      g[static_cast<std::size_t>(i)] = Bf16BitsToFloat(bits[static_cast<std::size_t>(i)]);
    double sum = 0.0;
    for (const Range& r : Cut()) sum = sum + (*cpu)->SumOfSquares(g.data() + r.offset, r.count);
    OptimizerStepResult result;
    result.applied = true;
    result.step = step;
    result.grad_norm = std::sqrt(sum) / static_cast<double>(kLossScale);
    result.grad_scale = static_cast<float>(
        ClipCoefficient(result.grad_norm, options.max_grad_norm) / static_cast<double>(kLossScale));
    AdamOptions adam = options.adam;
    if (rate) adam.learning_rate = rate(step);
    const AdamStepScalars scalars = *MakeAdamStepScalars(adam, step, result.grad_scale);
    AdamUpdateScalar(scalars, AdamSpan{run.param.data(), run.m.data(), run.v.data(), g.data(),
                                       run.bf16.data(), kParams});
    run.results.push_back(result);
  }
  return run;
}

std::int64_t FirstDifference(const void* a, const void* b, std::size_t element, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(a) + i * element,
                    static_cast<const char*>(b) + i * element, element) != 0) {
      return static_cast<std::int64_t>(i);
    }
  }
  return -1;
}

void CheckSameBits(const Run& want, const Run& got) {
  CHECK(FirstDifference(want.param.data(), got.param.data(), 4, kParams) == -1);
  CHECK(FirstDifference(want.m.data(), got.m.data(), 4, kParams) == -1);
  CHECK(FirstDifference(want.v.data(), got.v.data(), 4, kParams) == -1);
  CHECK(FirstDifference(want.bf16.data(), got.bf16.data(), 2, kParams) == -1);
  // The device's bf16 parameters are the bf16 of the engine's own masters.
  std::int64_t stale = -1;
  for (std::int64_t i = 0; i < kParams && stale < 0; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (got.bf16[k] != FloatToBf16Bits(got.param[k])) stale = i;
  }
  CHECK(stale == -1);
  REQUIRE(want.results.size() == got.results.size());
  for (std::size_t i = 0; i < want.results.size(); ++i) {
    CAPTURE(i, want.results[i].grad_norm, got.results[i].grad_norm);
    CHECK(got.results[i].applied);
    CHECK(got.results[i].step == want.results[i].step);
    CHECK(std::memcmp(&want.results[i].grad_norm, &got.results[i].grad_norm, 8) == 0);
    CHECK(std::memcmp(&want.results[i].grad_scale, &got.results[i].grad_scale, 4) == 0);
  }
}

TEST_CASE("engine: a per-step learning rate (SetLearningRate) gives the reference's bits",
          "[offload][engine]") {
  // Warm-up over 5 steps, then a linear decay: what a trainer's schedule hands the engine.
  const RateSchedule rate = [](int t) {
    return t <= 5 ? 1e-2f * static_cast<float>(t) / 5.0f
                  : 1e-2f * static_cast<float>(kSteps + 1 - t) / static_cast<float>(kSteps - 4);
  };
  for (const auto& [mode, share] : {std::pair{OffloadMode::kCpu, 0.0},
                                    std::pair{OffloadMode::kInterleaved, 0.5},
                                    std::pair{OffloadMode::kGpu, 1.0}}) {
    CAPTURE(OffloadModeName(mode), share);
    const OptimizerOffloadOptions options = BaseOptions(mode, share);
    CheckSameBits(Reference(options, kSteps, rate), RunEngine(options, 5, rate));
  }
  Rig rig(6);
  auto engine = rig.Create(BaseOptions(OffloadMode::kCpu, 0.0), InitialParams());
  CHECK(engine->SetLearningRate(-1e-3f).code() == absl::StatusCode::kInvalidArgument);
  CHECK(engine->SetLearningRate(std::nanf("")).code() == absl::StatusCode::kInvalidArgument);
  CHECK(engine->options().adam.learning_rate == 1e-2f);  // refused rates change nothing
  CHECK(engine->SetLearningRate(0.0f).ok());
}

TEST_CASE("engine: every mode and share gives the reference's bits over 20 steps",
          "[offload][engine]") {
  const OptimizerOffloadOptions cpu_options = BaseOptions(OffloadMode::kCpu, 0.0);
  const Run want = Reference(cpu_options);
  // The reference's bf16 copy is the bf16 of its master, element by element.
  std::int64_t bad_bf16 = -1;
  for (std::int64_t i = 0; i < kParams && bad_bf16 < 0; ++i) {
    if (want.bf16[static_cast<std::size_t>(i)] !=
        FloatToBf16Bits(want.param[static_cast<std::size_t>(i)]))
      bad_bf16 = i;
  }
  REQUIRE(bad_bf16 == -1);
  // Clipping is active in every step (what the options promise the test exercises).
  for (const OptimizerStepResult& result : want.results) {
    REQUIRE(result.grad_norm > cpu_options.max_grad_norm);
  }

  struct Case {
    OffloadMode mode;
    double share;
  };
  const Case c =
      GENERATE(Case{OffloadMode::kCpu, 0.0}, Case{OffloadMode::kInterleaved, 0.0},
               Case{OffloadMode::kInterleaved, 0.3}, Case{OffloadMode::kInterleaved, 0.5},
               Case{OffloadMode::kInterleaved, 1.0}, Case{OffloadMode::kStatic, 0.25},
               Case{OffloadMode::kStatic, 0.5}, Case{OffloadMode::kGpu, 1.0});
  CAPTURE(testing::EngineBackendKind(), std::string(OffloadModeName(c.mode)), c.share);
  const Run got = RunEngine(BaseOptions(c.mode, c.share),
                            static_cast<std::uint64_t>(c.mode) * 100 +
                                static_cast<std::uint64_t>(c.share * 10));
  CheckSameBits(want, got);
}

TEST_CASE("engine: the last subgroup is a GPU subgroup and is written back every step",
          "[offload][engine]") {
  const double share = GENERATE(0.3, 0.5, 1.0);
  CAPTURE(testing::EngineBackendKind(), share);
  const OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, share);
  Rig rig(static_cast<std::uint64_t>(share * 10) + 7);
  auto engine = rig.Create(options, InitialParams());
  const std::vector<SubgroupPlace> places = engine->placement();
  REQUIRE(places.back() == SubgroupPlace::kGpuStaged);
  // GPU optimizer state is two staging sets at most.
  CHECK(engine->memory().device_state_bytes == 2 * 12 * kSubgroup);
  // After each step the host copy of the LAST subgroup holds exactly that step's state (DOS
  // leaves the last GPU subgroup's update in the staging buffers, never written back).
  const std::int64_t last = 5 * kSubgroup;
  const auto n = static_cast<std::size_t>(kParams - last);
  std::vector<float> p(n), m(n), v(n);
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    REQUIRE(rig.Step(*engine, step).ok());
    REQUIRE(engine->ReadState(last, kParams - last, p.data(), m.data(), v.data()).ok());
    const Run want = Reference(options, step);
    CHECK(FirstDifference(want.param.data() + last, p.data(), 4, n) == -1);
    CHECK(FirstDifference(want.m.data() + last, m.data(), 4, n) == -1);
    CHECK(FirstDifference(want.v.data() + last, v.data(), 4, n) == -1);
    CHECK(std::any_of(m.begin(), m.end(), [](float x) { return x != 0.0f; }));
  }
}

TEST_CASE("engine: a non-finite gradient norm skips the step and changes nothing",
          "[offload][engine]") {
  CAPTURE(testing::EngineBackendKind());
  const OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, 0.5);
  const std::vector<float> initial = InitialParams();
  Rig rig(3);
  auto engine = rig.Create(options, initial);
  std::vector<std::uint16_t> g = Gradients(1);
  g[12345] = 0x7F80;  // +inf (a loss-scale overflow)
  rig.Upload(rig.grad_bits(), g.data(), kParams * 2);
  REQUIRE(engine->AddGradients(rig.grad_bits(), 0, kParams).ok());
  auto skipped = engine->Step(kLossScale);
  REQUIRE(skipped.ok());
  CHECK_FALSE(skipped->applied);
  CHECK(skipped->step == 0);
  CHECK(std::isinf(skipped->grad_norm));
  Run after;
  rig.ReadAll(*engine, after);
  CHECK(FirstDifference(after.param.data(), initial.data(), 4, kParams) == -1);
  CHECK(std::all_of(after.m.begin(), after.m.end(), [](float x) { return x == 0.0f; }));
  // The next step with finite gradients applies as step 1, as if the skipped one never was
  // (the norm accumulator was reset too).
  auto applied = rig.Step(*engine, 1);
  REQUIRE(applied.ok());
  CHECK(applied->applied);
  CHECK(applied->step == 1);
  const Run want = Reference(options, 1);
  CHECK(std::memcmp(&want.results[0].grad_norm, &applied->grad_norm, 8) == 0);
  rig.ReadAll(*engine, after);
  CHECK(FirstDifference(want.param.data(), after.param.data(), 4, kParams) == -1);
}

TEST_CASE("engine: bad input is rejected and writes nothing", "[offload][engine]") {
  CAPTURE(testing::EngineBackendKind());
  const std::vector<float> initial = InitialParams();
  Rig rig(4);
  const std::vector<std::uint16_t> poison(kParams, 0xABAB);
  rig.Upload(rig.bf16_params(), poison.data(), kParams * 2);

  OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, 0.5);
  SECTION("Create errors leave the device parameters and the backend alone") {
    const BackendStats before = rig.backend->Stats();
    OptimizerOffloadOptions bad = options;
    bad.subgroup_size = 0;
    auto r = OptimizerOffload::Create(*rig.backend, bad, initial, {rig.bf16_params(), kParams});
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    bad = options;
    bad.host_memory_limit_bytes = 1000;
    r = OptimizerOffload::Create(*rig.backend, bad, initial, {rig.bf16_params(), kParams});
    CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(r.status().message().find("1000") != std::string_view::npos);
    r = OptimizerOffload::Create(*rig.backend, options, {initial.data(), kParams - 1},
                                 {rig.bf16_params(), kParams});
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    r = OptimizerOffload::Create(*rig.backend, options, initial, {rig.bf16_params(), kParams + 1});
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    const BackendStats after = rig.backend->Stats();
    CHECK(after.device_allocations == before.device_allocations);
    CHECK(after.host_allocations == before.host_allocations);
    CHECK(after.copies == before.copies);
    CHECK(rig.DownloadBf16(rig.bf16_params()) == poison);
  }
  SECTION("gradient and step errors leave the state alone") {
    auto engine = rig.Create(options, initial);
    OptimizerOffload& e = *engine;
    std::uint16_t* grads = rig.grad_bits();
    CHECK(e.AddGradients(grads, kParams - 10, 11).code() == absl::StatusCode::kInvalidArgument);
    CHECK(e.AddGradients(grads, -1, 10).code() == absl::StatusCode::kInvalidArgument);
    CHECK(e.AddGradients(grads, 0, 0).code() == absl::StatusCode::kInvalidArgument);
    CHECK(e.AddGradients(nullptr, 0, 10).code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(e.AddGradients(grads, 100, 50).ok());
    for (const Range& overlapping : {Range{120, 100}, Range{50, 51}, Range{100, 50}}) {
      const absl::Status overlap = e.AddGradients(grads, overlapping.offset, overlapping.count);
      CAPTURE(overlapping.offset, overlapping.count, overlap.ToString());
      CHECK(overlap.code() == absl::StatusCode::kInvalidArgument);
      CHECK(overlap.message().find("overlap") != std::string_view::npos);
    }
    REQUIRE(e.AddGradients(grads, 150, 10).ok());  // adjacent ranges do not overlap
    const auto early = e.Step(kLossScale);
    CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(early.status().message().find("subgroup 0") != std::string_view::npos);
    CHECK(e.SetGpuShare(0.2).code() == absl::StatusCode::kFailedPrecondition);  // grads pending
    for (float bad_scale : {0.0f, -1.0f, std::nanf(""), INFINITY}) {
      CAPTURE(bad_scale);
      CHECK(e.Step(bad_scale).status().code() == absl::StatusCode::kInvalidArgument);
    }
    CHECK(e.ReadState(kParams, 1, nullptr, nullptr, nullptr).code() ==
          absl::StatusCode::kInvalidArgument);
    Run state;
    rig.ReadAll(e, state);
    CHECK(FirstDifference(state.param.data(), initial.data(), 4, kParams) == -1);
    for (std::int64_t i = 0; i < kParams; ++i) {
      if (state.bf16[static_cast<std::size_t>(i)] !=
          FloatToBf16Bits(initial[static_cast<std::size_t>(i)])) {
        FAIL("bf16 parameter " << i << " is not the bf16 of the initial master");
      }
    }
  }
  SECTION("SetGpuShare beyond max_gpu_share, or in another mode, is refused") {
    auto engine = rig.Create(options, initial);
    CHECK(engine->SetGpuShare(0.9).code() == absl::StatusCode::kInvalidArgument);
    CHECK(engine->SetGpuShare(-0.1).code() == absl::StatusCode::kInvalidArgument);
    CHECK(engine->SetGpuShare(0.2).ok());
    engine.reset();
    auto cpu_engine = rig.Create(BaseOptions(OffloadMode::kCpu, 0.0), initial);
    CHECK(cpu_engine->SetGpuShare(0.2).code() == absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("engine: SetGpuShare between steps keeps the reference's bits", "[offload][engine]") {
  CAPTURE(testing::EngineBackendKind());
  OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, 0.0);
  options.max_gpu_share = 1.0;
  const Run want = Reference(options);
  Rig rig(5);
  auto engine = rig.Create(options, InitialParams());
  const std::int64_t allocations = engine->allocations();
  Run got;
  for (int step = 1; step <= kSteps; ++step) {
    const double share = (step % 11) / 10.0;  // 0.1 .. 1.0, 0 again
    REQUIRE(engine->SetGpuShare(share).ok());
    auto result = rig.Step(*engine, step);
    REQUIRE(result.ok());
    got.results.push_back(*result);
    CHECK(engine->last_step_stats().gpu_staged_subgroups ==
          static_cast<int>(SubgroupsForShare(engine->num_subgroups(), share)));
    CheckStepBytes(*engine);
  }
  CHECK(engine->allocations() == allocations);
  rig.ReadAll(*engine, got);
  CheckSameBits(want, got);
}

}  // namespace
}  // namespace pipeoffload
