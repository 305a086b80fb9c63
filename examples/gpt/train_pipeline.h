// gpt_train's drivers: one pipeline rank (its stage of the GPT under a PipelineStage,
// pipeoffload/pipeline.h), and the single-process reference. Both print the same per-step
// lines and the same checksum, so runs compare from the command line.
//
// A pipeline rank, per DESIGN.md section 5.1 and the GptStageModel protocol:
//   setup   - the job's spec (flags or --schedule-file), this stage's model and backend (a
//             TrainStage from the factory: CPU, or CUDA with --backend cuda), agreed by every
//             rank; then PipelineStage::Open over the rank group: every stage's exact stash
//             sizes and (--costs measured) measured costs, the schedule every rank plans and
//             compares, the arena and executor. Each phase ends with every rank's status
//             gathered, so a failure anywhere (wrong stage count, corrupted file, budget too
//             small) is reported by every rank and all stop.
//   step s  - StartIteration(s); PipelineStage::Run (the device drained); gather status,
//             losses and stats; the tied embedding gradient between stages 0 and p-1;
//             OptimizerStep.
//   end     - gather parameter hashes -> CombineTensorHashes; per-stage memory report; trace.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PIPELINE_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PIPELINE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/train_group.h"
#include "examples/gpt/train_links.h"
#include "examples/gpt/train_options.h"
#include "examples/gpt/train_stage.h"
#include "pipeoffload/calibrate.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::gpt {

// One stage's memory and time over the run. Peaks are the maxima over all steps of the
// runtime's per-iteration high-water marks (requested bytes, DeviceArena accounting).
struct StageSummary {
  int stage = 0;
  std::int64_t stash_peak_bytes = 0;            // measured activation stash high-water
  std::int64_t predicted_stash_peak_bytes = 0;  // StagePrediction::peak_bytes
  std::int64_t p2p_peak_bytes = 0;              // boundary buffers in the arena
  std::int64_t other_arena_peak_bytes = 0;      // anything else in the arena
  std::int64_t host_peak_bytes = 0;             // host pool slots in use
  std::int64_t predicted_host_bytes = 0;
  std::int64_t offloaded_bytes = 0;  // D2H bytes of the last step
  std::int64_t predicted_offloaded_bytes = 0;
  std::int64_t arena_budget_bytes = 0;
  std::int64_t model_state_bytes = 0;  // parameters, gradients, optimizer state (TrainStage)
  double optimizer_seconds = 0.0;      // per step, mean over the steps after the first
  std::string description;             // TrainStage::Describe: backend, where the state lives
  double compute_seconds = 0.0;        // per step, mean over the steps after the first
  double wait_seconds = 0.0;
};

struct TrainResult {
  std::optional<Schedule> schedule;  // pipeline runs: what ran, with its predictions
  std::vector<double> losses;        // per step: mean over microbatches (in mb order)
  std::vector<double> step_seconds;  // per step: this rank's wall time
  std::vector<double> grad_norms;    // per step: global gradient norm (NaN: clipping off)
  std::vector<StageSummary> stages;  // pipeline runs: every stage, in stage order
  std::uint64_t checksum = 0;        // CombineTensorHashes of every parameter tensor
  bool peaks_match = true;           // measured stash peak == predicted on every stage
  std::vector<StageCosts> measured_costs;  // --costs measured: every stage's, in stage order
  std::optional<LinkReport> links;         // --trace: the traced step's copy overlaps and P2P
};

// Runs this rank's stage for options.steps steps. `group` and `transport` connect the same
// ranks (rank r is stage r). When `out` is not null, rank 0 prints the run there (header, one
// line per step, the per-stage table, the checksum). Every rank returns the same result.
// Errors: every rank returns an error when any rank fails; its message names the failing
// rank(s) and their errors (setup: bad spec, stage count, schedule file, budget; a step: the
// executor's error, e.g. the watchdog's). If the ranks cannot even meet to agree on a failure
// (a collective times out), the rank prints its error to stderr and ends the job (AbortJob);
// inside PipelineStage::Open such a failure is returned instead.
[[nodiscard]] absl::StatusOr<TrainResult> RunPipelineRank(const TrainOptions& options,
                                                          std::shared_ptr<const GptData> data,
                                                          RankGroup& group, Transport& transport,
                                                          std::FILE* out);
// As above, with each rank's stage built by `factory` (RunPipelineRank above uses
// CreateCpuTrainStage): how gpt_train runs the CUDA GPT through the same driver.
[[nodiscard]] absl::StatusOr<TrainResult> RunPipelineRank(const TrainOptions& options,
                                                          std::shared_ptr<const GptData> data,
                                                          RankGroup& group, Transport& transport,
                                                          std::FILE* out,
                                                          const TrainStageFactory& factory);

// The single-process reference (ReferenceTrainer) with the same output lines.
// Errors: the model's (bad config, data the config cannot read).
[[nodiscard]] absl::StatusOr<TrainResult> RunReference(const TrainOptions& options,
                                                       std::shared_ptr<const GptData> data,
                                                       std::FILE* out);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PIPELINE_H_
