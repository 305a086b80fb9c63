// pipeline_bench: what activation offload costs a real pipeline step on one GPU.
//
// p stages run as threads of this process on ONE GPU, each with its own CUDA backend (its own
// streams) and PipelineStage (LocalPipeline, pipeoffload/pipeline.h: arena and executor),
// exchanging device buffers through the local transport copied on the receivers' streams.
// Each stage's model is --model=gpt (the CUDA GPT layer stack of examples/gpt/cuda, when this
// build has it; the default then) or --model=gemm (a GPT layer's four GEMMs,
// bench/gemm_stage_model.h).
//
//   1. The ceilings: the bf16 GEMM rate (cuBLAS 8192^3) and the pinned PCIe bandwidths (D2H,
//      H2D alone and together; or --pcie-gbs / --duplex-gbs).
//   2. F and B of one chunk timed alone on the GPU (CUDA events, median of --reps).
//   3. Each policy compiled with the planner's one-GPU costs (pipeline_bench_plan.h: compute
//      x p, the link split p ways; P:shared one link shared with BARRIER hand-overs) and
//      predicted by SimulateSharedGpu from the solo costs.
//   4. Each policy run --warmup + --steps iterations (RELEASE deferred, or with --release=wait
//      blocking): median step, model TFLOP/s (72h^2s + 12s^2h per layer and microbatch),
//      stash peaks per stage (logical, measured vs predicted, and physical), offloaded bytes
//      and the offload copies' achieved GB/s, waits (in BARRIER, for released blocks' copies),
//      predicted vs measured step, device memory.
//   5. Once 1f1b has run: every policy's calibrated prediction, SimulateSharedGpu with its
//      compute costs x (measured 1f1b step / 1f1b's solo-cost prediction), CalibrationScale.
// Policies: 1f1b (1F1B, one chunk per stage, no offload: the baseline), none (--family and
// --chunks without offload), po-h, po-f, selective, auto (on --family / --chunks). The 1f1b
// baseline cuts the layers differently, so its models are rebuilt (same layers, same seed).
//
// --dry-run: no GPU; estimated costs, plans and predictions only. --summarize=JSONL
// [--peer=JSONL]: no GPU; the checklist of issue 5's targets over earlier runs' --json lines
// and scripts/torch_peer.py's.
// `pipeline_bench --help` lists every flag (the table in pipeline_bench_plan.cc).
// Exit status: 0 ok, 1 a failure (message on stderr), 2 bad flags, 77 no usable GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gemm_stage_model.h"
#include "bench/pipeline_bench_plan.h"
#include "bench/pipeline_bench_report.h"
#include "examples/common/flags.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/calibrate.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/pipeline.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/trace.h"
#if defined(PO_BENCH_WITH_GPT)
#include "examples/gpt/cuda/gpt_layer_stack.h"
#endif

namespace pipeoffload::bench {
namespace {

constexpr int kNoGpuExitCode = 77;
constexpr double kWaitTimeoutSeconds = 120.0;
constexpr int kGemmRateSize = 8192;
constexpr int kGemmRateReps = 10;
constexpr std::int64_t kLinkProbeBytes = std::int64_t{512} << 20;
constexpr std::uint64_t kSeed = 1;

#if defined(PO_BENCH_WITH_GPT)
constexpr bool kHaveGpt = true;
gpt::cuda::LayerStackShape GptShape(const BenchOptions& options, const Layout& layout) {
  gpt::cuda::LayerStackShape shape;
  shape.hidden = options.hidden;
  shape.heads = options.Heads();
  shape.seq = options.sequence;
  shape.batch = 1;
  shape.layers_per_chunk = layout.layers_per_chunk;
  shape.chunks_per_stage = layout.chunks;
  shape.seed = kSeed;
  shape.lean_saved = options.lean_saved;
  shape.recompute = PlansRecompute(options);
  return shape;
}
#else
constexpr bool kHaveGpt = false;
#endif

std::string ModelName(const BenchOptions& options) {
  if (!options.model.empty()) return options.model;
  return kHaveGpt ? "gpt" : "gemm";
}

GemmShape GemmShapeOf(const BenchOptions& options, const Layout& layout) {
  GemmShape shape;
  shape.hidden = options.hidden;
  shape.sequence = options.sequence;
  shape.layers_per_chunk = layout.layers_per_chunk;
  shape.chunks_per_stage = layout.chunks;
  return shape;
}

absl::Status CheckModel(const BenchOptions& options, const Layout& layout) {
  if (ModelName(options) == "gemm") return CheckGemmShape(GemmShapeOf(options, layout));
#if defined(PO_BENCH_WITH_GPT)
  return gpt::cuda::CheckLayerStackShape(GptShape(options, layout));
#else
  return absl::UnimplementedError(
      "--model=gpt: this build has no CUDA GPT layer stack (target po_gpt_cuda); use "
      "--model=gemm");
#endif
}

// Saved and boundary bytes of a chunk of `layout` without a GPU (for --dry-run).
ChunkCosts EstimatedCosts(const BenchOptions& options, const Layout& layout) {
  ChunkCosts costs;
  costs.times = EstimatedChunkTimes(options);
  // The flags' 0: the cost model derives them.
  costs.recompute_full_s = options.recompute_ms > 0 ? options.recompute_ms / 1e3 : -1.0;
  costs.recompute_lean_s = options.lean_ms > 0 ? options.lean_ms / 1e3 : -1.0;
  const GemmShape gemm = GemmShapeOf(options, layout);
  costs.saved_bytes = gemm.SavedBytes();
  costs.boundary_bytes = gemm.BoundaryBytes();
#if defined(PO_BENCH_WITH_GPT)
  if (ModelName(options) == "gpt") {
    const gpt::cuda::LayerStackShape shape = GptShape(options, layout);
    costs.saved_bytes = shape.SavedBytes();
    costs.boundary_bytes = shape.BoundaryBytes();
    costs.retained_full_bytes = shape.RetainedBytes(Recompute::kFull);
    costs.retained_lean_bytes = shape.RetainedBytes(Recompute::kLean);
    // The layer stack's B reads its lean blocks in place (the bench never splits W).
    costs.lean_rebuild_bytes = costs.retained_lean_bytes > 0 ? 0 : -1;
  }
#endif
  return costs;
}

absl::StatusOr<std::unique_ptr<StageModel>> CreateModel(Backend& backend,
                                                        const BenchOptions& options,
                                                        const Layout& layout) {
  if (ModelName(options) == "gemm") {
    return CreateGemmStageModel(backend, GemmShapeOf(options, layout));
  }
#if defined(PO_BENCH_WITH_GPT)
  return gpt::cuda::CreateCudaGptLayerStack(backend, GptShape(options, layout));
#else
  return CheckModel(options, layout);
#endif
}

absl::StatusOr<std::int64_t> DeviceUsedBytes() {
  std::size_t free_bytes = 0, total_bytes = 0;
  PO_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<std::int64_t>(total_bytes - free_bytes);
}

// One stage's long-lived pieces, shared by every policy of one layout.
struct StageRig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<StageModel> model;  // destroyed before its backend
  std::int64_t model_bytes = 0;       // device memory the model took (cudaMemGetInfo)
};

absl::StatusOr<std::vector<StageRig>> BuildRigs(const BenchOptions& options,
                                                const Layout& layout) {
  std::vector<StageRig> rigs;
  for (int d = 0; d < options.stages; ++d) {
    StageRig rig;
    PO_ASSIGN_OR_RETURN(rig.backend, CreateCudaBackend({/*device=*/0}));
    PO_RETURN_IF_ERROR(rig.backend->Synchronize(kWaitTimeoutSeconds));
    PO_ASSIGN_OR_RETURN(const std::int64_t before, DeviceUsedBytes());
    absl::StatusOr<std::unique_ptr<StageModel>> model = CreateModel(*rig.backend, options, layout);
    if (!model.ok()) return Annotate(model.status(), absl::StrCat("stage ", d, "'s model"));
    rig.model = std::move(*model);
    PO_RETURN_IF_ERROR(rig.backend->Synchronize(kWaitTimeoutSeconds));
    PO_ASSIGN_OR_RETURN(const std::int64_t after, DeviceUsedBytes());
    rig.model_bytes = after - before;
    rigs.push_back(std::move(rig));
  }
  return rigs;
}

using SpanList = std::vector<std::pair<double, double>>;  // [start, end) on NowSeconds' clock

// Forwards to a stage's model and records an event on the compute queue before and after each
// call, so the GPU-side span of every chunk is known (the executor times the host-side call,
// which returns once the kernels are enqueued). An op's span runs from when its stream reached
// it to when its last kernel finished; the union over stages is the time the GPU had work.
class EventTimedModel final : public StageModel {
 public:
  EventTimedModel(StageModel& inner, Backend& backend) : inner_(inner), backend_(backend) {}
  ~EventTimedModel() override {
    for (const Event& event : events_) backend_.DestroyEvent(event);
  }

  // Events for `calls` model calls per step (created now: none in the steady state).
  absl::Status Prepare(int calls) {
    while (static_cast<int>(events_.size()) < 2 * calls) {
      PO_ASSIGN_OR_RETURN(const Event event, backend_.CreateEvent());
      events_.push_back(event);
    }
    return absl::OkStatus();
  }
  void StartStep() { next_ = 0; }
  // The step's spans, on NowSeconds' clock. REQUIRES: the backend is idle.
  absl::StatusOr<SpanList> Spans() {
    SpanList spans;
    for (std::size_t i = 0; i + 1 < next_; i += 2) {
      PO_ASSIGN_OR_RETURN(const double start, backend_.EventTime(events_[i]));
      PO_ASSIGN_OR_RETURN(const double end, backend_.EventTime(events_[i + 1]));
      spans.emplace_back(start, end);
    }
    return spans;
  }

  std::int64_t SavedBytes(int chunk, bool split) const override {
    return inner_.SavedBytes(chunk, split);
  }
  std::int64_t BoundaryBytes() const override { return inner_.BoundaryBytes(); }
  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override {
    PO_RETURN_IF_ERROR(Mark());
    PO_RETURN_IF_ERROR(inner_.Forward(mb, chunk, input, output, saved));
    return Mark();
  }
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input,
                        void* saved, bool with_weight_grad) override {
    PO_RETURN_IF_ERROR(Mark());
    PO_RETURN_IF_ERROR(
        inner_.Backward(mb, chunk, grad_output, grad_input, saved, with_weight_grad));
    return Mark();
  }
  absl::Status BackwardWeight(int mb, int chunk, void* saved) override {
    PO_RETURN_IF_ERROR(Mark());
    PO_RETURN_IF_ERROR(inner_.BackwardWeight(mb, chunk, saved));
    return Mark();
  }
  // Recompute: ForwardRetaining stands for an F and RecomputeSaved is its own op (IsCompute),
  // so each is one timed call like the others.
  std::int64_t RetainedBytes(int chunk, Recompute mode, bool split) const override {
    return inner_.RetainedBytes(chunk, mode, split);
  }
  absl::Status ForwardRetaining(int mb, int chunk, const void* input, void* output, void* retained,
                                Recompute mode) override {
    PO_RETURN_IF_ERROR(Mark());
    PO_RETURN_IF_ERROR(inner_.ForwardRetaining(mb, chunk, input, output, retained, mode));
    return Mark();
  }
  absl::Status RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                              Recompute mode) override {
    PO_RETURN_IF_ERROR(Mark());
    PO_RETURN_IF_ERROR(inner_.RecomputeSaved(mb, chunk, retained, saved, mode));
    return Mark();
  }
  // Forwarded, or the runtime would rebuild entries the inner model's B reads in place (and
  // MeasureRecompute, which asks the inner model, would price the op as B does).
  bool BackwardReadsRetained(int chunk, Recompute mode, bool split) const override {
    return inner_.BackwardReadsRetained(chunk, mode, split);
  }

 private:
  absl::Status Mark() {
    if (next_ >= events_.size()) {
      return absl::InternalError("EventTimedModel: more model calls than the program has");
    }
    return backend_.RecordEvent(events_[next_++], backend_.queue(QueueKind::kCompute));
  }

  StageModel& inner_;
  Backend& backend_;
  std::vector<Event> events_;
  std::size_t next_ = 0;
};

// Seconds the planner charges a RECOMPUTE / RECOMPUTE_LEAN op of `mode` on chunk 0 (medians
// on the compute queue of `reps` runs after one untimed, on pseudo-random input); -1 when the
// model does not offer `mode` (ChunkCosts: not measured).
//  - Normally RecomputeSaved(mb 0, chunk 0, mode) from a block ForwardRetaining wrote: the op
//    the runtime runs.
//  - When the model's B reads the retained block itself (BackwardReadsRetained for an unsplit
//    backward), the runtime never calls RecomputeSaved and the op runs nothing: the rebuild's
//    cost moves into B. Then it is the unsplit Backward on the retained block minus the unsplit
//    Backward on a full entry Forward wrote (same input and output gradient), clamped at 0
//    against noise. Each Backward follows its own (untimed) forward: the model learns from that
//    call which layout the entry has, and B consumes what it learnt.
absl::StatusOr<double> MeasureRecompute(Backend& backend, StageModel& model, Recompute mode,
                                        int reps) {
  const std::int64_t retained_bytes = model.RetainedBytes(0, mode, false);
  if (retained_bytes <= 0) return -1.0;
  const bool in_backward = model.BackwardReadsRetained(0, mode, /*split_backward=*/false);
  const std::int64_t boundary = model.BoundaryBytes();
  std::vector<void*> blocks;
  std::vector<Event> events;
  const auto release = [&] {
    static_cast<void>(backend.Synchronize(kWaitTimeoutSeconds));
    for (void* block : blocks) backend.FreeDevice(block);
    for (const Event& event : events) backend.DestroyEvent(event);
  };
  // Median seconds of `timed` on the compute queue, `untimed` enqueued before each run.
  const auto median = [&](const auto& untimed, const auto& timed) -> absl::StatusOr<double> {
    const Queue compute = backend.queue(QueueKind::kCompute);
    std::vector<double> seconds;
    for (int rep = 0; rep <= reps; ++rep) {
      PO_RETURN_IF_ERROR(untimed());
      PO_RETURN_IF_ERROR(backend.RecordEvent(events[0], compute));
      PO_RETURN_IF_ERROR(timed());
      PO_RETURN_IF_ERROR(backend.RecordEvent(events[1], compute));
      PO_RETURN_IF_ERROR(backend.WaitEvent(events[1], kWaitTimeoutSeconds));
      PO_ASSIGN_OR_RETURN(const double start, backend.EventTime(events[0]));
      PO_ASSIGN_OR_RETURN(const double end, backend.EventTime(events[1]));
      if (rep > 0) seconds.push_back(end - start);  // the first: untimed
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
  };
  const auto measure = [&]() -> absl::StatusOr<double> {
    // input, output, retained block, full entry, output gradient, input gradient
    for (const std::int64_t bytes : {boundary, boundary, retained_bytes,
                                     model.SavedBytes(0, false), boundary, boundary}) {
      PO_ASSIGN_OR_RETURN(void* block, backend.AllocateDevice(bytes));
      blocks.push_back(block);
    }
    PO_RETURN_IF_ERROR(FillRandomBf16(backend, blocks[0], boundary, 1.0f, kSeed));
    PO_RETURN_IF_ERROR(FillRandomBf16(backend, blocks[4], boundary, 1.0f, kSeed + 1));
    for (int i = 0; i < 2; ++i) {
      PO_ASSIGN_OR_RETURN(const Event event, backend.CreateEvent());
      events.push_back(event);
    }
    const auto retain = [&] {
      return model.ForwardRetaining(0, 0, blocks[0], blocks[1], blocks[2], mode);
    };
    if (!in_backward) {
      PO_RETURN_IF_ERROR(retain());
      return median([] { return absl::OkStatus(); },
                    [&] { return model.RecomputeSaved(0, 0, blocks[2], blocks[3], mode); });
    }
    const auto backward_of = [&](void* entry) {
      return [&model, &blocks, entry] {
        return model.Backward(0, 0, blocks[4], blocks[5], entry, /*with_weight_grad=*/true);
      };
    };
    PO_ASSIGN_OR_RETURN(const double on_retained, median(retain, backward_of(blocks[2])));
    PO_ASSIGN_OR_RETURN(
        const double on_full,
        median([&] { return model.Forward(0, 0, blocks[0], blocks[1], blocks[3]); },
               backward_of(blocks[3])));
    return std::max(0.0, on_retained - on_full);
  };
  absl::StatusOr<double> seconds = measure();
  release();
  return seconds;
}

// Length of the union of `spans`.
double UnionLength(SpanList spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0.0, start = 0.0, end = -1e300;
  for (const auto& [a, b] : spans) {
    if (a > end) {
      if (end > start) total += end - start;
      start = a;
      end = b;
    } else {
      end = std::max(end, b);
    }
  }
  if (end > start) total += end - start;
  return total;
}

struct StepResult {
  std::vector<IterationStats> stats;
  double seconds = 0.0;  // earliest stage start to every GPU queue idle
};

// Runs one step: every stage on its own thread; each stage's Run returns once its GPU work is
// done, so when all have returned every queue is idle.
absl::StatusOr<StepResult> RunStep(LocalPipeline& pipeline, Backend& clock) {
  StepResult step;
  PO_ASSIGN_OR_RETURN(step.stats, pipeline.Run());
  double start = step.stats[0].start_time;
  for (const IterationStats& stage : step.stats) start = std::min(start, stage.start_time);
  step.seconds = clock.NowSeconds() - start;
  return step;
}

// Every stage of `plan` as the bench runs it: the plan's schedule as given, the arenas exactly
// the programs' need (BenchArenaSizing: with a spare entry where they recompute), no
// poisoning (no fill kernels on release).
StageOptions RunOptions(const BenchOptions& options, const PlannedPolicy& plan) {
  StageOptions stage;
  stage.schedule = plan.schedule;
  stage.costs.source = CostSource::kGiven;
  stage.costs.given = plan.solo;
  stage.arena = BenchArenaSizing(plan.schedule);
  stage.p2p_reserve = options.p2p_reserve_worst ? P2PReserve::kWorstCase : P2PReserve::kPlanned;
  stage.poison_on_free = false;
  stage.executor.wait_timeout_seconds = options.wait_timeout_s;
  stage.executor.stash.wait_for_copy_at_release = options.release_wait;
  stage.executor.stash_physical_slack_bytes = options.release_uncapped ? -1 : 0;
  return stage;
}

absl::StatusOr<PolicyRun> RunPolicy(const BenchOptions& options, const PlannedPolicy& plan,
                                    const LinkFigures& link, std::vector<StageRig>& rigs) {
  const Schedule& schedule = plan.schedule;
  const int p = options.stages;
  PolicyRun result;
  result.name = plan.name;
  result.auto_choice = plan.auto_choice;
  result.predicted_step = plan.shared.step_time;
  result.predicted_serial = plan.shared.compute_work;
  result.planner_step = schedule.predictions->step_time;
  result.warnings = static_cast<int>(schedule.predictions->warnings.size());
  for (const StagePrediction& stage : schedule.predictions->stages) {
    result.predicted_peak.push_back(stage.peak_bytes);
  }
  std::vector<std::unique_ptr<EventTimedModel>> timed;  // outlive the pipeline
  std::vector<StageModel*> models;
  std::vector<Backend*> backends;
  for (int d = 0; d < p; ++d) {
    StageRig& rig = rigs[static_cast<std::size_t>(d)];
    timed.push_back(std::make_unique<EventTimedModel>(*rig.model, *rig.backend));
    int calls = 0;
    for (const Op& op : schedule.stages[static_cast<std::size_t>(d)].ops) {
      calls += IsCompute(op.kind) ? 1 : 0;
    }
    PO_RETURN_IF_ERROR(timed.back()->Prepare(calls));
    models.push_back(timed.back().get());
    backends.push_back(rig.backend.get());
  }
  absl::StatusOr<std::unique_ptr<LocalPipeline>> pipeline =
      LocalPipeline::Open(RunOptions(options, plan), models, backends);
  if (!pipeline.ok()) return Annotate(pipeline.status(), plan.name);
  for (int d = 0; d < p; ++d) {
    result.arena_bytes.push_back((*pipeline)->stage(d).arena_need().budget_bytes);
    result.model_bytes.push_back(rigs[static_cast<std::size_t>(d)].model_bytes);
  }
  PO_ASSIGN_OR_RETURN(result.device_used_bytes, DeviceUsedBytes());
  result.stash_peak.assign(static_cast<std::size_t>(p), 0);
  result.stash_physical_peak.assign(static_cast<std::size_t>(p), 0);
  result.p2p_peak.assign(static_cast<std::size_t>(p), 0);
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    for (auto& model : timed) model->StartStep();
    absl::StatusOr<StepResult> ran = RunStep(**pipeline, *rigs[0].backend);
    if (!ran.ok()) return Annotate(ran.status(), absl::StrCat(plan.name, ": step ", step));
    if (step < options.warmup) continue;
    result.step_seconds.push_back(ran->seconds);
    result.offloaded_bytes = 0;
    result.wait_seconds.clear();
    result.release_wait.clear();
    result.barrier_wait.clear();
    SpanList spans;
    for (auto& model : timed) {
      PO_ASSIGN_OR_RETURN(const SpanList mine, model->Spans());
      spans.insert(spans.end(), mine.begin(), mine.end());
    }
    result.gpu_busy = UnionLength(std::move(spans));
    std::vector<CopyInterval> copies;
    for (const IterationStats& stage : ran->stats) {
      const auto d = static_cast<std::size_t>(stage.stage);
      result.stash_peak[d] = std::max(result.stash_peak[d], stage.stash_high_water_bytes);
      result.stash_physical_peak[d] =
          std::max(result.stash_physical_peak[d], stage.stash_physical_high_water_bytes);
      result.p2p_peak[d] = std::max(result.p2p_peak[d], stage.p2p_high_water_bytes);
      result.offloaded_bytes += stage.offloaded_bytes;
      result.wait_seconds.push_back(stage.wait_seconds);
      // Release waits from the executor: RELEASE no longer blocks by default, so the time
      // spent on released blocks' copies is wherever a block was needed (not the RELEASE op).
      result.release_wait.push_back(stage.release_wait_seconds);
      double barrier = 0.0;
      for (const TimedOp& op : stage.ops) {
        if (op.op.kind == OpKind::kBarrier) barrier += op.end - op.start;
      }
      result.barrier_wait.push_back(barrier);
      for (const TimedOp& op : stage.ops) {
        if (op.op.kind == OpKind::kOffload || op.op.kind == OpKind::kReload) {
          copies.push_back({op.op.kind == OpKind::kOffload, op.start, op.end, op.bytes});
        }
      }
    }
    const LinkUse use = SummarizeCopies(copies, link.d2h, link.h2d, link.duplex);
    if (!options.trace_dir.empty() && step == options.warmup + options.steps - 1) {
      // The last step as a Perfetto / Chrome trace (one process per stage, one track per
      // engine), to look at which op waited for what.
      absl::StatusOr<Timeline> measured = MeasuredTimeline(ran->stats);
      if (!measured.ok()) return Annotate(measured.status(), plan.name);
      const std::string path = absl::StrCat(options.trace_dir, "/pipeline_bench_h",
                                            options.hidden, "_", plan.name, ".json");
      std::ofstream file(path);
      file << TimelineToTraceJson(schedule, *measured, 1e6);
      if (!file) return absl::UnavailableError(absl::StrCat("cannot write ", path));
    }
    result.offload_gbs = use.d2h_gbs;
    result.reload_gbs = use.h2d_gbs;
    result.link_efficiency = use.efficiency;
  }
  pipeline->reset();  // drains every stage's backend, then frees its executor and arena
  return result;
}

bool SameModel(const Layout& a, const Layout& b) {
  return a.chunks == b.chunks && a.layers_per_chunk == b.layers_per_chunk;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

absl::Status AppendFile(const std::string& path, const std::string& text) {
  if (path.empty()) return absl::OkStatus();
  std::ofstream file(path, std::ios::app);
  file << text;
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status Summarize(const BenchOptions& options) {
  PO_ASSIGN_OR_RETURN(const std::string runs_text, ReadFile(options.summarize));
  absl::StatusOr<std::vector<BenchRun>> runs = ParseRuns(runs_text);
  if (!runs.ok()) return Annotate(runs.status(), options.summarize);
  std::vector<PeerRun> peers;
  if (!options.peer.empty()) {
    PO_ASSIGN_OR_RETURN(const std::string peer_text, ReadFile(options.peer));
    absl::StatusOr<std::vector<PeerRun>> parsed = ParsePeers(peer_text);
    if (!parsed.ok()) return Annotate(parsed.status(), options.peer);
    peers = std::move(*parsed);
  }
  const std::string checklist = Checklist(*runs, peers);
  std::printf("%s", checklist.c_str());
  return AppendFile(options.out, checklist + "\n");
}

absl::Status DryRun(const BenchOptions& options) {
  const Layout layout = PolicyLayout(options, "none");
  PO_RETURN_IF_ERROR(CheckModel(options, layout));
  const ChunkCosts costs = EstimatedCosts(options, layout);
  // The link as given (--pcie-gbs and --duplex-gbs), else the H200's nominal figures.
  LinkFigures link;
  if (options.pcie_gbs > 0) link.d2h = link.h2d = options.pcie_gbs * 1e9;
  if (options.duplex_gbs > 0) link.duplex = options.duplex_gbs * 1e9;
  std::printf("(--dry-run: F and B %s, link %.1f/%.1f/%.1f GB/s; one-GPU steps from these solo "
              "costs: the calibrated ones need a measured 1f1b step)\n",
              options.forward_ms > 0 ? "as given" : "estimated at 600 TFLOP/s", link.d2h / 1e9,
              link.h2d / 1e9, link.duplex / 1e9);
  BenchOptions each = options;
  bool failed = false;
  for (const std::string& policy : options.policies) {
    each.policies = {policy};
    absl::StatusOr<std::vector<PlannedPolicy>> plans = PlanPolicies(each, costs, link);
    if (!plans.ok()) {
      std::printf("%s: %s\n", policy.c_str(), plans.status().ToString().c_str());
      failed = true;
      continue;
    }
    std::printf("%s", PlansToText(options, costs, *plans).c_str());
  }
  return failed ? absl::InvalidArgumentError("a policy could not be planned (see above)")
                : absl::OkStatus();
}

absl::Status Bench(const BenchOptions& options) {
  const Layout layout = PolicyLayout(options, "none");
  PO_RETURN_IF_ERROR(CheckModel(options, layout));
  PO_RETURN_IF_ERROR(CheckModel(options, PolicyLayout(options, "1f1b")));
  absl::StatusOr<std::vector<StageRig>> rigs = BuildRigs(options, layout);
  if (!rigs.ok()) return rigs.status();
  Layout rig_layout = layout;
  // Chunk 0 of stage 1 is a middle virtual stage (reads its input, writes its input gradient),
  // like most chunks of the pipeline; stage 0's first chunk skips the input gradient.
  const std::size_t probe = options.stages > 1 ? 1 : 0;
  Backend& backend = *(*rigs)[probe].backend;
  StageModel& model = *(*rigs)[probe].model;

  BenchRun run;
  // The record names the layout too: "gpt --saved=lean" rows are not comparable to full ones.
  run.model = absl::StrCat(ModelName(options), options.lean_saved ? " --saved=lean" : "",
                           options.p2p_reserve_worst ? " --p2p-reserve=worst" : "");
  run.hidden = options.hidden;
  run.heads = options.Heads();
  run.sequence = options.sequence;
  run.stages = options.stages;
  run.microbatches = options.Microbatches();
  run.chunks = options.chunks;
  run.layers_per_chunk = options.layers_per_chunk;
  run.family = options.family;
  run.model_flops_per_step = ModelFlopsPerStep(options);
  run.release_mode =
      options.release_wait ? "wait" : (options.release_uncapped ? "defer-uncapped" : "defer");
  PO_ASSIGN_OR_RETURN(run.gemm_flops, MeasureGemmRate(backend, kGemmRateSize, kGemmRateReps));
  ChunkCosts costs;
  // As a middle stage runs it, on pseudo-random bf16 (METHOD.md: never time on constants).
  ChunkTimingOptions timing;
  timing.reps = options.reps;
  timing.fill = [&backend](void* device, std::int64_t bytes, int index) {
    return FillRandomBf16(backend, device, bytes, 1.0f, static_cast<std::uint64_t>(index) + 1);
  };
  PO_ASSIGN_OR_RETURN(costs.times, MeasureChunkTimes(backend, model, timing));
  costs.saved_bytes = model.SavedBytes(0, false);
  costs.boundary_bytes = model.BoundaryBytes();
  costs.retained_full_bytes = model.RetainedBytes(0, Recompute::kFull, false);
  costs.retained_lean_bytes = model.RetainedBytes(0, Recompute::kLean, false);
  costs.lean_rebuild_bytes = model.BackwardReadsRetained(0, Recompute::kLean, false) ? 0 : -1;
  run.forward_s = costs.times.forward;
  run.backward_s = costs.times.backward;
  run.entry_bytes = costs.saved_bytes;
  PO_ASSIGN_OR_RETURN(costs.recompute_full_s,
                      MeasureRecompute(backend, model, Recompute::kFull, options.reps));
  PO_ASSIGN_OR_RETURN(costs.recompute_lean_s,
                      MeasureRecompute(backend, model, Recompute::kLean, options.reps));
  LinkFigures link;
  if (options.pcie_gbs > 0 && options.duplex_gbs > 0) {
    link = LinkFigures{options.pcie_gbs * 1e9, options.pcie_gbs * 1e9, options.duplex_gbs * 1e9};
  } else {
    PO_ASSIGN_OR_RETURN(link, MeasureLink(backend, kLinkProbeBytes, 5));
  }
  run.d2h_gbs = link.d2h / 1e9;
  run.h2d_gbs = link.h2d / 1e9;
  run.duplex_gbs = link.duplex / 1e9;
  const auto recompute_ms = [](double seconds) {
    return seconds < 0 ? std::string("not offered") : absl::StrFormat("%.3f ms", seconds * 1e3);
  };
  std::fprintf(stderr,
               "pipeline_bench: h=%d GEMM %.0f TFLOP/s, chunk F %.3f ms B %.3f ms, recompute "
               "full %s lean %s%s, link %.1f / %.1f / %.1f GB/s\n",
               options.hidden, run.gemm_flops / 1e12, costs.times.forward * 1e3,
               costs.times.backward * 1e3, recompute_ms(costs.recompute_full_s).c_str(),
               recompute_ms(costs.recompute_lean_s).c_str(),
               costs.lean_rebuild_bytes == 0 ? " (B reads the lean block in place)" : "",
               run.d2h_gbs, run.h2d_gbs, run.duplex_gbs);
  // Each policy planned alone: one that cannot be planned (auto over its budget) is reported,
  // and the others still run.
  std::int64_t budget = static_cast<std::int64_t>(options.budget_gb * 1e9);
  if (budget == 0) {
    PO_ASSIGN_OR_RETURN(const PlannedPolicy base,
                        PlanPolicy(options, "1f1b", costs, options.layers_per_chunk, link, 0));
    budget = static_cast<std::int64_t>(static_cast<double>(MaxPeakBytes(base.schedule)) *
                                       options.budget_fraction);
  }
  std::vector<std::optional<PlannedPolicy>> plans;
  std::vector<PolicyRun> results(options.policies.size());
  for (std::size_t i = 0; i < options.policies.size(); ++i) {
    results[i].name = options.policies[i];
    results[i].order = LayoutName(PolicyLayout(options, options.policies[i]));
    absl::StatusOr<PlannedPolicy> plan =
        PlanPolicy(options, options.policies[i], costs, options.layers_per_chunk, link, budget);
    if (!plan.ok()) {
      results[i].error = std::string(plan.status().message());
      plans.emplace_back();
      std::fprintf(stderr, "pipeline_bench: %s\n", plan.status().ToString().c_str());
      continue;
    }
    std::fprintf(stderr, "%s", PlansToText(options, costs, {*plan}).c_str());
    plans.push_back(*std::move(plan));
  }

  // Policies on the rigs' layout first, then the others (the 1f1b baseline when v > 1).
  bool failed = false;
  for (const bool same : {true, false}) {
    for (std::size_t i = 0; i < plans.size(); ++i) {
      if (!plans[i].has_value() || SameModel(plans[i]->layout, layout) != same) continue;
      PlannedPolicy& plan = *plans[i];
      if (!SameModel(plan.layout, rig_layout)) {
        if (rigs.ok()) rigs->clear();  // free the old models before the new ones allocate
        rigs = BuildRigs(options, plan.layout);
        if (!rigs.ok()) {
          std::fprintf(stderr, "pipeline_bench: %s\n", rigs.status().ToString().c_str());
          results[i].error = std::string(rigs.status().message());
          failed = true;
          rig_layout = Layout{Family::k1F1B, 0, 0};  // no model: the next policy rebuilds
          continue;
        }
        rig_layout = plan.layout;
        // Re-plan with this model's own bytes (times: the measured chunk's, rescaled).
        ChunkCosts rebuilt =
            RescaleChunk(costs, options.layers_per_chunk, plan.layout.layers_per_chunk);
        rebuilt.saved_bytes = (*rigs)[0].model->SavedBytes(0, false);
        rebuilt.retained_full_bytes = (*rigs)[0].model->RetainedBytes(0, Recompute::kFull, false);
        rebuilt.retained_lean_bytes = (*rigs)[0].model->RetainedBytes(0, Recompute::kLean, false);
        rebuilt.lean_rebuild_bytes =
            (*rigs)[0].model->BackwardReadsRetained(0, Recompute::kLean, false) ? 0 : -1;
        absl::StatusOr<PlannedPolicy> replanned = PlanPolicy(
            options, plan.name, rebuilt, plan.layout.layers_per_chunk, link, budget);
        if (!replanned.ok()) {
          results[i].error = std::string(replanned.status().message());
          failed = true;
          continue;
        }
        plan = *std::move(replanned);
      }
      std::fprintf(stderr, "pipeline_bench: running %s (%s)\n", plan.name.c_str(),
                   LayoutName(plan.layout).c_str());
      absl::StatusOr<PolicyRun> result = RunPolicy(options, plan, link, *rigs);
      if (!result.ok()) {
        std::fprintf(stderr, "pipeline_bench: %s\n", result.status().ToString().c_str());
        results[i].error = std::string(result.status().message());
        failed = true;
        continue;
      }
      results[i] = *std::move(result);
      results[i].order = LayoutName(plan.layout);
      const std::string base = SplitPolicyName(plan.name).base;
      if (base != "1f1b" && base != "none") {
        absl::StrAppendFormat(&results[i].order, ", planned at %gx%s", plan.planner_scale,
                              plan.shared_link ? ", link shared" : "");
      }
    }
  }
  run.policies = std::move(results);
  // Only now: the scale comes from 1f1b's measured step, and 1f1b runs last when its layout
  // differs from the others'.
  if (absl::Status calibrated = Calibrate(plans, run); !calibrated.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", calibrated.ToString().c_str());
  }
  const std::string table = RunToMarkdown(run);
  std::printf("%s\n", table.c_str());
  PO_RETURN_IF_ERROR(AppendFile(options.out, table + "\n"));
  PO_RETURN_IF_ERROR(AppendFile(options.json, RunToJsonLine(run)));
  if (failed) return absl::InternalError("a policy failed to run (its row says why)");
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const absl::StatusOr<BenchOptions> parsed = ParseBenchOptions(argc, argv);
  if (const std::optional<int> exit = examples::FlagsExitCode("pipeline_bench", parsed,
                                                              BenchHelpText)) {
    return *exit;  // --help, or bad flags (2)
  }
  const BenchOptions& options = *parsed;
  auto finish = [](const absl::Status& status) {
    if (status.ok()) return 0;
    std::fprintf(stderr, "pipeline_bench: %s\n", status.ToString().c_str());
    return 1;
  };
  if (!options.summarize.empty()) return finish(Summarize(options));
  if (options.dry_run) return finish(DryRun(options));
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) return finish(devices.status());
  if (*devices == 0) {
    std::fprintf(stderr, "pipeline_bench: no usable GPU; skipping\n");
    return kNoGpuExitCode;
  }
  return finish(Bench(options));
}

}  // namespace
}  // namespace pipeoffload::bench

int main(int argc, char** argv) { return pipeoffload::bench::Main(argc, argv); }
