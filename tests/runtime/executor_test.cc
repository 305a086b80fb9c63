// Executor on hand-written programs (independent of the compiler): results bitwise equal to the
// single-process reference with and without offload, exact stash high-water marks, no leaks,
// steady state without allocation, and every failure mode reported clearly and in time.
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "pipeoffload/runtime.h"
#include "tests/runtime/hand_schedules.h"
#include "tests/runtime/toy_model.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::FindOp;
using testing::GradsByVirtualStage;
using testing::Hand1F1B;
using testing::HarnessOptions;
using testing::RunToyPipeline;
using testing::StageOutcome;
using testing::ToyConfig;
using testing::ToyReference;
using testing::ToyStageModel;

constexpr int kWidth = 64;

// Bytes of one toy stash entry of chunk 0 (stamp + x [+ dy]).
std::int64_t EntryBytes(bool split) { return 4 * (3 + kWidth + (split ? kWidth : 0)); }

void RequireAllOk(const std::vector<StageOutcome>& outcomes) {
  for (std::size_t d = 0; d < outcomes.size(); ++d) {
    INFO("stage " << d << ": " << outcomes[d].status.ToString());
    REQUIRE(outcomes[d].status.ok());
  }
}

std::vector<testing::ToyGrads> Reference(const Schedule& schedule) {
  return ToyReference(ToyConfig{schedule.spec.num_stages, schedule.spec.chunks_per_stage,
                                schedule.spec.num_microbatches, kWidth, 0});
}

TEST_CASE("executor runs a hand-written p=2 1F1B bitwise equal to the reference",
          "[runtime][executor]") {
  const bool split = GENERATE(false, true);
  const Schedule schedule = Hand1F1B(2, 3, split);
  const auto outcomes = RunToyPipeline(schedule, HarnessOptions{});
  RequireAllOk(outcomes);
  CHECK(GradsByVirtualStage(outcomes, 2, 1) == Reference(schedule));
  // 1F1B keeps min(p - d, m) entries: 2 on stage 0, 1 on stage 1.
  CHECK(outcomes[0].iterations[0].stash_high_water_bytes == 2 * EntryBytes(split));
  CHECK(outcomes[1].iterations[0].stash_high_water_bytes == 1 * EntryBytes(split));
  CHECK(outcomes[0].iterations[0].stash_high_water_entries == 2);
  for (const StageOutcome& outcome : outcomes) {
    CHECK(outcome.iterations[0].p2p_high_water_bytes >= 4 * kWidth);
    CHECK(outcome.iterations[0].offloaded_bytes == 0);
    CHECK(outcome.arena_in_use_after == 0);
    CHECK(outcome.host_pool_capacity == 0);
  }
}

TEST_CASE("offload on and off give bitwise equal gradients and the predicted stash peaks",
          "[runtime][executor][offload]") {
  const bool split = GENERATE(false, true);
  const std::uint64_t seed = GENERATE(1u, 2u);
  HarnessOptions options;
  options.backend.max_copy_delay_seconds = 0.002;  // random copy delays expose missing waits
  options.backend.fault_seed = seed;
  const Schedule plain = Hand1F1B(4, 4, split);
  // Stage 0 offloads mb 0 and 1: F0 OFF REL F1 OFF REL F2 F3 RELOAD0 B0 ... peaks at 3 entries
  // (instead of 4); stage 1 offloads mb 0 but reloads it right before B0, so its peak stays 3.
  const Schedule offloaded = Hand1F1B(4, 4, split, {{0, 1}, {0}});
  const auto off = RunToyPipeline(plain, options);
  const auto on = RunToyPipeline(offloaded, options);
  RequireAllOk(off);
  RequireAllOk(on);
  const auto reference = Reference(plain);
  CHECK(GradsByVirtualStage(off, 4, 1) == reference);
  CHECK(GradsByVirtualStage(on, 4, 1) == reference);
  const std::int64_t entry = EntryBytes(split);
  const std::vector<std::int64_t> peaks_off = {4 * entry, 3 * entry, 2 * entry, 1 * entry};
  const std::vector<std::int64_t> peaks_on = {3 * entry, 3 * entry, 2 * entry, 1 * entry};
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const IterationStats& a = off[static_cast<std::size_t>(d)].iterations[0];
    const IterationStats& b = on[static_cast<std::size_t>(d)].iterations[0];
    CHECK(a.stash_high_water_bytes == peaks_off[static_cast<std::size_t>(d)]);
    CHECK(b.stash_high_water_bytes == peaks_on[static_cast<std::size_t>(d)]);
    CHECK(on[static_cast<std::size_t>(d)].arena_in_use_after == 0);
  }
  // Host memory: both of stage 0's entries sit on the host at once; the pool holds exactly that.
  CHECK(on[0].iterations[0].host_high_water_bytes == 2 * entry);
  CHECK(on[0].iterations[0].offloaded_bytes == 2 * entry);
  CHECK(on[0].iterations[0].reloaded_bytes == 2 * entry);
  CHECK(on[0].host_pool_capacity >= 2 * entry);
  CHECK(on[0].backend_stats.bytes_d2h == 2 * entry);
  CHECK(on[1].iterations[0].host_high_water_bytes == entry);
  CHECK(on[2].iterations[0].host_high_water_bytes == 0);
}

TEST_CASE("iterations reuse the arena and host pool without allocating",
          "[runtime][executor][offload]") {
  HarnessOptions options;
  options.iterations = 3;
  options.backend.max_copy_delay_seconds = 0.001;
  const Schedule plain = Hand1F1B(4, 4, false);
  const Schedule offloaded = Hand1F1B(4, 4, false, {{0, 1, 2}, {0, 1}});
  const auto off = RunToyPipeline(plain, options);
  const auto on = RunToyPipeline(offloaded, options);
  RequireAllOk(off);
  RequireAllOk(on);
  CHECK(GradsByVirtualStage(off, 4, 1) == GradsByVirtualStage(on, 4, 1));
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const StageOutcome& outcome = on[static_cast<std::size_t>(d)];
    CHECK(outcome.backend_stats.device_allocations == 1);  // the arena, once
    CHECK(outcome.backend_stats.host_allocations == (d < 2 ? 1 : 0));  // the pool, once
    REQUIRE(outcome.iterations.size() == 3);
    for (const IterationStats& stats : outcome.iterations) {
      CHECK(stats.stash_high_water_bytes == outcome.iterations[0].stash_high_water_bytes);
    }
  }
}

TEST_CASE("a chain of chunks on one stage passes data locally", "[runtime][executor]") {
  // p = 1, v = 2: virtual stages 0 and 1 both live on stage 0; no messages at all.
  Schedule schedule;
  schedule.spec.num_stages = 1;
  schedule.spec.num_microbatches = 2;
  schedule.spec.chunks_per_stage = 2;
  StageProgram program;
  for (int mb = 0; mb < 2; ++mb) {
    program.ops.push_back(Op{OpKind::kForward, mb, 0, -1});
    program.ops.push_back(Op{OpKind::kOffload, mb, 0, -1});
    program.ops.push_back(Op{OpKind::kRelease, mb, 0, -1});
    program.ops.push_back(Op{OpKind::kForward, mb, 1, -1});
    program.ops.push_back(Op{OpKind::kBackward, mb, 1, -1});
    program.ops.push_back(Op{OpKind::kReload, mb, 0, -1});
    program.ops.push_back(Op{OpKind::kBackward, mb, 0, -1});
  }
  schedule.stages.push_back(program);
  HarnessOptions options;
  options.extra_words = 5;  // chunk 1's entries are larger than chunk 0's
  const auto outcomes = RunToyPipeline(schedule, options);
  RequireAllOk(outcomes);
  CHECK(GradsByVirtualStage(outcomes, 1, 2) ==
        ToyReference(ToyConfig{1, 2, 2, kWidth, 5}));
  // F0.0 is on the host while F0.1 runs; then RELOAD brings it back as F0.1 is freed.
  const std::int64_t chunk0 = 4 * (3 + kWidth + 5);
  const std::int64_t chunk1 = 4 * (3 + kWidth + 10);
  CHECK(outcomes[0].iterations[0].stash_high_water_bytes == std::max(chunk0, chunk1));
}

TEST_CASE("measured timelines follow the op semantics", "[runtime][executor][trace]") {
  const bool blocking_release = GENERATE(false, true);
  CAPTURE(blocking_release);
  HarnessOptions options;
  options.backend.min_copy_delay_seconds = 0.001;
  options.backend.max_copy_delay_seconds = 0.003;
  options.executor.stash.wait_for_copy_at_release = blocking_release;
  const Schedule schedule = Hand1F1B(4, 4, false, {{0, 1}, {0}});
  const auto outcomes = RunToyPipeline(schedule, options);
  RequireAllOk(outcomes);
  std::vector<IterationStats> stats;
  for (const StageOutcome& outcome : outcomes) stats.push_back(outcome.iterations[0]);
  absl::StatusOr<Timeline> timeline = MeasuredTimeline(stats);
  REQUIRE(timeline.ok());
  REQUIRE(timeline->stages.size() == 4);
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const std::vector<TimedOp>& ops = timeline->stages[static_cast<std::size_t>(d)];
    const StageProgram& program = schedule.stages[static_cast<std::size_t>(d)];
    REQUIRE(ops.size() == program.ops.size());
    double last_compute_end = 0.0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      CAPTURE(i);
      CHECK(ops[i].op == program.ops[i]);
      CHECK(ops[i].start <= ops[i].end);
      if (ops[i].engine == Engine::kCompute) {
        CHECK(ops[i].start >= last_compute_end);  // one compute engine, program order
        last_compute_end = ops[i].end;
      }
    }
    for (int mb : d == 0 ? std::vector<int>{0, 1} : d == 1 ? std::vector<int>{0}
                                                           : std::vector<int>{}) {
      auto at = [&](OpKind kind) {
        return ops[static_cast<std::size_t>(FindOp(program, Op{kind, mb, 0, -1}))];
      };
      CHECK(at(OpKind::kOffload).engine == Engine::kD2H);
      CHECK(at(OpKind::kReload).engine == Engine::kH2D);
      CHECK(at(OpKind::kOffload).bytes == EntryBytes(false));
      CHECK(at(OpKind::kOffload).start >= at(OpKind::kForward).end);
      // Only a blocking RELEASE waits for the copy; a deferred one may end before it.
      if (blocking_release) CHECK(at(OpKind::kRelease).end >= at(OpKind::kOffload).end);
      CHECK(at(OpKind::kReload).start >= at(OpKind::kOffload).end);
      CHECK(at(OpKind::kBackward).start >= at(OpKind::kReload).end);
    }
    std::int64_t max_sample = 0;
    for (const MemorySample& sample : timeline->memory[static_cast<std::size_t>(d)]) {
      max_sample = std::max(max_sample, sample.bytes);
    }
    CHECK(max_sample == outcomes[static_cast<std::size_t>(d)].iterations[0].stash_high_water_bytes);
    CHECK(timeline->predictions.stages[static_cast<std::size_t>(d)].peak_bytes == max_sample);
  }
  // One clock for all stages: every op is shifted by the same origin, the earliest stage start
  // (a per-stage origin would misalign the stages' timelines).
  double origin = stats[0].start_time;
  for (const IterationStats& stage : stats) origin = std::min(origin, stage.start_time);
  for (int d = 0; d < 4; ++d) {
    CAPTURE(d);
    const std::vector<TimedOp>& ops = timeline->stages[static_cast<std::size_t>(d)];
    const std::vector<TimedOp>& raw = stats[static_cast<std::size_t>(d)].ops;
    REQUIRE(ops.size() == raw.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      CHECK(ops[i].start == raw[i].start - origin);
      CHECK(ops[i].end == raw[i].end - origin);
    }
  }
  CHECK(timeline->predictions.step_time > 0.0);
  stats[1].stage = 3;
  CHECK(MeasuredTimeline(stats).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("poisoning catches a RELEASE that does not wait for its D2H copy",
          "[runtime][executor][poison]") {
  HarnessOptions options;
  options.backend.min_copy_delay_seconds = 0.05;  // the D2H starts 50 ms late
  options.backend.max_copy_delay_seconds = 0.05;
  options.executor.wait_timeout_seconds = 2.0;
  options.executor.stash.unsafe_release_without_wait = true;
  // The last stage offloads mb 0: F0.0 OFFLOAD0.0 RELEASE0.0 RELOAD0.0 B0.0. The release frees
  // and poisons the block before the late D2H reads it; the D2H copies poison to the host and
  // the reload brings it back, where B0.0's check finds it. (When another F reuses the block
  // first, it zero-fills and overwrites it: then the corruption is wrong data instead, which the
  // toy model's stamp check reports.)
  const Schedule schedule = Hand1F1B(2, 2, false, {{}, {0}});
  const auto outcomes = RunToyPipeline(schedule, options);
  const absl::Status& status = outcomes[1].status;
  INFO(status.ToString());
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(status.message()).rfind("stage 1, op 5 (B0.0): stash entry (mb 0, chunk 0) "
                                            "holds the poison pattern at byte 0 of 268", 0) == 0);
  CHECK(outcomes[1].arena_in_use_after == 0);  // the failed iteration freed everything
  // The same run waiting for its copies is correct.
  options.executor.stash.unsafe_release_without_wait = false;
  const auto safe = RunToyPipeline(schedule, options);
  RequireAllOk(safe);
  CHECK(GradsByVirtualStage(safe, 2, 1) == Reference(schedule));
}

TEST_CASE("a B that would read a released entry is an illegal stash transition",
          "[runtime][executor][poison]") {
  Schedule schedule = Hand1F1B(2, 2, false, {{0}});
  std::vector<Op>& ops = schedule.stages[0].ops;
  ops.erase(ops.begin() + FindOp(schedule.stages[0], Op{OpKind::kReload, 0, 0, -1}));
  HarnessOptions options;
  options.executor.wait_timeout_seconds = 1.0;
  const auto outcomes = RunToyPipeline(schedule, options);
  const std::string message(outcomes[0].status.message());
  INFO(message);
  CHECK(outcomes[0].status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(message.find("(B0.0)") != std::string::npos);
  CHECK(message.find("stash entry (mb 0, chunk 0) is ON_HOST") != std::string::npos);
}

TEST_CASE("a missing RECV makes the watchdog name op and peer within the timeout",
          "[runtime][executor][watchdog]") {
  Schedule schedule = Hand1F1B(4, 4, false);
  std::vector<Op>& ops = schedule.stages[1].ops;
  ops.erase(ops.begin() +
            FindOp(schedule.stages[1], Op{OpKind::kRecvActivation, 2, 0, 0}));
  HarnessOptions options;
  options.executor.wait_timeout_seconds = 1.0;
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = RunToyPipeline(schedule, options);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(elapsed < 5.0);
  std::vector<std::string> messages;
  for (const StageOutcome& outcome : outcomes) {
    messages.emplace_back(outcome.status.message());
    INFO(outcome.status.ToString());
    CHECK_FALSE(outcome.status.ok());
  }
  // The broken stage knows at once that F2.0 has no input.
  CHECK(outcomes[1].status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(messages[1].find("no RECV_F2.0<-0 was posted before it") != std::string::npos);
  // Its neighbours wait in vain and the watchdog names what they wait for, and from whom.
  CHECK(outcomes[2].status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(messages[2].rfind("stage 2 waited 1.0 s for RECV_F2.0<-1 (before F2.0, op", 0) == 0);
  CHECK(outcomes[0].status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(messages[0].rfind("stage 0 waited 1.0 s for RECV_B0.0<-1 (before B0.0, op", 0) == 0);
}

TEST_CASE("a missing SEND is reported by both sides", "[runtime][executor][watchdog]") {
  Schedule schedule = Hand1F1B(2, 2, false);
  std::vector<Op>& ops = schedule.stages[0].ops;
  ops.erase(ops.begin() + FindOp(schedule.stages[0], Op{OpKind::kSendActivation, 1, 0, 1}));
  HarnessOptions options;
  options.executor.wait_timeout_seconds = 0.5;
  const auto outcomes = RunToyPipeline(schedule, options);
  INFO(outcomes[0].status.ToString());
  INFO(outcomes[1].status.ToString());
  // Stage 0 waits in vain for the gradient of B1.0, which stage 1 never computes.
  CHECK(outcomes[0].status.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(outcomes[0].status.message())
            .rfind("stage 0 waited 0.5 s for RECV_B1.0<-1 (before B1.0, op", 0) == 0);
  CHECK(std::string(outcomes[1].status.message())
            .rfind("stage 1 waited 0.5 s for RECV_F1.0<-0 (before F1.0, op", 0) == 0);
}

TEST_CASE("an unmatched BARRIER makes the watchdog name it", "[runtime][executor][watchdog]") {
  Schedule schedule = Hand1F1B(2, 2, false);
  // Matched barriers run fine.
  // Stage 0 meets stage 1 after sending F0.0's output, stage 1 after computing F0.0.
  schedule.stages[0].ops.insert(schedule.stages[0].ops.begin() + 2, Op{OpKind::kBarrier, -1, -1, 1});
  schedule.stages[1].ops.insert(schedule.stages[1].ops.begin() + 2, Op{OpKind::kBarrier, -1, -1, 0});
  HarnessOptions options;
  options.executor.wait_timeout_seconds = 0.5;
  RequireAllOk(RunToyPipeline(schedule, options));
  schedule.stages[1].ops.erase(schedule.stages[1].ops.begin() + 2);
  const auto outcomes = RunToyPipeline(schedule, options);
  INFO(outcomes[0].status.ToString());
  CHECK(std::string(outcomes[0].status.message()).rfind("stage 0 waited 0.5 s for BARRIER~1 (op 2)", 0) ==
        0);
}

struct Endpoints {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceArena> arena;
  std::vector<std::unique_ptr<Transport>> transports;
};

Endpoints MakeEndpoints(int ranks, std::int64_t budget) {
  Endpoints e;
  e.backend = std::move(*CreateCpuBackend());
  DeviceArenaOptions arena_options;
  arena_options.budget_bytes = budget;
  e.arena = std::move(*DeviceArena::Create(*e.backend, arena_options));
  e.transports = std::move(*CreateLocalTransports(ranks));
  return e;
}

TEST_CASE("a schedule for another number of ranks is refused at Create",
          "[runtime][executor][errors]") {
  const Schedule schedule = Hand1F1B(2, 2, false);
  Endpoints e = MakeEndpoints(3, 1 << 20);
  ToyStageModel model(ToyConfig{2, 1, 2, kWidth, 0}, 0);
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(
      schedule.spec, schedule.stages[0], model, *e.backend, *e.arena, *e.transports[0]);
  REQUIRE(executor.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(executor.status().message()) ==
        "executor: the schedule has 2 stages but the local transport connects 3 ranks; run one "
        "rank per stage");
  Endpoints two = MakeEndpoints(2, 1 << 20);
  executor = Executor::Create(schedule.spec, schedule.stages[1], model, *two.backend,
                              *two.arena, *two.transports[0]);
  REQUIRE(executor.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(executor.status().message()) ==
        "executor: the program of stage 1 was given to rank 0");
}

TEST_CASE("a budget too small for the program is refused with the numbers",
          "[runtime][executor][errors]") {
  const Schedule schedule = Hand1F1B(2, 3, false);
  HarnessOptions options;
  options.arena_budget_bytes = 600;
  options.executor.wait_timeout_seconds = 0.5;
  const auto outcomes = RunToyPipeline(schedule, options);
  const std::string message(outcomes[0].status.message());
  INFO(message);
  CHECK(outcomes[0].status.code() == absl::StatusCode::kResourceExhausted);
  // Two entries of 268 bytes, each taking 512 with 256-byte alignment, at F1.0.
  CHECK(message ==
        "executor: stage 0: the program's activation stash peaks at 536 bytes (1024 with the "
        "arena's 256-byte alignment) at op 2 (F1.0), but the device arena has 512 bytes free "
        "(budget 600, 0 held by other users); raise the budget or offload more");
  // Stage 1's stash fits; it then waits in vain for stage 0, which never started.
  CHECK(std::string(outcomes[1].status.message())
            .rfind("stage 1 waited 0.5 s for RECV_F0.0<-0 (before F0.0, op 1)", 0) == 0);
}

TEST_CASE("programs that do not fit the spec are refused at Create",
          "[runtime][executor][errors]") {
  struct Case {
    Op op;
    const char* expected;
  };
  const Case cases[] = {
      {Op{OpKind::kForward, 5, 0, -1}, "op 0 (F5.0): mb must be in [0, 2) and chunk in [0, 1)"},
      {Op{OpKind::kForward, 0, 1, -1}, "op 0 (F0.1): mb must be in [0, 2)"},
      {Op{OpKind::kSendActivation, 0, 0, 0}, "op 0 (SEND_F0.0->0): the peer must be stage 1"},
      {Op{OpKind::kRecvActivation, 0, 0, 1}, "virtual stage 0 has no neighbour in that direction"},
      {Op{OpKind::kBarrier, -1, -1, 0}, "a BARRIER's peer must be another stage"},
  };
  for (const Case& c : cases) {
    Schedule schedule = Hand1F1B(2, 2, false);
    schedule.stages[0].ops.insert(schedule.stages[0].ops.begin(), c.op);
    Endpoints e = MakeEndpoints(2, 1 << 20);
    ToyStageModel model(ToyConfig{2, 1, 2, kWidth, 0}, 0);
    absl::Status status = Executor::Create(schedule.spec, schedule.stages[0], model, *e.backend,
                                           *e.arena, *e.transports[0])
                              .status();
    INFO(status.ToString());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find(c.expected) != std::string::npos);
  }
}

// A model whose sizes are not usable.
class BadSizesModel final : public StageModel {
 public:
  BadSizesModel(std::int64_t saved, std::int64_t boundary) : saved_(saved), boundary_(boundary) {}
  std::int64_t SavedBytes(int, bool) const override { return saved_; }
  std::int64_t BoundaryBytes() const override { return boundary_; }
  absl::Status Forward(int, int, const void*, void*, void*) override { return {}; }
  absl::Status Backward(int, int, const void*, void*, void*, bool) override { return {}; }
  absl::Status BackwardWeight(int, int, void*) override { return {}; }

 private:
  const std::int64_t saved_;
  const std::int64_t boundary_;
};

TEST_CASE("a model with non-positive sizes is refused at Create", "[runtime][executor][errors]") {
  const Schedule schedule = Hand1F1B(2, 2, false);
  Endpoints e = MakeEndpoints(2, 1 << 20);
  BadSizesModel no_stash(0, 256);
  absl::Status status = Executor::Create(schedule.spec, schedule.stages[0], no_stash,
                                         *e.backend, *e.arena, *e.transports[0])
                            .status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()) ==
        "executor: stage 0: the model's SavedBytes(chunk 0) is 0; it must be positive");
  BadSizesModel no_boundary(256, -1);
  status = Executor::Create(schedule.spec, schedule.stages[0], no_boundary, *e.backend,
                            *e.arena, *e.transports[0])
               .status();
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("BoundaryBytes() is -1") != std::string::npos);
}

TEST_CASE("other arena users are reported apart from the stash and count against the budget",
          "[runtime][executor]") {
  const Schedule schedule = Hand1F1B(1, 3, false);
  Endpoints e = MakeEndpoints(1, 4096);
  // "Weights" of 2000 bytes live in the arena across iterations.
  absl::StatusOr<void*> weights = e.arena->Allocate(2000, MemoryCategory::kOther);
  REQUIRE(weights.ok());
  ToyStageModel model(ToyConfig{1, 1, 3, kWidth, 0}, 0);
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(
      schedule.spec, schedule.stages[0], model, *e.backend, *e.arena, *e.transports[0]);
  REQUIRE(executor.ok());
  absl::StatusOr<IterationStats> stats = (*executor)->Run();
  REQUIRE(stats.ok());
  CHECK(stats->stash_high_water_bytes == EntryBytes(false));  // p = 1: F then B, one at a time
  CHECK(stats->other_high_water_bytes == 2000);
  CHECK(stats->p2p_high_water_bytes == 0);  // one virtual stage: nothing to exchange
  // With more held by others, the same program no longer fits.
  absl::StatusOr<void*> more = e.arena->Allocate(1600, MemoryCategory::kOther);
  REQUIRE(more.ok());
  absl::Status status = Executor::Create(schedule.spec, schedule.stages[0], model, *e.backend,
                                         *e.arena, *e.transports[0])
                            .status();
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(status.message()).find("has 256 bytes free (budget 4096, 3840 held by other "
                                           "users)") != std::string::npos);
}

}  // namespace
}  // namespace pipeoffload
