// pipeline_bench: what activation offload costs a real pipeline step on one GPU.
//
// p stages run as threads of this process on ONE GPU, each with its own CUDA backend (its own
// streams), device arena and executor, exchanging device buffers through the local transport
// with CudaDeviceCopier. Each stage is a GemmStageModel (bench/gemm_stage_model.h): a GPT
// layer's four bf16 GEMMs per layer, 34 h s saved bytes per layer.
//
//   1. F and B of one chunk are timed alone on the GPU (CUDA events, median of --reps);
//   2. the cost model is built from them, the saved and boundary bytes, and the PCIe figures
//      (--pcie-gbs solo, --duplex-gbs per direction when both run); each policy is compiled;
//   3. each policy runs --warmup + --steps iterations; the table reports the median step,
//      overhead vs 1f1b, model TFLOP/s (3x the forward GEMM FLOPs actually launched), stash
//      peak measured vs predicted, offloaded GB per step and achieved offload GB/s (OFFLOAD
//      bytes over the copies' own durations), and predicted vs measured step time.
// The prediction assumes one GPU per stage; here p stages time-share one GPU, so the step is
// bounded below by the "serial" column: p * m * v * (F + B) measured alone.
//
// Flags: --hidden=N (4096) --seq=N (2048) --layers-per-chunk=N (1) --microbatches=N (4p)
//   --stages=N (4) --family=1f1b|interleaved|group-interleaved (1f1b) --chunks=N (1)
//   --policy=P or --policies=P,P,...|all with P in 1f1b|po-h|po-f|selective|auto
//   (all = 1f1b,po-h,po-f) --offload-fraction=F (0.5, selective) --budget-gb=G (auto)
//   --steps=N (5) --warmup=N (2) --reps=N (5) --pcie-gbs=G (55) --duplex-gbs=G (46)
//   --out=PATH (also write the markdown there) --dry-run (no GPU: estimated costs, compile
//   and print predictions only).
// Exit status: 0 ok, 1 a failure (message on stderr), 2 bad flags, 77 no usable GPU.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/gemm_stage_model.h"
#include "bench/pipeline_bench_plan.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload::bench {
namespace {

constexpr int kNoGpuExitCode = 77;
constexpr double kWaitTimeoutSeconds = 120.0;

// One stage's long-lived pieces, shared by every policy.
struct StageRig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<StageModel> model;
};

struct PolicyResult {
  std::string name;
  std::vector<double> step_seconds;
  std::vector<std::int64_t> stash_peak;  // [stage], max over steps
  std::int64_t offloaded_bytes = 0;      // per step, all stages
  double offload_bytes_timed = 0.0;      // OFFLOAD bytes of the last step ...
  double offload_seconds = 0.0;          // ... and the sum of their copy durations
  double predicted_step = 0.0;
  std::vector<std::int64_t> predicted_peak;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

struct StepResult {
  std::vector<IterationStats> stats;
  double seconds = 0.0;  // earliest stage start to every GPU queue idle
};

// Runs one step: every stage's executor on its own thread, then waits for every queue, since a
// stage's Run returns once its last kernels are enqueued, not done.
absl::StatusOr<StepResult> RunStep(std::vector<std::unique_ptr<Executor>>& executors,
                                   std::vector<StageRig>& rigs) {
  const std::size_t p = executors.size();
  std::vector<std::optional<absl::StatusOr<IterationStats>>> results(p);
  std::vector<std::thread> threads;
  for (std::size_t d = 0; d < p; ++d) {
    threads.emplace_back([&, d] { results[d] = executors[d]->Run(); });
  }
  for (std::thread& thread : threads) thread.join();
  StepResult step;
  for (std::size_t d = 0; d < p; ++d) {
    if (!results[d]->ok()) return results[d]->status();
    step.stats.push_back(std::move(**results[d]));
  }
  for (StageRig& rig : rigs) PO_RETURN_IF_ERROR(rig.backend->Synchronize(kWaitTimeoutSeconds));
  double start = step.stats[0].start_time;
  for (const IterationStats& stage : step.stats) start = std::min(start, stage.start_time);
  step.seconds = rigs[0].backend->NowSeconds() - start;
  return step;
}

absl::StatusOr<PolicyResult> RunPolicy(const BenchOptions& options, const PlannedPolicy& plan,
                                       std::vector<StageRig>& rigs) {
  const Schedule& schedule = plan.schedule;
  const int p = options.stages;
  PolicyResult result;
  result.name = plan.name;
  result.predicted_step = schedule.predictions->step_time;
  for (const StagePrediction& stage : schedule.predictions->stages) {
    result.predicted_peak.push_back(stage.peak_bytes);
  }
  LocalTransportOptions transport_options;
  for (StageRig& rig : rigs) {
    PO_ASSIGN_OR_RETURN(LocalCopyFunction copier,
                        CudaDeviceCopier(*rig.backend, kWaitTimeoutSeconds));
    transport_options.receive_copiers.push_back(std::move(copier));
  }
  PO_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Transport>> transports,
                      CreateLocalTransports(p, transport_options));
  std::vector<std::unique_ptr<DeviceArena>> arenas;
  std::vector<std::unique_ptr<Executor>> executors;
  ExecutorOptions executor_options;
  executor_options.wait_timeout_seconds = kWaitTimeoutSeconds;
  for (int d = 0; d < p; ++d) {
    StageRig& rig = rigs[static_cast<std::size_t>(d)];
    DeviceArenaOptions arena_options;
    arena_options.budget_bytes = ArenaBudget(schedule, d, rig.model->BoundaryBytes());
    arena_options.poison_on_free = false;  // a benchmark: no fill kernels on release
    PO_ASSIGN_OR_RETURN(std::unique_ptr<DeviceArena> arena,
                        DeviceArena::Create(*rig.backend, arena_options));
    absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(
        schedule.spec, schedule.stages[static_cast<std::size_t>(d)], *rig.model, *rig.backend,
        *arena, *transports[static_cast<std::size_t>(d)], executor_options);
    if (!executor.ok()) {
      return Annotate(executor.status(), absl::StrCat(plan.name, ": stage ", d));
    }
    arenas.push_back(std::move(arena));
    executors.push_back(std::move(*executor));
  }
  result.stash_peak.assign(static_cast<std::size_t>(p), 0);
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    absl::StatusOr<StepResult> ran = RunStep(executors, rigs);
    if (!ran.ok()) return Annotate(ran.status(), absl::StrCat(plan.name, ": step ", step));
    if (step < options.warmup) continue;
    result.step_seconds.push_back(ran->seconds);
    const std::vector<IterationStats>* stats = &ran->stats;
    result.offloaded_bytes = 0;
    result.offload_bytes_timed = 0.0;
    result.offload_seconds = 0.0;
    for (const IterationStats& stage : *stats) {
      auto& peak = result.stash_peak[static_cast<std::size_t>(stage.stage)];
      peak = std::max(peak, stage.stash_high_water_bytes);
      result.offloaded_bytes += stage.offloaded_bytes;
      for (const TimedOp& op : stage.ops) {
        if (op.op.kind != OpKind::kOffload || !(op.end > op.start)) continue;
        result.offload_bytes_timed += static_cast<double>(op.bytes);
        result.offload_seconds += op.end - op.start;
      }
    }
  }
  // Executors before arenas before transports: queued work ends in the executors' teardown.
  executors.clear();
  for (StageRig& rig : rigs) PO_RETURN_IF_ERROR(rig.backend->Synchronize(kWaitTimeoutSeconds));
  return result;
}

std::string Gb(double bytes) { return absl::StrFormat("%.2f", bytes / 1e9); }

std::string Table(const BenchOptions& options, const ChunkTimes& times,
                  const std::vector<PolicyResult>& results) {
  const GemmShape shape = options.Shape();
  const double flops_per_step = 3.0 * shape.ForwardFlops() * options.stages *
                                options.chunks * options.Microbatches();
  const double serial = options.stages * options.chunks * options.Microbatches() *
                        (times.forward + times.backward);
  std::string out = absl::StrFormat(
      "### pipeline_bench h=%d s=%d layers/chunk=%d p=%d m=%d v=%d family=%s (one GPU)\n\n"
      "chunk F %.2f ms, B %.2f ms (alone); saved %s GB per entry; serial bound %.3f s; PCIe "
      "%.0f/%.0f GB/s solo/duplex in the cost model\n\n",
      options.hidden, options.sequence, options.layers_per_chunk, options.stages,
      options.Microbatches(), options.chunks, options.family, times.forward * 1e3,
      times.backward * 1e3, Gb(static_cast<double>(shape.SavedBytes())), serial,
      options.pcie_gbs, options.duplex_gbs);
  absl::StrAppend(&out,
                  "| policy | step s (median) | overhead vs 1f1b | TFLOP/s | stash peak GB "
                  "measured/predicted per stage | offloaded GB/step | offload GB/s | predicted "
                  "step s |\n|---|---|---|---|---|---|---|---|\n");
  std::optional<double> base;
  for (const PolicyResult& r : results) {
    if (r.name == "1f1b") base = Median(r.step_seconds);
  }
  for (const PolicyResult& r : results) {
    const double step = Median(r.step_seconds);
    std::string peaks;
    for (std::size_t d = 0; d < r.stash_peak.size(); ++d) {
      absl::StrAppend(&peaks, d == 0 ? "" : ", ", Gb(static_cast<double>(r.stash_peak[d])), "/",
                      Gb(static_cast<double>(r.predicted_peak[d])));
    }
    absl::StrAppendFormat(
        &out, "| %s | %.4f | %s | %.1f | %s | %s | %s | %.4f |\n", r.name, step,
        base ? absl::StrFormat("%+.1f%%", (step / *base - 1.0) * 100.0) : std::string("n/a"),
        flops_per_step / step / 1e12, peaks, Gb(static_cast<double>(r.offloaded_bytes)),
        r.offload_seconds > 0 ? Gb(r.offload_bytes_timed / r.offload_seconds) : "-",
        r.predicted_step);
  }
  return out;
}

int Main(int argc, char** argv) {
  absl::StatusOr<BenchOptions> parsed = ParseBenchOptions(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n%s", std::string(parsed.status().message()).c_str(),
                 kBenchUsage);
    return 2;
  }
  const BenchOptions& options = *parsed;
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "pipeline_bench: %s\n", status.ToString().c_str());
    return 1;
  };
  if (options.dry_run) {
    const ChunkTimes times = EstimatedChunkTimes(options);
    absl::StatusOr<std::vector<PlannedPolicy>> plans = PlanPolicies(options, times);
    if (!plans.ok()) return fail(plans.status());
    std::printf("%s", PlansToText(options, times, *plans).c_str());
    return 0;
  }
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) return fail(devices.status());
  if (*devices == 0) {
    std::fprintf(stderr, "pipeline_bench: no usable GPU; skipping\n");
    return kNoGpuExitCode;
  }
  std::vector<StageRig> rigs;
  for (int d = 0; d < options.stages; ++d) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend({/*device=*/0});
    if (!backend.ok()) return fail(backend.status());
    absl::StatusOr<std::unique_ptr<StageModel>> model =
        CreateGemmStageModel(**backend, options.Shape());
    if (!model.ok()) return fail(model.status());
    rigs.push_back(StageRig{std::move(*backend), std::move(*model)});
  }
  absl::StatusOr<ChunkTimes> times =
      MeasureChunkTimes(*rigs[0].backend, *rigs[0].model, options.reps);
  if (!times.ok()) return fail(times.status());
  absl::StatusOr<std::vector<PlannedPolicy>> plans = PlanPolicies(options, *times);
  if (!plans.ok()) return fail(plans.status());
  std::vector<PolicyResult> results;
  for (const PlannedPolicy& plan : *plans) {
    std::fprintf(stderr, "pipeline_bench: running %s\n", plan.name.c_str());
    absl::StatusOr<PolicyResult> result = RunPolicy(options, plan, rigs);
    if (!result.ok()) return fail(result.status());
    results.push_back(std::move(*result));
  }
  const std::string table = Table(options, *times, results);
  std::printf("%s\n", table.c_str());
  if (!options.out.empty()) {
    std::ofstream file(options.out, std::ios::app);
    file << table << "\n";
    if (!file) return fail(absl::UnavailableError(absl::StrCat("cannot write ", options.out)));
  }
  return 0;
}

}  // namespace
}  // namespace pipeoffload::bench

int main(int argc, char** argv) { return pipeoffload::bench::Main(argc, argv); }
