// libFuzzer target: the canonical schedule reader (ParseScheduleJson), then Validate and
// Simulate of whatever it accepts. Properties beyond "no crash": a parsed schedule writes back
// to text that parses to the same text (the writer/reader round trip is exact), and Simulate
// never reports a non-finite time for a valid schedule.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pipeoffload/schedule_io.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/validate.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pipeoffload::Schedule> parsed = pipeoffload::ParseScheduleJson(text);
  if (!parsed.ok()) return 0;
  const std::string written = pipeoffload::ScheduleToJson(*parsed);
  absl::StatusOr<pipeoffload::Schedule> again = pipeoffload::ParseScheduleJson(written);
  PO_FUZZ_CHECK(again.ok(), "a written schedule does not parse back");
  PO_FUZZ_CHECK(pipeoffload::ScheduleToJson(*again) == written, "the round trip changed the text");
  if (!pipeoffload::Validate(*parsed).ok()) return 0;
  pipeoffload::fuzzing::SimulateChecked(*parsed, pipeoffload::UnitCostModel(0.25));
  return 0;
}
