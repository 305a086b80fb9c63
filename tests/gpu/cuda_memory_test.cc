// The runtime's memory parts (DeviceArena, HostPool, ActivationStash) on the CUDA backend, with
// real kernels on the compute stream: a two-chunk toy model (y = a * x + b per chunk, loss
// 0.5 * y^2) trained for two iterations with every stash entry offloaded right after its
// forward and reloaded before its backward, against the same run without offload and a CPU
// reference. Run alone with `gpu_tests "[cuda][stash]"`.
//
// Why not the Executor: Executor::Create refuses backends whose device memory is not
// host-accessible (it stages nothing for host-buffer transports yet), so this test drives the
// stash in the order a p = 1 schedule with full offload would (F, OFFLOAD, RELEASE ... RELOAD,
// B), with the arena's poisoning on.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/sm_copy_kernel.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/cuda_stream.h"
#include "pipeoffload/memory.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/test_kernels.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {
namespace {

constexpr int kChunks = 2;
constexpr int kMicrobatches = 4;
constexpr int kIterations = 2;
constexpr std::int64_t kWidth = 50001;        // n floats per activation: odd on purpose
constexpr std::int64_t kEntryBytes = 4 * kWidth;  // a stash entry holds the chunk's input x
// Before each forward's copy into its stash entry: long enough that a D2H copy that does not
// wait for the compute queue would read the entry before the forward wrote it.
constexpr double kSpinSeconds = 1e-3;

float ParamA(int c, std::int64_t i) { return 0.9f + 0.01f * static_cast<float>((c * 31 + i) % 17); }
float ParamB(int c, std::int64_t i) {
  return 0.05f * static_cast<float>((c * 7 + i * 3) % 11) - 0.2f;
}
float Input(int mb, std::int64_t i) {
  return std::sin(0.37f * static_cast<float>(i % 1000) + static_cast<float>(mb) * 1.3f);
}

struct ToyGrads {
  std::vector<float> a[kChunks];
  std::vector<float> b[kChunks];
};

bool BitwiseEqual(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), 4 * x.size()) == 0;
}

// The same arithmetic on the CPU, rounded like the kernels (one rounding per fma / mul / add).
ToyGrads Reference() {
  ToyGrads grads;
  for (int c = 0; c < kChunks; ++c) {
    grads.a[c].assign(kWidth, 0.0f);
    grads.b[c].assign(kWidth, 0.0f);
  }
  for (int it = 0; it < kIterations; ++it) {
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      for (std::int64_t i = 0; i < kWidth; ++i) {
        const float x0 = Input(mb, i);
        const float y0 = std::fmaf(ParamA(0, i), x0, ParamB(0, i));
        const float y1 = std::fmaf(ParamA(1, i), y0, ParamB(1, i));
        const float gy1 = y1;  // d(0.5 y^2)/dy
        const float gx1 = ParamA(1, i) * gy1;
        grads.a[1][i] = std::fmaf(gy1, y0, grads.a[1][i]);
        grads.b[1][i] += gy1;
        grads.a[0][i] = std::fmaf(gx1, x0, grads.a[0][i]);
        grads.b[0][i] += gx1;
      }
    }
  }
  return grads;
}

struct ToyRun {
  ToyGrads grads;
  BackendStats after_first;  // stats after iteration 1
  BackendStats after_last;   // after the last iteration, before reading the gradients back
  std::int64_t stash_high_water = 0;           // logical: program order, what a compiler predicts
  std::int64_t stash_physical_high_water = 0;  // the arena's: released blocks wait for their D2H
  std::int64_t arena_in_use_at_end = 0;  // besides parameters, gradients and inputs
};

void* Allocate(DeviceArena& arena, std::int64_t bytes, MemoryCategory category) {
  absl::StatusOr<void*> block = arena.Allocate(bytes, category);
  INFO(block.status().ToString());
  REQUIRE(block.ok());
  return *block;
}

void Ok(const absl::Status& status) {
  INFO(status.ToString());
  REQUIRE(status.ok());
}

ToyRun RunToy(bool offload) {
  auto backend = NewCudaBackend();
  absl::StatusOr<cudaStream_t> stream_or = CudaComputeStream(*backend);
  REQUIRE(stream_or.ok());
  const cudaStream_t stream = *stream_or;
  const Queue compute = backend->queue(QueueKind::kCompute);
  DeviceArenaOptions arena_options;
  arena_options.budget_bytes = 64 << 20;
  arena_options.poison_on_free = true;
  absl::StatusOr<std::unique_ptr<DeviceArena>> arena_or =
      DeviceArena::Create(*backend, arena_options);
  REQUIRE(arena_or.ok());
  DeviceArena& arena = **arena_or;
  std::vector<HostSlotClass> classes;
  if (offload) classes.push_back({kEntryBytes, kMicrobatches * kChunks});
  absl::StatusOr<std::unique_ptr<HostPool>> pool = HostPool::Create(*backend, classes);
  REQUIRE(pool.ok());
  // Released blocks are held back only while the stash stays within one entry (what the
  // executor does with a program's predicted peak): each F then waits for the previous copy.
  ActivationStashOptions stash_options;
  stash_options.physical_limit_bytes = kEntryBytes;
  ActivationStash stash(*backend, arena, **pool, stash_options);

  // Parameters, gradients and inputs live in the arena too (category kOther); uploads and
  // downloads use pageable vectors so host_allocations counts the pool alone.
  auto upload = [&](const std::vector<float>& values) {
    void* device = Allocate(arena, kEntryBytes, MemoryCategory::kOther);
    Ok(backend->CopyAsync(backend->queue(QueueKind::kH2D), device, values.data(), kEntryBytes));
    return static_cast<float*>(device);
  };
  float* a[kChunks];
  float* b[kChunks];
  float* ga[kChunks];
  float* gb[kChunks];
  for (int c = 0; c < kChunks; ++c) {
    std::vector<float> host_a(kWidth), host_b(kWidth);
    for (std::int64_t i = 0; i < kWidth; ++i) {
      host_a[i] = ParamA(c, i);
      host_b[i] = ParamB(c, i);
    }
    a[c] = upload(host_a);
    b[c] = upload(host_b);
    ga[c] = upload(std::vector<float>(kWidth, 0.0f));
    gb[c] = upload(std::vector<float>(kWidth, 0.0f));
  }
  float* inputs[kMicrobatches];
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    std::vector<float> x(kWidth);
    for (std::int64_t i = 0; i < kWidth; ++i) x[i] = Input(mb, i);
    inputs[mb] = upload(x);
  }
  Drain(*backend, QueueKind::kH2D);
  const std::int64_t base_in_use = arena.reserved_bytes();

  ToyRun run;
  arena.ResetHighWater();
  for (int it = 0; it < kIterations; ++it) {
    float* outputs[kMicrobatches];
    for (int mb = 0; mb < kMicrobatches; ++mb) {  // F(mb, 0), F(mb, 1), each then offloaded
      float* x = inputs[mb];
      for (int c = 0; c < kChunks; ++c) {
        absl::StatusOr<void*> saved = stash.Create(mb, c, kEntryBytes);
        REQUIRE(saved.ok());
        PO_CUDA_CHECK(LaunchSpin(stream, kSpinSeconds));
        Ok(backend->CopyAsync(compute, *saved, x, kEntryBytes));
        auto* y = static_cast<float*>(Allocate(arena, kEntryBytes, MemoryCategory::kP2P));
        PO_CUDA_CHECK(LaunchAffineForward(x, a[c], b[c], y, kWidth, stream));
        if (c > 0) Ok(arena.Free(x));
        x = y;
        if (offload) {
          Ok(stash.StartOffload(mb, c));
          Ok(stash.FinishOffload(mb, c, 30.0));
        }
      }
      outputs[mb] = x;
    }
    for (int mb = 0; mb < kMicrobatches; ++mb) {  // B(mb, 1), B(mb, 0), each reloaded first
      float* gy = outputs[mb];                      // the loss gradient is y itself
      for (int c = kChunks - 1; c >= 0; --c) {
        if (offload) {
          Ok(stash.StartReload(mb, c));
          REQUIRE(stash.FinishReload(mb, c, 30.0).ok());
        }
        absl::StatusOr<void*> saved = stash.DeviceData(mb, c);
        REQUIRE(saved.ok());
        float* gx =
            c > 0 ? static_cast<float*>(Allocate(arena, kEntryBytes, MemoryCategory::kP2P))
                  : nullptr;
        PO_CUDA_CHECK(LaunchAffineBackward(static_cast<const float*>(*saved), gy, a[c], gx,
                                           ga[c], gb[c], kWidth, stream));
        Ok(arena.Free(gy));
        Ok(stash.Free(mb, c));
        gy = gx;
      }
    }
    Ok(stash.CheckEmpty());
    Ok(backend->Synchronize(60.0));
    (it == 0 ? run.after_first : run.after_last) = backend->Stats();
  }
  run.stash_high_water = stash.device_high_water_bytes();
  run.stash_physical_high_water = arena.Usage(MemoryCategory::kStash).high_water_bytes;
  run.arena_in_use_at_end = arena.reserved_bytes() - base_in_use;
  for (int c = 0; c < kChunks; ++c) {
    for (auto [device, host] :
         {std::pair{ga[c], &run.grads.a[c]}, std::pair{gb[c], &run.grads.b[c]}}) {
      host->assign(kWidth, 0.0f);
      Ok(backend->CopyAsync(backend->queue(QueueKind::kD2H), host->data(), device, kEntryBytes));
    }
  }
  Drain(*backend, QueueKind::kD2H);
  CHECK((*pool)->slots_in_use() == 0);
  return run;
}

TEST_CASE("offload on and off give bitwise equal gradients on the GPU, equal to the reference",
          "[gpu][cuda][stash]") {
  const ToyGrads reference = Reference();
  const ToyRun plain = RunToy(/*offload=*/false);
  const ToyRun offloaded = RunToy(/*offload=*/true);
  for (int c = 0; c < kChunks; ++c) {
    CAPTURE(c);
    CHECK(BitwiseEqual(offloaded.grads.a[c], plain.grads.a[c]));
    CHECK(BitwiseEqual(offloaded.grads.b[c], plain.grads.b[c]));
    CHECK(BitwiseEqual(plain.grads.a[c], reference.a[c]));
    CHECK(BitwiseEqual(plain.grads.b[c], reference.b[c]));
    CHECK_FALSE(std::isnan(offloaded.grads.a[c][0]));  // no poison read back
  }
  // The stash peaks at every entry without offload, at one entry with it (released at once).
  CHECK(plain.stash_high_water == kMicrobatches * kChunks * kEntryBytes);
  CHECK(offloaded.stash_high_water == kEntryBytes);
  // RELEASE does not wait for the copy (the spin kernel keeps it in flight), but the stash's
  // physical cap makes the next allocation wait for it: the arena never holds more either.
  CHECK(plain.stash_physical_high_water == plain.stash_high_water);
  CHECK(offloaded.stash_physical_high_water == kEntryBytes);
  CHECK(plain.arena_in_use_at_end == 0);
  CHECK(offloaded.arena_in_use_at_end == 0);
}

TEST_CASE("the steady state allocates nothing and moves exactly the offloaded bytes",
          "[gpu][cuda][stash][stats]") {
  const ToyRun run = RunToy(/*offload=*/true);
  const std::int64_t per_iteration = kMicrobatches * kChunks * kEntryBytes;
  // One cudaMalloc (the arena) and one cudaHostAlloc (the pool), both before iteration 1.
  CHECK(run.after_first.device_allocations == 1);
  CHECK(run.after_first.host_allocations == 1);
  CHECK(run.after_last.device_allocations == 1);
  CHECK(run.after_last.host_allocations == 1);
  CHECK(run.after_last.bytes_d2h - run.after_first.bytes_d2h == per_iteration);
  CHECK(run.after_last.bytes_h2d - run.after_first.bytes_h2d == per_iteration);
}

TEST_CASE("the host pool of a CUDA backend is pinned", "[gpu][cuda][stash]") {
  auto backend = NewCudaBackend();
  absl::StatusOr<std::unique_ptr<HostPool>> pool = HostPool::Create(*backend, {{4096, 2}});
  REQUIRE(pool.ok());
  absl::StatusOr<HostSlot> slot = (*pool)->Acquire(1000);
  REQUIRE(slot.ok());
  cudaPointerAttributes attributes{};
  PO_CUDA_CHECK(cudaPointerGetAttributes(&attributes, slot->data));
  CHECK(attributes.type == cudaMemoryTypeHost);
  CHECK((*pool)->Release(*slot).ok());
}

TEST_CASE("LaunchSmCopy moves words device <-> mapped host memory in stream order",
          "[gpu][cuda]") {
  for (const std::int64_t bytes : {std::int64_t{32}, internal::kMaxSmCopyBytes}) {
    CAPTURE(bytes);
    const auto n = static_cast<std::size_t>(bytes / 4);
    std::uint32_t* host = nullptr;
    std::uint32_t* mapped = nullptr;
    std::uint32_t* device = nullptr;
    cudaStream_t stream = nullptr;
    PO_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), static_cast<std::size_t>(bytes),
                                cudaHostAllocMapped));
    PO_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped), host, 0));
    PO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device), static_cast<std::size_t>(bytes)));
    PO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (std::size_t i = 0; i < n; ++i) host[i] = 0x9e3779b9u * static_cast<std::uint32_t>(i + 1);
    const std::vector<std::uint32_t> sent(host, host + n);
    CHECK(internal::LaunchSmCopy(device, mapped, bytes, stream) == cudaSuccess);  // host -> dev
    PO_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::memset(host, 0, static_cast<std::size_t>(bytes));
    CHECK(internal::LaunchSmCopy(mapped, device, bytes, stream) == cudaSuccess);  // dev -> host
    PO_CUDA_CHECK(cudaStreamSynchronize(stream));
    CHECK(std::vector<std::uint32_t>(host, host + n) == sent);
    PO_CUDA_CHECK(cudaStreamDestroy(stream));
    PO_CUDA_CHECK(cudaFree(device));
    PO_CUDA_CHECK(cudaFreeHost(host));
  }
}

TEST_CASE("an arena larger than the device fails with ResourceExhausted", "[gpu][cuda][stash]") {
  auto backend = NewCudaBackend();
  DeviceArenaOptions options;
  options.budget_bytes = std::int64_t{1} << 50;
  const absl::Status status = DeviceArena::Create(*backend, options).status();
  INFO(status.ToString());
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  CHECK(backend->Stats().device_allocations == 0);
}

}  // namespace
}  // namespace pipeoffload::testing
