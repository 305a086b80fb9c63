// The way in (DESIGN.md section 5.1): one pipeline stage per rank, opened in one call.
//
//   auto stage = PipelineStage::Open(options, model);   // collective over options.group
//   for (step ...) { /* stage the step's inputs */ auto stats = stage->Run(); /* optimizer */ }
//
// Open owns the sequence every trainer repeats: the schedule (compiled from a spec, or loaded
// from a file / given, validated and re-simulated), the costs it is planned with (nominal,
// given or measured on this device), every stage's exact stash sizes (so the predicted stash
// peak is what Run measures), the P2P buffer lifetimes across stages and from them the device
// arena's size, then the backend, transport, arena and executor. Run executes one iteration
// and drains the device. Everything comes back as absl::Status with the reason.
//
// Contracts a trainer needs:
//  - Streams. The executor calls the StageModel's Forward / Backward / BackwardWeight on the
//    rank's thread; each must enqueue its device work on the backend's COMPUTE queue (CUDA:
//    CudaComputeStream(backend), cuda_stream.h; CPU: the calling thread itself) and may return
//    before that work finishes. The executor orders offload copies and P2P transfers against
//    that queue with events, so work on any other stream is invisible to it (and unsafe).
//  - Completion. Run returns once the iteration's work on every queue of the backend has
//    finished (it calls Backend::Synchronize), so gradients and losses may be read on the host
//    and the next iteration's inputs staged right after it. On error too, nothing of the
//    iteration is left in flight (bounded by wait_timeout_seconds).
//  - Threads. A PipelineStage is thread-compatible: its calls must not overlap (successive
//    calls may come from different threads when ordered, e.g. by a join). The model is called
//    on the thread that calls Open (measured costs: MeasureStageCosts's probe) and Run, one
//    call at a time; LocalPipeline calls stage d's model on a thread of its own, all stages at
//    once. Stages of one
//    process (the local transport) run on threads of their own, each with its own Backend,
//    Transport endpoint and RankGroup endpoint (LocalPipeline below does that). Open is
//    collective over `group` when one is given: every rank must call it (at about the same
//    time; every wait is bounded by the group's timeout), and they fail together.
//  - Lifetimes. `model`, and the backend, transport and group given in the options, must
//    outlive the stage. The stage owns what it creates (a CPU backend, a one-rank transport, the
//    arena and executor); its destructor drains the backend first.
#ifndef PIPEOFFLOAD_PIPELINE_H_
#define PIPEOFFLOAD_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/calibrate.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/p2p_lifetimes.h"
#include "pipeoffload/planning.h"
#include "pipeoffload/rank_group.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/stage_model.h"
#include "pipeoffload/transport.h"

namespace pipeoffload {

// Where the stage's times come from. Bytes always come from the stage models themselves.
enum class CostSource : std::uint8_t {
  kNominal,   // NominalCostModel(sizes, StageCostOptions::nominal_chunk_time)
  kGiven,     // StageCostOptions::given, with the models' bytes (WithModelSizes)
  kMeasured,  // each stage times its chunks and host link (MeasureStageCosts), at Open
};

struct StageCostOptions {
  CostSource source = CostSource::kNominal;
  // kNominal: a chunk's F, B and W time (any unit, e.g. layers per chunk).
  double nominal_chunk_time = 1.0;
  // kGiven: the times, link and P2P figures to plan with. kMeasured: the figures it does not
  // measure (P2P, reload margin, copy-engine sharing). Its bytes are replaced by the models'
  // own; without a group and with p > 1 the other stages' bytes are taken from it
  // (activation_bytes_per_virtual_stage, else activation_bytes) and this stage's must match
  // its model (InvalidArgument otherwise).
  CostModel given;
  // kMeasured: the probe of each stage (MeasureStageCosts). With the model's first iteration
  // started (e.g. its microbatch 0 staged) before Open; the calls leave gradients behind,
  // which the caller's next iteration start zeroes.
  StageCostProbe probe;
  // kMeasured: stages that share one machine (the local transport: one GPU, or the CPU's
  // cores) measure one at a time, each alone, synchronised over the group.
  bool measure_in_turns = false;
  // Stages sharing one GPU and the compute-factor search (planning.h); and the auto policy's
  // budget as a share of the plan without offload.
  PlanOptions plan;
};

// What Open is given. Exactly one of spec, schedule_file and schedule.
struct StageOptions {
  // --- the schedule ---
  std::optional<PipelineSpec> spec;  // compiled (PlanSchedule) under the stage's costs
  std::string schedule_file;         // pipeoffload.schedule/1 JSON (LoadScheduleFile)
  std::optional<Schedule> schedule;  // run as given
  // A file or given schedule is validated and its predictions replaced (ReplanSchedule).

  // --- where it runs ---
  // This rank's device. Null: a CPU backend of the stage's own (CreateCpuBackend, queue waits
  // bounded by wait_timeout_seconds).
  Backend* backend = nullptr;
  // This rank's endpoint; transport->rank() is the stage. Null: only for a one-stage pipeline
  // (a one-rank local transport of the stage's own).
  Transport* transport = nullptr;
  // The job's ranks (the same ranks as the transport, rank r = stage r). Needed when p > 1 for
  // measured costs and whenever the given costs do not hold every stage's sizes; with it, every
  // rank learns every stage's sizes and costs, the ranks check that they run one schedule
  // (ScheduleFingerprint), and a failure of any rank's set-up fails Open on every rank with the
  // same message naming it (AllGatherChecked).
  RankGroup* group = nullptr;

  // --- costs ---
  StageCostOptions costs;

  // --- memory ---
  ArenaSizing arena;
  P2PReserve p2p_reserve = P2PReserve::kPlanned;
  // When a send may be waited for (p2p_lifetimes.h). Empty: kMessageConsumed over the NCCL
  // transport (it runs a rank's transfers in posting order on one stream, so a posted receive
  // may still wait behind the receiver's own sends), kReceivePosted otherwise.
  std::optional<P2PGuarantee> p2p_guarantee;
  bool poison_on_free = kPoisonByDefault;  // DeviceArenaOptions::poison_on_free

  // --- the executor ---
  // wait_timeout_seconds bounds every wait of Open and Run (watchdog, drains, probes); the
  // stash options and slack as ExecutorOptions says. p2p_guarantee_points must be left empty:
  // Open fills it from the analysis (InvalidArgument otherwise).
  ExecutorOptions executor;
};

// One rank's stage of a pipeline. See the top of this file for the contracts.
class PipelineStage {
 public:
  // Sets the stage up, in this order: checks the options; the schedule's spec; this stage's
  // sizes and (kMeasured) costs; with a group, every stage's, gathered; the cost model; the
  // schedule (PlanSchedule or ReplanSchedule); with a group, the ranks' agreement on it; the P2P
  // analysis (AnalyzeP2P); the arena (StageArenaNeed, DeviceArena::Create); the executor.
  // Errors (with a group, the same on every rank, naming each failed rank):
  //  - InvalidArgument: not exactly one schedule source; a stage model whose SavedBytes differ
  //    from the given costs' bytes for this stage ("stash size mismatch"); ranks whose models
  //    disagree on BoundaryBytes; options out of range;
  //  - FailedPrecondition: a transport or group whose size is not the schedule's stage count,
  //    a group whose rank is not the transport's, p > 1 without a group when one is needed
  //    (measured costs, or given costs without every stage's sizes); an invalid schedule;
  //    ranks that hold different schedules;
  //  - NotFound / PermissionDenied / InvalidArgument / FailedPrecondition: LoadScheduleFile's;
  //  - ResourceExhausted: an arena budget the program does not fit ("the arena budget of N
  //    bytes is too small for the plan: " and the executor's numbers: the stash peak, the P2P
  //    plan's peak, the op that reaches it); the device's when the arena cannot be reserved;
  //    the compiler's for auto (no plan fits the spec's memory budget);
  //  - the compiler's, the probes', the executor's and the group's (DeadlineExceeded).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PipelineStage>> Open(
      const StageOptions& options, StageModel& model);

  // Drains the backend (bounded by wait_timeout_seconds, errors ignored), then frees the
  // executor, the arena and what Open created.
  virtual ~PipelineStage() = default;

  // One iteration of the stage's program (Executor::Run), then the backend drained. Returns
  // this stage's measured iteration. Errors: the executor's (annotated with the stage and op,
  // DeadlineExceeded from the watchdog); the drain's; Internal when the arena still holds
  // memory after a successful iteration (a leak). After an error the iteration's memory is
  // freed and Run may be called again. Not collective: a trainer that wants every rank to
  // agree on a step's outcome gathers its status itself (AllGatherChecked).
  [[nodiscard]] virtual absl::StatusOr<IterationStats> Run() = 0;

  // This stage's rank (= its index in schedule().stages).
  virtual int stage() const = 0;
  // The schedule every rank runs, with predictions under cost_model().
  virtual const Schedule& schedule() const = 0;
  // What the schedule was planned (or re-simulated) with, and the plan's one-GPU predictions.
  virtual const Plan& plan() const = 0;
  // Every stage's sizes (those of other stages from the group, else from the given costs).
  virtual const ModelSizes& sizes() const = 0;
  // kMeasured: every stage's measurements (with a group; p = 1: this stage's). Else empty.
  virtual const std::vector<StageCosts>& measured_costs() const = 0;
  // This stage's arena: what the program needs and the budget it got.
  virtual const ArenaNeed& arena_need() const = 0;
  // Every stage's arena budget, by stage, when opened with a group; else this stage's only
  // (others 0).
  virtual const std::vector<std::int64_t>& arena_budgets() const = 0;
  virtual Backend& backend() = 0;
  virtual Transport& transport() = 0;
  virtual const HostPool& host_pool() const = 0;
};

// Every stage of a pipeline in this process, each on a thread of its own (tests, benchmarks,
// one GPU shared by the stages): one PipelineStage per stage over the local transport (copying
// on the receivers' compute queues when backends are given, so buffers may be device memory)
// and a local rank group. Thread-compatible, like the stages it drives.
class LocalPipeline {
 public:
  // Opens stage d for models[d] on backends[d] (no backends: each stage a CPU backend of its
  // own), all with `options`, whose backend, transport and group must be left null (they are
  // set here). The models and backends must outlive the pipeline. Errors: InvalidArgument for
  // no models, backends of another count, or a backend, transport or group in `options`;
  // otherwise Open's, the same on every stage.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LocalPipeline>> Open(
      const StageOptions& options, const std::vector<StageModel*>& models,
      const std::vector<Backend*>& backends = {});
  ~LocalPipeline();

  // One iteration: every stage's Run on a thread of its own; stats[d] is stage d's. Returns
  // once every stage's device work has finished. Errors: the lowest failing stage's.
  [[nodiscard]] absl::StatusOr<std::vector<IterationStats>> Run();

  int num_stages() const { return static_cast<int>(stages_.size()); }
  PipelineStage& stage(int d) { return *stages_[static_cast<std::size_t>(d)]; }

 private:
  LocalPipeline() = default;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<RankGroup>> groups_;
  std::vector<std::unique_ptr<PipelineStage>> stages_;  // destroyed first
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_PIPELINE_H_
