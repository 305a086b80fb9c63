// Planning the schedule a job runs: cost models built from the stage models' exact sizes and
// nominal, given or measured times; the compute-factor search for stages that share one GPU;
// schedule files; the device arena a stage's program needs. What PipelineStage::Open
// (pipeline.h) does between "the models exist" and "the executor runs", as functions a user
// can call alone (a dry run, a benchmark's plans). Pure, except LoadScheduleFile (reads one
// file). Target: pipeoffload::pipeline.
//
// Stages that share one GPU (the scaling, derived). Stages as threads on ONE GPU with ONE host
// link: let F, B be a chunk's forward / backward measured alone, S an entry's bytes and W the
// link's bandwidth. On p GPUs of their own, a stage computes at full speed and owns its link,
// so an entry's transfer over its lifetime costs (S / W) / (F + B). Here, while all p stages
// have work (the steady state, where offload must hide), each gets a 1/p share of the GPU, so
// its ops take p F and p B, and all p stages' copies take turns on one link. The planner is
// therefore given compute x c and (the default, split link) every bandwidth / p with
// host_link_group_size 1 (SharedGpuCostModel, c = p), which keeps each stage's ratio of
// compute to PCIe time what it would be on a GPU of its own. With shared_link the planner
// instead staggers the p stages' copies on the one link at full bandwidth and hands it over
// with BARRIERs (host_link_group_size p); on one GPU those hand-overs couple p threads whose
// real progress differs from the plan, and measured worse on the H200 (po-h at h = 4096: +1.2%
// step split vs +5.3% shared; docs/benchmarks.md). Outside the steady state fewer than p
// stages run, so their ops take less than c = p times the solo time, and a copy the planner
// fitted into an op's p-fold duration arrives late. The compiler has no notion of a shared
// compute engine, so PlanSchedule searches the factor: it plans each offload policy at
// c = p, 3p/4, p/2, p/4 and 1 (at least 1), predicts each plan with SimulateSharedGpu
// (shared_gpu.h) from the solo costs, and keeps the one with the smallest stash peak whose
// one-GPU step stays within search_tolerance of the same order without offload (else the
// fastest). Smaller c plans shorter lifespans against a busier link: fewer, safer copies.
// auto searches the link model too (SharedGpu::search_link): each factor split and shared.
#ifndef PIPEOFFLOAD_PLANNING_H_
#define PIPEOFFLOAD_PLANNING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/calibrate.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/p2p_lifetimes.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/shared_gpu.h"

namespace pipeoffload {

// The exact sizes of a pipeline's models: StageModel::SavedBytes of chunk c on stage d at
// saved_bytes[spec.stage_map().virtual_stage(d, c)] (c * p + d under loop placement; p * v
// entries, each > 0), and StageModel::BoundaryBytes.
struct ModelSizes {
  std::vector<std::int64_t> saved_bytes;
  std::int64_t boundary_bytes = 0;
  // StageModel::RetainedBytes(c, kFull / kLean) at [c * p + d] like saved_bytes (-1: not
  // offered); empty: unknown (WithModelSizes keeps the cost model's retained bytes).
  std::vector<std::int64_t> retained_full_bytes;
  std::vector<std::int64_t> retained_lean_bytes;
  // What a RECOMPUTE_LEAN allocates, at [c * p + d] like saved_bytes: 0 where the model's B
  // reads the lean block in place (StageModel::BackwardReadsRetained), else -1 (the whole
  // entry); empty: unknown (WithModelSizes keeps the cost model's lean_rebuild_bytes).
  std::vector<std::int64_t> lean_rebuild_bytes;
};

// `base` with the bytes of `sizes` (activation_bytes_per_virtual_stage, activation_bytes = the
// largest entry, boundary_bytes, and the retained and rebuilt bytes of recomputed entries when
// sizes has them), so the compiler's predicted stash peaks are exactly what the runtime measures.
// REQUIRES: sizes.saved_bytes not empty.
CostModel WithModelSizes(CostModel base, const ModelSizes& sizes);

// Times when none are known: a chunk's F, B and W each take `chunk_time` (any unit; e.g.
// layers per chunk, so plans with different v compare), the largest entry crosses the host
// link in a quarter of a chunk's F and a boundary message in a tenth, in both directions at
// once (a CPU memcpy is far faster than the CPU's compute, so the offload planner is never
// short of bandwidth). Bytes from `sizes`. REQUIRES: saved_bytes not empty, chunk_time > 0.
CostModel NominalCostModel(const ModelSizes& sizes, double chunk_time);

// The cost model from every stage's measurements (stages[d] of stage d), in seconds, solo (each
// stage alone on its device). Per stage, F and B are the means over its chunks; the model's F
// and B are the smallest stage's, and stage_time_scale[d] = (F_d + B_d) / (F + B) gives each
// stage its own pace (the first and last chunks carry the embedding and the head). B covers B
// and W, split evenly. The link is the slowest stage's in each figure (stages measured at
// once, so a host link two GPUs share shows as their halved rate), each stage its own link
// (host_link_group_size 1: no BARRIER hand-overs). P2P figures, margins and copy-engine
// sharing come from `base`; bytes from `sizes`.
// REQUIRES: stages not empty, each with chunks, every time and bandwidth > 0.
CostModel MeasuredCostModel(const ModelSizes& sizes, const std::vector<StageCosts>& stages,
                            const CostModel& base = {});

// `cost` with its forward, backward and weight times multiplied by `factor` (copies unchanged).
CostModel ScaleComputeTimes(const CostModel& cost, double factor);

// How the stages share devices.
struct SharedGpu {
  // 1: every stage has a device and host link of its own. num_stages: all stages on one GPU
  // (threads of one process); planned as the top of this file says. Nothing in between.
  int stages_per_device = 1;
  // c above. 0: searched (offload policies; c = p for plans without offload); >= 1: pinned.
  double compute_factor = 0.0;
  // Plan the copies on the one link with BARRIER hand-overs instead of the link split p ways.
  bool shared_link = false;
  // auto only: plan on both link models and keep the better (the search below), unless false,
  // when shared_link is kept as given. Split, each stage owns a quarter of the link whether it
  // needs it or not; shared, a stage may take what the others leave, at the cost of BARRIERs
  // (h = 4096 at torch full recompute's memory on an H100: 1.4288 s split, 1.3027 s shared).
  bool search_link = true;
  // The search's bound on the one-GPU slowdown against the same order without offload.
  double search_tolerance = 0.01;
};

// What the planner is given for stages sharing one GPU at compute factor `compute_factor`:
// ScaleComputeTimes(solo, c) with the reload margin divided by c (the same real time: the
// margin is counted in B durations, which c stretched), then either the link split p ways
// (each bandwidth / p, host_link_group_size 1) or, with shared_link, one link for all
// (host_link_group_size p).
CostModel SharedGpuCostModel(const CostModel& solo, const SharedGpu& shared, int num_stages,
                             double compute_factor);

struct PlanOptions {
  // --- auto: when > 0 and the spec's policy is auto, its memory budget is this share of the
  // largest stage's predicted stash peak of the same order without offload (spec's
  // memory_budget_bytes is then ignored).
  double auto_budget_share = 0.0;
  SharedGpu shared_gpu;
};

struct Plan {
  Schedule schedule;        // valid, with predictions (Simulate under planned_with)
  CostModel planned_with;   // what the compiler saw (solo, or SharedGpuCostModel; its
                            // host_link_group_size says which link model on one GPU)
  double compute_factor = 1.0;  // c it was planned at (1 with devices of their own)
  // stages_per_device > 1: SimulateSharedGpu of the schedule and of the same order without
  // offload, from the solo costs (the one-GPU step to compare with a measured one).
  std::optional<SharedGpuPrediction> shared;
  std::optional<SharedGpuPrediction> shared_baseline;
};

// Compiles `spec` under `solo` (seconds or units; with stages sharing one GPU: measured alone),
// as PlanOptions say. Errors: InvalidArgument for a stages_per_device other than 1 and p, or a
// pinned compute factor below 1; the compiler's (auto: ResourceExhausted when no plan fits the
// budget; in a search, the first factor's error when no factor compiles); SimulateSharedGpu's.
[[nodiscard]] absl::StatusOr<Plan> PlanSchedule(const PipelineSpec& spec, const CostModel& solo,
                                                const PlanOptions& options = {});

// A schedule made elsewhere (a file, another program) re-planned for this job: validated, its
// predictions replaced by a simulation under the cost model PlanSchedule would plan with
// (with stages sharing one GPU: at the pinned factor, else c = p), since a file's predictions
// were made for some other model. Errors: FailedPrecondition when it fails Validate or hangs
// in simulation; SimulateSharedGpu's.
[[nodiscard]] absl::StatusOr<Plan> ReplanSchedule(Schedule schedule, const CostModel& solo,
                                                  const PlanOptions& options = {});

// Reads `path` as pipeoffload.schedule/1 JSON and checks it with Validate.
// Errors (each naming the path): NotFound / PermissionDenied when it cannot be read;
// InvalidArgument with the JSON position or field when it does not parse; FailedPrecondition
// with the broken invariant when it parses but is not a valid schedule.
[[nodiscard]] absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path);

// FNV-1a of the schedule's canonical JSON: ranks compare it to prove they run one schedule.
std::uint64_t ScheduleFingerprint(const Schedule& schedule);

// Room for a stage's P2P buffers in its arena.
enum class P2PReserve : std::uint8_t {
  // The peak of AnalyzeP2P's lifetimes, which the executor then holds to
  // (ExecutorOptions::p2p_guarantee_points): tight and safe.
  kPlanned,
  // Every buffer the program could hold if no send finished before the end of the step (the
  // executor gets no plan and frees a send's buffer whenever the transport says it finished).
  kWorstCase,
};

// How a stage's device arena is sized.
struct ArenaSizing {
  // > 0: the budget, exactly (Open fails with ResourceExhausted when the program does not fit,
  // as Executor::Create checks it). 0: sized from the plan: its exact need (ArenaNeed) plus
  // the headroom.
  std::int64_t budget_bytes = 0;
  std::int64_t alignment = 256;  // DeviceArenaOptions::alignment
  // Headroom for the first-fit allocator: on a GPU, offload releases and P2P buffers come and
  // go in a timing-dependent order, so a block can fail to fit with enough bytes free. With
  // only a quarter more, stage 0 of a 2-stage po-f run once failed to place a stash entry with
  // twice its size free but no contiguous block (H200, batch 3); one spare largest entry
  // fixed it. A benchmark that reports memory sets both to nothing.
  double fragmentation_share = 0.25;
  bool spare_largest_entry = true;
};

// What one stage's program needs of its arena.
struct ArenaNeed {
  std::int64_t stash_bytes = 0;  // the program-order stash peak, each entry aligned
  std::int64_t p2p_bytes = 0;    // the P2P reserve's peak in aligned boundary blocks
  int p2p_blocks = 0;
  std::int64_t largest_entry_bytes = 0;  // aligned
  // Aligned; the arena carves stash blocks below it (retained blocks) from the top
  // (DeviceArenaOptions::stash_high_below_bytes).
  std::int64_t smallest_entry_bytes = 0;
  // The stash peak plus the P2P reserve. With kPlanned it is what Executor::Create checks; with
  // kWorstCase the executor checks the stash peak only (without a plan the P2P room is not
  // bounded up front: a run whose sends finish early needs less).
  std::int64_t exact() const { return stash_bytes + p2p_bytes; }
  std::int64_t budget_bytes = 0;  // ArenaSizing's budget, or the exact need plus headroom
};

// The arena stage `stage` of `schedule` needs with the sizes of `sizes`, P2P room as `reserve`
// says (kPlanned: `p2p` must be that stage's AnalyzeP2P lifetimes; kWorstCase: `p2p` is
// ignored). Errors: InvalidArgument for a stage out of range, sizes that do not cover the
// schedule or a bad alignment; FailedPrecondition from the program walk.
[[nodiscard]] absl::StatusOr<ArenaNeed> StageArenaNeed(const Schedule& schedule, int stage,
                                                       const ModelSizes& sizes, P2PReserve reserve,
                                                       const P2PLifetimes* p2p,
                                                       const ArenaSizing& sizing = {});

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_PLANNING_H_
