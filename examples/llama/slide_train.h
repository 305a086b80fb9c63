// slide_train's driver: the model (named shape, config.json, checkpoint), the data, the backend,
// the LayerSlidingEngine, the learning-rate schedule, one line per step, the trace, the summary
// and the checkpoint at the end. In a library so tests run it in-process.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_TRAIN_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_TRAIN_H_

#include <ostream>
#include <vector>

#include "absl/status/status.h"
#include "examples/llama/slide_options.h"

namespace pipeoffload::llama {

// What a run measured (also written to --json).
struct SlideTrainSummary {
  std::vector<double> losses;     // per step
  std::vector<double> step_seconds;
  double median_step_seconds = 0.0;  // over steps 2.. (step 1 warms up), or step 1 alone
  double tokens_per_second = 0.0;    // at the median step
  double model_tflops = 0.0;         // ModelFlopsPerToken's metric at the median step
  std::int64_t device_peak_bytes = 0;  // the process's device memory beyond the context
  std::int64_t host_peak_bytes = 0;    // VmHWM
};

// Learning rate of step `step` (0-based) of `options.steps`: linear warm-up over warmup_steps,
// then a cosine from lr to min_lr at the last step.
float ScheduledLearningRate(const SlideTrainOptions& options, std::int64_t step);

// Runs everything the options ask for, printing progress and results to `out`.
// Errors: every input problem with its reason (bad model name or config file, checkpoint that
// does not match, data that cannot feed the model, a budget too small, a --save destination
// that is not an empty or new directory, a GPU missing for --backend cuda, a non-finite loss or
// gradient norm): all but the last before training. No checkpoint is written after an error,
// and a failed save leaves none half-written (the finished run's --trace and --json are
// written before the save).
[[nodiscard]] absl::StatusOr<SlideTrainSummary> RunSlideTrain(const SlideTrainOptions& options,
                                                              std::ostream& out);

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_TRAIN_H_
