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
// that rounding only. The model's own GPU master, m and v stay allocated (unused): the CUDA
// model has no way to leave them out yet.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CUDA_TRAIN_STAGE_CUDA_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CUDA_TRAIN_STAGE_CUDA_H_

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

// OK when at least `needed` CUDA devices are visible. Errors: FailedPrecondition saying how many
// there are (none: no driver, no GPU, or CUDA_VISIBLE_DEVICES hides them) and what was asked.
[[nodiscard]] absl::Status CheckCudaDevices(int needed, const char* what);

// The one-GPU layout of --transport local: one CUDA backend per stage on device 0 (each its own
// streams) and local transports whose receives copy device to device on the receiver's compute
// stream (CudaDeviceCopier). Errors: CheckCudaDevices's; the backends' and transports'.
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
[[nodiscard]] absl::StatusOr<CudaMpiRank> CreateCudaMpiRank(TrainGroup& group,
                                                            const TrainOptions& options);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_CUDA_TRAIN_STAGE_CUDA_H_
