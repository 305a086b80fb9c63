// Measured costs for the planner: how long a stage's chunks take on its device and how fast its
// host link moves bytes, timed through the Backend interface (events on its queues), so the
// same code serves the CPU backend, one GPU and every rank of a multi-GPU job.
//
// Why: the offload planner decides what hides behind compute from the ratio of transfer time to
// compute time. Nominal costs get that ratio badly wrong on a GPU (at h = 4096 an H200 moves a
// layer's saved activations to the host in ~3x the time it computes the layer's forward, while
// a CPU memcpy is far faster than the CPU's compute), and a plan made on them stalls on every
// reload (docs/benchmarks.md, "gpt_train over NCCL on two H200s"). pipeline_bench and gpt_train
// plan GPU runs with these figures.
#ifndef PIPEOFFLOAD_CALIBRATE_H_
#define PIPEOFFLOAD_CALIBRATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/schedule.h"  // VirtualStageMap
#include "pipeoffload/stage_model.h"

namespace pipeoffload {

// Seconds of one chunk's Forward and full Backward (input and weight gradients) alone on the
// device.
struct ChunkTimes {
  double forward = 0.0;
  double backward = 0.0;
};

// Host link bandwidths in bytes per second between device memory and the backend's host
// buffers (pinned on CUDA): each direction alone, and each direction while both run. The
// defaults are the H200's pinned PCIe Gen5 figures (reference/hardware.md), for plans made
// without a device.
struct LinkFigures {
  double d2h = 55.3e9;
  double h2d = 55.3e9;
  double duplex = 46.0e9;
};

// Copies of `bytes` bytes on the D2H and H2D queues: D2H alone, H2D alone, then both at once
// (duplex is the slower direction's rate while both run). Each figure is the median of `reps`
// timed copies after one untimed one. Allocates two device and two host buffers of `bytes`
// (from the backend, not an arena) and frees them on every path.
// Errors: InvalidArgument for bytes < 4096 or reps < 1; the backend's (ResourceExhausted when
// the buffers do not fit).
[[nodiscard]] absl::StatusOr<LinkFigures> MeasureLink(Backend& backend, std::int64_t bytes,
                                                      int reps);

// What MeasureChunkTimes runs.
struct ChunkTimingOptions {
  int chunk = 0;  // the stage model's chunk
  int mb = 0;     // the microbatch the calls name (the model's data for it must be staged)
  // Whether the chunk reads an input activation and writes an input gradient (false on the
  // first virtual stage, which reads its own tokens), and whether it writes an output and
  // reads an output gradient (false on the last virtual stage, which computes the loss).
  bool has_input = true;
  bool has_output = true;
  int untimed = 2;  // warm-up calls (cuBLAS heuristics, first-touch, clocks)
  int reps = 3;     // timed calls; each figure is their median
  double timeout_seconds = 120.0;  // per call: a hung kernel surfaces as DeadlineExceeded
  // Fills a device buffer the chunk reads (input, output gradient, saved entry) before the
  // first call; `index` numbers the buffers. Empty: FillAsync with a non-zero pattern (copies
  // and kernels on zeros can be special). pipeline_bench passes pseudo-random bf16.
  std::function<absl::Status(void* device, std::int64_t bytes, int index)> fill;
};

// Times `model`'s Forward and Backward (with weight gradients) of `options.chunk` on
// `backend`'s compute queue, with events recorded around each call. The model must be ready to
// run that chunk for `options.mb` (e.g. its iteration started, so its tokens are staged); its
// weight gradients accumulate the calls' contributions, so start the next iteration (which
// zeroes them) before training. Allocates the stash entry and boundary buffers from the backend
// and frees them on every path.
// Errors: InvalidArgument for reps < 1, untimed < 0 or a chunk whose SavedBytes is not
// positive; DeadlineExceeded when a call does not finish in time; the model's and backend's.
[[nodiscard]] absl::StatusOr<ChunkTimes> MeasureChunkTimes(Backend& backend, StageModel& model,
                                                           const ChunkTimingOptions& options);

// What one pipeline stage measured: each of its chunks alone on its device (in chunk order),
// and its host link. The planner's input for measured costs (planning.h: MeasuredCostModel).
struct StageCosts {
  std::vector<ChunkTimes> chunks;
  LinkFigures link;
};
// The mean over a stage's chunks. REQUIRES: costs.chunks not empty.
ChunkTimes MeanChunkTimes(const StageCosts& costs);
// Each figure's minimum over the stages. REQUIRES: stages not empty.
LinkFigures SlowestLink(const std::vector<StageCosts>& stages);

// What MeasureStageCosts runs.
struct StageCostProbe {
  int untimed = 2;  // per chunk, as ChunkTimingOptions
  int reps = 3;
  double timeout_seconds = 120.0;
  // The host link is timed with copies of the stage's largest stash entry, clamped to
  // [1 MiB, link_probe_max_bytes]: big enough for the copy engines' full rate, small enough to
  // leave the device's memory to the model (two device and two host buffers of it).
  std::int64_t link_probe_max_bytes = std::int64_t{256} << 20;
  int link_reps = 3;
  std::function<absl::Status(void* device, std::int64_t bytes, int index)> fill;  // as above
};

// Times every chunk of stage `stage` of a pipeline placed as `map` says (chunk c is virtual
// stage map.virtual_stage(stage, c): the first has no input, the last no output; under V a
// stage's chunk 1 runs back down the pipeline) with MeasureChunkTimes on microbatch 0, then its
// host link with MeasureLink. The
// model must be ready to run every chunk for microbatch 0 (its first iteration started) and
// its weight gradients collect the calls' contributions (start the next iteration, which
// zeroes them, before training). Errors: those two functions', annotated with the stage and
// chunk; InvalidArgument for a stage outside [0, map.num_stages) or map.chunks < 1.
[[nodiscard]] absl::StatusOr<StageCosts> MeasureStageCosts(Backend& backend, StageModel& model,
                                                           const VirtualStageMap& map, int stage,
                                                           bool split_backward,
                                                           const StageCostProbe& probe = {});

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_CALIBRATE_H_
