// Parameters of one CUDA chunk on the device: a table of tensors (global id, spec) in canonical
// order, each at a 256-byte aligned offset, and one array per role:
//   bf16   working copy the kernels read (always)
//   grad   fp32 gradient accumulators (always)
//   master fp32 parameters, m and v (AdamW moments): only with optimizer state (the full GPT;
//          the benchmark's layer stack has none), in allocations of their own so that
//          DropOptimizerState can give them back when an optimizer-offload engine takes over
// The AdamW step (LaunchAdamUpdate, lib/optim/cuda/adam_kernel.h) updates master, m and v and
// rewrites the bf16 copy from the new master in the same pass.
//
// Optimizer state: created with it or without; with it, DropOptimizerState frees it for good.
// Without it (never, or no longer) AdamWStep and DownloadMaster fail with FailedPrecondition
// saying which of the two.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_PARAMS_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_PARAMS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_params.h"

namespace pipeoffload::gpt::cuda {

struct DeviceTensor {
  int id = 0;  // global id (index into GptTensorSpecs)
  TensorSpec spec;
  std::int64_t offset = 0;  // elements into every array; a multiple of 128
};

class DeviceParameters {
 public:
  // Allocates the arrays for `tensors` (id, spec) on the current device: bf16 and grad from
  // `memory`, the optimizer state (with_optimizer_state) in allocations the parameters own;
  // every array starts zeroed (enqueued on `stream`). An empty list allocates nothing (a chunk
  // with no layers, embedding or head). Errors: the allocation's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceParameters>> Create(
      const std::vector<DeviceTensor>& tensors, bool with_optimizer_state,
      DeviceAllocations& memory, cudaStream_t stream);

  const std::vector<DeviceTensor>& tensors() const { return tensors_; }
  std::int64_t padded_elements() const { return padded_; }
  bool has_optimizer_state() const { return master_ != nullptr; }
  // Device bytes of the fp32 master, m and v held now: 12 * padded_elements(), or 0.
  std::int64_t optimizer_state_bytes() const {
    return state_memory_ == nullptr ? 0 : state_memory_->total_bytes();
  }
  // Local index of tensor `id`, or -1.
  int Find(int id) const;

  const __nv_bfloat16* weight(int local) const { return bf16_ + tensors_[local].offset; }
  float* grad(int local) const { return grad_ + tensors_[local].offset; }
  // The whole bf16 working copy (padded_elements(), tensor `local` at tensors()[local].offset),
  // for an optimizer that rewrites it in place (an OptimizerOffload engine). Null when the
  // chunk holds no tensors.
  __nv_bfloat16* mutable_weights() { return bf16_; }

  // master = the block's fp32 values of every tensor of ours (by id; host copies, synchronous:
  // creation only), bf16 = their rounding (RoundToBf16Bits). Without optimizer state only the
  // bf16 copy is written. InvalidArgument when the block lacks one of our ids or its size
  // differs.
  [[nodiscard]] absl::Status UploadFrom(const ParameterBlock& block, cudaStream_t stream);
  // bf16 = per the specs: N(0, init_std) from (seed, id) where init_std > 0, else init_value.
  [[nodiscard]] absl::Status FillRandom(std::uint64_t seed, cudaStream_t stream);
  [[nodiscard]] absl::Status ZeroGrads(cudaStream_t stream);
  // One AdamW step (t >= 1) on every tensor from its gradient; weight decay on the tensors
  // whose spec says so. Errors: FailedPrecondition without optimizer state (naming why: never
  // allocated, or dropped) or when the build has no GPU Adam (po_optim_cuda); InvalidArgument
  // for bad hyper-parameters.
  // Every gradient is multiplied by `grad_scale` as it is read (global-norm clipping's
  // coefficient); the rate is config.learning_rate (the caller applies the schedule).
  [[nodiscard]] absl::Status AdamWStep(const AdamWConfig& config, std::int64_t t,
                                       cudaStream_t stream, float grad_scale = 1.0f);
  // Each tensor's gradient sum of squares, sum over its elements of double(g)^2 on the GPU
  // (LaunchSumOfSquares: deterministic, the same bits for the same gradients), in tensor
  // order; waits for `stream`. Errors: FailedPrecondition when the build has no po_optim_cuda;
  // the launches' and the wait's.
  [[nodiscard]] absl::StatusOr<std::vector<TensorSquareSum>> GradSquareSums(
      cudaStream_t stream) const;

  // Waits for `stream` (queued AdamW steps read the state), then frees the fp32 master, m and v
  // for good: from then on optimizer_state_bytes() is 0 and AdamWStep / DownloadMaster /
  // DownloadMasters fail. The caller hands the state to an optimizer-offload engine first
  // (DownloadMasters). The current device must be the one the parameters live on. OK when
  // there is none. Errors: the wait's (DeadlineExceeded, the stream's error).
  [[nodiscard]] absl::Status DropOptimizerState(cudaStream_t stream);

  // Host copies for tests and checksums (synchronize `stream` first): tensor `local`'s master
  // (fp32; FailedPrecondition without optimizer state), gradient, or bf16 copy widened to fp32.
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadMaster(int local,
                                                                  cudaStream_t stream) const;
  // The whole fp32 master array (padded_elements() values, padding zero: what an engine over
  // the flat arrays starts from). FailedPrecondition without optimizer state.
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadMasters(cudaStream_t stream) const;
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadGrad(int local,
                                                                cudaStream_t stream) const;
  [[nodiscard]] absl::StatusOr<std::vector<float>> DownloadWeight(int local,
                                                                  cudaStream_t stream) const;

 private:
  DeviceParameters() = default;
  // FailedPrecondition for `what` without optimizer state, saying whether it was ever there.
  absl::Status NoStateError(const char* what) const;

  std::vector<DeviceTensor> tensors_;
  std::int64_t padded_ = 0;
  __nv_bfloat16* bf16_ = nullptr;
  float* grad_ = nullptr;
  // master_, m_ and v_ and nothing else (DropOptimizerState frees it); null without state.
  std::unique_ptr<DeviceAllocations> state_memory_;
  float* master_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
  bool dropped_ = false;
  // GradSquareSums' device scratch: one double per tensor, and the partials of the largest.
  double* square_sums_ = nullptr;
  double* square_partials_ = nullptr;
};

// Lays `specs` (with their ids) out at 128-element aligned offsets.
std::vector<DeviceTensor> LayOutTensors(const std::vector<std::pair<int, TensorSpec>>& specs);

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_PARAMS_H_
