// One gpt_train pipeline rank (see train_pipeline.h for the phases).
//
// Invariants:
//  - Every rank makes the same sequence of group calls whatever happens: gpt_train's own
//    set-up gather, PipelineStage::Open (collective over the group: its phases gather too),
//    then one gather per step and one at the end, each carrying the rank's status. A rank
//    returns only after such a gather (so nobody is left waiting) or ends the job through
//    AbortJob when the ranks cannot meet. The tied-gradient Exchange happens only after a
//    gather said every rank's iteration succeeded.
//  - Every rank plans the schedule itself from the same inputs (Open gathers the stash sizes
//    and measured costs); Open compares the schedules' fingerprints before any step.
//  - Gradients accumulate inside GptStageModel in the order the executor runs B / W, which
//    the schedule fixes per chunk in microbatch order: the reason the checksum is the
//    single-process one.
#include "examples/gpt/train_pipeline.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/train_plan.h"
#include "examples/gpt/train_report.h"
#include "examples/gpt/train_wire.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/pipeline.h"

namespace pipeoffload::gpt {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Ends the job when the ranks cannot meet to agree on a failure.
[[noreturn]] void FailUncoordinated(RankGroup& group, const absl::Status& status) {
  std::fprintf(stderr, "gpt_train: rank %d/%d: fatal: %s\n", group.rank(), group.size(),
               std::string(status.message()).c_str());
  AbortJob(group, 1);
}

// AllGatherChecked, ending the job when the ranks cannot meet.
absl::StatusOr<std::vector<std::string>> Gather(RankGroup& group, const absl::Status& mine,
                                                const std::string& payload,
                                                const std::string& phase) {
  if (mine.code() == absl::StatusCode::kDeadlineExceeded && group.size() > 1) {
    // A wait that expired (the watchdog): some rank may be stopped or dead, so the ranks may
    // not meet, and the first to give up ends the job (AbortJob) before the later ones could
    // say why they failed: say it at once. Other failures meet and are reported together.
    std::fprintf(stderr, "gpt_train: rank %d/%d: %s failed here: %s\n", group.rank(),
                 group.size(), phase.c_str(), std::string(mine.message()).c_str());
    std::fflush(stderr);
  }
  bool group_failed = false;
  absl::StatusOr<std::vector<std::string>> all =
      AllGatherChecked(group, mine, payload, phase, &group_failed);
  if (group_failed) FailUncoordinated(group, all.status());
  return all;
}

struct Stage {
  PipelineSpec spec;
  GptConfig config;
  std::unique_ptr<TrainStage> train;  // the model and its backend
  std::optional<Schedule> loaded;     // --schedule-file
  std::unique_ptr<PipelineStage> pipeline;
};

// Stages that share one device: the local transport's stages are threads on one GPU with
// --backend cuda (CPU stages run on cores of their own).
int StagesPerDevice(const TrainOptions& options, const Transport& transport, int num_stages) {
  return transport.Name() == "local" && options.backend == TrainBackend::kCuda ? num_stages : 1;
}

// Phase 1, local: the job's spec, this stage's model, the trace file's writability. With
// --costs measured, the model's first iteration is started, so Open can time its chunks.
absl::Status SetUpModel(const TrainOptions& options, std::shared_ptr<const GptData> data,
                        const RankGroup& group, const std::string& transport_name,
                        const TrainStageFactory& factory, Stage& stage) {
  std::optional<Schedule> loaded;
  if (!options.schedule_file.empty()) {
    PO_ASSIGN_OR_RETURN(loaded, LoadScheduleFile(options.schedule_file));
  }
  PO_ASSIGN_OR_RETURN(stage.spec, JobSpec(options, loaded, group.size(), transport_name));
  stage.loaded = std::move(loaded);
  stage.config = options.config;
  stage.config.num_microbatches = stage.spec.num_microbatches;
  TrainStageSpec stage_spec;
  stage_spec.config = stage.config;
  stage_spec.num_stages = stage.spec.num_stages;
  stage_spec.chunks_per_stage = stage.spec.chunks_per_stage;
  stage_spec.stage = group.rank();
  stage_spec.placement = JobPlacement(stage.spec);
  stage_spec.data = std::move(data);
  PO_ASSIGN_OR_RETURN(stage.train, factory(options, stage_spec));
  if (group.rank() == 0 && !options.trace_path.empty()) {
    std::FILE* trace = std::fopen(options.trace_path.c_str(), "w");
    if (trace == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot write the trace file ", options.trace_path,
                                                 ": ", std::strerror(errno)));
    }
    std::fclose(trace);
  }
  if (options.measured_costs) PO_RETURN_IF_ERROR(stage.train->StartIteration(0));
  return absl::OkStatus();
}

// Phase 2: what PipelineStage::Open is given.
StageOptions PipelineOptions(const TrainOptions& options, TrainStage& train, Transport& transport,
                             RankGroup& group, const Stage& stage) {
  StageOptions out;
  if (stage.loaded.has_value()) {
    out.schedule = stage.loaded;
  } else {
    out.spec = stage.spec;
  }
  out.backend = &train.backend();
  out.transport = &transport;
  out.group = &group;
  StageCostOptions& costs = out.costs;
  if (options.measured_costs) {
    costs.source = CostSource::kMeasured;
    // Stages of the local transport share the machine (one GPU, or the CPU's cores), so they
    // measure in turns, each alone; ranks of an MPI job measure at once, each on its own
    // device, so a host link that devices share shows in every figure.
    costs.measure_in_turns = transport.Name() == "local";
    // Stages on one GPU plan with compute x p and the link split p ways (planning.h), at
    // c = p as gpt_train always has (the one-GPU factor search is pipeline_bench's to judge).
    const int shared = StagesPerDevice(options, transport, stage.spec.num_stages);
    costs.plan.shared_gpu.stages_per_device = shared;
    if (shared > 1) costs.plan.shared_gpu.compute_factor = shared;
  } else {
    costs.source = CostSource::kNominal;
    costs.nominal_chunk_time =
        ChunkComputeUnits(stage.config.n_layer, stage.spec.num_virtual_stages());
  }
  costs.plan.auto_budget_share = options.memory_budget_share;
  out.arena.budget_bytes = options.arena_bytes;
  out.p2p_reserve = options.p2p_reserve_worst ? P2PReserve::kWorstCase : P2PReserve::kPlanned;
  out.poison_on_free = options.poison || kPoisonByDefault;
  out.executor.wait_timeout_seconds = options.watchdog_seconds;
  return out;
}

// Folds one step's stats of a stage into its summary. Times: the first step pays for cold
// caches and page faults, so it is kept apart and counts only when it is the only step.
void Accumulate(const IterationStats& stats, std::int64_t step, std::int64_t steps,
                StageSummary& summary) {
  summary.stash_peak_bytes = std::max(summary.stash_peak_bytes, stats.stash_high_water_bytes);
  summary.p2p_peak_bytes = std::max(summary.p2p_peak_bytes, stats.p2p_high_water_bytes);
  summary.other_arena_peak_bytes =
      std::max(summary.other_arena_peak_bytes, stats.other_high_water_bytes);
  summary.host_peak_bytes = std::max(summary.host_peak_bytes, stats.host_high_water_bytes);
  summary.offloaded_bytes = stats.offloaded_bytes;
  if (step > 0 || steps == 1) {
    const double counted = static_cast<double>(steps == 1 ? 1 : steps - 1);
    summary.compute_seconds += stats.compute_seconds / counted;
    summary.wait_seconds += stats.wait_seconds / counted;
  }
}

// The step's global gradient norm and clipping scale: every stage's per-tensor sums of squares
// gathered (with each rank's status, so a failure on one is an error on all) and combined in
// tensor-id order, the same bits on every rank. Without clipping (clip_norm 0): no gather, norm
// NaN (not computed), scale 1.
absl::StatusOr<GlobalClip> StepClip(float clip_norm, TrainStage& train, RankGroup& group,
                                    std::int64_t step) {
  if (clip_norm <= 0.0f) return GlobalClip{std::numeric_limits<double>::quiet_NaN(), 1.0f};
  absl::StatusOr<std::vector<TensorSquareSum>> mine = train.GradSquareSums();
  PO_ASSIGN_OR_RETURN(const std::vector<std::string> gathered,
                      Gather(group, mine.status(), mine.ok() ? EncodeSquareSums(*mine) : "",
                             absl::StrCat("step ", step, " (gradient norm)")));
  std::vector<TensorSquareSum> sums;
  for (const std::string& bytes : gathered) {
    std::vector<TensorSquareSum> theirs;
    PO_RETURN_IF_ERROR(DecodeSquareSums(bytes, &theirs));
    sums.insert(sums.end(), theirs.begin(), theirs.end());
  }
  absl::StatusOr<GlobalClip> clip = ClipGlobalNorm(std::move(sums), train.num_tensors(), clip_norm);
  if (!clip.ok()) return Annotate(clip.status(), absl::StrCat("step ", step));
  return clip;
}

}  // namespace

absl::StatusOr<TrainResult> RunPipelineRank(const TrainOptions& options,
                                            std::shared_ptr<const GptData> data, RankGroup& group,
                                            Transport& transport, std::FILE* out) {
  return RunPipelineRank(options, std::move(data), group, transport, out, CreateCpuTrainStage);
}

absl::StatusOr<TrainResult> RunPipelineRank(const TrainOptions& options,
                                            std::shared_ptr<const GptData> data, RankGroup& group,
                                            Transport& transport, std::FILE* out,
                                            const TrainStageFactory& factory) {
  const int rank = group.rank();
  const int num_ranks = group.size();
  if (transport.size() != num_ranks || transport.rank() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the side channel (rank ", rank, " of ", num_ranks, ") and the transport (rank ",
        transport.rank(), " of ", transport.size(), ") disagree"));
  }
  std::FILE* const print = rank == 0 ? out : nullptr;
  const std::shared_ptr<const GptData> corpus = data;
  Stage stage;

  // Set-up can take a minute on GPUs (parameters, pinned memory, measuring): rank 0 says where
  // it is, with its own times.
  double phase_start = Now();
  const auto progress = [&](const char* what) {
    if (print == nullptr) return;
    std::fprintf(print, "setup: %s (%.1f s)\n", what, Now() - phase_start);
    std::fflush(print);
    phase_start = Now();
  };

  // Phase 1: spec and model, agreed by every rank.
  absl::Status status =
      SetUpModel(options, std::move(data), group, transport.Name(), factory, stage);
  progress(status.ok() ? "stage model built" : "stage model failed");
  PO_RETURN_IF_ERROR(Gather(group, status, "", "setup (model)").status());

  // Phase 2: the pipeline stage (costs, schedule, arena, executor), agreed by every rank.
  absl::StatusOr<std::unique_ptr<PipelineStage>> opened = PipelineStage::Open(
      PipelineOptions(options, *stage.train, transport, group, stage), stage.train->model());
  PO_RETURN_IF_ERROR(opened.status());
  stage.pipeline = *std::move(opened);
  progress(options.measured_costs
               ? "chunk times and host link measured, schedule compiled, arenas and executors "
                 "ready on every rank"
               : "schedule compiled, arenas and executors ready on every rank");
  const Schedule& schedule = stage.pipeline->schedule();
  const int p = schedule.spec.num_stages;
  const std::vector<StageCosts>& costs = stage.pipeline->measured_costs();
  TrainResult result;
  result.schedule = schedule;
  result.measured_costs = costs;
  result.stages.resize(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    const StagePrediction& predicted = schedule.predictions->stages[static_cast<std::size_t>(d)];
    StageSummary& summary = result.stages[static_cast<std::size_t>(d)];
    summary.stage = d;
    summary.predicted_stash_peak_bytes = predicted.peak_bytes;
    summary.predicted_host_bytes = predicted.host_bytes;
    summary.predicted_offloaded_bytes = predicted.offloaded_bytes;
    summary.arena_budget_bytes = stage.pipeline->arena_budgets()[static_cast<std::size_t>(d)];
  }
  if (print != nullptr) {
    PrintDataAndModel(print, *corpus, stage.config);
    PrintPlan(print, schedule, transport.Name(), !costs.empty());
    if (!costs.empty()) {
      std::fprintf(print, "%s\n",
                   DescribeCosts(costs, StagesPerDevice(options, transport, p)).c_str());
    }
    std::fflush(print);
  }

  // The steps. Model TFLOP/s per GPU on cuda: with the local transport every stage shares one.
  const bool trace = !options.trace_path.empty();
  double flops_per_gpu = 0.0;
  if (options.backend == TrainBackend::kCuda) {
    flops_per_gpu = ModelFlopsPerStep(stage.config) / (transport.Name() == "local" ? 1 : p);
  }
  double optimizer_seconds = 0.0;  // this rank's mean OptimizerStep time after the first step
  std::vector<IterationStats> last_stats;
  for (std::int64_t step = 0; step < options.steps; ++step) {
    const double start = Now();
    StepReport report;
    const absl::Status started = stage.train->StartIteration(step);
    // Run returns once the step's device work has finished, the arena empty.
    absl::StatusOr<IterationStats> stats =
        started.ok() ? stage.pipeline->Run() : absl::StatusOr<IterationStats>(started);
    if (stats.ok()) {
      report.stats = *std::move(stats);
    } else {
      report.status = stats.status();
    }
    if (report.status.ok() && stage.train->holds_loss()) {
      absl::StatusOr<std::vector<double>> losses = stage.train->Losses();
      if (losses.ok()) {
        report.losses = *std::move(losses);
      } else {
        report.status = losses.status();
      }
    }
    const bool with_timeline = trace && step == options.steps - 1;
    PO_ASSIGN_OR_RETURN(const std::vector<std::string> gathered,
                        Gather(group, report.status, EncodeStepReport(report, with_timeline),
                               absl::StrCat("step ", step)));
    std::vector<double> losses;
    for (int d = 0; d < p; ++d) {
      PO_ASSIGN_OR_RETURN(StepReport theirs,
                          DecodeStepReport(gathered[static_cast<std::size_t>(d)]));
      if (!theirs.losses.empty()) losses = theirs.losses;
      Accumulate(theirs.stats, step, options.steps, result.stages[static_cast<std::size_t>(d)]);
      if (with_timeline) last_stats.push_back(std::move(theirs.stats));
    }
    // Past the gather every iteration succeeded, so the ranks' remaining calls pair up; a
    // failure now is local and the others cannot be told in order: end the job.
    if (absl::Status tied = stage.train->ExchangeTiedGrad(group); !tied.ok()) {
      FailUncoordinated(group, Annotate(tied, absl::StrCat("step ", step, ": tied gradient")));
    }
    PO_ASSIGN_OR_RETURN(const GlobalClip clip, StepClip(stage.config.optimizer.clip_norm,
                                                        *stage.train, group, step));
    result.grad_norms.push_back(clip.norm);
    if (absl::Status stepped = stage.train->OptimizerStep(clip.scale); !stepped.ok()) {
      FailUncoordinated(group, Annotate(stepped, absl::StrCat("step ", step, ": optimizer")));
    }
    if (step > 0 || options.steps == 1) {
      optimizer_seconds += stage.train->last_optimizer_seconds() /
                           static_cast<double>(options.steps == 1 ? 1 : options.steps - 1);
    }
    result.losses.push_back(MeanLoss(losses));
    result.step_seconds.push_back(Now() - start);
    if (print != nullptr) {
      PrintStep(print, step, result.losses.back(), result.step_seconds.back(), flops_per_gpu,
                LearningRateAt(stage.config.optimizer, step + 1), clip.norm);
    }
  }

  // The end: checksum over every stage's tensors, the memory report, the trace.
  absl::StatusOr<std::vector<TensorHash>> my_hashes = stage.train->ParameterHashes();
  ByteWriter end;
  end.PutString(EncodeHashes(my_hashes.ok() ? *my_hashes : std::vector<TensorHash>{},
                             stage.train->ModelStateBytes()));
  end.Put<double>(optimizer_seconds);
  end.PutString(stage.train->Describe());
  PO_ASSIGN_OR_RETURN(const std::vector<std::string> gathered,
                      Gather(group, my_hashes.status(), end.Take(), "checksum"));
  std::vector<TensorHash> hashes;
  for (int d = 0; d < p; ++d) {
    ByteReader reader(gathered[static_cast<std::size_t>(d)]);
    std::string encoded;
    StageSummary& summary = result.stages[static_cast<std::size_t>(d)];
    reader.GetString(&encoded);
    reader.Get(&summary.optimizer_seconds);
    reader.GetString(&summary.description);
    PO_RETURN_IF_ERROR(reader.Finish("stage summary"));
    std::vector<TensorHash> theirs;
    PO_RETURN_IF_ERROR(DecodeHashes(encoded, &theirs, &summary.model_state_bytes));
    hashes.insert(hashes.end(), theirs.begin(), theirs.end());
  }
  PO_ASSIGN_OR_RETURN(result.checksum,
                      CombineTensorHashes(std::move(hashes), stage.train->num_tensors()));
  for (const StageSummary& summary : result.stages) {
    if (options.steps > 0 && summary.stash_peak_bytes != summary.predicted_stash_peak_bytes) {
      result.peaks_match = false;
    }
  }
  if (print != nullptr) {
    PrintStageTable(print, result);
    PrintChecksum(print, result.checksum);
  }
  if (trace && !last_stats.empty()) {
    PO_ASSIGN_OR_RETURN(result.links,
                        MeasureLinks(stage.pipeline->plan().planned_with, last_stats));
    if (print != nullptr) PrintLinkReport(print, *result.links);
  }
  if (rank == 0 && trace && !last_stats.empty()) {
    PO_RETURN_IF_ERROR(WriteTraceFile(options.trace_path, schedule, last_stats));
    if (print != nullptr) std::fprintf(print, "trace: %s\n", options.trace_path.c_str());
  }
  return result;
}

}  // namespace pipeoffload::gpt
