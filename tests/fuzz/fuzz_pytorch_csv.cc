// libFuzzer target: the PyTorch pipelining CSV reader (ParsePyTorchCsv). The first byte picks
// the pipeline's stage count (1..15, or 0: the file's rows) and the family hint; the rest is the
// CSV; the placement is inferred. Accepted files are lowered to P2P where they hold none (as po-schedule import
// does), validated and simulated; a valid schedule exports to CSV that imports to the same
// compute order.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pipeoffload/compiler.h"
#include "pipeoffload/schedule_io.h"
#include "pipeoffload/validate.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto family = static_cast<pipeoffload::Family>((data[0] >> 4) % 5);
  const pipeoffload::CsvImportOptions options{data[0] & 0x0F, std::nullopt, family};
  const std::string_view csv(reinterpret_cast<const char*>(data + 1), size - 1);
  absl::StatusOr<pipeoffload::Schedule> parsed = pipeoffload::ParsePyTorchCsv(csv, options);
  if (!parsed.ok()) return 0;
  pipeoffload::Schedule schedule = *std::move(parsed);
  bool has_comm = false;
  for (const pipeoffload::StageProgram& program : schedule.stages) {
    for (const pipeoffload::Op& op : program.ops) has_comm = has_comm || IsP2P(op.kind);
  }
  const int num_stages = schedule.spec.num_stages;
  if (!has_comm && num_stages > 1) {
    absl::StatusOr<pipeoffload::Schedule> lowered = pipeoffload::LowerCommunication(schedule);
    if (!lowered.ok()) return 0;
    schedule = *std::move(lowered);
  }
  if (!pipeoffload::Validate(schedule).ok()) return 0;
  const std::string exported =
      pipeoffload::ScheduleToPyTorchCsv(schedule, pipeoffload::CsvFlavor::kComputeComms);
  absl::StatusOr<pipeoffload::Schedule> again =
      pipeoffload::ParsePyTorchCsv(exported, pipeoffload::CsvImportOptions{num_stages,
                                                                           std::nullopt, family});
  PO_FUZZ_CHECK(again.ok(), "an exported CSV does not import");
  PO_FUZZ_CHECK(pipeoffload::ScheduleToPyTorchCsv(*again, pipeoffload::CsvFlavor::kComputeComms) ==
                    exported,
                "the CSV round trip changed the file");
  pipeoffload::fuzzing::SimulateChecked(schedule, pipeoffload::UnitCostModel(0.25));
  return 0;
}
