// The optimizer-offload engine on a GPU (include/pipeoffload/optimizer_offload.h): every mode
// and share gives the bits of a host reference built from AdamUpdateScalar, over 20 steps, with
// the last subgroup a GPU one; the bf16 parameters on the device are the bf16 of the masters;
// and bad input leaves everything untouched. Tags: [gpuadam][engine].
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/backend/cuda/cuda_check.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/optimizer_offload.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

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

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { PO_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); }
  ~DeviceBuffer() { PO_CUDA_CHECK(cudaFree(ptr_)); }
  std::uint16_t* u16() const { return static_cast<std::uint16_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

void ReadAll(OptimizerOffload& engine, const DeviceBuffer& bf16, Run& run) {
  run.param.resize(kParams);
  run.m.resize(kParams);
  run.v.resize(kParams);
  run.bf16.resize(kParams);
  REQUIRE(engine.ReadState(0, kParams, run.param.data(), run.m.data(), run.v.data()).ok());
  PO_CUDA_CHECK(cudaMemcpy(run.bf16.data(), bf16.u16(), kParams * 2, cudaMemcpyDeviceToHost));
}

Run RunEngine(const OptimizerOffloadOptions& options) {
  const std::vector<float> initial = InitialParams();
  DeviceBuffer bf16(kParams * 2);
  DeviceBuffer grads(kParams * 2);
  cudaStream_t stream = nullptr;
  PO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto engine = OptimizerOffload::Create(options, initial, {bf16.u16(), kParams});
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  const std::int64_t allocations = (*engine)->allocations();
  Run run;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<std::uint16_t> g = Gradients(step);
    PO_CUDA_CHECK(
        cudaMemcpyAsync(grads.u16(), g.data(), kParams * 2, cudaMemcpyHostToDevice, stream));
    for (const Range& r : Cut()) {
      const absl::Status added =
          (*engine)->AddGradients(grads.u16() + r.offset, r.offset, r.count, stream);
      INFO(added.ToString());
      REQUIRE(added.ok());
    }
    auto result = (*engine)->Step(kLossScale, stream);
    INFO(result.status().ToString());
    REQUIRE(result.ok());
    run.results.push_back(*result);
    PO_CUDA_CHECK(cudaStreamSynchronize(stream));
    // PCIe bytes of the update: 12 B/param each way for staged subgroups, a 2 B/param bf16
    // upload for host ones, nothing for resident ones.
    std::int64_t h2d = 0, d2h = 0;
    const std::vector<SubgroupPlace> places = (*engine)->placement();
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
    const OptimizerStepStats stats = (*engine)->last_step_stats();
    CHECK(stats.h2d_bytes == h2d);
    CHECK(stats.d2h_bytes == d2h);
    CHECK(stats.update_seconds > 0.0);
  }
  CHECK((*engine)->allocations() == allocations);  // the steady state allocates nothing
  ReadAll(**engine, bf16, run);
  PO_CUDA_CHECK(cudaStreamDestroy(stream));
  return run;
}

// The same 20 steps on the host with AdamUpdateScalar, the norm as the engine defines it (sum of
// squares per AddGradients range, in call order) and MakeAdamStepScalars.
Run Reference(const OptimizerOffloadOptions& options, int steps = kSteps) {
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
    const AdamStepScalars scalars = *MakeAdamStepScalars(options.adam, step, result.grad_scale);
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

TEST_CASE("every mode and share gives the reference's bits over 20 steps", "[gpuadam][engine]") {
  const OptimizerOffloadOptions cpu_options = BaseOptions(OffloadMode::kCpu, 0.0);
  const Run want = Reference(cpu_options);
  // The bf16 copy must be the bf16 of the master, element by element.
  std::int64_t bad_bf16 = -1;
  for (std::int64_t i = 0; i < kParams && bad_bf16 < 0; ++i) {
    if (want.bf16[static_cast<std::size_t>(i)] !=
        FloatToBf16Bits(want.param[static_cast<std::size_t>(i)]))
      bad_bf16 = i;
  }
  REQUIRE(bad_bf16 == -1);

  struct Case {
    OffloadMode mode;
    double share;
  };
  const Case c =
      GENERATE(Case{OffloadMode::kCpu, 0.0}, Case{OffloadMode::kInterleaved, 0.0},
               Case{OffloadMode::kInterleaved, 0.3}, Case{OffloadMode::kInterleaved, 0.5},
               Case{OffloadMode::kInterleaved, 1.0}, Case{OffloadMode::kStatic, 0.25},
               Case{OffloadMode::kStatic, 0.5}, Case{OffloadMode::kGpu, 1.0});
  CAPTURE(std::string(OffloadModeName(c.mode)), c.share);
  const OptimizerOffloadOptions options = BaseOptions(c.mode, c.share);
  const Run got = RunEngine(options);
  CheckSameBits(want, got);
}

TEST_CASE("the last subgroup is a GPU subgroup and is written back every step",
          "[gpuadam][engine]") {
  const double share = GENERATE(0.3, 0.5, 1.0);
  CAPTURE(share);
  const OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, share);
  const std::vector<float> initial = InitialParams();
  DeviceBuffer bf16(kParams * 2);
  auto engine = OptimizerOffload::Create(options, initial, {bf16.u16(), kParams});
  REQUIRE(engine.ok());
  const std::vector<SubgroupPlace> places = (*engine)->placement();
  REQUIRE(places.back() == SubgroupPlace::kGpuStaged);
  // GPU optimizer state is two staging sets at most.
  CHECK((*engine)->memory().device_state_bytes == 2 * 12 * kSubgroup);
  // After each step the host copy of the LAST subgroup holds exactly that step's state (DOS
  // leaves the last GPU subgroup's update in the staging buffers, never written back).
  DeviceBuffer grads(kParams * 2);
  const std::int64_t last = 5 * kSubgroup;
  const auto n = static_cast<std::size_t>(kParams - last);
  std::vector<float> p(n), m(n), v(n);
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    const std::vector<std::uint16_t> g = Gradients(step);
    PO_CUDA_CHECK(cudaMemcpy(grads.u16(), g.data(), kParams * 2, cudaMemcpyHostToDevice));
    for (const Range& r : Cut()) {
      REQUIRE((*engine)->AddGradients(grads.u16() + r.offset, r.offset, r.count, nullptr).ok());
    }
    REQUIRE((*engine)->Step(kLossScale).ok());
    REQUIRE((*engine)->ReadState(last, kParams - last, p.data(), m.data(), v.data()).ok());
    const Run want = Reference(options, step);
    CHECK(FirstDifference(want.param.data() + last, p.data(), 4, n) == -1);
    CHECK(FirstDifference(want.m.data() + last, m.data(), 4, n) == -1);
    CHECK(FirstDifference(want.v.data() + last, v.data(), 4, n) == -1);
    CHECK(std::any_of(m.begin(), m.end(), [](float x) { return x != 0.0f; }));
  }
}

TEST_CASE("a non-finite gradient norm skips the step and changes nothing", "[gpuadam][engine]") {
  const OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, 0.5);
  const std::vector<float> initial = InitialParams();
  DeviceBuffer bf16(kParams * 2);
  DeviceBuffer grads(kParams * 2);
  auto engine = OptimizerOffload::Create(options, initial, {bf16.u16(), kParams});
  REQUIRE(engine.ok());
  std::vector<std::uint16_t> g = Gradients(1);
  g[12345] = 0x7F80;  // +inf (a loss-scale overflow)
  PO_CUDA_CHECK(cudaMemcpy(grads.u16(), g.data(), kParams * 2, cudaMemcpyHostToDevice));
  REQUIRE((*engine)->AddGradients(grads.u16(), 0, kParams, nullptr).ok());
  auto skipped = (*engine)->Step(kLossScale);
  REQUIRE(skipped.ok());
  CHECK_FALSE(skipped->applied);
  CHECK(skipped->step == 0);
  Run after;
  ReadAll(**engine, bf16, after);
  CHECK(FirstDifference(after.param.data(), initial.data(), 4, kParams) == -1);
  CHECK(std::all_of(after.m.begin(), after.m.end(), [](float x) { return x == 0.0f; }));
  // The next step with finite gradients applies as step 1.
  g = Gradients(1);
  PO_CUDA_CHECK(cudaMemcpy(grads.u16(), g.data(), kParams * 2, cudaMemcpyHostToDevice));
  REQUIRE((*engine)->AddGradients(grads.u16(), 0, kParams, nullptr).ok());
  auto applied = (*engine)->Step(kLossScale);
  REQUIRE(applied.ok());
  CHECK(applied->applied);
  CHECK(applied->step == 1);
}

TEST_CASE("bad input to the engine is rejected and writes nothing", "[gpuadam][engine]") {
  const std::vector<float> initial = InitialParams();
  DeviceBuffer bf16(kParams * 2);
  DeviceBuffer grads(kParams * 2);
  PO_CUDA_CHECK(cudaMemset(bf16.u16(), 0xAB, kParams * 2));
  std::vector<std::uint16_t> before(kParams), after(kParams);
  PO_CUDA_CHECK(cudaMemcpy(before.data(), bf16.u16(), kParams * 2, cudaMemcpyDeviceToHost));

  OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, 0.5);
  SECTION("Create errors leave the device parameters alone") {
    OptimizerOffloadOptions bad = options;
    bad.subgroup_size = 0;
    CHECK(OptimizerOffload::Create(bad, initial, {bf16.u16(), kParams}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    bad = options;
    bad.host_memory_limit_bytes = 1000;
    const auto small = OptimizerOffload::Create(bad, initial, {bf16.u16(), kParams});
    CHECK(small.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(small.status().message().find("1000") != std::string_view::npos);
    CHECK(OptimizerOffload::Create(options, {initial.data(), kParams - 1}, {bf16.u16(), kParams})
              .status()
              .code() == absl::StatusCode::kInvalidArgument);
    CHECK(OptimizerOffload::Create(options, initial, {bf16.u16(), kParams + 1}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    PO_CUDA_CHECK(cudaMemcpy(after.data(), bf16.u16(), kParams * 2, cudaMemcpyDeviceToHost));
    CHECK(before == after);
  }
  SECTION("gradient and step errors leave the state alone") {
    auto engine = OptimizerOffload::Create(options, initial, {bf16.u16(), kParams});
    REQUIRE(engine.ok());
    OptimizerOffload& e = **engine;
    CHECK(e.AddGradients(grads.u16(), kParams - 10, 11, nullptr).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(e.AddGradients(nullptr, 0, 10, nullptr).code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(e.AddGradients(grads.u16(), 100, 50, nullptr).ok());
    const absl::Status overlap = e.AddGradients(grads.u16(), 120, 100, nullptr);
    CHECK(overlap.code() == absl::StatusCode::kInvalidArgument);
    CHECK(overlap.message().find("overlap") != std::string_view::npos);
    const auto early = e.Step(kLossScale);
    CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(e.SetGpuShare(0.2).code() == absl::StatusCode::kFailedPrecondition);  // grads pending
    CHECK(e.Step(0.0f).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(e.ReadState(kParams, 1, nullptr, nullptr, nullptr).code() ==
          absl::StatusCode::kInvalidArgument);
    Run state;
    ReadAll(e, bf16, state);
    CHECK(FirstDifference(state.param.data(), initial.data(), 4, kParams) == -1);
    for (std::int64_t i = 0; i < kParams; ++i) {
      if (state.bf16[static_cast<std::size_t>(i)] !=
          FloatToBf16Bits(initial[static_cast<std::size_t>(i)])) {
        FAIL("bf16 parameter " << i << " is not the bf16 of the initial master");
      }
    }
  }
  SECTION("SetGpuShare beyond max_gpu_share is refused") {
    auto engine = OptimizerOffload::Create(options, initial, {bf16.u16(), kParams});
    REQUIRE(engine.ok());
    CHECK((*engine)->SetGpuShare(0.9).code() == absl::StatusCode::kInvalidArgument);
    CHECK((*engine)->SetGpuShare(0.2).ok());
  }
}

TEST_CASE("SetGpuShare between steps keeps the reference's bits", "[gpuadam][engine]") {
  OptimizerOffloadOptions options = BaseOptions(OffloadMode::kInterleaved, 0.0);
  options.max_gpu_share = 1.0;
  const Run want = Reference(options);
  const std::vector<float> initial = InitialParams();
  DeviceBuffer bf16(kParams * 2);
  DeviceBuffer grads(kParams * 2);
  auto engine = OptimizerOffload::Create(options, initial, {bf16.u16(), kParams});
  REQUIRE(engine.ok());
  Run got;
  for (int step = 1; step <= kSteps; ++step) {
    REQUIRE((*engine)->SetGpuShare((step % 11) / 10.0).ok());  // 0.1 .. 1.0, 0 again
    const std::vector<std::uint16_t> g = Gradients(step);
    PO_CUDA_CHECK(cudaMemcpy(grads.u16(), g.data(), kParams * 2, cudaMemcpyHostToDevice));
    for (const Range& r : Cut())
      REQUIRE((*engine)->AddGradients(grads.u16() + r.offset, r.offset, r.count, nullptr).ok());
    auto result = (*engine)->Step(kLossScale);
    REQUIRE(result.ok());
    got.results.push_back(*result);
  }
  ReadAll(**engine, bf16, got);
  CheckSameBits(want, got);
}

}  // namespace
}  // namespace pipeoffload
