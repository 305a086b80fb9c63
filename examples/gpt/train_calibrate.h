// gpt_train --costs measured: what each stage measures before its first step (its chunks'
// compute and its host link, pipeoffload/calibrate.h), how the figures travel between the ranks,
// and the line that reports them. MeasuredTrainCostModel (train_plan.h) turns them into the
// cost model every rank plans with.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CALIBRATE_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CALIBRATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/gpt/train_plan.h"
#include "examples/gpt/train_stage.h"
#include "examples/gpt/train_wire.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::gpt {

// The largest host-link probe: big enough for the copy engines' full rate, small enough to
// leave the device's memory to the model (two device and two pinned host buffers of it).
inline constexpr std::int64_t kLinkProbeMaxBytes = std::int64_t{256} << 20;

// Times stage `rank`'s chunks of `spec` (chunk c is virtual stage c * p + rank: the first has no
// input, the last no output) and its host link, with copies of its largest stash entry capped
// at kLinkProbeMaxBytes. Starts iteration 0 first, so the first and last virtual stages have
// their tokens and targets; the calls leave gradients behind, which the first training step's
// StartIteration zeroes (training is bitwise what it is without measuring).
// Errors: MeasureChunkTimes' and MeasureLink's, annotated with the stage and chunk.
[[nodiscard]] absl::StatusOr<StageCosts> MeasureStageCosts(TrainStage& stage,
                                                           const PipelineSpec& spec, int rank);

void PutStageCosts(ByteWriter& writer, const StageCosts& costs);
// False when the bytes run short (the reader's Finish then says so).
bool GetStageCosts(ByteReader& reader, StageCosts* costs);

// One line: "costs: measured, per stage F / B ms (mean over its chunks): 12.10 / 25.31, ...;
// host link (slowest stage) D2H 54.1, H2D 52.0, duplex 46.2 GB/s", and with
// stages_per_device > 1 how the plan shares the device.
// REQUIRES: stages not empty, each with chunks.
std::string DescribeCosts(const std::vector<StageCosts>& stages, int stages_per_device);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CALIBRATE_H_
