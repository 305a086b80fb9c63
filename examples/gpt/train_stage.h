// What gpt_train's pipeline driver (train_pipeline.cc) needs of one stage, whatever it runs on:
// the StageModel the executor calls, the backend it runs on, and the iteration protocol around
// the runtime (start, losses, tied gradient, optimizer step, parameter hashes). One driver then
// serves the fp32 CPU GPT (GptStageModel on the CPU backend, below) and the bf16 CUDA GPT
// (GptCudaStageModel on a CUDA backend, optionally with its optimizer state offloaded:
// examples/gpt/train_cuda/train_stage_cuda.h), so the phases, collectives and reports of
// train_pipeline.cc exist once.
//
// Per step the driver calls: StartIteration(s); PipelineStage::Run (which returns once the
// step's device work has finished); Losses (on the stage that holds them); after every rank's
// step succeeded, ExchangeTiedGrad, then (global-norm clipping on) GradSquareSums, whose
// results every rank gathers and combines into the step's gradient scale, and
// OptimizerStep(scale). With --costs measured, StartIteration(0)
// also comes before PipelineStage::Open, which runs the chunks to time them.
// At the end: ParameterHashes, ModelStateBytes, Describe.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_STAGE_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_STAGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/gpt_params.h"
#include "examples/gpt/optimizer_schedule.h"
#include "examples/gpt/train_group.h"
#include "examples/gpt/train_options.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::gpt {

// One pipeline stage of the GPT with its backend. Calls come from one thread (the rank's).
class TrainStage {
 public:
  virtual ~TrainStage() = default;

  virtual StageModel& model() = 0;
  // The backend the model runs on (the pipeline stage's: its executor's and its arena's).
  virtual Backend& backend() = 0;

  // Prepares step `step` (gradients zeroed, the step's microbatches staged).
  [[nodiscard]] virtual absl::Status StartIteration(std::int64_t step) = 0;
  // Whether this stage computes the loss (holds the last virtual stage).
  virtual bool holds_loss() const = 0;
  // The mean loss of each microbatch of this step. Only called when holds_loss().
  [[nodiscard]] virtual absl::StatusOr<std::vector<double>> Losses() = 0;
  // The tied embedding's gradient between stages 0 and p-1 over `group`, when this stage needs
  // it (CPU only: the CUDA GPT refuses tied embeddings at creation). OK when there is none.
  [[nodiscard]] virtual absl::Status ExchangeTiedGrad(RankGroup& group) = 0;
  // Each of this stage's tensors' gradient sum of squares (mirrors excluded), the step's
  // gradients final (after ExchangeTiedGrad): what CombineSquareSums (optimizer_schedule.h)
  // turns into the global norm, the same bits for any stage cut on the CPU.
  [[nodiscard]] virtual absl::StatusOr<std::vector<TensorSquareSum>> GradSquareSums() = 0;
  // One AdamW step over this stage's parameters (on the GPU, or in an optimizer-offload engine)
  // with every gradient times `grad_scale` (clipping's coefficient, 1 without clipping), at
  // the schedule's rate (LearningRateAt).
  [[nodiscard]] virtual absl::Status OptimizerStep(float grad_scale) = 0;
  // Seconds the last OptimizerStep took on this thread (the update, including any transfers).
  virtual double last_optimizer_seconds() const = 0;

  // FNV-1a hashes of the fp32 parameters of this stage's tensors (CombineTensorHashes with
  // num_tensors() gives the model checksum).
  [[nodiscard]] virtual absl::StatusOr<std::vector<TensorHash>> ParameterHashes() = 0;
  virtual int num_tensors() const = 0;
  // Bytes of parameters, gradients and optimizer state this stage keeps outside the arena.
  virtual std::int64_t ModelStateBytes() const = 0;
  // One line for the report: the backend and where the model state lives.
  virtual std::string Describe() const = 0;
};

// What a stage factory builds: stage `stage` of `num_stages` with `chunks_per_stage` chunks of
// the GPT of `config` (m = the job's microbatches), reading `data`.
struct TrainStageSpec {
  GptConfig config;
  int num_stages = 1;
  int chunks_per_stage = 1;
  int stage = 0;
  Placement placement = Placement::kLoop;  // the schedule's, resolved (zbv, dualpipev: v)
  std::shared_ptr<const GptData> data;
};

// Builds a rank's stage; the driver calls it once, on the rank's thread.
using TrainStageFactory = std::function<absl::StatusOr<std::unique_ptr<TrainStage>>(
    const TrainOptions& options, const TrainStageSpec& spec)>;

// The fp32 CPU GPT (GptStageModel) on its own CPU backend, whose queue waits are bounded by
// --watchdog. Errors: GptStageModel::Create's (bad config, pipeline shape, corpus).
[[nodiscard]] absl::StatusOr<std::unique_ptr<TrainStage>> CreateCpuTrainStage(
    const TrainOptions& options, const TrainStageSpec& spec);

// Model FLOP of one training step of the whole model (every stage), the convention of
// bench/pipeline_bench: per layer and sequence 3 x (24 C^2 T + 4 T^2 C) (forward and a
// backward of twice its cost, attention over full T x T scores), plus 3 x 2 T C V for the head;
// times B sequences and m microbatches. Embedding lookups and normalizations are not counted.
// Refuses, before anything is allocated, a CPU model whose fp32 state does not fit the host:
// `share_of_model` of its parameters live in this host's processes (1 for --transport local and
// the reference; the local ranks' share under mpirun). Errors: ResourceExhausted naming the GB
// needed and available; OK when /proc/meminfo cannot be read (the allocation then tells).
[[nodiscard]] absl::Status CheckCpuHostMemory(const GptConfig& config, double share_of_model);

double ModelFlopsPerStep(const GptConfig& config);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_STAGE_H_
