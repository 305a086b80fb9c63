// Device parameters of a CUDA chunk (see gpt_cuda_params.h).
#include "examples/gpt/cuda/gpt_cuda_params.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/gpt_cuda_random.h"
#include "examples/gpt/rng.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"

#ifdef PO_GPT_CUDA_HAVE_ADAM
#include "lib/optim/cuda/adam_kernel.h"
#include "pipeoffload/adam.h"
#endif

namespace pipeoffload::gpt::cuda {
namespace {

constexpr std::int64_t kOffsetAlignment = 128;  // elements: 256 bytes of bf16, 512 of fp32
constexpr double kWaitSeconds = 120.0;

absl::Status CopyToHost(void* dst, const void* src, std::int64_t bytes, cudaStream_t stream) {
  PO_RETURN_IF_ERROR(WaitForStream(stream, kWaitSeconds, "downloading a tensor"));
  PO_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

}  // namespace

std::vector<DeviceTensor> LayOutTensors(const std::vector<std::pair<int, TensorSpec>>& specs) {
  std::vector<DeviceTensor> tensors;
  std::int64_t cursor = 0;
  for (const auto& [id, spec] : specs) {
    tensors.push_back(DeviceTensor{id, spec, cursor});
    cursor += (spec.numel() + kOffsetAlignment - 1) / kOffsetAlignment * kOffsetAlignment;
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<DeviceParameters>> DeviceParameters::Create(
    const std::vector<DeviceTensor>& tensors, bool with_optimizer_state, DeviceAllocations& memory,
    cudaStream_t stream) {
  std::unique_ptr<DeviceParameters> params(new DeviceParameters());
  // A chunk without layers in the middle of a deep pipeline holds no tensors at all.
  if (tensors.empty()) return params;
  params->tensors_ = tensors;
  const DeviceTensor& last = tensors.back();
  params->padded_ = last.offset + (last.spec.numel() + kOffsetAlignment - 1) / kOffsetAlignment *
                                      kOffsetAlignment;
  const std::int64_t n = params->padded_;
  PO_ASSIGN_OR_RETURN(params->bf16_, memory.AllocateArray<__nv_bfloat16>(n));
  PO_ASSIGN_OR_RETURN(params->grad_, memory.AllocateArray<float>(n));
  PO_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(params->bf16_, 0, static_cast<std::size_t>(n * 2), stream));
  PO_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(params->grad_, 0, static_cast<std::size_t>(n * 4), stream));
#ifdef PO_GPT_CUDA_HAVE_ADAM
  std::int64_t partials = 1;
  for (const DeviceTensor& tensor : tensors) {
    partials = std::max(partials, SumOfSquaresPartialCount(tensor.spec.numel()));
  }
  PO_ASSIGN_OR_RETURN(params->square_sums_,
                      memory.AllocateArray<double>(static_cast<std::int64_t>(tensors.size())));
  PO_ASSIGN_OR_RETURN(params->square_partials_, memory.AllocateArray<double>(partials));
#endif
  if (with_optimizer_state) {
    int device = 0;
    PO_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    params->state_memory_ = std::make_unique<DeviceAllocations>(device);
    for (float** array : {&params->master_, &params->m_, &params->v_}) {
      PO_ASSIGN_OR_RETURN(*array, params->state_memory_->AllocateArray<float>(n));
      PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(*array, 0, static_cast<std::size_t>(n * 4), stream));
    }
  }
  return params;
}

int DeviceParameters::Find(int id) const {
  for (int i = 0; i < static_cast<int>(tensors_.size()); ++i) {
    if (tensors_[static_cast<std::size_t>(i)].id == id) return i;
  }
  return -1;
}

absl::Status DeviceParameters::NoStateError(const char* what) const {
  return absl::FailedPreconditionError(absl::StrCat(
      what, " needs the GPU's fp32 master, m and v, but ",
      dropped_ ? "they were dropped (DropOptimizerState: an optimizer-offload engine owns the "
                 "optimizer state; read it there)"
               : "these parameters were created without optimizer state"));
}

absl::Status DeviceParameters::UploadFrom(const ParameterBlock& block, cudaStream_t stream) {
  if (tensors_.empty()) return absl::OkStatus();
  std::vector<std::uint16_t> rounded;
  PO_RETURN_IF_ERROR(WaitForStream(stream, kWaitSeconds, "uploading parameters"));
  for (const DeviceTensor& tensor : tensors_) {
    const int local = block.Find(tensor.id, /*mirror=*/false);
    if (local < 0 ||
        block.tensors()[static_cast<std::size_t>(local)].spec.numel() != tensor.spec.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter block has no tensor ", tensor.id,
                                                     " (", tensor.spec.name, ") of ",
                                                     tensor.spec.numel(), " elements"));
    }
    const float* values = block.param(local);
    const std::int64_t n = tensor.spec.numel();
    rounded.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      rounded[static_cast<std::size_t>(i)] = RoundToBf16Bits(values[i]);
    }
    // On the stream (a legacy-stream cudaMemcpy from pageable memory may still be in flight
    // when it returns, unordered with the non-blocking stream), then waited for, so `rounded`
    // can be reused.
    if (master_ != nullptr) {
      PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(master_ + tensor.offset, values,
                                              static_cast<std::size_t>(n * 4),
                                              cudaMemcpyHostToDevice, stream));
    }
    PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bf16_ + tensor.offset, rounded.data(),
                                            static_cast<std::size_t>(n * 2), cudaMemcpyHostToDevice,
                                            stream));
    PO_RETURN_IF_ERROR(WaitForStream(stream, kWaitSeconds, "uploading parameters"));
  }
  return absl::OkStatus();
}

absl::Status DeviceParameters::FillRandom(std::uint64_t seed, cudaStream_t stream) {
  for (const DeviceTensor& tensor : tensors_) {
    __nv_bfloat16* out = bf16_ + tensor.offset;
    const std::int64_t n = tensor.spec.numel();
    if (tensor.spec.init_std > 0.0f) {
      const std::uint64_t stream_seed = DeriveSeed({seed, static_cast<std::uint64_t>(tensor.id)});
      PO_CUDA_RETURN_IF_ERROR(
          LaunchFillNormalBf16(out, n, tensor.spec.init_std, stream_seed, stream));
    } else {
      PO_CUDA_RETURN_IF_ERROR(LaunchFillConstantBf16(out, n, tensor.spec.init_value, stream));
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceParameters::ZeroGrads(cudaStream_t stream) {
  if (padded_ == 0) return absl::OkStatus();
  PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grad_, 0, static_cast<std::size_t>(padded_ * 4), stream));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorSquareSum>> DeviceParameters::GradSquareSums(
    cudaStream_t stream) const {
  std::vector<TensorSquareSum> sums;
  if (tensors_.empty()) return sums;
#ifdef PO_GPT_CUDA_HAVE_ADAM
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const DeviceTensor& tensor = tensors_[i];
    // One stream: the partials are reused by the next tensor's launch only after this one's.
    PO_RETURN_IF_ERROR(LaunchSumOfSquares(grad_ + tensor.offset, tensor.spec.numel(),
                                          square_partials_, square_sums_ + i, SumMode::kOverwrite,
                                          stream));
  }
  std::vector<double> host(tensors_.size());
  PO_RETURN_IF_ERROR(CopyToHost(host.data(), square_sums_,
                                static_cast<std::int64_t>(host.size() * sizeof(double)), stream));
  for (std::size_t i = 0; i < tensors_.size(); ++i) sums.push_back({tensors_[i].id, host[i]});
  return sums;
#else
  static_cast<void>(stream);
  return absl::FailedPreconditionError(
      "this build has no GPU sum of squares (po_optim_cuda was not found when po_gpt_cuda was "
      "configured)");
#endif
}

absl::Status DeviceParameters::AdamWStep(const AdamWConfig& config, std::int64_t t,
                                         cudaStream_t stream, float grad_scale) {
  if (tensors_.empty()) return absl::OkStatus();
  if (master_ == nullptr) return NoStateError("AdamWStep");
#ifdef PO_GPT_CUDA_HAVE_ADAM
  AdamOptions options;
  options.learning_rate = config.learning_rate;
  options.beta1 = config.beta1;
  options.beta2 = config.beta2;
  options.epsilon = config.epsilon;
  options.decoupled_weight_decay = true;
  options.weight_decay = config.weight_decay;
  PO_ASSIGN_OR_RETURN(const AdamStepScalars decayed, MakeAdamStepScalars(options, t, grad_scale));
  options.weight_decay = 0.0f;
  PO_ASSIGN_OR_RETURN(const AdamStepScalars plain, MakeAdamStepScalars(options, t, grad_scale));
  for (const DeviceTensor& tensor : tensors_) {
    AdamSpan span;
    span.param = master_ + tensor.offset;
    span.exp_avg = m_ + tensor.offset;
    span.exp_avg_sq = v_ + tensor.offset;
    span.grad = grad_ + tensor.offset;
    span.param_bf16 = reinterpret_cast<std::uint16_t*>(bf16_ + tensor.offset);
    span.count = tensor.spec.numel();
    PO_RETURN_IF_ERROR(LaunchAdamUpdate(tensor.spec.weight_decay ? decayed : plain, span, stream));
  }
  return absl::OkStatus();
#else
  static_cast<void>(config);
  static_cast<void>(t);
  static_cast<void>(stream);
  static_cast<void>(grad_scale);
  return absl::FailedPreconditionError(
      "this build has no GPU Adam (po_optim_cuda was not found when po_gpt_cuda was configured)");
#endif
}

absl::StatusOr<std::vector<float>> DeviceParameters::DownloadMaster(int local,
                                                                    cudaStream_t stream) const {
  if (master_ == nullptr) return NoStateError("DownloadMaster");
  const DeviceTensor& tensor = tensors_[static_cast<std::size_t>(local)];
  std::vector<float> out(static_cast<std::size_t>(tensor.spec.numel()));
  PO_RETURN_IF_ERROR(
      CopyToHost(out.data(), master_ + tensor.offset, tensor.spec.numel() * 4, stream));
  return out;
}

absl::StatusOr<std::vector<float>> DeviceParameters::DownloadMasters(cudaStream_t stream) const {
  if (tensors_.empty()) return std::vector<float>();
  if (master_ == nullptr) return NoStateError("DownloadMasters");
  std::vector<float> out(static_cast<std::size_t>(padded_));
  PO_RETURN_IF_ERROR(CopyToHost(out.data(), master_, padded_ * 4, stream));
  return out;
}

absl::Status DeviceParameters::DropOptimizerState(cudaStream_t stream) {
  if (state_memory_ == nullptr) return absl::OkStatus();
  PO_RETURN_IF_ERROR(WaitForStream(stream, kWaitSeconds, "dropping the optimizer state"));
  state_memory_.reset();  // cudaFree of the three arrays, on their device
  master_ = m_ = v_ = nullptr;
  dropped_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DeviceParameters::DownloadGrad(int local,
                                                                  cudaStream_t stream) const {
  const DeviceTensor& tensor = tensors_[static_cast<std::size_t>(local)];
  std::vector<float> out(static_cast<std::size_t>(tensor.spec.numel()));
  PO_RETURN_IF_ERROR(
      CopyToHost(out.data(), grad_ + tensor.offset, tensor.spec.numel() * 4, stream));
  return out;
}

absl::StatusOr<std::vector<float>> DeviceParameters::DownloadWeight(int local,
                                                                    cudaStream_t stream) const {
  const DeviceTensor& tensor = tensors_[static_cast<std::size_t>(local)];
  const std::int64_t n = tensor.spec.numel();
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
  PO_RETURN_IF_ERROR(CopyToHost(bits.data(), bf16_ + tensor.offset, n * 2, stream));
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    out[static_cast<std::size_t>(i)] = Bf16BitsToFloat(bits[static_cast<std::size_t>(i)]);
  }
  return out;
}

}  // namespace pipeoffload::gpt::cuda
