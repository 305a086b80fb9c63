// libFuzzer target: the cost-model reader (ParseCostModelJson). An accepted model writes back
// to JSON that reads as the same model (text equality of the rewrite), and plans and simulates
// a small po-h pipeline (p = 4, m = 8; the model's per-stage tables fit it or are refused).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pipeoffload/compiler.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/validate.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const pipeoffload::CostModel defaults = pipeoffload::UnitCostModel(0.25);
  absl::StatusOr<pipeoffload::CostModel> cost = pipeoffload::ParseCostModelJson(text, defaults);
  if (!cost.ok()) return 0;
  const std::string written = pipeoffload::CostModelToJson(*cost);
  absl::StatusOr<pipeoffload::CostModel> again =
      pipeoffload::ParseCostModelJson(written, defaults);
  PO_FUZZ_CHECK(again.ok(), "a written cost model does not parse back");
  PO_FUZZ_CHECK(pipeoffload::CostModelToJson(*again) == written, "the round trip changed it");

  pipeoffload::PipelineSpec spec;
  spec.num_stages = 4;
  spec.num_microbatches = 8;
  spec.offload = pipeoffload::OffloadPolicy::kHalf;
  absl::StatusOr<pipeoffload::Schedule> schedule = pipeoffload::Compile(spec, *cost);
  if (!schedule.ok()) return 0;
  PO_FUZZ_CHECK(pipeoffload::Validate(*schedule).ok(), "the compiler emitted an invalid schedule");
  pipeoffload::fuzzing::SimulateChecked(*schedule, *cost);
  return 0;
}
