// The engine's plan (byte counts of every buffer, placement) and Create's input errors, which
// come before anything is allocated or queued (checked on a CPU backend's counters).
// Tags: [offload][plan].
#include "lib/optim/offload_plan.h"

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "pipeoffload/backend.h"
#include "pipeoffload/optimizer_offload.h"
#include "tests/backend/backend_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using internal::OffloadPlan;

constexpr std::int64_t kS = 1000;

OptimizerOffloadOptions Options(OffloadMode mode, double share, std::int64_t params) {
  OptimizerOffloadOptions o;
  o.num_params = params;
  o.subgroup_size = kS;
  o.mode = mode;
  o.gpu_share = share;
  o.grad_chunk = 300;
  return o;
}

OffloadPlan Plan(const OptimizerOffloadOptions& o) {
  auto plan = internal::PlanOffload(o);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  return *plan;
}

TEST_CASE("plan byte counts per mode", "[offload][plan]") {
  const std::int64_t n = 10 * kS + 5;  // 11 subgroups, the last of 5
  const std::int64_t partials = 8 * ((n + 8191) / 8192 + 1);
  SECTION("interleaved 0.5: host holds everything, the GPU two staging sets") {
    const OffloadPlan p = Plan(Options(OffloadMode::kInterleaved, 0.5, n));
    CHECK(p.host_params == n);
    CHECK(p.staged_slots == 6);  // round(5.5)
    CHECK(p.pinned_state_bytes == 12 * n);
    CHECK(p.pinned_grad_bytes == 4 * n);
    CHECK(p.pinned_upload_bytes == internal::kUploadSlots * 2 * kS);
    CHECK(p.device_state_bytes == 2 * 12 * kS);
    CHECK(p.device_grad_bytes == 6 * 4 * kS);
    CHECK(p.device_scratch_bytes == 2 * 4 * 300 + partials);
  }
  SECTION("max_gpu_share sizes the gradient slots") {
    OptimizerOffloadOptions o = Options(OffloadMode::kInterleaved, 0.0, n);
    o.max_gpu_share = 1.0;
    const OffloadPlan p = Plan(o);
    CHECK(p.staged_slots == 11);
    CHECK(p.device_grad_bytes == 11 * 4 * kS);
    CHECK(p.device_state_bytes == 2 * 12 * kS);
  }
  SECTION("cpu: nothing on the GPU but scratch") {
    const OffloadPlan p = Plan(Options(OffloadMode::kCpu, 0.7, n));
    CHECK(p.device_state_bytes == 0);
    CHECK(p.device_grad_bytes == 0);
    CHECK(p.pinned_bytes() == 16 * n + internal::kUploadSlots * 2 * kS);
  }
  SECTION("static 0.5: the last six subgroups live on the GPU") {
    const OffloadPlan p = Plan(Options(OffloadMode::kStatic, 0.5, n));
    const std::int64_t resident = 5 * kS + 5;
    CHECK(p.resident_params == resident);
    CHECK(p.host_params == n - resident);
    CHECK(p.device_state_bytes == 12 * resident);
    CHECK(p.device_grad_bytes == 4 * resident);
    CHECK(p.pinned_state_bytes == 12 * (n - resident));
    CHECK(p.resident_offset[5] == 0);
    CHECK(p.host_offset[4] == 4 * kS);
    CHECK(p.host_offset[5] == -1);
  }
  SECTION("gpu: no pinned memory at all") {
    const OffloadPlan p = Plan(Options(OffloadMode::kGpu, 0.0, n));
    CHECK(p.pinned_bytes() == 0);
    CHECK(p.device_state_bytes == 12 * n);
    CHECK(p.device_scratch_bytes == partials);
  }
}

TEST_CASE("bad options name the field", "[offload][plan]") {
  struct Case {
    const char* field;
    void (*mutate)(OptimizerOffloadOptions&);
  };
  const Case cases[] = {
      {"num_params", [](OptimizerOffloadOptions& o) { o.num_params = 0; }},
      {"subgroup_size", [](OptimizerOffloadOptions& o) { o.subgroup_size = 0; }},
      {"gpu_share", [](OptimizerOffloadOptions& o) { o.gpu_share = 1.5; }},
      {"max_gpu_share", [](OptimizerOffloadOptions& o) { o.max_gpu_share = 0.2; }},
      {"max_grad_norm",
       [](OptimizerOffloadOptions& o) {
         o.max_grad_norm = std::numeric_limits<double>::infinity();
       }},
      {"cpu.threads", [](OptimizerOffloadOptions& o) { o.cpu.threads = -1; }},
      {"host_memory_limit_bytes",
       [](OptimizerOffloadOptions& o) { o.host_memory_limit_bytes = -1; }},
      {"grad_chunk", [](OptimizerOffloadOptions& o) { o.grad_chunk = 0; }},
      {"timeout_seconds", [](OptimizerOffloadOptions& o) { o.timeout_seconds = 0.0; }},
      {"beta2", [](OptimizerOffloadOptions& o) { o.adam.beta2 = 1.0f; }},
      {"learning_rate", [](OptimizerOffloadOptions& o) { o.adam.learning_rate = -1.0f; }},
  };
  for (const Case& c : cases) {
    OptimizerOffloadOptions o = Options(OffloadMode::kInterleaved, 0.5, 5000);
    c.mutate(o);
    const absl::Status status = internal::ValidateOffloadOptions(o);
    CAPTURE(c.field, status.ToString());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(status.message().find(c.field) != std::string_view::npos);
  }
  CHECK(internal::ValidateOffloadOptions(Options(OffloadMode::kInterleaved, 0.5, 5000)).ok());
}

TEST_CASE("host memory too small is ResourceExhausted naming the bytes", "[offload][plan]") {
  const OffloadPlan p = Plan(Options(OffloadMode::kCpu, 0.0, 4000));
  const std::int64_t need = p.pinned_bytes();
  CHECK(internal::CheckHostMemory(p, need).ok());
  const absl::Status small = internal::CheckHostMemory(p, need - 1);
  CAPTURE(small.ToString());
  CHECK(small.code() == absl::StatusCode::kResourceExhausted);
  CHECK(small.message().find(std::to_string(need)) != std::string_view::npos);
  CHECK(small.message().find(std::to_string(need - 1)) != std::string_view::npos);
  CHECK(internal::AvailableHostMemoryBytes() > 0);  // Linux: /proc/meminfo exists
}

TEST_CASE("Create's input errors come before any allocation or queued work", "[offload][plan]") {
  std::unique_ptr<Backend> backend = testing::NewCpuBackend();
  std::vector<float> initial(5000, 1.0f);
  // A fake device pointer: these calls must fail before they could dereference it.
  auto* fake_device = reinterpret_cast<std::uint16_t*>(std::uintptr_t{0x1000});
  const std::span<std::uint16_t> bf16(fake_device, 5000);
  OptimizerOffloadOptions o = Options(OffloadMode::kInterleaved, 0.5, 5000);

  o.subgroup_size = 0;
  auto r = OptimizerOffload::Create(*backend, o, initial, bf16);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("subgroup_size") != std::string_view::npos);

  o = Options(OffloadMode::kInterleaved, 0.5, 5000);
  r = OptimizerOffload::Create(*backend, o, std::span<const float>(initial.data(), 4999), bf16);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("4999") != std::string_view::npos);
  CHECK(r.status().message().find("5000") != std::string_view::npos);

  r = OptimizerOffload::Create(*backend, o, initial, std::span<std::uint16_t>(fake_device, 5001));
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("device_params_bf16") != std::string_view::npos);

  r = OptimizerOffload::Create(*backend, o, initial, std::span<std::uint16_t>());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);

  o.host_memory_limit_bytes = 4096;
  r = OptimizerOffload::Create(*backend, o, initial, bf16);
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(r.status().message().find("4096") != std::string_view::npos);

  const BackendStats stats = backend->Stats();
  CHECK(stats.host_allocations == 0);
  CHECK(stats.device_allocations == 0);
  CHECK(stats.copies == 0);
}

TEST_CASE("mode names round-trip", "[offload][plan]") {
  for (OffloadMode mode :
       {OffloadMode::kCpu, OffloadMode::kInterleaved, OffloadMode::kStatic, OffloadMode::kGpu}) {
    auto parsed = ParseOffloadMode(OffloadModeName(mode));
    REQUIRE(parsed.ok());
    CHECK(*parsed == mode);
  }
  CHECK(ParseOffloadMode("twinflow").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload
