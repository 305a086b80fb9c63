// Local transport with receive copiers (rendezvous; AcceptsDeviceMemory) and the executor on a
// backend whose device memory is not host-accessible: an "opaque" wrapper of the CPU backend
// that says so, so the executor must take the device path (no host access, compute waits
// before RECVs) while the toy model's exact gradients still prove the data moved correctly.
#include <cstring>
#include <tuple>
#include <thread>
#include <vector>

#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/transport.h"
#include "tests/backend/opaque_backend.h"
#include "tests/runtime/toy_model.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::OpaqueBackend;

std::unique_ptr<OpaqueBackend> MakeOpaque(const CpuBackendOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateCpuBackend(options);
  REQUIRE(cpu.ok());
  return std::make_unique<OpaqueBackend>(std::move(*cpu));
}

// A copier that memcpys and records which rank's copier ran and how often.
LocalCopyFunction CountingCopier(int rank, std::vector<int>* calls) {
  return [rank, calls](void* dst, const void* src, std::int64_t bytes) {
    std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    calls->push_back(rank);
    return absl::OkStatus();
  };
}

TEST_CASE("local transport accepts device memory only with receive copiers",
          "[runtime][transport][device]") {
  auto plain = CreateLocalTransports(2);
  REQUIRE(plain.ok());
  CHECK_FALSE((*plain)[0]->AcceptsDeviceMemory());
  std::vector<int> calls;
  LocalTransportOptions options;
  options.receive_copiers = {CountingCopier(0, &calls)};
  auto with = CreateLocalTransports(2, options);
  REQUIRE(with.ok());
  CHECK((*with)[0]->AcceptsDeviceMemory());
  CHECK((*with)[1]->AcceptsDeviceMemory());

  options.receive_copiers = {CountingCopier(0, &calls), CountingCopier(1, &calls)};
  auto wrong = CreateLocalTransports(3, options);
  CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(wrong.status().message().find("0, 1 or num_ranks (3)") != std::string::npos);
  options.receive_copiers = {LocalCopyFunction()};
  auto empty = CreateLocalTransports(2, options);
  CHECK(empty.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(empty.status().message().find("receive_copiers[0] is an empty function") !=
        std::string::npos);
}

TEST_CASE("copier transport: a send finishes when its receiver has copied, with its copier",
          "[runtime][transport][device]") {
  std::vector<int> calls;
  LocalTransportOptions options;
  options.receive_copiers = {CountingCopier(0, &calls), CountingCopier(1, &calls)};
  auto ranks = CreateLocalTransports(2, options);
  REQUIRE(ranks.ok());
  std::vector<int> data = {1, 2, 3, 4};
  const MessageTag tag{MessageKind::kActivation, 3, 0};
  auto sent = (*ranks)[0]->Send(1, tag, data.data(), 16);
  REQUIRE(sent.ok());
  CHECK(*(*sent)->Test() == false);  // rendezvous: nothing copied yet
  CHECK((*sent)->Wait(0.01).code() == absl::StatusCode::kDeadlineExceeded);
  data = {5, 6, 7, 8};  // not sent yet, so the receiver sees the buffer as it is at its copy
  std::vector<int> got(4, -1);
  auto received = (*ranks)[1]->Recv(0, tag, got.data(), 16);
  REQUIRE(received.ok());
  REQUIRE((*received)->Wait(1.0).ok());
  CHECK(got == std::vector<int>{5, 6, 7, 8});
  CHECK(calls == std::vector<int>{1});  // the receiver's copier, once
  CHECK(*(*sent)->Test() == true);
  CHECK((*sent)->Wait(1.0).ok());
  // Barriers (zero bytes) stay eager and need no copier.
  // Catch's assertions are not thread-safe (TSan's find): the thread keeps its status, checked
  // after the join.
  absl::Status other_barrier;
  std::thread other([&] { other_barrier = (*ranks)[1]->Barrier(0, 5.0); });
  CHECK((*ranks)[0]->Barrier(1, 5.0).ok());
  other.join();
  CHECK(other_barrier.ok());
  CHECK(calls.size() == 1);
}

TEST_CASE("copier transport: size mismatch, copier errors and withdrawn sends",
          "[runtime][transport][device]") {
  LocalTransportOptions options;
  options.receive_copiers = {[](void*, const void*, std::int64_t) {
    return absl::InternalError("copy engine on fire");
  }};
  auto ranks = CreateLocalTransports(2, options);
  REQUIRE(ranks.ok());
  std::vector<char> buffer(64);
  const MessageTag tag{MessageKind::kGrad, 1, 0};
  SECTION("size mismatch fails both sides, naming both sizes") {
    auto sent = (*ranks)[0]->Send(1, tag, buffer.data(), 64);
    REQUIRE(sent.ok());
    auto received = (*ranks)[1]->Recv(0, tag, buffer.data(), 32);
    REQUIRE(received.ok());
    const absl::Status status = (*received)->Wait(1.0);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(status.message().find("expected 32 bytes") != std::string::npos);
    CHECK(status.message().find("has 64") != std::string::npos);
    CHECK((*sent)->Wait(1.0).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a copier error reaches both sides") {
    auto sent = (*ranks)[0]->Send(1, tag, buffer.data(), 64);
    REQUIRE(sent.ok());
    auto received = (*ranks)[1]->Recv(0, tag, buffer.data(), 64);
    REQUIRE(received.ok());
    const absl::Status status = (*received)->Wait(1.0);
    CHECK(status.code() == absl::StatusCode::kInternal);
    CHECK(status.message().find("copy engine on fire") != std::string::npos);
    CHECK(status.message().find("rank 1 copying grad") != std::string::npos);
    CHECK((*sent)->Test().status().code() == absl::StatusCode::kInternal);
  }
  SECTION("a destroyed unfinished send is withdrawn") {
    auto sent = (*ranks)[0]->Send(1, tag, buffer.data(), 64);
    REQUIRE(sent.ok());
    sent->reset();
    auto received = (*ranks)[1]->Recv(0, tag, buffer.data(), 64);
    REQUIRE(received.ok());
    CHECK(*(*received)->Test() == false);
    CHECK((*received)->Wait(0.05).code() == absl::StatusCode::kDeadlineExceeded);
  }
}

TEST_CASE("BackendComputeCopier copies on the backend's compute queue and waits",
          "[runtime][transport][device]") {
  auto backend = MakeOpaque();
  LocalCopyFunction copy = BackendComputeCopier(*backend, 5.0);
  std::vector<std::uint8_t> src(1000);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 7);
  std::vector<std::uint8_t> dst(1000, 0);
  REQUIRE(copy(dst.data(), src.data(), 1000).ok());
  CHECK(dst == src);
  CHECK(backend->records() == 1);  // recorded the compute queue once, then waited on it
  CHECK(backend->Stats().copies == 1);
}

TEST_CASE("executor runs on a non-host-accessible backend with the copier transport, exactly",
          "[runtime][executor][device]") {
  const auto [family, v, policy] = GENERATE(
      std::make_tuple(Family::k1F1B, 1, OffloadPolicy::kNone),
      std::make_tuple(Family::k1F1B, 1, OffloadPolicy::kFull),
      std::make_tuple(Family::kInterleaved, 2, OffloadPolicy::kHalf),
      std::make_tuple(Family::kInterleaved, 2, OffloadPolicy::kFull));
  testing::ToyConfig config;
  config.num_stages = 4;
  config.chunks_per_stage = v;
  config.num_microbatches = 8;
  absl::StatusOr<Schedule> schedule = testing::CompileToy(config, family, policy);
  REQUIRE(schedule.ok());
  CAPTURE(FamilyName(family), OffloadPolicyName(policy));

  CpuBackendOptions cpu;
  cpu.max_copy_delay_seconds = 200e-6;  // jitter the copy engines
  std::vector<std::unique_ptr<OpaqueBackend>> backends;
  LocalTransportOptions options;
  for (int d = 0; d < 4; ++d) {
    cpu.fault_seed = static_cast<std::uint64_t>(d + 1);
    backends.push_back(MakeOpaque(cpu));
    options.receive_copiers.push_back(BackendComputeCopier(*backends.back(), 10.0));
  }
  auto plain = CreateLocalTransports(4);
  REQUIRE(plain.ok());
  {
    // Without copiers the executor refuses such a backend, saying what would work.
    DeviceArenaOptions arena_options;
    arena_options.budget_bytes = 1 << 20;
    auto arena = DeviceArena::Create(*backends[0], arena_options);
    REQUIRE(arena.ok());
    testing::ToyStageModel model(config, 0);
    auto refused = Executor::Create(schedule->spec, schedule->stages[0], model, *backends[0],
                                    **arena, *(*plain)[0]);
    CHECK(refused.status().code() == absl::StatusCode::kUnimplemented);
    CHECK(refused.status().message().find("receive copiers") != std::string::npos);
  }
  auto transports = CreateLocalTransports(4, options);
  REQUIRE(transports.ok());
  std::vector<std::unique_ptr<testing::ToyStageModel>> models;
  std::vector<std::unique_ptr<DeviceArena>> arenas;
  std::vector<std::unique_ptr<Executor>> executors;
  for (int d = 0; d < 4; ++d) {
    models.push_back(std::make_unique<testing::ToyStageModel>(config, d));
    DeviceArenaOptions arena_options;
    arena_options.budget_bytes = 1 << 20;
    auto arena = DeviceArena::Create(*backends[static_cast<std::size_t>(d)], arena_options);
    REQUIRE(arena.ok());
    auto executor = Executor::Create(schedule->spec, schedule->stages[static_cast<std::size_t>(d)],
                                     *models.back(), *backends[static_cast<std::size_t>(d)],
                                     **arena, *(*transports)[static_cast<std::size_t>(d)]);
    INFO(executor.status().ToString());
    REQUIRE(executor.ok());
    arenas.push_back(std::move(*arena));
    executors.push_back(std::move(*executor));
  }
  const std::vector<testing::ToyGrads> reference = testing::ToyReference(config);
  for (int iteration = 0; iteration < 2; ++iteration) {
    std::vector<absl::Status> statuses(4);
    std::vector<IterationStats> stats(4);
    std::vector<std::thread> threads;
    for (int d = 0; d < 4; ++d) {
      threads.emplace_back([&, d] {
        auto ran = executors[static_cast<std::size_t>(d)]->Run();
        statuses[static_cast<std::size_t>(d)] = ran.status();
        if (ran.ok()) stats[static_cast<std::size_t>(d)] = std::move(*ran);
      });
    }
    for (auto& thread : threads) thread.join();
    for (int d = 0; d < 4; ++d) {
      INFO("stage " << d << ": " << statuses[static_cast<std::size_t>(d)].ToString());
      REQUIRE(statuses[static_cast<std::size_t>(d)].ok());
      // The measured stash peak is the compiler's prediction, exactly.
      CHECK(stats[static_cast<std::size_t>(d)].stash_high_water_bytes ==
            schedule->predictions->stages[static_cast<std::size_t>(d)].peak_bytes);
      CHECK(stats[static_cast<std::size_t>(d)].offloaded_bytes ==
            schedule->predictions->stages[static_cast<std::size_t>(d)].offloaded_bytes);
    }
    if (iteration > 0) continue;  // the second only proves Run can be called again
    // After one iteration the gradients equal the single-process reference's, bitwise.
    for (int d = 0; d < 4; ++d) {
      for (int c = 0; c < v; ++c) {
        CHECK(models[static_cast<std::size_t>(d)]->grads(c) ==
              reference[static_cast<std::size_t>(c * 4 + d)]);
      }
    }
  }
}

}  // namespace
}  // namespace pipeoffload
