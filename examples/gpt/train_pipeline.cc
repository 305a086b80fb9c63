// One gpt_train pipeline rank (see train_pipeline.h for the phases).
//
// Invariants:
//  - Every rank makes the same sequence of group calls whatever happens: each phase and each
//    step ends in exactly one AllGather carrying the rank's status, and a rank returns only
//    after such a gather (so nobody is left waiting) or ends the job through Abort when the
//    ranks cannot meet. The tied-gradient Exchange happens only after a gather said every
//    rank's iteration succeeded.
//  - Every rank compiles the schedule itself from the same inputs (gathered stash sizes,
//    deterministic cost model); the schedules' fingerprints are compared before any step.
//  - Gradients accumulate inside GptStageModel in the order the executor runs B / W, which
//    the schedule fixes per chunk in microbatch order: the reason the checksum is the
//    single-process one.
#include "examples/gpt/train_pipeline.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "examples/gpt/train_calibrate.h"
#include "examples/gpt/train_plan.h"
#include "examples/gpt/train_report.h"
#include "examples/gpt/train_wire.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload::gpt {
namespace {

constexpr std::int64_t kArenaAlignment = 256;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Ends the job when the ranks cannot meet to agree on a failure.
[[noreturn]] void FailUncoordinated(TrainGroup& group, const absl::Status& status) {
  std::fprintf(stderr, "gpt_train: rank %d/%d: fatal: %s\n", group.rank(), group.size(),
               std::string(status.message()).c_str());
  group.Abort(1);
  std::abort();  // Abort does not return; a virtual call does not tell the compiler so
}

// Gathers every rank's (status, payload) for `phase`. Returns every payload when all ranks
// succeeded; else an error, the same on every rank, naming each failed rank and its error.
absl::StatusOr<std::vector<std::string>> GatherChecked(TrainGroup& group, const absl::Status& mine,
                                                       std::string payload,
                                                       const std::string& phase) {
  ByteWriter writer;
  PutStatus(writer, mine);
  writer.PutString(payload);
  absl::StatusOr<std::vector<std::string>> all = group.AllGather(writer.Take());
  if (!all.ok()) FailUncoordinated(group, Annotate(all.status(), phase));
  std::vector<std::string> payloads;
  // Failures grouped by message, in rank order: ranks that fail alike (a bad file, a wrong
  // stage count) are named together with one message.
  std::vector<std::pair<std::string, std::vector<int>>> failures;
  absl::StatusCode first_code = absl::StatusCode::kOk;
  int failed = 0;
  for (int r = 0; r < group.size(); ++r) {
    ByteReader reader((*all)[static_cast<std::size_t>(r)]);
    absl::Status status;
    std::string theirs;
    GetStatus(reader, &status);
    reader.GetString(&theirs);
    if (absl::Status read = reader.Finish(phase); !read.ok()) status = read;
    if (!status.ok()) {
      if (failed++ == 0) first_code = status.code();
      const std::string message(status.message());
      auto same = std::find_if(failures.begin(), failures.end(),
                               [&](const auto& failure) { return failure.first == message; });
      if (same == failures.end()) {
        failures.push_back({message, {r}});
      } else {
        same->second.push_back(r);
      }
    }
    payloads.push_back(std::move(theirs));
  }
  if (failed == 0) return payloads;
  const auto ranks = [](const std::vector<int>& list) {
    return absl::StrCat(list.size() == 1 ? "rank " : "ranks ", absl::StrJoin(list, ", "));
  };
  std::string text =
      absl::StrCat(phase, " failed on ",
                   failed == group.size() ? std::string("every rank")
                                          : absl::StrCat(failed, " of ", group.size(), " ranks"));
  if (failures.size() == 1) {
    if (failed < group.size()) absl::StrAppend(&text, " (", ranks(failures[0].second), ")");
    absl::StrAppend(&text, ": ", failures[0].first);
  } else {
    text += ":";
    for (const auto& [message, list] : failures) {
      absl::StrAppend(&text, "\n  ", ranks(list), ": ", message);
    }
  }
  return absl::Status(first_code, text);
}

struct Stage {
  PipelineSpec spec;
  GptConfig config;
  std::unique_ptr<TrainStage> train;  // the model and its backend
  StageModel* model = nullptr;        // train->model()
  std::optional<Schedule> loaded;     // --schedule-file
  Schedule schedule;
  CostModel cost;  // what the schedule was planned with
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<Executor> executor;
};

// Phase 1, local: the job's spec, this stage's model, the trace file's writability.
absl::Status SetUpModel(const TrainOptions& options, std::shared_ptr<const GptData> data,
                        const TrainGroup& group, const std::string& transport_name,
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
  stage_spec.data = std::move(data);
  PO_ASSIGN_OR_RETURN(stage.train, factory(options, stage_spec));
  stage.model = &stage.train->model();
  if (group.rank() == 0 && !options.trace_path.empty()) {
    std::FILE* trace = std::fopen(options.trace_path.c_str(), "w");
    if (trace == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot write the trace file ", options.trace_path,
                                                 ": ", std::strerror(errno)));
    }
    std::fclose(trace);
  }
  return absl::OkStatus();
}

// The largest stash entry of this stage's chunks.
std::int64_t LargestEntryBytes(const StageModel& model, const PipelineSpec& spec) {
  std::int64_t largest = 0;
  for (int c = 0; c < spec.chunks_per_stage; ++c) {
    largest = std::max(largest, model.SavedBytes(c, spec.split_backward));
  }
  return largest;
}

// Stages that share one device: the local transport's stages are threads on one GPU with --backend
// cuda (CPU stages run on cores of their own).
int StagesPerDevice(const TrainOptions& options, const Transport& transport, int num_stages) {
  return transport.Name() == "local" && options.backend == TrainBackend::kCuda ? num_stages : 1;
}

// Phase 1b, --costs measured: this stage's chunk times and host link. Stages of the local
// transport share the machine (one GPU, or the CPU's cores), so they measure in turns, each
// alone; ranks of an MPI job measure at once, each on its own device, so a host link that
// devices share shows in every figure. Every rank makes the same group calls whatever fails;
// a failure travels in the next gather.
void MeasureCosts(TrainGroup& group, const Transport& transport, Stage& stage,
                  absl::Status& status, StageCosts& costs) {
  const bool in_turns = transport.Name() == "local";
  const int turns = in_turns ? group.size() : 1;
  for (int turn = 0; turn < turns; ++turn) {
    if (status.ok() && (!in_turns || turn == group.rank())) {
      absl::StatusOr<StageCosts> measured =
          MeasureStageCosts(*stage.train, stage.spec, group.rank());
      if (measured.ok()) {
        costs = *std::move(measured);
      } else {
        status = measured.status();
      }
    }
    if (in_turns) {
      absl::StatusOr<std::vector<std::string>> synced = group.AllGather("");
      if (!synced.ok()) FailUncoordinated(group, Annotate(synced.status(), "measuring costs"));
    }
  }
}

// Phase 2, after the stash sizes (and measured costs) are known everywhere: schedule, backend,
// arena, executor. `costs` is empty for --costs nominal.
absl::Status SetUpRuntime(const TrainOptions& options, const std::vector<std::int64_t>& saved,
                          const std::vector<StageCosts>& costs, TrainGroup& group,
                          Transport& transport, Stage& stage) {
  stage.cost =
      costs.empty()
          ? TrainCostModel(saved, stage.model->BoundaryBytes(),
                           ChunkComputeUnits(stage.config.n_layer, stage.spec.num_virtual_stages()))
          : MeasuredTrainCostModel(saved, stage.model->BoundaryBytes(), costs,
                                   StagesPerDevice(options, transport, group.size()));
  PO_ASSIGN_OR_RETURN(stage.schedule, PlanSchedule(stage.spec, stage.loaded, stage.cost,
                                                   options.memory_budget_share));
  stage.spec = stage.schedule.spec;  // resolved (group size filled in)
  const int rank = group.rank();
  const StageProgram& program = stage.schedule.stages[static_cast<std::size_t>(rank)];
  const StagePrediction& prediction =
      stage.schedule.predictions->stages[static_cast<std::size_t>(rank)];
  // P2P buffer lifetimes over all stages: the arena reserves their peak and the executor holds
  // to it (it waits for a send once its receiver is known to have posted the receive).
  // --p2p-reserve worst: neither (room for every P2P buffer of the step, no waits). Over NCCL a
  // rank's transfers run in posting order on one stream, so a receive the peer has posted may
  // still wait behind its other transfers: there a send is waited for only once its message is
  // known to be consumed.
  const P2PGuarantee guarantee = transport.Name() == "nccl" ? P2PGuarantee::kMessageConsumed
                                                            : P2PGuarantee::kReceivePosted;
  const P2PLifetimes* stage_p2p = nullptr;
  std::vector<P2PLifetimes> p2p;
  if (!options.p2p_reserve_worst) {
    absl::StatusOr<std::vector<P2PLifetimes>> analyzed = AnalyzeP2P(stage.schedule, guarantee);
    if (!analyzed.ok()) return Annotate(analyzed.status(), "the schedule's P2P buffer lifetimes");
    p2p = *std::move(analyzed);
    stage_p2p = &p2p[static_cast<std::size_t>(rank)];
  }
  DeviceArenaOptions arena_options;
  arena_options.alignment = kArenaAlignment;
  arena_options.poison_on_free = options.poison || kPoisonByDefault;
  arena_options.budget_bytes =
      options.arena_bytes > 0
          ? options.arena_bytes
          : DefaultArenaBytes(program, prediction, stage.model->BoundaryBytes(), kArenaAlignment,
                              LargestEntryBytes(*stage.model, stage.spec), stage_p2p);
  PO_ASSIGN_OR_RETURN(stage.arena, DeviceArena::Create(stage.train->backend(), arena_options));
  ExecutorOptions executor_options;
  executor_options.wait_timeout_seconds = options.watchdog_seconds;
  if (stage_p2p != nullptr) executor_options.p2p_guarantee_points = stage_p2p->guarantee_point;
  absl::StatusOr<std::unique_ptr<Executor>> executor =
      Executor::Create(stage.spec, program, *stage.model, stage.train->backend(), *stage.arena,
                       transport, executor_options);
  if (!executor.ok()) {
    if (executor.status().code() == absl::StatusCode::kResourceExhausted) {
      return Annotate(executor.status(),
                      absl::StrCat("the arena budget of ", arena_options.budget_bytes,
                                   " bytes (--arena-bytes) is too small for the plan"));
    }
    return executor.status();
  }
  stage.executor = *std::move(executor);
  return absl::OkStatus();
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

}  // namespace

absl::StatusOr<TrainResult> RunPipelineRank(const TrainOptions& options,
                                            std::shared_ptr<const GptData> data, TrainGroup& group,
                                            Transport& transport, std::FILE* out) {
  return RunPipelineRank(options, std::move(data), group, transport, out, CreateCpuTrainStage);
}

absl::StatusOr<TrainResult> RunPipelineRank(const TrainOptions& options,
                                            std::shared_ptr<const GptData> data, TrainGroup& group,
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

  // Phase 1: spec and model (and with --costs measured, the stage's costs); then every stage's
  // stash entry sizes and costs.
  absl::Status status =
      SetUpModel(options, std::move(data), group, transport.Name(), factory, stage);
  progress(status.ok() ? "stage model built" : "stage model failed");
  std::vector<std::int64_t> my_saved;
  if (status.ok()) {
    for (int c = 0; c < stage.spec.chunks_per_stage; ++c) {
      my_saved.push_back(stage.model->SavedBytes(c, stage.spec.split_backward));
    }
  }
  StageCosts my_costs;
  if (options.measured_costs) {
    MeasureCosts(group, transport, stage, status, my_costs);
    progress("chunk times and host link measured");
  }
  ByteWriter sizes;
  sizes.PutVector(my_saved);
  PutStageCosts(sizes, my_costs);
  PO_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                      GatherChecked(group, status, sizes.Take(), "setup (model)"));
  const int p = stage.spec.num_stages;
  std::vector<std::int64_t> saved(static_cast<std::size_t>(p * stage.spec.chunks_per_stage));
  std::vector<StageCosts> costs;
  for (int d = 0; d < p; ++d) {
    ByteReader reader(gathered[static_cast<std::size_t>(d)]);
    std::vector<std::int64_t> theirs;
    reader.GetVector(&theirs);
    StageCosts their_costs;
    GetStageCosts(reader, &their_costs);
    PO_RETURN_IF_ERROR(reader.Finish("stash sizes and costs"));
    if (options.measured_costs) costs.push_back(std::move(their_costs));
    for (std::size_t c = 0;
         c < theirs.size() && c < static_cast<std::size_t>(stage.spec.chunks_per_stage); ++c) {
      saved[c * static_cast<std::size_t>(p) + static_cast<std::size_t>(d)] = theirs[c];
    }
  }

  // Phase 2: schedule and runtime; every rank must hold the same schedule.
  status = SetUpRuntime(options, saved, costs, group, transport, stage);
  ByteWriter agreement;
  agreement.Put<std::uint64_t>(status.ok() ? ScheduleFingerprint(stage.schedule) : 0);
  agreement.Put<std::int64_t>(status.ok() ? stage.arena->budget_bytes() : 0);
  PO_ASSIGN_OR_RETURN(gathered, GatherChecked(group, status, agreement.Take(), "setup (schedule)"));
  progress("schedule compiled, arenas and executors ready on every rank");
  std::vector<std::uint64_t> fingerprints(static_cast<std::size_t>(p));
  std::vector<std::int64_t> budgets(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    ByteReader reader(gathered[static_cast<std::size_t>(d)]);
    reader.Get(&fingerprints[static_cast<std::size_t>(d)]);
    reader.Get(&budgets[static_cast<std::size_t>(d)]);
    PO_RETURN_IF_ERROR(reader.Finish("schedule fingerprint"));
    if (fingerprints[static_cast<std::size_t>(d)] != fingerprints[0]) {
      return absl::InternalError(
          absl::StrCat("rank ", d,
                       " compiled a different schedule than rank 0 from the same inputs (a "
                       "nondeterminism bug in the compiler)"));
    }
  }
  TrainResult result;
  result.schedule = stage.schedule;
  result.measured_costs = costs;
  result.stages.resize(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    const StagePrediction& predicted =
        stage.schedule.predictions->stages[static_cast<std::size_t>(d)];
    StageSummary& summary = result.stages[static_cast<std::size_t>(d)];
    summary.stage = d;
    summary.predicted_stash_peak_bytes = predicted.peak_bytes;
    summary.predicted_host_bytes = predicted.host_bytes;
    summary.predicted_offloaded_bytes = predicted.offloaded_bytes;
    summary.arena_budget_bytes = budgets[static_cast<std::size_t>(d)];
  }
  if (print != nullptr) {
    PrintDataAndModel(print, *corpus, stage.config);
    PrintPlan(print, stage.schedule, transport.Name(), !costs.empty());
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
    absl::StatusOr<IterationStats> stats =
        started.ok() ? stage.executor->Run() : absl::StatusOr<IterationStats>(started);
    if (stats.ok()) {
      report.stats = *std::move(stats);
      report.status = stage.train->FinishIteration(options.watchdog_seconds);
      // The executor empties the stash, host pool and P2P buffers; the arena must agree.
      if (report.status.ok() && stage.arena->reserved_bytes() != 0) {
        report.status = absl::InternalError(
            absl::StrCat("stage ", rank, ": the arena still holds ", stage.arena->reserved_bytes(),
                         " bytes after the iteration (stash ",
                         stage.arena->Usage(MemoryCategory::kStash).in_use_bytes, ", p2p ",
                         stage.arena->Usage(MemoryCategory::kP2P).in_use_bytes, ")"));
      }
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
    PO_ASSIGN_OR_RETURN(gathered,
                        GatherChecked(group, report.status, EncodeStepReport(report, with_timeline),
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
    if (absl::Status stepped = stage.train->OptimizerStep(); !stepped.ok()) {
      FailUncoordinated(group, Annotate(stepped, absl::StrCat("step ", step, ": optimizer")));
    }
    if (step > 0 || options.steps == 1) {
      optimizer_seconds += stage.train->last_optimizer_seconds() /
                           static_cast<double>(options.steps == 1 ? 1 : options.steps - 1);
    }
    result.losses.push_back(MeanLoss(losses));
    result.step_seconds.push_back(Now() - start);
    if (print != nullptr) {
      PrintStep(print, step, result.losses.back(), result.step_seconds.back(), flops_per_gpu);
    }
  }

  // The end: checksum over every stage's tensors, the memory report, the trace.
  absl::StatusOr<std::vector<TensorHash>> my_hashes = stage.train->ParameterHashes();
  ByteWriter end;
  end.PutString(EncodeHashes(my_hashes.ok() ? *my_hashes : std::vector<TensorHash>{},
                             stage.train->ModelStateBytes()));
  end.Put<double>(optimizer_seconds);
  end.PutString(stage.train->Describe());
  PO_ASSIGN_OR_RETURN(gathered, GatherChecked(group, my_hashes.status(), end.Take(), "checksum"));
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
    PO_ASSIGN_OR_RETURN(result.links, MeasureLinks(stage.cost, last_stats));
    if (print != nullptr) PrintLinkReport(print, *result.links);
  }
  if (rank == 0 && trace && !last_stats.empty()) {
    PO_RETURN_IF_ERROR(WriteTraceFile(options.trace_path, stage.schedule, last_stats));
    if (print != nullptr) std::fprintf(print, "trace: %s\n", options.trace_path.c_str());
  }
  return result;
}

}  // namespace pipeoffload::gpt
