// gpt_train --costs measured (see the header).
#include "examples/gpt/train_calibrate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt {
namespace {

constexpr int kLinkReps = 3;
constexpr std::int64_t kLinkProbeMinBytes = std::int64_t{1} << 20;

}  // namespace

absl::StatusOr<StageCosts> MeasureStageCosts(TrainStage& stage, const PipelineSpec& spec,
                                             int rank) {
  PO_RETURN_IF_ERROR(stage.StartIteration(0));
  StageCosts costs;
  std::int64_t largest = 0;
  const int v = spec.chunks_per_stage;
  for (int c = 0; c < v; ++c) {
    ChunkTimingOptions options;
    options.chunk = c;
    options.has_input = !(c == 0 && rank == 0);
    options.has_output = !(c == v - 1 && rank == spec.num_stages - 1);
    absl::StatusOr<ChunkTimes> times = MeasureChunkTimes(stage.backend(), stage.model(), options);
    if (!times.ok()) {
      return Annotate(times.status(), absl::StrCat("measuring stage ", rank, " chunk ", c));
    }
    costs.chunks.push_back(*times);
    largest = std::max(largest, stage.model().SavedBytes(c, spec.split_backward));
  }
  const std::int64_t probe = std::clamp(largest, kLinkProbeMinBytes, kLinkProbeMaxBytes);
  absl::StatusOr<LinkFigures> link = MeasureLink(stage.backend(), probe, kLinkReps);
  if (!link.ok()) {
    return Annotate(link.status(), absl::StrCat("measuring stage ", rank, "'s host link"));
  }
  costs.link = *link;
  return costs;
}

void PutStageCosts(ByteWriter& writer, const StageCosts& costs) {
  writer.PutVector(costs.chunks);
  writer.Put(costs.link);
}

bool GetStageCosts(ByteReader& reader, StageCosts* costs) {
  return reader.GetVector(&costs->chunks) && reader.Get(&costs->link);
}

std::string DescribeCosts(const std::vector<StageCosts>& stages, int stages_per_device) {
  std::string text = "costs: measured, per stage F / B ms (mean over its chunks):";
  for (std::size_t d = 0; d < stages.size(); ++d) {
    const ChunkTimes mean = MeanChunkTimes(stages[d]);
    absl::StrAppendFormat(&text, "%s %.2f / %.2f", d == 0 ? "" : ",", 1e3 * mean.forward,
                          1e3 * mean.backward);
  }
  const LinkFigures link = SlowestLink(stages);
  absl::StrAppendFormat(&text, "; host link (slowest stage) D2H %.1f, H2D %.1f, duplex %.1f GB/s",
                        link.d2h / 1e9, link.h2d / 1e9, link.duplex / 1e9);
  if (stages_per_device > 1) {
    absl::StrAppend(&text, "; the ", stages_per_device,
                    " stages share one device: planned with compute x", stages_per_device,
                    " and the link split ", stages_per_device, " ways");
  }
  return text;
}

}  // namespace pipeoffload::gpt
