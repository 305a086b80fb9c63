// How gpt_train gets the schedule it runs: the cost model built from the model's exact sizes,
// compiling (or loading and re-simulating a --schedule-file), the checks that the schedule fits
// the job, and the default arena budget. Pure functions of their inputs, except
// LoadScheduleFile, which reads one file.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PLAN_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/train_options.h"
#include "pipeoffload/calibrate.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/p2p_lifetimes.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::gpt {

// The cost model the compiler plans with. Bytes are the model's own: saved_bytes has p * v
// entries (StageModel::SavedBytes of chunk c on stage d at index c * p + d), so the predicted
// stash peak of every stage is exactly what the runtime measures; boundary_bytes is
// StageModel::BoundaryBytes. Times are nominal, in units of one layer's forward: a chunk's F,
// B and W each take ChunkComputeUnits (so plans with different v compare), the largest entry
// crosses the host link in kTransferUnits of a chunk's F, a boundary message in a tenth.
// They are the same on every rank, so every rank compiles the same schedule.
// REQUIRES: saved_bytes not empty, every entry > 0, chunk_units > 0.
CostModel TrainCostModel(const std::vector<std::int64_t>& saved_bytes, std::int64_t boundary_bytes,
                         double chunk_units);
// Layers per chunk, n_layer / (p * v), but at least a quarter: a chunk without layers still
// embeds, runs the head or passes the residual stream on.
double ChunkComputeUnits(int n_layer, int num_virtual_stages);
// A memcpy of an activation is much faster than the chunk's compute on the CPU, so the offload
// planner is never short of bandwidth and po-f offloads every entry whose lifespan allows it.
inline constexpr double kTransferUnits = 0.25;

// What one stage measured for --costs measured (train_calibrate.h): each of its chunks' times
// alone on its device, in chunk order, and its host link.
struct StageCosts {
  std::vector<ChunkTimes> chunks;
  LinkFigures link;
};
// The mean over a stage's chunks. REQUIRES: costs.chunks not empty.
ChunkTimes MeanChunkTimes(const StageCosts& costs);
// Each figure's minimum over the stages. REQUIRES: stages not empty.
LinkFigures SlowestLink(const std::vector<StageCosts>& stages);

// The cost model from every stage's measurements (stages[d] of stage d), in seconds. Per stage,
// F and B are the means over its chunks; the model's F and B are the smallest stage's, and
// stage_time_scale[d] = (F_d + B_d) / (F + B) gives each stage its own pace (the first and last
// chunks carry the embedding and the head). B covers B and W, split evenly (gpt_train's
// spec splits W only on request). The link is the slowest stage's in each figure (the stages
// measured at once, so a host link two GPUs share shows as their halved rate), each stage its
// own link (host_link_group_size 1: no BARRIER hand-overs). `stages_per_device` > 1 says
// that many stages share one device and its link (the local transport on one GPU): compute is
// planned that many times slower and every bandwidth divided by it, which keeps each stage's
// ratio of compute to transfer time what it would be on a device of its own (the split link of
// pipeline_bench_plan.h). Bytes as in TrainCostModel; P2P keeps CostModel's default rate.
// REQUIRES: saved_bytes not empty with every entry > 0; stages not empty, each with chunks,
// every time and bandwidth > 0; stages_per_device >= 1.
CostModel MeasuredTrainCostModel(const std::vector<std::int64_t>& saved_bytes,
                                 std::int64_t boundary_bytes,
                                 const std::vector<StageCosts>& stages, int stages_per_device);

// Reads `path` as pipeoffload.schedule/1 JSON and checks it with Validate.
// Errors (each naming the path): NotFound / PermissionDenied when it cannot be read;
// InvalidArgument with the JSON position or field when it does not parse; FailedPrecondition
// with the broken invariant when it parses but is not a valid schedule.
[[nodiscard]] absl::StatusOr<Schedule> LoadScheduleFile(const std::string& path);

// The spec of the job: from a loaded schedule (which must have num_ranks stages and agree with
// the pipeline flags given explicitly: --stages, --chunks, --microbatches, --split-backward),
// else TrainSpec(options, num_ranks) (where an explicit --stages must equal num_ranks).
// `transport_name` ("mpi", "local") words the stage-count error.
// Errors: FailedPrecondition for a stage count that differs from the ranks, naming both and
// how to launch it; InvalidArgument for conflicting flags or a spec the compiler rejects.
[[nodiscard]] absl::StatusOr<PipelineSpec> JobSpec(const TrainOptions& options,
                                                   const std::optional<Schedule>& loaded,
                                                   int num_ranks, std::string_view transport_name);

// The schedule to run: Compile(spec, cost), or `loaded` with its predictions replaced by a
// simulation under `cost` (a file's predictions were made for some other model). For
// --schedule auto with memory_budget_share > 0, the budget is that share of the largest
// stage's stash peak of the same order without offload. Errors: the compiler's (for auto,
// ResourceExhausted when no plan fits the budget); FailedPrecondition when the loaded schedule
// hangs in simulation.
[[nodiscard]] absl::StatusOr<Schedule> PlanSchedule(const PipelineSpec& spec,
                                                    const std::optional<Schedule>& loaded,
                                                    const CostModel& cost,
                                                    double memory_budget_share = 0.0);

// The arena budget that surely holds `program`: its predicted stash peak with every entry
// rounded to `alignment`, plus room for its P2P buffers, plus a quarter for fragmentation, plus
// one more `largest_entry_bytes`
// (the stage's largest stash entry). Why the extra entry: the arena is first-fit, and on the
// GPU offload releases and P2P buffers come and go in a timing-dependent order; with only the
// quarter, stage 0 of a 2-stage po-f run once failed to place a stash entry with twice its
// size free but no contiguous block (H200, batch 3). The P2P room: with `p2p` (this stage's
// AnalyzeP2P lifetimes, which the executor holds to when given their guarantee points) their
// peak in aligned boundary buffers; without, one per op that can allocate one (F, B, RECV_F,
// RECV_B). REQUIRES: alignment a power of two.
std::int64_t DefaultArenaBytes(const StageProgram& program, const StagePrediction& prediction,
                               std::int64_t boundary_bytes, std::int64_t alignment,
                               std::int64_t largest_entry_bytes = 0,
                               const P2PLifetimes* p2p = nullptr);

// FNV-1a of the schedule's canonical JSON: ranks compare it to prove they run one schedule.
std::uint64_t ScheduleFingerprint(const Schedule& schedule);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_PLAN_H_
