// gpt_train --backend cuda: the CUDA TrainStage (GptCudaStageModel on a CUDA backend, its AdamW
// on the GPU or in optimizer-offload engines) and the launchers that give each rank its backend
// and transport (stages as threads on one GPU, or one MPI rank per GPU over NCCL).
//
// Optimizer-state offload (--optimizer-offload cpu | interleaved | static): one
// OptimizerOffload engine per chunk over the chunk's flat parameter arrays (DeviceParameters:
// every tensor at a 128-element aligned offset, padding included). The engine owns the fp32
// master, m and v (pinned host memory, or a share on the GPU) and writes the chunk's bf16
// working copy in place. Once per step the chunk's fp32 gradient accumulators are rounded to
// bf16 into a scratch array (Fp32ToBf16) and handed to the engine (AddGradients), which takes
// bf16 gradients: so against the GPU AdamW (--optimizer-offload none) the update differs by
// that rounding only. The model is created without GPU optimizer state (GptCudaStageModel::
// Create(..., with_optimizer_state = false)): each chunk's fp32 master, m and v are freed as
// soon as the chunk exists, and the engines start from the host copies of its masters, so the
// GPU holds only what the engine puts there (nothing for cpu, two staging subgroups for
// interleaved, the resident share for static).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CUDA_TRAIN_STAGE_CUDA_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CUDA_TRAIN_STAGE_CUDA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/train_group.h"
#include "examples/gpt/train_options.h"
#include "examples/gpt/train_stage.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::gpt {

// The stage on `backend` (a CUDA backend that must outlive it). `cpu_threads` bounds each
// engine's CPU Adam threads (0: every CPU; stages sharing a host should split them).
// Errors: GptCudaStageModel::Create's (InvalidArgument for sizes the CUDA kernels do not take,
// Unimplemented for tied embeddings, allocation errors); OptimizerOffload::Create's
// (ResourceExhausted when pinned host memory is short, naming the bytes).
[[nodiscard]] absl::StatusOr<std::unique_ptr<TrainStage>> CreateCudaTrainStage(
    const TrainOptions& options, const TrainStageSpec& spec, Backend& backend, int cpu_threads);

// GPU memory of a stage from CreateCudaTrainStage, by owner (bytes).
struct CudaStageMemory {
  std::int64_t model_bytes = 0;            // the model's (GptCudaStageModel::device_bytes)
  std::int64_t model_optimizer_bytes = 0;  // of which its fp32 master, m and v (0 with offload)
  std::int64_t engine_state_bytes = 0;     // the engines' fp32 p, m, v on the GPU
  std::int64_t engine_other_bytes = 0;     // the engines' GPU fp32 grads and scratch, and the
                                           // stage's bf16 gradient copies handed to them
  // GPU memory that went from free to used while the stage was created (cudaMemGetInfo
  // before and after, stage creations in one process serialized): the accounted bytes plus
  // the CUDA libraries' own and allocation rounding. Approximate when other threads allocate
  // on the same GPU meanwhile (stages as threads: their backends and arenas).
  std::int64_t measured_bytes = 0;

  // What the stage's optimizer keeps on the GPU: the model's state plus the engines'.
  std::int64_t optimizer_state_bytes() const { return model_optimizer_bytes + engine_state_bytes; }
};

// The memory of `stage`, which must come from CreateCudaTrainStage (InvalidArgument else).
[[nodiscard]] absl::StatusOr<CudaStageMemory> GetCudaStageMemory(const TrainStage& stage);

// OK when at least `needed` CUDA devices are visible. Errors: FailedPrecondition saying how many
// there are (none: no driver, no GPU, or CUDA_VISIBLE_DEVICES hides them) and what was asked.
[[nodiscard]] absl::Status CheckCudaDevices(int needed, const char* what);

// The one-GPU layout of --transport local: one CUDA backend per stage on device 0 (each its own
// streams) and local transports whose receives copy device to device on the receiver's compute
// stream (CreateLocalTransports over the backends). Errors: CheckCudaDevices's; the backends'
// and transports'.
struct CudaLocalRig {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Transport>> transports;
};
[[nodiscard]] absl::StatusOr<CudaLocalRig> CreateCudaLocalRig(int num_stages,
                                                              double timeout_seconds);

// This MPI rank's GPU, NCCL transport and CUDA backend for --transport mpi. Every rank first
// checks that its local rank has a GPU of its own (NCCL cannot put two ranks on one device) and
// the ranks agree over `group` before any NCCL call, so too many ranks fail at once on every
// rank with one message. Errors: FailedPrecondition for that (naming the ranks per host and
// the GPUs); Unimplemented when built without NCCL; CreateNcclTransport's.
struct CudaMpiRank {
  std::unique_ptr<Transport> transport;  // destroy before the group (it finalizes MPI last)
  std::unique_ptr<Backend> backend;
};
[[nodiscard]] absl::StatusOr<CudaMpiRank> CreateCudaMpiRank(RankGroup& group,
                                                            const TrainOptions& options);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CUDA_TRAIN_STAGE_CUDA_H_
