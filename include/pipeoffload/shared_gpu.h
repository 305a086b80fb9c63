// The step time of a pipeline whose p stages time-share ONE GPU and ONE host link: stages as
// threads of one process, each with its own streams, on one device (the local transport on one
// GPU; pipeline_bench, and gpt_train --backend cuda --transport local).
//
// Why not Simulate (simulate.h) alone: Simulate gives every stage its own compute engine and
// host link. On one GPU that is wrong in both directions: a stage's op runs slower than alone
// while other stages have kernels in flight, and faster when it has the GPU to itself (warm-up
// and cool-down), so the pipeline bubble of a per-GPU schedule is filled by the other stages'
// work and the step is close to the sum of all compute, not to (m + p - 1) chunk times.
//
// The model here (processor sharing, "fluid"): the same issue rules as Simulate (program order;
// SEND/RECV posted without blocking; F/B wait for their received data and, when offloaded, their
// RELOAD; OFFLOAD after its F, RELEASE after its OFFLOAD, RELOAD after its OFFLOAD; BARRIER a
// rendezvous; one compute op, one D2H and one H2D copy at a time per stage), but
//  - the compute ops running at one instant share the GPU equally: with n of them running,
//    each advances at 1/n of its solo speed (durations in `cost` are solo: measured alone);
//  - the copies running at one instant share the one host link: each direction carries its
//    solo bandwidth while the other direction is idle and duplex_bandwidth while both run,
//    split equally among that direction's copies (host_link_group_size is ignored: one link);
//  - a P2P transfer (a device-to-device copy on one GPU) takes p2p_latency + bytes /
//    p2p_bandwidth once both ends are posted and its data is produced.
// It is a prediction from solo op costs, not a fit: kernels of different streams do not
// interleave perfectly, so a measured step above this prediction by a few percent is the
// price of sharing; a larger gap is stalls (a reload late, a barrier wait). Pure: no I/O.
#ifndef PIPEOFFLOAD_SHARED_GPU_H_
#define PIPEOFFLOAD_SHARED_GPU_H_

#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload {

struct SharedGpuPrediction {
  double step_time = 0.0;     // makespan
  double compute_work = 0.0;  // sum of every compute op's solo duration (the serial bound)
  double gpu_idle = 0.0;      // time within the step with no compute op running
  double copy_stall = 0.0;    // of gpu_idle: time some stage waited for a reload or a release
  std::vector<double> stage_end;  // [stage]
};

// Predicts `schedule` (valid, any policy) on one shared GPU with solo costs `cost`.
// Errors: InvalidArgument for non-positive durations or bandwidths; FailedPrecondition naming
// each stuck stage's head op when the programs cannot finish.
[[nodiscard]] absl::StatusOr<SharedGpuPrediction> SimulateSharedGpu(const Schedule& schedule,
                                                                    const CostModel& cost);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_SHARED_GPU_H_
