// SimulateSharedGpu (shared_gpu.h) on hand-timed programs: copies hold their stage and stall
// compute, both directions at once run at the duplex rate, running stages split the GPU
// equally, and bad input or a stuck program is an error naming what is wrong.
#include "pipeoffload/shared_gpu.h"

#include <string>
#include <utility>
#include <vector>

#include "pipeoffload/compiler.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using Catch::Approx;

using testing::B;
using testing::F;
using testing::Offload;
using testing::Release;
using testing::Reload;

// One stage of `microbatches` microbatches running `ops`.
Schedule OneStage(std::vector<Op> ops, int microbatches) {
  return testing::Make(1, microbatches, 1, false, {std::move(ops)});
}

TEST_CASE("shared GPU: copies hold the stage, compute waits for them", "[sim][shared_gpu]") {
  // F0 [0,1]; OFFLOAD0 [1,3] (10 B at 5 B/s); RELEASE0 at 3; RELOAD0 [3,5]; B0 [5,6].
  CostModel cost = testing::HandTimedCosts();
  cost.d2h_bandwidth = cost.h2d_bandwidth = 5.0;
  const Schedule schedule = OneStage({F(0), Offload(0), Release(0), Reload(0), B(0)}, 1);
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(schedule, cost);
  REQUIRE(out.ok());
  CHECK(out->step_time == Approx(6.0));
  CHECK(out->compute_work == Approx(2.0));
  CHECK(out->gpu_idle == Approx(4.0));
  CHECK(out->copy_stall == Approx(4.0));
}

TEST_CASE("shared GPU: both directions at once run at the duplex rate", "[sim][shared_gpu]") {
  // F0 [0,1]; OFF0 [1,2] solo; REL0 2; F1 [2,3]; OFF1 and RELOAD0 from 3 at 5 B/s each: [3,5];
  // REL1 5; B0 [5,6]; RELOAD1 [5,6] solo at 10 B/s; B1 [6,7]. Idle: [1,2] and [3,5].
  const Schedule schedule = OneStage({F(0), Offload(0), Release(0), F(1), Offload(1), Reload(0),
                                      Release(1), B(0), Reload(1), B(1)},
                                     2);
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(schedule, testing::HandTimedCosts());
  REQUIRE(out.ok());
  CHECK(out->step_time == Approx(7.0));
  CHECK(out->compute_work == Approx(4.0));
  CHECK(out->gpu_idle == Approx(3.0));
  CHECK(out->copy_stall == Approx(3.0));
}

TEST_CASE("shared GPU: running stages split the GPU equally", "[sim][shared_gpu]") {
  // 1F1B p=2 m=2, F = 1, B = 3 (solo). Stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1.
  // [0,1] s0 F0 alone; [1,3] s0 F1 + s1 F0 at half speed; [3,6] s1 B0 alone; from 6 s1 F1
  // and s0 B0 share: s1 F1 ends at 8 with 2 of s0 B0 left; s1 B1 and s0 B0 share until 12
  // (s0 B0 done, 1 of s1 B1 left); s1 B1 alone to 13; s0 B1 [13,16].
  PipelineSpec spec;
  spec.num_stages = 2;
  spec.num_microbatches = 2;
  CostModel cost = testing::HandTimedCosts();
  cost.backward_time = cost.weight_time = 1.5;
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  REQUIRE(schedule.ok());
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(*schedule, cost);
  REQUIRE(out.ok());
  CHECK(out->step_time == Approx(16.0));
  CHECK(out->compute_work == Approx(16.0));
  CHECK(out->gpu_idle == Approx(0.0).margin(1e-9));
  REQUIRE(out->stage_end.size() == 2);
  CHECK(out->stage_end[0] == Approx(16.0));
  CHECK(out->stage_end[1] == Approx(13.0));
}

TEST_CASE("shared GPU: bad input is an error, a stuck program a hang report", "[sim][shared_gpu]") {
  const Schedule stuck = OneStage({F(0), Reload(0), B(0)}, 1);
  absl::StatusOr<SharedGpuPrediction> out = SimulateSharedGpu(stuck, testing::HandTimedCosts());
  REQUIRE(out.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(out.status().message()).find("stage 0 at op 1 (RELOAD0.0)") !=
        std::string::npos);

  CostModel zero = testing::HandTimedCosts();
  zero.forward_time = 0.0;
  out = SimulateSharedGpu(OneStage({F(0)}, 1), zero);
  CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
  CostModel no_link = testing::HandTimedCosts();
  no_link.duplex_bandwidth = 0.0;
  out = SimulateSharedGpu(OneStage({F(0)}, 1), no_link);
  CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload
