// PlanSliding: bytes per tier, slot sizing, placement, errors.
#include <string>

#include "pipeoffload/layer_sliding.h"
#include "tests/slide/slide_test_shapes.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::TestShape;

SlidingOptions Options(std::int64_t budget, int microbatches = 2) {
  SlidingOptions options;
  options.gpu_memory_budget_bytes = budget;
  options.num_microbatches = microbatches;
  return options;
}

TEST_CASE("PlanSliding counts every device and host byte of an all-sliding plan", "[slide][plan]") {
  // 4 layers of 2000, embedding and head of 1000 (fp32), activations of 1 KiB, M = 2.
  const SlidingModelShape shape = TestShape(4, 1000, 2000, 1000);
  SlidingOptions options = Options(1 << 30);
  options.placement.assign(6, UnitPlace::kSliding);
  const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, options);
  REQUIRE(plan.ok());
  // No unit is 1.5x the median: three equal slots of the largest.
  CHECK(plan->slot_elements == std::vector<std::int64_t>{2000, 2000, 2000});
  CHECK(plan->device_slot_bytes == 3 * 2 * 8192);      // params + grads, 8000 B rounded to 256
  CHECK(plan->device_accumulator_bytes == 8192);
  CHECK(plan->device_activation_bytes == 4 * 2 * 1024);  // act and grad, 2 sets, M = 2
  CHECK(plan->device_workspace_bytes == 4096);
  CHECK(plan->device_resident_bytes == 0);
  CHECK(plan->device_engine_bytes == 256 + 256 + 8 * 256);
  CHECK(plan->device_model_bytes == 8192);
  CHECK(plan->device_total_bytes == 80384);
  // fp32: the master is the upload source (pinned); m, v pageable; three landing buffers of the
  // largest unit; checkpoints of units 1..3 for 2 microbatches; the per-unit sums.
  CHECK(plan->host_pageable_bytes == 8 * 10000);
  CHECK(plan->host_pinned_bytes == 4 * 10000 + 3 * 4 * 2000 + 3 * 2 * 1024 + 8 * 6);
  CHECK(plan->landing_buffers == 3);
  CHECK(plan->nvme_bytes == 0);
  CHECK(plan->resident_units() == 0);
}

TEST_CASE("PlanSliding counts a bf16 model's split masters: 12 B per sliding parameter on the "
          "host, 14 B per resident one on the device",
          "[slide][plan]") {
  SlidingModelShape shape = TestShape(4, 1000, 2000, 1000);
  shape.param_dtype = SlideDtype::kBf16;
  SlidingOptions options = Options(1 << 30);
  options.placement.assign(6, UnitPlace::kSliding);
  options.placement[0] = UnitPlace::kResident;  // the embedding: 1000 parameters
  const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, options);
  REQUIRE(plan.ok());
  // Sliding: 9000 parameters. Pageable: m, v and the masters' low halves (10 B); pinned: the
  // high halves (the upload copies, 2 B), three bf16 landing buffers of a layer, checkpoints
  // of units 1..3 for 2 microbatches, the per-unit sums.
  CHECK(plan->host_pageable_bytes == 10 * 9000);
  CHECK(plan->host_pinned_bytes == 2 * 9000 + 3 * 2 * 2000 + 3 * 2 * 1024 + 8 * 6);
  // Resident embedding: parameters (the high halves) 2000 B -> 2048, gradients 2048, m and v
  // 4096 each, low halves 2048: 14 B per parameter, each array rounded to 256 B.
  CHECK(plan->device_resident_bytes == 2048 + 2048 + 4096 + 4096 + 2048);
  // Slots of bf16 parameters and gradients: 4000 B each, rounded to 4096.
  CHECK(plan->device_slot_bytes == 3 * 2 * 4096);
  // With m, v and the low halves of half the sliding units (the top 3 of 5) on NVMe: 2 B per
  // parameter left on the host there (the high halves, pinned).
  options.nvme_dir = "/nonexistent-but-only-planned";
  options.nvme_fraction = 0.5;
  const absl::StatusOr<SlidingPlan> nvme = PlanSliding(shape, options);
  REQUIRE(nvme.ok());
  CHECK(nvme->nvme == std::vector<bool>{false, false, false, true, true, true});
  CHECK(nvme->host_pageable_bytes == 10 * 9000 - 10 * (2000 + 2000 + 1000));
  // Per unit m, v and lo, each rounded to 4 KiB: layers 8000 + 8000 + 4000 B, the head 4000 +
  // 4000 + 2000 B.
  CHECK(nvme->nvme_bytes == 2 * (8192 + 8192 + 4096) + (4096 + 4096 + 4096));
  // Pinned: the high halves of all sliding units, the landing buffers, checkpoints and sums as
  // without NVMe, plus two staging sets of the largest NVMe unit's m, v, lo.
  CHECK(nvme->host_pinned_bytes == plan->host_pinned_bytes + 2 * (8192 + 8192 + 4096));
}

TEST_CASE("PlanSliding makes the unit resident that takes the most off the CPU's critical path",
          "[slide][plan]") {
  const SlidingModelShape shape = TestShape(4, 1000, 2000, 1000);
  // The all-sliding plan (80384 B) plus exactly one 1000-element resident unit (params, grads,
  // m, v: 4 x 4096 B). The embedding resident leaves the 4 layers below the (deferred) head on
  // the critical path, 8000 elements; the head resident leaves the embedding and layers 0-2
  // below the deferred layer.3, 7000: the head goes resident, nothing else fits.
  const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, Options(80384 + 16384));
  REQUIRE(plan.ok());
  CHECK(plan->placement[5] == UnitPlace::kResident);
  for (int u = 0; u < 5; ++u) CHECK(plan->placement[static_cast<std::size_t>(u)] == UnitPlace::kSliding);
  CHECK(plan->device_resident_bytes == 16384);
  CHECK(plan->device_total_bytes == 80384 + 16384);
  // One byte less: the embedding does not fit, the head (also 1000) neither.
  const absl::StatusOr<SlidingPlan> tight = PlanSliding(shape, Options(80384 + 16383));
  REQUIRE(tight.ok());
  CHECK(tight->resident_units() == 0);
  // Everything resident: no ring.
  const absl::StatusOr<SlidingPlan> all = PlanSliding(shape, Options(std::int64_t{1} << 30));
  REQUIRE(all.ok());
  CHECK(all->resident_units() == 6);
  CHECK(all->slot_elements.empty());
  CHECK(all->host_pageable_bytes == 0);
}

TEST_CASE("PlanSliding puts outsized units on NVMe last", "[slide][plan]") {
  // Embedding and head of 6000 (3x a layer): the tier's staging sets are sized for its largest
  // unit, so the top layers go first and the head only when the fraction reaches it.
  SlidingOptions options = Options(1 << 30);
  options.placement.assign(6, UnitPlace::kSliding);
  options.nvme_dir = "/only-planned";
  options.nvme_fraction = 0.5;  // 3 of 6 sliding units
  const absl::StatusOr<SlidingPlan> half = PlanSliding(TestShape(4, 6000, 2000, 6000), options);
  REQUIRE(half.ok());
  CHECK(half->nvme == std::vector<bool>{false, false, true, true, true, false});
  options.nvme_fraction = 5.0 / 6.0;  // 5 of 6: every layer, then the head (the top outsized)
  const absl::StatusOr<SlidingPlan> most = PlanSliding(TestShape(4, 6000, 2000, 6000), options);
  REQUIRE(most.ok());
  CHECK(most->nvme == std::vector<bool>{false, true, true, true, true, true});
  // Staging: two sets of m, v (fp32) of the largest NVMe unit, 2000 vs 6000 elements.
  CHECK(most->host_pinned_bytes - half->host_pinned_bytes ==
        2 * 2 * (24576 - 8192));
}

TEST_CASE("PlanSliding gives an outsized unit a slot of its own", "[slide][plan]") {
  SlidingOptions options = Options(1 << 30);
  options.placement.assign(6, UnitPlace::kSliding);
  const absl::StatusOr<SlidingPlan> plan =
      PlanSliding(TestShape(4, 6000, 2000, 6000), options);
  REQUIRE(plan.ok());
  CHECK(plan->slot_elements == std::vector<std::int64_t>{6000, 2000, 2000, 2000});
  options.num_slots = 2;
  const absl::StatusOr<SlidingPlan> two = PlanSliding(TestShape(4, 6000, 2000, 6000), options);
  REQUIRE(two.ok());
  CHECK(two->slot_elements == std::vector<std::int64_t>{6000, 2000});
  options.num_slots = 1;
  const absl::StatusOr<SlidingPlan> one = PlanSliding(TestShape(4, 6000, 2000, 6000), options);
  REQUIRE(one.ok());
  CHECK(one->slot_elements == std::vector<std::int64_t>{6000});
}

TEST_CASE("PlanSliding keeps a tied head where its embedding is", "[slide][plan]") {
  const SlidingModelShape shape = TestShape(4, 1000, 2000, 10, /*tied=*/true);
  const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, Options(1 << 30));
  REQUIRE(plan.ok());
  CHECK(plan->placement[0] == plan->placement[5]);
  SlidingOptions options = Options(1 << 30);
  options.placement = {UnitPlace::kResident, UnitPlace::kSliding, UnitPlace::kSliding,
                       UnitPlace::kSliding,  UnitPlace::kSliding, UnitPlace::kSliding};
  const absl::StatusOr<SlidingPlan> bad = PlanSliding(shape, options);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()).find("unit 5 (head)") != std::string::npos);
  // Sliding tied: the head's slot view is its own 10 elements plus the embedding's 1000, and
  // its borrowed gradients go through a pinned side buffer of 4000 bytes.
  options.placement.assign(6, UnitPlace::kSliding);
  const absl::StatusOr<SlidingPlan> sliding = PlanSliding(shape, options);
  REQUIRE(sliding.ok());
  CHECK(sliding->host_pinned_bytes ==
        4 * 9010 + 3 * 4 * 2000 + 3 * 2 * 1024 + 4 * 1000 + 8 * 6);
}

TEST_CASE("PlanSliding says how much a budget too small for one unit needs", "[slide][plan]") {
  const SlidingModelShape shape = TestShape(4, 1000, 2000, 1000);
  const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, Options(1000));
  REQUIRE(plan.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string message(plan.status().message());
  // One slot pair of 2000 fp32 elements instead of three.
  CHECK(message.find("the minimum, with one slot, is 47616 bytes") != std::string::npos);
  SlidingOptions at_minimum = Options(47616);
  at_minimum.num_slots = 1;
  REQUIRE(PlanSliding(shape, at_minimum).ok());
}

TEST_CASE("PlanSliding parks gradients when clipping and puts the top units on NVMe",
          "[slide][plan]") {
  const SlidingModelShape shape = TestShape(4, 1000, 2000, 1000);
  SlidingOptions options = Options(1 << 30);
  options.placement.assign(6, UnitPlace::kSliding);
  options.max_grad_norm = 1.0;
  options.nvme_dir = "/tmp";
  options.nvme_fraction = 0.5;
  const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, options);
  REQUIRE(plan.ok());
  CHECK(plan->landing_buffers == 0);
  // Half of the 6 sliding units, from the top: head, layer.3, layer.2.
  CHECK(plan->nvme == std::vector<bool>{false, false, false, true, true, true});
  CHECK(plan->nvme_bytes == 2 * 4096 + 2 * 8192 + 2 * 8192);
  // m, v of the NVMe units leave pageable memory; every unit's gradients are parked.
  CHECK(plan->host_pageable_bytes == 8 * 10000 - 8 * (1000 + 2000 + 2000));
  CHECK(plan->host_pinned_bytes ==
        4 * 10000 + 4 * 10000 + 3 * 2 * 1024 + 2 * 2 * 8192 + 8 * 6);
}

TEST_CASE("PlanSliding puts the lowest checkpoints on NVMe and counts their staging ring",
          "[slide][plan]") {
  // 6 layers: checkpoints of units 1..5 (the inputs of layers 0..4), 3 KiB each, M = 3.
  const SlidingModelShape shape = TestShape(6, 1000, 2000, 1000, false, 3072);
  SlidingOptions options = Options(1 << 30, 3);
  options.placement.assign(8, UnitPlace::kSliding);
  const absl::StatusOr<SlidingPlan> host = PlanSliding(shape, options);
  REQUIRE(host.ok());
  CHECK(host->nvme_checkpoints == std::vector<bool>(8, false));
  CHECK(host->checkpoint_staging_buffers == 0);
  CHECK(host->host_pinned_bytes == 4 * 14000 + 3 * 4 * 2000 + 5 * 3 * 3072 + 8 * 8);
  options.nvme_dir = "/only-planned";
  options.nvme_checkpoint_fraction = 0.5;  // 2.5 of 5 rounds to 3: units 1, 2, 3
  const absl::StatusOr<SlidingPlan> drive = PlanSliding(shape, options);
  REQUIRE(drive.ok());
  CHECK(drive->nvme_checkpoints ==
        std::vector<bool>{false, true, true, true, false, false, false, false});
  CHECK(drive->checkpoint_staging_buffers == 4);
  // 9 checkpoints leave pinned memory; 4 staging buffers and 9 drive records of 4 KiB come.
  CHECK(drive->host_pinned_bytes ==
        4 * 14000 + 3 * 4 * 2000 + 2 * 3 * 3072 + 4 * 4096 + 8 * 8);
  CHECK(drive->nvme_bytes == 9 * 4096);
  CHECK(drive->host_pageable_bytes == host->host_pageable_bytes);
  CHECK(drive->device_total_bytes == host->device_total_bytes);
  const std::string described = drive->Describe(shape);
  CHECK(described.find("checkpoints of 3 units, staged through 4 pinned buffers") !=
        std::string::npos);
  // A ring never has more buffers than there are checkpoints on the drive.
  options.nvme_checkpoint_fraction = 0.2;  // 1 unit, 3 checkpoints
  const absl::StatusOr<SlidingPlan> one = PlanSliding(shape, options);
  REQUIRE(one.ok());
  CHECK(one->checkpoint_staging_buffers == 3);
  CHECK(one->nvme_bytes == 3 * 4096);
}

TEST_CASE("PlanSliding rejects bad options by name", "[slide][plan]") {
  const SlidingModelShape shape = TestShape(2, 100, 100, 100);
  auto code_and_field = [&](SlidingOptions options, std::string field) {
    const absl::StatusOr<SlidingPlan> plan = PlanSliding(shape, options);
    CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(plan.status().message()).find(field) != std::string::npos);
  };
  code_and_field(Options(0), "gpu_memory_budget_bytes");
  code_and_field(Options(1 << 20, 0), "num_microbatches");
  SlidingOptions nvme = Options(1 << 20);
  nvme.nvme_fraction = 0.5;
  code_and_field(nvme, "nvme_dir");
  nvme.nvme_fraction = 1.5;
  nvme.nvme_dir = "/tmp";
  code_and_field(nvme, "nvme_fraction");
  SlidingOptions checkpoints = Options(1 << 20);
  checkpoints.nvme_checkpoint_fraction = 0.5;
  code_and_field(checkpoints, "nvme_checkpoint_fraction needs nvme_dir");
  checkpoints.nvme_checkpoint_fraction = -0.5;
  checkpoints.nvme_dir = "/tmp";
  code_and_field(checkpoints, "nvme_checkpoint_fraction must be in [0, 1]");
  SlidingOptions placement = Options(1 << 20);
  placement.placement = {UnitPlace::kSliding};
  code_and_field(placement, "placement");
  SlidingOptions lr = Options(1 << 20);
  lr.adam.beta1 = 1.5f;
  code_and_field(lr, "beta1");
  SlidingModelShape no_units;
  no_units.activation_bytes = 4;
  CHECK(PlanSliding(no_units, Options(1 << 20)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("PlanSliding prefers a sliding head when that leaves fewer layers on the CPU's critical path",
          "[slide][plan]") {
  // Llama-3-8B's proportions: embedding and head 3x a layer. With the budget of "embedding +
  // layers 0-1 resident, head sliding" (A), "embedding + head resident" (B) also fits but leaves
  // 7 sliding layers, 6 of them below the top sliding unit; A leaves 6 layers and the head, whose
  // update the worker defers into the next forward: 6 layers below it, with fewer parameters.
  const SlidingModelShape shape = TestShape(8, 6000, 2000, 6000);
  const auto placed = [](std::vector<int> resident) {
    std::vector<UnitPlace> p(10, UnitPlace::kSliding);
    for (int u : resident) p[static_cast<std::size_t>(u)] = UnitPlace::kResident;
    return p;
  };
  SlidingOptions a = Options(std::int64_t{1} << 30);
  a.placement = placed({0, 1, 2});
  SlidingOptions b = Options(std::int64_t{1} << 30);
  b.placement = placed({0, 9});
  const absl::StatusOr<SlidingPlan> plan_a = PlanSliding(shape, a);
  const absl::StatusOr<SlidingPlan> plan_b = PlanSliding(shape, b);
  REQUIRE(plan_a.ok());
  REQUIRE(plan_b.ok());
  REQUIRE(plan_b->device_total_bytes <= plan_a->device_total_bytes);
  CHECK(plan_a->slot_elements == std::vector<std::int64_t>{6000, 2000, 2000, 2000});

  const absl::StatusOr<SlidingPlan> planned = PlanSliding(shape, Options(plan_a->device_total_bytes));
  REQUIRE(planned.ok());
  CHECK(planned->placement == plan_a->placement);
  CHECK(planned->landing_buffers == 3);
}

}  // namespace
}  // namespace pipeoffload
