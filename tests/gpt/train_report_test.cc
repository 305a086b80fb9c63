// What gpt_train's plan lines say: the unit of the predicted step, and the warning for an offload
// policy whose plan lowers no stash peak.
#include "examples/gpt/train_report.h"

#include <cstdio>
#include <string>

#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

// PrintPlan's output for a 2-stage schedule with these per-stage (peak, peak without offload).
std::string PlanText(OffloadPolicy offload, std::int64_t peak0, std::int64_t without0,
                     std::int64_t peak1, std::int64_t without1, bool seconds) {
  Schedule schedule;
  schedule.spec.num_stages = 2;
  schedule.spec.offload = offload;
  Predictions predictions;
  predictions.step_time = 1.5;
  predictions.step_time_without_offload = 1.25;
  for (const auto& [peak, without] : {std::pair{peak0, without0}, std::pair{peak1, without1}}) {
    StagePrediction stage;
    stage.peak_bytes = peak;
    stage.peak_bytes_without_offload = without;
    predictions.stages.push_back(stage);
  }
  schedule.predictions = predictions;
  std::FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  PrintPlan(file, schedule, "mpi", seconds);
  std::rewind(file);
  std::string text;
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) {
    text.push_back(static_cast<char>(c));
  }
  std::fclose(file);
  return text;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("PrintPlan warns when an offload policy lowers no stash peak", "[train][report]") {
  const std::string useless = PlanText(OffloadPolicy::kFull, 300, 300, 200, 250, true);
  CHECK(Has(useless, "plan warning: offload po-f leaves the largest stash peak at 300 bytes"));
  CHECK(Has(useless, "--chunks"));
  // The largest peak fell (stage 1 kept its own, below stage 0's old one): no warning.
  const std::string useful = PlanText(OffloadPolicy::kFull, 100, 300, 250, 250, true);
  CHECK_FALSE(Has(useful, "leaves the largest stash peak"));
  // Without offload there is nothing to warn about.
  CHECK_FALSE(Has(PlanText(OffloadPolicy::kNone, 300, 300, 300, 300, true), "plan warning"));
}

TEST_CASE("PrintPlan says the unit of the predicted step", "[train][report]") {
  CHECK(Has(PlanText(OffloadPolicy::kNone, 1, 1, 1, 1, true), "predicted step 1.5000 s (1.2500"));
  CHECK(Has(PlanText(OffloadPolicy::kNone, 1, 1, 1, 1, false),
            "predicted step 1.500 layer-forward units (1.250"));
}

}  // namespace
}  // namespace pipeoffload::gpt
