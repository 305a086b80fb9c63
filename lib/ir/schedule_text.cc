// The compact text form of a schedule, for humans (schedule_io.h): a spec line, one row of ops
// per stage, and a short summary of the predictions when there are any. Never parsed back, so
// it may change with taste; the canonical file is the JSON.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/schedule_io.h"

namespace pipeoffload {
namespace {

// "group-interleaved p=4 m=8 v=2 g=2 split-backward offload=selective fraction=0.5".
// Offload parameters appear only for the policies that read them.
std::string SpecLine(const PipelineSpec& spec) {
  std::string line = absl::StrFormat(
      "%s p=%d m=%d v=%d g=%d", std::string(FamilyName(spec.family)), spec.num_stages,
      spec.num_microbatches, spec.chunks_per_stage, spec.group_size);
  if (spec.split_backward) line.append(" split-backward");
  if (spec.recompute != Recompute::kNone) {  // absent otherwise: older lines stay the same
    absl::StrAppend(&line, " recompute=", RecomputeName(spec.recompute));
    absl::StrAppend(&line, spec.recompute_chunks > 0
                               ? absl::StrCat(" recompute-chunks=", spec.recompute_chunks)
                               : absl::StrFormat(" recompute-fraction=%g",
                                                 spec.recompute_fraction));
  }
  absl::StrAppend(&line, " offload=", std::string(OffloadPolicyName(spec.offload)));
  if (spec.offload == OffloadPolicy::kSelective) {
    absl::StrAppend(&line, absl::StrFormat(" fraction=%g chunks=%d", spec.offload_fraction,
                                           spec.offload_chunks));
  }
  if (spec.offload == OffloadPolicy::kAuto) {
    absl::StrAppend(&line, " budget=", spec.memory_budget_bytes, "B");
  }
  if (spec.strict) line.append(" strict");
  return line;
}

void AppendPredictions(const Predictions& predictions, std::string* out) {
  absl::StrAppend(out, absl::StrFormat(
                           "predicted: step %g (without offload %g), bubble %.2f%%, "
                           "collisions %d\n",
                           predictions.step_time, predictions.step_time_without_offload,
                           predictions.bubble_ratio * 100.0, predictions.collisions));
  for (std::size_t d = 0; d < predictions.stages.size(); ++d) {
    const StagePrediction& stage = predictions.stages[d];
    absl::StrAppend(
        out, absl::StrFormat("stage %d: peak %d units / %d B (without offload %d / %d B), "
                             "host %d B, offloaded %d B, busy %g, ends %g\n",
                             d, stage.peak_units, stage.peak_bytes,
                             stage.peak_units_without_offload, stage.peak_bytes_without_offload,
                             stage.host_bytes, stage.offloaded_bytes, stage.busy_time,
                             stage.end_time));
  }
  for (const LinkTraffic& link : predictions.links) {
    absl::StrAppend(out, absl::StrFormat("link %s: %d B d2h, %d B h2d\n", link.name,
                                         link.bytes_d2h, link.bytes_h2d));
  }
  for (const std::string& warning : predictions.warnings) {
    absl::StrAppend(out, "warning: ", warning, "\n");
  }
}

}  // namespace

std::string ScheduleToText(const Schedule& schedule) {
  std::string out = SpecLine(schedule.spec);
  out.push_back('\n');
  for (const StageProgram& program : schedule.stages) {
    absl::StrAppend(&out, "stage ", program.stage, " |");
    for (const Op& op : program.ops) absl::StrAppend(&out, " ", OpToString(op));
    out.push_back('\n');
  }
  if (schedule.predictions.has_value()) AppendPredictions(*schedule.predictions, &out);
  return out;
}

}  // namespace pipeoffload
