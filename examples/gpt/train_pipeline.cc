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
#include "examples/gpt/gpt_stage_model.h"
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
  std::unique_ptr<GptStageModel> model;
  std::optional<Schedule> loaded;  // --schedule-file
  Schedule schedule;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<Executor> executor;
};

// Phase 1, local: the job's spec, this stage's model, the trace file's writability.
absl::Status SetUpModel(const TrainOptions& options, std::shared_ptr<const GptData> data,
                        const TrainGroup& group, const std::string& transport_name, Stage& stage) {
  std::optional<Schedule> loaded;
  if (!options.schedule_file.empty()) {
    PO_ASSIGN_OR_RETURN(loaded, LoadScheduleFile(options.schedule_file));
  }
  PO_ASSIGN_OR_RETURN(stage.spec, JobSpec(options, loaded, group.size(), transport_name));
  stage.loaded = std::move(loaded);
  stage.config = options.config;
  stage.config.num_microbatches = stage.spec.num_microbatches;
  PO_ASSIGN_OR_RETURN(stage.model, GptStageModel::Create(stage.config, stage.spec.num_stages,
                                                         stage.spec.chunks_per_stage, group.rank(),
                                                         std::move(data)));
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

// Phase 2, after the stash sizes are known everywhere: schedule, backend, arena, executor.
absl::Status SetUpRuntime(const TrainOptions& options, const std::vector<std::int64_t>& saved,
                          TrainGroup& group, Transport& transport, Stage& stage) {
  const CostModel cost =
      TrainCostModel(saved, stage.model->BoundaryBytes(),
                     ChunkComputeUnits(stage.config.n_layer, stage.spec.num_virtual_stages()));
  PO_ASSIGN_OR_RETURN(stage.schedule, PlanSchedule(stage.spec, stage.loaded, cost));
  stage.spec = stage.schedule.spec;  // resolved (group size filled in)
  const int rank = group.rank();
  const StageProgram& program = stage.schedule.stages[static_cast<std::size_t>(rank)];
  const StagePrediction& prediction =
      stage.schedule.predictions->stages[static_cast<std::size_t>(rank)];
  CpuBackendOptions backend_options;
  backend_options.queue_wait_timeout_seconds = options.watchdog_seconds;
  PO_ASSIGN_OR_RETURN(stage.backend, CreateCpuBackend(backend_options));
  DeviceArenaOptions arena_options;
  arena_options.alignment = kArenaAlignment;
  arena_options.poison_on_free = options.poison || kPoisonByDefault;
  arena_options.budget_bytes =
      options.arena_bytes > 0
          ? options.arena_bytes
          : DefaultArenaBytes(program, prediction, stage.model->BoundaryBytes(), kArenaAlignment);
  PO_ASSIGN_OR_RETURN(stage.arena, DeviceArena::Create(*stage.backend, arena_options));
  ExecutorOptions executor_options;
  executor_options.wait_timeout_seconds = options.watchdog_seconds;
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(
      stage.spec, program, *stage.model, *stage.backend, *stage.arena, transport, executor_options);
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

std::int64_t ModelStateBytes(const GptStageModel& model) {
  std::int64_t floats = 0;
  for (int c = 0; c < model.chunks_per_stage(); ++c) floats += model.chunk(c).params().numel();
  return floats * 4 /* params, grads, 2 AdamW moments */ * std::int64_t{sizeof(float)};
}

// The tied embedding's gradient between stages 0 and p-1 (GptStageModel protocol step 3).
absl::Status ExchangeTiedGrad(TrainGroup& group, GptStageModel& model) {
  if (!model.NeedsTiedGradExchange()) return absl::OkStatus();
  const int peer = group.rank() == 0 ? group.size() - 1 : 0;
  const std::int64_t n = model.TiedGradElements();
  const std::string mine(reinterpret_cast<const char*>(model.TiedGradPart()),
                         static_cast<std::size_t>(n) * sizeof(float));
  PO_ASSIGN_OR_RETURN(const std::string theirs, group.Exchange(peer, mine));
  if (theirs.size() != mine.size()) {
    return absl::DataLossError(absl::StrCat("tied gradient from rank ", peer, " has ",
                                            theirs.size(), " bytes, expected ", mine.size()));
  }
  std::vector<float> part(static_cast<std::size_t>(n));
  std::memcpy(part.data(), theirs.data(), theirs.size());
  return model.SetPeerTiedGradPart(part.data(), n);
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

  // Phase 1: spec and model; then every stage's stash entry sizes.
  absl::Status status = SetUpModel(options, std::move(data), group, transport.Name(), stage);
  std::vector<std::int64_t> my_saved;
  if (status.ok()) {
    for (int c = 0; c < stage.spec.chunks_per_stage; ++c) {
      my_saved.push_back(stage.model->SavedBytes(c, stage.spec.split_backward));
    }
  }
  ByteWriter sizes;
  sizes.PutVector(my_saved);
  PO_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                      GatherChecked(group, status, sizes.Take(), "setup (model)"));
  const int p = stage.spec.num_stages;
  std::vector<std::int64_t> saved(static_cast<std::size_t>(p * stage.spec.chunks_per_stage));
  for (int d = 0; d < p; ++d) {
    ByteReader reader(gathered[static_cast<std::size_t>(d)]);
    std::vector<std::int64_t> theirs;
    reader.GetVector(&theirs);
    PO_RETURN_IF_ERROR(reader.Finish("stash sizes"));
    for (std::size_t c = 0;
         c < theirs.size() && c < static_cast<std::size_t>(stage.spec.chunks_per_stage); ++c) {
      saved[c * static_cast<std::size_t>(p) + static_cast<std::size_t>(d)] = theirs[c];
    }
  }

  // Phase 2: schedule and runtime; every rank must hold the same schedule.
  status = SetUpRuntime(options, saved, group, transport, stage);
  ByteWriter agreement;
  agreement.Put<std::uint64_t>(status.ok() ? ScheduleFingerprint(stage.schedule) : 0);
  agreement.Put<std::int64_t>(status.ok() ? stage.arena->budget_bytes() : 0);
  PO_ASSIGN_OR_RETURN(gathered, GatherChecked(group, status, agreement.Take(), "setup (schedule)"));
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
    PrintPlan(print, stage.schedule, transport.Name());
    std::fflush(print);
  }

  // The steps.
  const bool trace = !options.trace_path.empty();
  std::vector<IterationStats> last_stats;
  for (std::int64_t step = 0; step < options.steps; ++step) {
    const double start = Now();
    stage.model->StartIteration(step);
    StepReport report;
    absl::StatusOr<IterationStats> stats = stage.executor->Run();
    if (stats.ok()) {
      report.stats = *std::move(stats);
      // The executor empties the stash, host pool and P2P buffers; the arena must agree.
      if (stage.arena->reserved_bytes() != 0) {
        report.status = absl::InternalError(
            absl::StrCat("stage ", rank, ": the arena still holds ", stage.arena->reserved_bytes(),
                         " bytes after the iteration (stash ",
                         stage.arena->Usage(MemoryCategory::kStash).in_use_bytes, ", p2p ",
                         stage.arena->Usage(MemoryCategory::kP2P).in_use_bytes, ")"));
      }
    } else {
      report.status = stats.status();
    }
    if (stage.model->holds_loss()) report.losses = stage.model->losses();
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
    if (absl::Status tied = ExchangeTiedGrad(group, *stage.model); !tied.ok()) {
      FailUncoordinated(group, Annotate(tied, absl::StrCat("step ", step, ": tied gradient")));
    }
    if (absl::Status stepped = stage.model->OptimizerStep(); !stepped.ok()) {
      FailUncoordinated(group, Annotate(stepped, absl::StrCat("step ", step, ": optimizer")));
    }
    result.losses.push_back(MeanLoss(losses));
    result.step_seconds.push_back(Now() - start);
    if (print != nullptr) PrintStep(print, step, result.losses.back(), result.step_seconds.back());
  }

  // The end: checksum over every stage's tensors, the memory report, the trace.
  PO_ASSIGN_OR_RETURN(gathered, GatherChecked(group, absl::OkStatus(),
                                              EncodeHashes(stage.model->ParameterHashes(),
                                                           ModelStateBytes(*stage.model)),
                                              "checksum"));
  std::vector<TensorHash> hashes;
  for (int d = 0; d < p; ++d) {
    std::vector<TensorHash> theirs;
    std::int64_t state_bytes = 0;
    PO_RETURN_IF_ERROR(DecodeHashes(gathered[static_cast<std::size_t>(d)], &theirs, &state_bytes));
    hashes.insert(hashes.end(), theirs.begin(), theirs.end());
    StageSummary& summary = result.stages[static_cast<std::size_t>(d)];
    summary.model_state_bytes = state_bytes;
  }
  PO_ASSIGN_OR_RETURN(result.checksum,
                      CombineTensorHashes(std::move(hashes), stage.model->num_tensors()));
  for (const StageSummary& summary : result.stages) {
    if (options.steps > 0 && summary.stash_peak_bytes != summary.predicted_stash_peak_bytes) {
      result.peaks_match = false;
    }
  }
  if (print != nullptr) {
    PrintStageTable(print, result);
    PrintChecksum(print, result.checksum);
  }
  if (rank == 0 && trace && !last_stats.empty()) {
    PO_RETURN_IF_ERROR(WriteTraceFile(options.trace_path, stage.schedule, last_stats));
    if (print != nullptr) std::fprintf(print, "trace: %s\n", options.trace_path.c_str());
  }
  return result;
}

}  // namespace pipeoffload::gpt
