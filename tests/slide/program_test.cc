// BuildSlideProgram: an exact program, its invariants over many shapes and plans, and the
// checker catching broken programs.
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/slide/program.h"
#include "tests/slide/slide_test_shapes.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using internal::BuildSlideProgram;
using internal::CheckSlideProgram;
using internal::SlideOp;
using internal::SlideOpKind;
using internal::SlideProgram;
using internal::SlideProgramOptions;
using testing::TestShape;

SlidingPlan AllSliding(const SlidingModelShape& shape, int slots) {
  SlidingOptions options;
  options.gpu_memory_budget_bytes = std::int64_t{1} << 40;
  options.num_slots = slots;
  options.placement.assign(shape.units.size(), UnitPlace::kSliding);
  absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, options);
  REQUIRE(plan.ok());
  return *plan;
}

TEST_CASE("BuildSlideProgram: two slots, one microbatch, the CPU backend's order",
          "[slide][program]") {
  // embed, layer.0, layer.1, head. Uses F0 F1 F2 B3 B2 B1 B0; layer.0's input (unit 1) is the
  // only checkpoint (units 1 .. U-3).
  const SlidingModelShape shape = TestShape(2, 100, 100, 100);
  const SlidingPlan plan = AllSliding(shape, 2);
  SlideProgramOptions options;
  options.upload_distance = 1;
  options.grads_out_distance = 1;
  const absl::StatusOr<SlideProgram> program = BuildSlideProgram(shape, plan, options);
  REQUIRE(program.ok());
  CHECK(program->ToString() ==
        "begin_step\n"
        "upload u0 s0 wait_update\n"  // F0 into s0; F1's upload goes with it, before F0 runs
        "upload u1 s1 wait_update\n"
        "forward u0 mb0 s0\n"
        "save_ckpt u1 mb0\n"
        "end_use u0 s0\n"
        "upload u2 s0 wait_update\n"  // evicts the embedding (needed again last)
        "forward u1 mb0 s1\n"
        "end_use u1 s1\n"
        "upload u3 s1 wait_update\n"  // the head, for its backward
        "forward u2 mb0 s0\n"
        "end_use u2 s0\n"
        "begin_grads u3 s1\n"
        "backward u3 mb0 s1\n"
        "finish_grads u3 s1\n"
        "end_use u3 s1\n"
        "grads_out u3 s1\n"
        "load_ckpt u1 mb0\n"           // into act[1] once the head (its last reader) is done
        "upload u1 s1\n"               // the head's gradients are out: its slot is free
        "begin_grads u2 s0\n"          // layer.1 is still in s0 from the forward
        "backward u2 mb0 s0\n"
        "finish_grads u2 s0\n"
        "end_use u2 s0\n"
        "grads_out u2 s0\n"
        "upload u0 s0\n"
        "begin_grads u1 s1\n"
        "backward u1 mb0 s1\n"
        "finish_grads u1 s1\n"
        "end_use u1 s1\n"
        "grads_out u1 s1\n"
        "begin_grads u0 s0\n"
        "backward u0 mb0 s0\n"
        "finish_grads u0 s0\n"
        "end_use u0 s0\n"
        "grads_out u0 s0\n"
        "norm\n");
  CHECK(program->grads_out_order == std::vector<int>{3, 2, 1, 0});
  CHECK(program->uploads == 6);
  CHECK(CheckSlideProgram(shape, plan, 1, *program).ok());
}

TEST_CASE("BuildSlideProgram keeps every invariant over generated shapes and plans",
          "[slide][program]") {
  std::mt19937 rng(7);
  int checked = 0;
  for (int layers = 1; layers <= 6; ++layers) {
    for (bool tied : {false, true}) {
      for (int slots = 1; slots <= 4; ++slots) {
        for (int M : {1, 3}) {
          for (int distance = 0; distance <= 3; ++distance) {
            for (int grads_out = 1; grads_out <= 2; ++grads_out) {
              for (bool defer : {false, true}) {
                const std::int64_t big = (rng() % 2) ? 400 : 100;
                const SlidingModelShape shape = TestShape(layers, big, 100, tied ? 5 : big, tied);
                SlidingPlan plan = AllSliding(shape, slots);
                // Random resident units (a tied head follows the embedding).
                for (std::size_t u = 0; u < plan.placement.size(); ++u) {
                  if (rng() % 3 == 0) plan.placement[u] = UnitPlace::kResident;
                }
                if (tied) plan.placement.back() = plan.placement[0];
                // Random checkpoints on NVMe (loaded one microbatch at a time).
                const int num_units = static_cast<int>(shape.units.size());
                for (int u = 0; u < num_units; ++u) {
                  plan.nvme_checkpoints[static_cast<std::size_t>(u)] =
                      internal::IsCheckpointed(u, num_units) && rng() % 2 == 0;
                }
                SlideProgramOptions options;
                options.num_microbatches = M;
                options.upload_distance = distance;
                options.grads_out_distance = grads_out;
                options.defer_updates = defer;
                const absl::StatusOr<SlideProgram> program = BuildSlideProgram(shape, plan, options);
                if (!program.ok()) {
                  // One slot cannot hand gradients out one use late.
                  INFO(program.status().message());
                  REQUIRE(slots == 1);
                  REQUIRE(grads_out == 2);
                  REQUIRE(program.status().code() == absl::StatusCode::kFailedPrecondition);
                  continue;
                }
                const absl::Status status = CheckSlideProgram(shape, plan, M, *program);
                INFO(program->ToString());
                REQUIRE(status.ok());
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("BuildSlideProgram loads a checkpoint on NVMe after the backward of its microbatch "
          "above", "[slide][program]") {
  // embed, 4 layers, head: checkpoints of units 1..3; the lowest two on the drive.
  const SlidingModelShape shape = TestShape(4, 100, 100, 100);
  SlidingOptions options;
  options.gpu_memory_budget_bytes = std::int64_t{1} << 40;
  options.num_microbatches = 2;
  options.placement.assign(shape.units.size(), UnitPlace::kSliding);
  options.nvme_dir = "/only-planned";
  options.nvme_checkpoint_fraction = 0.6;  // 2 of 3
  const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, options);
  REQUIRE(plan.ok());
  CHECK(plan->nvme_checkpoints == std::vector<bool>{false, true, true, false, false, false});
  SlideProgramOptions program_options;
  program_options.num_microbatches = 2;
  const absl::StatusOr<SlideProgram> program = BuildSlideProgram(shape, *plan, program_options);
  REQUIRE(program.ok());
  REQUIRE(CheckSlideProgram(shape, *plan, 2, *program).ok());
  std::vector<std::string> loads;  // each load with the op before it
  for (std::size_t i = 1; i < program->ops.size(); ++i) {
    const SlideOp& op = program->ops[i];
    if (op.kind != SlideOpKind::kLoadCheckpoint) continue;
    const SlideOp& before = program->ops[i - 1];
    loads.push_back(absl::StrCat("u", op.unit, " mb", op.mb, " after ",
                                 std::string(internal::SlideOpKindName(before.kind)), " u",
                                 before.unit, " mb", before.mb));
  }
  // Unit 3 (host) right after B(5)'s hand-over, both microbatches together; units 2 and 1
  // (drive) each right after the backward of the same microbatch one unit up.
  CHECK(loads == std::vector<std::string>{
                     "u3 mb0 after grads_out u5 mb-1", "u3 mb1 after load_ckpt u3 mb0",
                     "u2 mb0 after backward u3 mb0", "u2 mb1 after backward u3 mb1",
                     "u1 mb0 after backward u2 mb0", "u1 mb1 after backward u2 mb1"});
}

TEST_CASE("BuildSlideProgram uploads each unit once when the ring holds the whole model",
          "[slide][program]") {
  const SlidingModelShape shape = TestShape(3, 100, 100, 100);
  const SlidingPlan plan = AllSliding(shape, 5);
  const absl::StatusOr<SlideProgram> program = BuildSlideProgram(shape, plan, {});
  REQUIRE(program.ok());
  CHECK(program->uploads == 5);
  CHECK(program->upload_elements == 500);
}

TEST_CASE("CheckSlideProgram catches broken programs", "[slide][program]") {
  const SlidingModelShape shape = TestShape(3, 100, 100, 100);
  const SlidingPlan plan = AllSliding(shape, 2);
  const absl::StatusOr<SlideProgram> built = BuildSlideProgram(shape, plan, {});
  REQUIRE(built.ok());
  auto broken = [&](auto mutate) {
    SlideProgram program = *built;
    mutate(program.ops);
    return CheckSlideProgram(shape, plan, 1, program);
  };
  auto find = [](std::vector<SlideOp>& ops, SlideOpKind kind, int unit) {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == kind && ops[i].unit == unit) return i;
    }
    FAIL("op not found");
    return std::size_t{0};
  };
  // A skipped update (the unit's gradients never go out).
  CHECK(broken([&](auto& ops) { ops.erase(ops.begin() + find(ops, SlideOpKind::kGradsOut, 2)); })
            .code() == absl::StatusCode::kInternal);
  // A forward without its upload.
  CHECK(!broken([&](auto& ops) { ops.erase(ops.begin() + find(ops, SlideOpKind::kUpload, 1)); }).ok());
  // A checkpoint loaded before it was saved.
  CHECK(!broken([&](auto& ops) { ops.erase(ops.begin() + find(ops, SlideOpKind::kSaveCheckpoint, 1)); }).ok());
  // The norm before the last unit finished.
  CHECK(!broken([&](auto& ops) {
          const std::size_t norm = find(ops, SlideOpKind::kNorm, -1);
          const SlideOp op = ops[norm];
          ops.erase(ops.begin() + norm);
          ops.insert(ops.begin() + 2, op);
        }).ok());
  // An upload that evicts a unit whose gradients are not out yet.
  CHECK(!broken([&](auto& ops) {
          const std::size_t out = find(ops, SlideOpKind::kGradsOut, 3);
          const SlideOp op = ops[out];
          ops.erase(ops.begin() + out);
          ops.insert(ops.end() - 1, op);
        }).ok());
}

}  // namespace
}  // namespace pipeoffload
