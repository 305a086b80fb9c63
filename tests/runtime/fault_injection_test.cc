// Fault injection on the CPU backend (issue 17), through the way in and the executor:
//  - copy engines delayed at random (CpuBackendOptions' copy delays) change no bit of a
//    LocalPipeline's gradients, under every offload policy that moves activations (po-h, po-f,
//    selective), with and without split backward, and the bytes offloaded and reloaded are the
//    undelayed run's;
//  - an arena budget one byte short of a stage's exact need fails Open with ResourceExhausted
//    naming the need, the free bytes and the budget;
//  - an arena that runs out in the middle of an iteration (another user of it took the room)
//    fails that iteration with the arena's numbers, frees every block and host slot the
//    iteration held, and the next iteration (the room given back) runs bitwise like the
//    single-process reference.
// Host pool exhaustion is tested where the pool is reachable: tests/memory/exhaustion_test.cc
// (the executor sizes its own pool exactly, so a run cannot exhaust it).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/p2p_lifetimes.h"
#include "pipeoffload/pipeline.h"
#include "pipeoffload/planning.h"
#include "tests/runtime/toy_model.h"
#include "tests/runtime/toy_stage_options.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using testing::ToyConfig;
using testing::ToyGrads;
using testing::ToyReference;
using testing::ToyStageModel;
using testing::ToyStageConfig;
using testing::ToyStageOptions;

constexpr double kTimeout = testing::kToyStageTimeout;

// Every copy starts 0 to 2 ms late, each at its own random delay: transfers finish out of the
// order they were enqueued in, and well after the compute that follows them.
CpuBackendOptions DelayedCopies() {
  CpuBackendOptions options;
  options.min_copy_delay_seconds = 0.0;
  options.max_copy_delay_seconds = 0.002;
  options.fault_seed = 17;
  return options;
}

// One iteration of a LocalPipeline whose stages run on CPU backends made with `cpu`.
struct LocalRun {
  absl::Status status;
  std::vector<std::vector<ToyGrads>> grads;  // [stage][chunk]
  std::vector<IterationStats> stats;         // [stage]
  std::vector<std::int64_t> predicted_peaks;  // [stage]
};

LocalRun RunLocal(const StageOptions& options, const CpuBackendOptions& cpu) {
  const PipelineSpec& spec = *options.spec;
  LocalRun run;
  std::vector<std::unique_ptr<ToyStageModel>> models;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<StageModel*> model_ptrs;
  std::vector<Backend*> backend_ptrs;
  for (int d = 0; d < spec.num_stages; ++d) {
    models.push_back(std::make_unique<ToyStageModel>(ToyStageConfig(spec), d));
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(cpu);
    REQUIRE(backend.ok());
    backends.push_back(*std::move(backend));
    model_ptrs.push_back(models.back().get());
    backend_ptrs.push_back(backends.back().get());
  }
  absl::StatusOr<std::unique_ptr<LocalPipeline>> pipeline =
      LocalPipeline::Open(options, model_ptrs, backend_ptrs);
  if (!pipeline.ok()) {
    run.status = pipeline.status();
    return run;
  }
  absl::StatusOr<std::vector<IterationStats>> stats = (*pipeline)->Run();
  if (!stats.ok()) {
    run.status = stats.status();
    return run;
  }
  run.stats = *std::move(stats);
  for (int d = 0; d < spec.num_stages; ++d) {
    const PipelineStage& stage = (*pipeline)->stage(d);
    run.predicted_peaks.push_back(
        stage.schedule().predictions->stages[static_cast<std::size_t>(d)].peak_bytes);
    std::vector<ToyGrads> grads;
    for (int c = 0; c < spec.chunks_per_stage; ++c) {
      grads.push_back(models[static_cast<std::size_t>(d)]->grads(c));
    }
    run.grads.push_back(std::move(grads));
  }
  return run;
}

TEST_CASE("delayed copy engines change no bit of a LocalPipeline's gradients",
          "[runtime][faults]") {
  const OffloadPolicy policy =
      GENERATE(OffloadPolicy::kHalf, OffloadPolicy::kFull, OffloadPolicy::kSelective);
  const bool split = GENERATE(false, true);
  PipelineSpec spec = testing::MakeSpec(Family::kGroupInterleaved, 2, 4, 2, 0, split, policy);
  spec.offload_fraction = 0.5;  // selective
  CAPTURE(OffloadPolicyName(policy), split);
  const StageOptions options = ToyStageOptions(spec);
  const LocalRun plain = RunLocal(options, CpuBackendOptions{});
  const LocalRun delayed = RunLocal(options, DelayedCopies());
  INFO(plain.status.ToString() << " / " << delayed.status.ToString());
  REQUIRE(plain.status.ok());
  REQUIRE(delayed.status.ok());
  const std::vector<ToyGrads> reference = ToyReference(ToyStageConfig(spec));
  std::int64_t offloaded = 0;
  for (int d = 0; d < spec.num_stages; ++d) {
    const auto s = static_cast<std::size_t>(d);
    CAPTURE(d);
    CHECK(delayed.grads[s] == plain.grads[s]);
    for (int c = 0; c < spec.chunks_per_stage; ++c) {
      CHECK(delayed.grads[s][static_cast<std::size_t>(c)] ==
            reference[static_cast<std::size_t>(c * spec.num_stages + d)]);
    }
    // The same entries went out and came back, and the stash peaked where it was predicted.
    CHECK(delayed.stats[s].offloaded_bytes == plain.stats[s].offloaded_bytes);
    CHECK(delayed.stats[s].reloaded_bytes == delayed.stats[s].offloaded_bytes);
    CHECK(delayed.stats[s].stash_high_water_bytes == delayed.predicted_peaks[s]);
    CHECK(plain.stats[s].stash_high_water_bytes == plain.predicted_peaks[s]);
    offloaded += delayed.stats[s].offloaded_bytes;
  }
  CHECK(offloaded > 0);  // OFFLOAD / RELOAD really ran under the delays
}

TEST_CASE("an arena budget one byte below a stage's exact need fails Open with the numbers",
          "[runtime][faults]") {
  const PipelineSpec spec =
      testing::MakeSpec(Family::kGroupInterleaved, 2, 4, 2, 0, false, OffloadPolicy::kHalf);
  StageOptions exact = ToyStageOptions(spec);
  exact.arena.fragmentation_share = 0.0;
  exact.arena.spare_largest_entry = false;
  ToyStageModel model0(ToyStageConfig(spec), 0);
  ToyStageModel model1(ToyStageConfig(spec), 1);
  const std::vector<StageModel*> model_ptrs{&model0, &model1};
  std::vector<ArenaNeed> needs;
  {
    absl::StatusOr<std::unique_ptr<LocalPipeline>> pipeline =
        LocalPipeline::Open(exact, model_ptrs);
    INFO(pipeline.status().ToString());
    REQUIRE(pipeline.ok());
    for (int d = 0; d < 2; ++d) needs.push_back((*pipeline)->stage(d).arena_need());
  }
  // The stage that needs the most gets one byte less than that; the other stage's need fits.
  const int short_stage = needs[0].exact() >= needs[1].exact() ? 0 : 1;
  const ArenaNeed& need = needs[static_cast<std::size_t>(short_stage)];
  REQUIRE(need.p2p_bytes > 0);  // so the stash alone fits and the P2P plan tips it over
  StageOptions options = exact;
  options.arena.budget_bytes = need.exact() - 1;
  const absl::Status status = LocalPipeline::Open(options, model_ptrs).status();
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  const std::string message(status.message());
  CAPTURE(message);
  // The budget rounds down to the 256-byte alignment: one aligned block short.
  CHECK(message.find("rank " + std::to_string(short_stage) + ": the arena budget of " +
                     std::to_string(need.exact() - 1) + " bytes is too small for the plan") !=
        std::string::npos);
  CHECK(message.find("need " + std::to_string(need.exact()) + " bytes, but the device arena has " +
                     std::to_string(need.exact() - 256) + " bytes free (budget " +
                     std::to_string(need.exact() - 1) + ", 0 held by other users)") !=
        std::string::npos);
}

// The toy model, made afresh by Reset (gradients accumulate across iterations; the iteration
// after a failure must start from zero to compare with the reference), counting forwards.
class ResettableModel final : public StageModel {
 public:
  explicit ResettableModel(const ToyConfig& config) : config_(config) { Reset(); }
  void Reset() { inner_ = std::make_unique<ToyStageModel>(config_, 0); }
  std::int64_t SavedBytes(int chunk, bool split) const override {
    return inner_->SavedBytes(chunk, split);
  }
  std::int64_t BoundaryBytes() const override { return inner_->BoundaryBytes(); }
  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override {
    ++forwards_;
    return inner_->Forward(mb, chunk, input, output, saved);
  }
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input, void* saved,
                        bool with_weight_grad) override {
    return inner_->Backward(mb, chunk, grad_output, grad_input, saved, with_weight_grad);
  }
  absl::Status BackwardWeight(int mb, int chunk, void* saved) override {
    return inner_->BackwardWeight(mb, chunk, saved);
  }
  const ToyStageModel& inner() const { return *inner_; }
  int forwards() const { return forwards_; }

 private:
  const ToyConfig config_;
  std::unique_ptr<ToyStageModel> inner_;
  int forwards_ = 0;
};

std::int64_t ArenaInUse(const DeviceArena& arena, MemoryCategory category) {
  return arena.Usage(category).in_use_bytes;
}

TEST_CASE("an arena that runs out mid-iteration fails it, frees everything, and recovers",
          "[runtime][faults]") {
  // One stage, two chunks, chunk 0's entries offloaded (selective: on one stage po-f finds no
  // lifespan long enough), copies delayed: the failure meets entries on the host and copies in
  // flight.
  PipelineSpec spec =
      testing::MakeSpec(Family::kInterleaved, 1, 4, 2, 0, false, OffloadPolicy::kSelective);
  spec.offload_chunks = 1;
  const ToyConfig config = ToyStageConfig(spec);
  ResettableModel model(config);
  CostModel cost = UnitCostModel(/*offload_ratio_k=*/0.5);
  for (int chunk = 0; chunk < 2; ++chunk) {
    cost.activation_bytes_per_virtual_stage.push_back(model.SavedBytes(chunk, false));
  }
  cost.boundary_bytes = model.BoundaryBytes();
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  INFO(schedule.status().ToString());
  REQUIRE(schedule.ok());
  const std::int64_t predicted_peak = schedule->predictions->stages[0].peak_bytes;

  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend(DelayedCopies());
  REQUIRE(backend.ok());
  DeviceArenaOptions arena_options;
  arena_options.budget_bytes = 1 << 16;
  arena_options.poison_on_free = true;
  absl::StatusOr<std::unique_ptr<DeviceArena>> arena =
      DeviceArena::Create(**backend, arena_options);
  REQUIRE(arena.ok());
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> transports = CreateLocalTransports(1);
  REQUIRE(transports.ok());
  // The stage's exact need (stash peak plus its P2P plan's peak, aligned), the executor held
  // to that plan.
  absl::StatusOr<std::vector<P2PLifetimes>> p2p = AnalyzeP2P(*schedule);
  REQUIRE(p2p.ok());
  const ModelSizes sizes{{model.SavedBytes(0, false), model.SavedBytes(1, false)},
                         model.BoundaryBytes()};
  absl::StatusOr<ArenaNeed> need =
      StageArenaNeed(*schedule, 0, sizes, P2PReserve::kPlanned, &(*p2p)[0]);
  INFO(need.status().ToString());
  REQUIRE(need.ok());
  ExecutorOptions executor_options;
  executor_options.wait_timeout_seconds = kTimeout;
  executor_options.p2p_guarantee_points = (*p2p)[0].guarantee_point;
  absl::StatusOr<std::unique_ptr<Executor>> executor =
      Executor::Create(spec, schedule->stages[0], model, **backend, **arena, *(*transports)[0],
                       executor_options);
  INFO(executor.status().ToString());
  REQUIRE(executor.ok());

  // After Create, another user of the arena (a trainer's workspace) takes all of it but one
  // aligned block less than the stage's need: the first forward fits (an entry and a boundary
  // buffer are well below the need), the peak does not.
  const std::int64_t room = need->exact() - (*arena)->alignment();
  REQUIRE(room >= (*arena)->AlignedSize(model.SavedBytes(0, false)) +
                      (*arena)->AlignedSize(model.BoundaryBytes()));
  const std::int64_t hog_bytes = (*arena)->largest_free_block() - room;
  absl::StatusOr<void*> hog = (*arena)->Allocate(hog_bytes, MemoryCategory::kOther);
  REQUIRE(hog.ok());

  const absl::Status failed = (*executor)->Run().status();
  CHECK(failed.code() == absl::StatusCode::kResourceExhausted);
  const std::string message(failed.message());
  CAPTURE(message);
  CHECK(model.forwards() >= 1);  // it failed in the middle, not before the first op
  CHECK(message.find("stage 0") != std::string::npos);
  CHECK(message.find("device arena: cannot allocate ") != std::string::npos);
  CHECK(message.find("other " + std::to_string(hog_bytes) + "; ") != std::string::npos);
  CHECK(message.find(std::to_string(arena_options.budget_bytes) + "-byte budget") !=
        std::string::npos);
  // Nothing of the failed iteration is left: no stash or P2P block, no host slot.
  CHECK(ArenaInUse(**arena, MemoryCategory::kStash) == 0);
  CHECK((*arena)->Usage(MemoryCategory::kStash).live_blocks == 0);
  CHECK(ArenaInUse(**arena, MemoryCategory::kP2P) == 0);
  CHECK(ArenaInUse(**arena, MemoryCategory::kOther) == hog_bytes);
  CHECK((*executor)->host_pool().slots_in_use() == 0);
  CHECK((*executor)->host_pool().in_use_bytes() == 0);

  // The room given back, the next iteration runs as if nothing had happened.
  REQUIRE((*arena)->Free(*hog).ok());
  model.Reset();
  absl::StatusOr<IterationStats> stats = (*executor)->Run();
  INFO(stats.status().ToString());
  REQUIRE(stats.ok());
  CHECK(stats->stash_high_water_bytes == predicted_peak);
  CHECK(stats->offloaded_bytes > 0);
  const std::vector<ToyGrads> reference = ToyReference(config);
  for (int c = 0; c < 2; ++c) {
    CAPTURE(c);
    CHECK(model.inner().grads(c) == reference[static_cast<std::size_t>(c)]);
  }
  for (MemoryCategory category :
       {MemoryCategory::kStash, MemoryCategory::kP2P, MemoryCategory::kOther}) {
    CHECK(ArenaInUse(**arena, category) == 0);
  }
  CHECK((*arena)->num_free_ranges() == 1);
}

}  // namespace
}  // namespace pipeoffload
