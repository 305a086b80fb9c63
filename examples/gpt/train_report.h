// What gpt_train prints, in one place so the pipeline ranks and the reference print the same
// lines (tests and scripts parse "step N loss X time Y s", the "stage d:" lines and
// "checksum 0x..."), and the measured trace file.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_REPORT_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_REPORT_H_

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/train_pipeline.h"
#include "pipeoffload/calibrate.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::gpt {

// The step's loss: the microbatches' mean losses summed in microbatch order, over m (the
// reference trainer's order, so equal runs print equal digits).
double MeanLoss(const std::vector<double>& losses);

// "data: ..." with the corpus's unigram entropy (the loss to beat), and "model: ...".
void PrintDataAndModel(std::FILE* out, const GptData& data, const GptConfig& config);
// "pipeline: ..." (stages, transport, family, v, g, m, offload policy) and "plan: ..." with the
// compiler's predictions (step time, bubble, per-stage stash peaks), then any planner
// warnings. `seconds`: the plan's times are seconds (--costs measured), else layer-forward
// units.
void PrintPlan(std::FILE* out, const Schedule& schedule, const std::string& transport_name,
               bool seconds);
// "step N loss %.9g time %.3f s", then ", model %.1f TFLOP/s per GPU" when flops_per_gpu > 0
// (the model FLOP of one step that each GPU carries), ", lr %.4g" when learning_rate >= 0 (the
// step's rate) and ", grad norm %.4g" when grad_norm is finite (computed: clipping on).
void PrintStep(std::FILE* out, std::int64_t step, double loss, double seconds,
               double flops_per_gpu = 0.0, double learning_rate = -1.0,
               double grad_norm = std::numeric_limits<double>::quiet_NaN());
// One "stage d: ..." line per stage (stash peak measured vs predicted, P2P and other arena
// peaks, host pool, offloaded bytes, budget, model state), a "stage d runs on: ..." line per
// stage that has a description (where its model and optimizer state live, optimizer time), the
// peak verdict and the mean step time after the first step.
void PrintStageTable(std::FILE* out, const TrainResult& result);
// One line: "costs: measured, per stage F / B ms (mean over its chunks): 12.10 / 25.31, ...;
// host link (slowest stage) D2H 54.1, H2D 52.0, duplex 46.2 GB/s", and with
// stages_per_device > 1 how the plan shares the device.
// REQUIRES: stages not empty, each with chunks.
std::string DescribeCosts(const std::vector<StageCosts>& stages, int stages_per_device);

// "checksum 0x%016llx".
void PrintChecksum(std::FILE* out, std::uint64_t checksum);

// Writes the stages' measured iterations (stats[d] of stage d) as Perfetto trace JSON in the
// simulator's layout (MeasuredTimeline + TimelineToTraceJson, microseconds).
// Errors: MeasuredTimeline's; Unavailable naming the path when the file cannot be written.
[[nodiscard]] absl::Status WriteTraceFile(const std::string& path, const Schedule& schedule,
                                          const std::vector<IterationStats>& stats);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_REPORT_H_
