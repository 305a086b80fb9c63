// MPI transport, run under `mpirun -np N` (N >= 2; CTest runs N = 2, label mpi): tagged
// messages, sizes, timeouts, the MPI_TAG_UB check, barriers, and the executor over MPI giving
// the same bits as the single-process reference (and so as the local transport); the MPI
// rank group, and a PipelineStage opened over both with measured costs.
//
// Every rank runs every test case in the same order; a case that talks ends with a barrier on
// the world so a failure on one rank cannot leave the other waiting on a later case's message.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/pipeline.h"
#include "pipeoffload/rank_group.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/transport.h"
#include "tests/runtime/hand_schedules.h"
#include "tests/runtime/toy_model.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::ToyConfig;
using testing::ToyReference;
using testing::ToyStageModel;

constexpr double kTimeout = 20.0;

// One transport for the whole process: MPI can be initialized only once, and the transport
// finalizes it when destroyed at exit.
Transport& World() {
  static std::unique_ptr<Transport> world = [] {
    absl::StatusOr<std::unique_ptr<Transport>> created = CreateMpiTransport();
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      std::abort();
    }
    return std::move(*created);
  }();
  return *world;
}

// Pairs up with every other rank (0 <-> r), so all ranks leave together.
void SyncAll() {
  Transport& world = World();
  if (world.rank() == 0) {
    for (int r = 1; r < world.size(); ++r) REQUIRE(world.Barrier(r, kTimeout).ok());
  } else {
    REQUIRE(world.Barrier(0, kTimeout).ok());
  }
}

TEST_CASE("mpi transport matches messages by tag", "[mpi]") {
  Transport& world = World();
  REQUIRE(world.size() >= 2);
  CHECK(world.Name() == "mpi");
  if (world.rank() == 0) {
    for (int i = 0; i < 3; ++i) {
      std::vector<int> data(8, i + 1);
      auto sent = world.Send(1, MessageTag{MessageKind::kActivation, i, 1}, data.data(), 32);
      REQUIRE(sent.ok());
      REQUIRE((*sent)->Wait(kTimeout).ok());
    }
  } else if (world.rank() == 1) {
    for (int i = 2; i >= 0; --i) {  // the reverse order of sending
      std::vector<int> data(8, 0);
      auto received = world.Recv(0, MessageTag{MessageKind::kActivation, i, 1}, data.data(), 32);
      REQUIRE(received.ok());
      REQUIRE((*received)->Wait(kTimeout).ok());
      CHECK(data == std::vector<int>(8, i + 1));
    }
  }
  SyncAll();
}

TEST_CASE("mpi transport reports a short message and a timeout", "[mpi]") {
  Transport& world = World();
  if (world.rank() == 0) {
    std::vector<int> data(3, 7);
    auto sent = world.Send(1, MessageTag{MessageKind::kGrad, 4, 0}, data.data(), 12);
    REQUIRE(sent.ok());
    REQUIRE((*sent)->Wait(kTimeout).ok());
  } else if (world.rank() == 1) {
    std::vector<int> data(4, 0);
    auto received = world.Recv(0, MessageTag{MessageKind::kGrad, 4, 0}, data.data(), 16);
    REQUIRE(received.ok());
    const absl::Status status = (*received)->Wait(kTimeout);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find("expected 16 bytes, the message has 12") !=
          std::string::npos);
    auto never = world.Recv(0, MessageTag{MessageKind::kGrad, 99, 0}, data.data(), 16);
    REQUIRE(never.ok());
    const absl::Status late = (*never)->Wait(0.2);
    CHECK(late.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(late.message()).find("receive of grad(mb 99, chunk 0) from rank 0") !=
          std::string::npos);
  }
  SyncAll();
}

TEST_CASE("mpi transport refuses tags above MPI_TAG_UB and bad peers", "[mpi]") {
  Transport& world = World();
  int x = 0;
  const int peer = world.rank() == 0 ? 1 : 0;
  const absl::Status big =
      world.Send(peer, MessageTag{MessageKind::kGrad, 1 << 28, 0}, &x, 4).status();
  CHECK(big.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(big.message()).find("MPI_TAG_UB") != std::string::npos);
  CHECK(world.Send(world.size(), MessageTag{}, &x, 4).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(world.Recv(world.rank(), MessageTag{}, &x, 4).status().code() ==
        absl::StatusCode::kInvalidArgument);
  SyncAll();
}

// Runs this rank's stage of `schedule` over MPI and checks its gradients against the
// single-process reference bit for bit.
void RunStageOverMpi(const Schedule& schedule, std::int64_t predicted_peak) {
  Transport& world = World();
  const int d = world.rank();
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  DeviceArenaOptions arena_options;
  arena_options.budget_bytes = 1 << 20;
  arena_options.poison_on_free = true;
  absl::StatusOr<std::unique_ptr<DeviceArena>> arena =
      DeviceArena::Create(**backend, arena_options);
  REQUIRE(arena.ok());
  const PipelineSpec& spec = schedule.spec;
  const ToyConfig config{spec.num_stages, spec.chunks_per_stage, spec.num_microbatches, 64, 0};
  ToyStageModel model(config, d);
  ExecutorOptions options;
  options.wait_timeout_seconds = kTimeout;
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(
      spec, schedule.stages[static_cast<std::size_t>(d)], model, **backend, **arena, world,
      options);
  INFO(executor.status().ToString());
  REQUIRE(executor.ok());
  absl::StatusOr<IterationStats> stats = (*executor)->Run();
  INFO(stats.status().ToString());
  REQUIRE(stats.ok());
  if (predicted_peak >= 0) CHECK(stats->stash_high_water_bytes == predicted_peak);
  // MPI moves host buffers from the host, so it cannot order after a queue: every SEND
  // host-waited the compute queue (RECVs need nothing on a host-accessible backend).
  CHECK_FALSE(world.CanOrderAfter((*backend)->queue(QueueKind::kCompute)));
  int sends = 0;
  for (const Op& op : schedule.stages[static_cast<std::size_t>(d)].ops) {
    sends += op.kind == OpKind::kSendActivation || op.kind == OpKind::kSendGrad ? 1 : 0;
  }
  CHECK(stats->p2p_compute_waits == sends);
  CHECK(stats->p2p_device_orders == 0);
  const auto reference = ToyReference(config);
  for (int c = 0; c < spec.chunks_per_stage; ++c) {
    CAPTURE(c);
    CHECK(model.grads(c) == reference[static_cast<std::size_t>(c * spec.num_stages + d)]);
  }
}

TEST_CASE("the executor over MPI matches the reference bit for bit", "[mpi][executor]") {
  Transport& world = World();
  const int p = world.size();
  std::vector<std::set<int>> offload(static_cast<std::size_t>(p));
  offload[0] = {0, 1};
  RunStageOverMpi(testing::Hand1F1B(p, 2 * p, /*split=*/false, offload), -1);
  SyncAll();

  PipelineSpec spec;
  spec.num_stages = p;
  spec.num_microbatches = 2 * p;
  spec.offload = OffloadPolicy::kFull;
  CostModel cost = UnitCostModel(0.5);
  cost.activation_bytes = ToyStageModel(ToyConfig{p, 1, 2 * p, 64, 0}, 0).SavedBytes(0, false);
  cost.boundary_bytes = 4 * 64;
  absl::StatusOr<Schedule> compiled = Compile(spec, cost);
  INFO(compiled.status().ToString());
  REQUIRE(compiled.ok());
  RunStageOverMpi(*compiled,
                  compiled->predictions->stages[static_cast<std::size_t>(world.rank())].peak_bytes);
  SyncAll();
}

// The MPI rank group, created after the world transport (which owns MPI and finalizes it at
// exit), so it is destroyed first.
RankGroup& Group() {
  World();
  static std::unique_ptr<RankGroup> group = [] {
    absl::StatusOr<std::unique_ptr<RankGroup>> created = CreateMpiRankGroup(kTimeout);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      std::abort();
    }
    return std::move(*created);
  }();
  return *group;
}

TEST_CASE("the MPI rank group gathers and exchanges; AllGatherChecked agrees on failures",
          "[mpi][group]") {
  RankGroup& group = Group();
  const int rank = group.rank();
  CHECK(group.size() == World().size());
  CHECK(rank == World().rank());
  absl::StatusOr<std::vector<std::string>> all =
      group.AllGather(std::string(static_cast<std::size_t>(rank), 'x'));
  REQUIRE(all.ok());
  for (int r = 0; r < group.size(); ++r) {
    CHECK((*all)[static_cast<std::size_t>(r)] == std::string(static_cast<std::size_t>(r), 'x'));
  }
  if (group.size() % 2 == 0) {
    const int peer = rank ^ 1;
    absl::StatusOr<std::string> theirs = group.Exchange(peer, std::to_string(rank));
    REQUIRE(theirs.ok());
    CHECK(*theirs == std::to_string(peer));
  }
  const absl::Status mine =
      rank == 1 ? absl::NotFoundError("rank 1's file") : absl::OkStatus();
  absl::StatusOr<std::vector<std::string>> checked =
      AllGatherChecked(group, mine, "", "setup (mpi)");
  CHECK(checked.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(checked.status().message()).find("setup (mpi) failed on 1 of ") == 0);
  SyncAll();
}

TEST_CASE("an MPI all-gather that a rank never joins names it; a failed rank keeps its reason",
          "[mpi][group]") {
  // A group of its own (the shared one must stay usable): the last rank stays away, as a
  // stopped rank would; every other rank failed its step and says what it waited for.
  absl::StatusOr<std::unique_ptr<RankGroup>> created = CreateMpiRankGroup(1.0);
  REQUIRE(created.ok());
  RankGroup& group = **created;
  const int last = group.size() - 1;
  if (group.rank() != last) {
    const std::string reason = "stage " + std::to_string(group.rank()) +
                               " waited 1.0 s for RECV_B0.0<-" + std::to_string(last);
    absl::StatusOr<std::vector<std::string>> all =
        AllGatherChecked(group, absl::DeadlineExceededError(reason), "", "step 0");
    std::string came = last == 1 ? "rank 0" : "ranks 0";
    for (int r = 1; r < last; ++r) came += ", " + std::to_string(r);
    CHECK(all.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(std::string(all.status().message()) ==
          "step 0: the ranks could not meet: rank " + std::to_string(group.rank()) +
              ": collective 0 (sizes) waited 1.0 s; " + came + " arrived, rank " +
              std::to_string(last) + " did not; this rank had failed: " + reason);
  }
  SyncAll();  // over the shared transport; the abandoned round is freed with the group
}

TEST_CASE("a PipelineStage opens over MPI with measured costs and runs po-f exactly",
          "[mpi][pipeline]") {
  Transport& world = World();
  const int p = world.size();
  PipelineSpec spec;
  spec.num_stages = p;
  spec.num_microbatches = 2 * p;
  spec.offload = OffloadPolicy::kFull;
  StageOptions options;
  options.spec = spec;
  options.transport = &world;
  options.group = &Group();
  options.costs.source = CostSource::kMeasured;
  options.costs.probe.link_probe_max_bytes = 1 << 20;
  options.executor.wait_timeout_seconds = kTimeout;
  ToyStageModel model(ToyConfig{p, 1, 2 * p, 64, 0}, world.rank());
  absl::StatusOr<std::unique_ptr<PipelineStage>> stage = PipelineStage::Open(options, model);
  INFO(stage.status().ToString());
  REQUIRE(stage.ok());
  CHECK((*stage)->measured_costs().size() == static_cast<std::size_t>(p));
  const StagePrediction& predicted =
      (*stage)->schedule().predictions->stages[static_cast<std::size_t>(world.rank())];
  for (int it = 0; it < 2; ++it) {
    absl::StatusOr<IterationStats> stats = (*stage)->Run();
    INFO(stats.status().ToString());
    REQUIRE(stats.ok());
    CHECK(stats->stash_high_water_bytes == predicted.peak_bytes);
    CHECK(stats->offloaded_bytes == predicted.offloaded_bytes);
  }
  SyncAll();
}

}  // namespace
}  // namespace pipeoffload
