// gpt_train: trains the example GPT as a pipeline under a compiled schedule (one MPI rank per
// stage, or every stage a thread with --transport local), or single-process without mpirun.
// --backend cuda runs the CUDA GPT through the same driver (built with PO_GPT_TRAIN_WITH_CUDA:
// stages as threads on one GPU, or one MPI rank per GPU over NCCL).
// `gpt_train --help` lists every flag. Exit codes: 0 done; 1 the run failed (the reason is
// printed by every rank); 2 bad flags; 3 a stage's measured stash peak differed from the
// compiler's prediction (a bug, reported after the checksum).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/common/flags.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/train_group.h"
#include "examples/gpt/train_options.h"
#include "examples/gpt/train_pipeline.h"
#include "examples/gpt/train_stage.h"
#include "pipeoffload/planning.h"
#include "pipeoffload/transport.h"
#ifdef PO_GPT_TRAIN_WITH_CUDA
#include "examples/gpt/train_cuda/train_stage_cuda.h"
#endif

namespace {

using namespace pipeoffload::gpt;  // NOLINT: an example's main

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitPeakMismatch = 3;

// The launcher's rank, read before MPI starts (flag and data errors are printed by every rank
// without initializing MPI).
std::string LauncherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* value = std::getenv(name)) return value;
  }
  return "";
}

int Fail(const std::string& who, const std::string& message, int code) {
  std::fprintf(stderr, "gpt_train: %s%serror: %s\n", who.c_str(), who.empty() ? "" : ": ",
               message.c_str());
  return code;
}

// The collectives wait for the slowest rank's iteration; a rank stuck in one is stopped by
// the watchdog (each of its waits is bounded), so a few watchdog periods always suffice.
double CollectiveTimeout(const TrainOptions& options) {
  return 3.0 * options.watchdog_seconds + 30.0;
}

int ExitCode(const TrainResult& result) { return result.peaks_match ? 0 : kExitPeakMismatch; }

// mpirun kills every rank as soon as one exits non-zero, maybe before the others have printed
// their message. So under mpirun a failing rank first meets all the others (each has printed
// by then), and MPI is finalized, before anyone exits.
int ExitTogether(std::unique_ptr<pipeoffload::RankGroup> group, int code) {
  if (group == nullptr && LaunchedByMpi() && MpiAvailable()) {
    absl::StatusOr<std::unique_ptr<pipeoffload::RankGroup>> created =
        CreateMpiTrainGroup(/*timeout_seconds=*/30.0);
    if (created.ok()) group = *std::move(created);
  }
  if (group != nullptr) group->AllGather("").IgnoreError();  // a late rank: exit anyway
  return code;
}

constexpr const char* kBuiltWithoutCuda =
    "--backend cuda: this gpt_train was built without CUDA (configure with -DPO_WITH_CUDA=ON "
    "where nvcc is found); use --backend cpu";

#ifdef PO_GPT_TRAIN_WITH_CUDA
// CPU threads for each optimizer-offload engine when `ranks_per_host` stages share the host.
int EngineThreads(int ranks_per_host) {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus <= 0 ? 0 : std::max(1, cpus / std::max(1, ranks_per_host));
}
#endif

int RunLocal(const TrainOptions& options, const std::shared_ptr<const GptData>& data) {
  int stages = options.stages_given ? options.stages : 4;
  if (!options.stages_given && !options.schedule_file.empty()) {
    absl::StatusOr<pipeoffload::Schedule> loaded = pipeoffload::LoadScheduleFile(options.schedule_file);
    if (!loaded.ok()) return Fail("", std::string(loaded.status().message()), kExitFailed);
    stages = loaded->spec.num_stages;
  }
  auto groups = pipeoffload::CreateLocalRankGroups(stages, CollectiveTimeout(options));
  if (!groups.ok()) return Fail("", std::string(groups.status().message()), kExitFailed);
#ifdef PO_GPT_TRAIN_WITH_CUDA
  // Outlives the transports (their receive copiers use its backends) and the stages.
  CudaLocalRig rig;
#endif
  absl::StatusOr<std::vector<std::unique_ptr<pipeoffload::Transport>>> transports;
  TrainStageFactory factory = CreateCpuTrainStage;
  if (options.backend == TrainBackend::kCuda) {
#ifdef PO_GPT_TRAIN_WITH_CUDA
    absl::StatusOr<CudaLocalRig> created = CreateCudaLocalRig(stages, options.watchdog_seconds);
    if (!created.ok()) return Fail("", std::string(created.status().message()), kExitFailed);
    rig = *std::move(created);
    transports = std::move(rig.transports);
    const int threads = EngineThreads(stages);
    factory = [&rig, threads](const TrainOptions& o, const TrainStageSpec& spec) {
      return CreateCudaTrainStage(o, spec, *rig.backends[static_cast<std::size_t>(spec.stage)],
                                  threads);
    };
#else
    return Fail("", kBuiltWithoutCuda, kExitFailed);
#endif
  } else {
    transports = pipeoffload::CreateLocalTransports(stages);
  }
  if (!transports.ok()) return Fail("", std::string(transports.status().message()), kExitFailed);
  std::vector<absl::StatusOr<TrainResult>> results(static_cast<std::size_t>(stages),
                                                   absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < stages; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      results[i] =
          RunPipelineRank(options, data, *(*groups)[i], *(*transports)[i], stdout, factory);
    });
  }
  for (std::thread& thread : threads) thread.join();
  int code = 0;
  for (int r = 0; r < stages; ++r) {
    const auto& result = results[static_cast<std::size_t>(r)];
    if (!result.ok()) {
      code = Fail(absl::StrCat("rank ", r, "/", stages), std::string(result.status().message()),
                  kExitFailed);
    }
  }
  return code != 0 ? code : ExitCode(*results[0]);
}

int RunMpi(const TrainOptions& options, const std::shared_ptr<const GptData>& data) {
  absl::StatusOr<std::unique_ptr<pipeoffload::RankGroup>> group =
      CreateMpiTrainGroup(CollectiveTimeout(options));
  if (!group.ok()) {
    return Fail(absl::StrCat("rank ", LauncherRank()), std::string(group.status().message()),
                kExitFailed);
  }
  const std::string who = absl::StrCat("rank ", (*group)->rank(), "/", (*group)->size());
  absl::StatusOr<std::unique_ptr<pipeoffload::Transport>> transport;
  std::unique_ptr<pipeoffload::Backend> backend;  // --backend cuda: this rank's GPU
  TrainStageFactory factory = CreateCpuTrainStage;
  if (options.backend == TrainBackend::kCuda) {
#ifdef PO_GPT_TRAIN_WITH_CUDA
    // Every rank checks its GPU and they agree first, so a bad launch fails on all at once.
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<CudaMpiRank> rank = CreateCudaMpiRank(**group, options);
    if (!rank.ok()) {
      return ExitTogether(*std::move(group),
                          Fail(who, std::string(rank.status().message()), kExitFailed));
    }
    if ((*group)->rank() == 0) {
      std::printf("setup: GPU, NCCL communicator and CUDA backend ready (%.1f s)\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::fflush(stdout);
    }
    transport = std::move(rank->transport);
    backend = std::move(rank->backend);
    const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int threads = EngineThreads(local_size != nullptr ? std::atoi(local_size) : 1);
    factory = [&backend, threads](const TrainOptions& o, const TrainStageSpec& spec) {
      return CreateCudaTrainStage(o, spec, *backend, threads);
    };
#else
    return ExitTogether(*std::move(group), Fail(who, kBuiltWithoutCuda, kExitFailed));
#endif
  } else {
    transport = CreateMpiStageTransport(/*max_chunks=*/64);  // the largest --chunks
  }
  if (!transport.ok()) {
    Fail(who, std::string(transport.status().message()), kExitFailed);
    AbortJob(**group, kExitFailed);
  }
  absl::StatusOr<TrainResult> result =
      RunPipelineRank(options, data, **group, **transport, stdout, factory);
  backend.reset();     // after the stage (gone with RunPipelineRank)
  transport->reset();  // before the group, which finalizes MPI
  if (!result.ok()) {
    return ExitTogether(*std::move(group),
                        Fail(who, std::string(result.status().message()), kExitFailed));
  }
  return ExitCode(*result);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string launcher_rank = LauncherRank();
  const std::string who = launcher_rank.empty() ? "" : "rank " + launcher_rank;
  absl::StatusOr<TrainOptions> parsed =
      ParseTrainOptions(std::vector<std::string>(argv + 1, argv + argc));
  if (!parsed.ok()) {
    const std::string message =
        pipeoffload::examples::WithHelpPointer(std::string(parsed.status().message()));
    return ExitTogether(nullptr, Fail(who, message, kExitUsage));
  }
  TrainOptions& options = *parsed;
  if (options.help) {
    if (launcher_rank.empty() || launcher_rank == "0") std::fputs(TrainHelpText().c_str(), stdout);
    return 0;
  }
#ifndef PO_GPT_TRAIN_WITH_CUDA
  if (options.backend == TrainBackend::kCuda) {
    return ExitTogether(nullptr, Fail(who, kBuiltWithoutCuda, kExitFailed));
  }
#endif
  if (options.backend == TrainBackend::kCpu) {
    // Under mpirun the host holds its local ranks' stages: about LOCAL_SIZE / SIZE of the model.
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
    const double share = local != nullptr && world != nullptr && std::atoi(world) > 0
                             ? std::min(1.0, std::atof(local) / std::atof(world))
                             : 1.0;
    if (absl::Status fits = CheckCpuHostMemory(options.config, share); !fits.ok()) {
      return ExitTogether(nullptr, Fail(who, std::string(fits.message()), kExitFailed));
    }
  }
  TrainTransport transport = options.transport;
  if (transport == TrainTransport::kAuto) {
    // The CUDA GPT has no single-process reference: without mpirun it runs on one GPU.
    const TrainTransport alone = options.backend == TrainBackend::kCuda
                                     ? TrainTransport::kLocal
                                     : TrainTransport::kReference;
    transport = LaunchedByMpi() ? TrainTransport::kMpi : alone;
  }
  std::shared_ptr<const GptData> data;
  if (options.data_path.empty()) {
    data = std::make_shared<const GptData>(GptData::Synthetic());
  } else {
    absl::StatusOr<GptData> loaded = GptData::FromFile(options.data_path);
    if (!loaded.ok()) {
      return ExitTogether(nullptr, Fail(who, std::string(loaded.status().message()), kExitFailed));
    }
    data = std::make_shared<const GptData>(*std::move(loaded));
  }
  switch (transport) {
    case TrainTransport::kReference: {
      if (!options.trace_path.empty() || !options.schedule_file.empty()) {
        return Fail(who,
                    "--trace and --schedule-file need a pipeline: start under mpirun or pass "
                    "--transport local",
                    kExitUsage);
      }
      if (!options.schedule.empty() || options.stages_given) {
        std::fprintf(stderr,
                     "gpt_train: note: no mpirun and no --transport local, so this is the "
                     "single-process reference; the pipeline flags do not apply\n");
      }
      absl::StatusOr<TrainResult> result = RunReference(options, data, stdout);
      if (!result.ok()) return Fail(who, std::string(result.status().message()), kExitFailed);
      return 0;
    }
    case TrainTransport::kLocal:
      return RunLocal(options, data);
    case TrainTransport::kMpi:
    case TrainTransport::kAuto:
      break;
  }
  return RunMpi(options, data);
}
