// LlamaCudaModel: creation and allocation, microbatch staging (host sampling, row indexes, one
// upload per step), call validation and the dispatch of each UnitCall to LlamaCudaUnits, and
// the step's loss (see llama_cuda_model.h for the invariants).
#include "examples/llama/cuda/llama_cuda_model.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/llama/cuda/llama_cuda_kernels.h"
#include "examples/llama/llama_cpu_model.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload::llama::cuda {
namespace {


std::int64_t MicrobatchInts(int N) {
  const std::int64_t ints = 2 * std::int64_t{N} + TokenRowIndexInts(N);
  return (ints + 63) / 64 * 64;
}

// The one device block: every microbatch's ints (tokens, targets, row index) and loss sums.
std::int64_t DeviceBlockBytes(std::int64_t N, int max_microbatches) {
  return max_microbatches * (MicrobatchInts(static_cast<int>(N)) * 4 +
                             static_cast<std::int64_t>(sizeof(double)));
}

}  // namespace

LlamaCudaModel::LlamaCudaModel(Backend& backend, const LlamaConfig& config, const TokenData& data,
                               const LlamaCudaModelOptions& options, cudaStream_t stream,
                               int device)
    : backend_(backend),
      config_(config),
      data_(&data),
      options_(options),
      stream_(stream),
      device_(device),
      N_(options.batch_size * options.seq_len),
      mb_ints_(MicrobatchInts(options.batch_size * options.seq_len)) {}

absl::StatusOr<std::unique_ptr<LlamaCudaModel>> LlamaCudaModel::Create(
    Backend& backend, const LlamaConfig& config, const TokenData& data,
    const LlamaCudaModelOptions& options) {
  PO_ASSIGN_OR_RETURN(const cudaStream_t stream, CudaComputeStream(backend));
  PO_ASSIGN_OR_RETURN(const int device, CudaBackendDevice(backend));
  PO_RETURN_IF_ERROR(ValidateLlamaConfig(config));
  auto bad = [](const char* field, double value, const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama cuda model: ", field, " = ", value, ": ", why));
  };
  if (options.batch_size < 1) return bad("batch_size", options.batch_size, "must be >= 1");
  if (options.seq_len < 1) return bad("seq_len", options.seq_len, "must be >= 1");
  if (options.max_microbatches < 1) {
    return bad("max_microbatches", options.max_microbatches, "must be >= 1");
  }
  if (std::int64_t{options.batch_size} * options.seq_len > std::numeric_limits<int>::max() / 8) {
    return bad("batch_size * seq_len",
               static_cast<double>(std::int64_t{options.batch_size} * options.seq_len),
               "too many rows");
  }
  if (!(options.timeout_seconds > 0.0)) {
    return bad("timeout_seconds", options.timeout_seconds, "must be > 0");
  }
  PO_RETURN_IF_ERROR(data.CheckCompatible(config.vocab_size, options.seq_len));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device));
  std::unique_ptr<LlamaCudaModel> model(
      new LlamaCudaModel(backend, config, data, options, stream, device));
  PO_ASSIGN_OR_RETURN(model->units_,
                      LlamaCudaUnits::Create(config, options.batch_size, options.seq_len,
                                             options.ce_chunk_rows, device, stream));
  PO_RETURN_IF_ERROR(model->Allocate());

  PO_ASSIGN_OR_RETURN(model->shape_, PlanShape(config, options));
  return model;
}

absl::StatusOr<SlidingModelShape> LlamaCudaModel::PlanShape(const LlamaConfig& config,
                                                            const LlamaCudaModelOptions& options) {
  PO_ASSIGN_OR_RETURN(const LlamaCudaWorkspaces plan,
                      LlamaCudaUnits::PlanWorkspaces(config, options.batch_size, options.seq_len,
                                                     options.ce_chunk_rows));
  SlidingModelShape shape;
  shape.units = LlamaUnitShapes(config);
  for (int u = 0; u < NumUnits(config); ++u) {
    shape.units[u].workspace_bytes = u == EmbeddingUnit()     ? 0
                                     : u == HeadUnit(config) ? plan.head.bytes
                                                             : plan.decoder.bytes;
  }
  const std::int64_t N = std::int64_t{options.batch_size} * options.seq_len;
  shape.param_dtype = SlideDtype::kBf16;
  shape.activation_bytes = N * config.hidden_size * 2;
  shape.model_device_bytes = DeviceBlockBytes(N, options.max_microbatches) + plan.device_bytes;
  return shape;
}

absl::Status LlamaCudaModel::Allocate() {
  const std::int64_t slots = options_.max_microbatches;
  const std::int64_t ints_bytes = slots * mb_ints_ * 4;
  device_block_bytes_ = DeviceBlockBytes(N_, options_.max_microbatches);  // ints, then losses
  PO_ASSIGN_OR_RETURN(device_block_, backend_.AllocateDevice(device_block_bytes_));
  PO_ASSIGN_OR_RETURN(host_block_, backend_.AllocateHost(device_block_bytes_));
  device_ints_ = static_cast<std::int32_t*>(device_block_);
  device_losses_ = reinterpret_cast<double*>(static_cast<std::byte*>(device_block_) + ints_bytes);
  host_ints_ = static_cast<std::int32_t*>(host_block_);
  host_losses_ = reinterpret_cast<double*>(static_cast<std::byte*>(host_block_) + ints_bytes);
  std::memset(host_block_, 0, static_cast<std::size_t>(device_block_bytes_));
  PO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
  PO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&losses_ready_, cudaEventDisableTiming));
  segments_.assign(static_cast<std::size_t>(slots), 0);
  has_loss_.assign(static_cast<std::size_t>(slots), 0);
  return absl::OkStatus();
}

LlamaCudaModel::~LlamaCudaModel() {
  internal::ScopedDevice guard;
  if (!guard.Enter(device_).ok()) return;
  static_cast<void>(gpt::cuda::WaitForStream(stream_, options_.timeout_seconds, "~LlamaCudaModel"));
  units_.reset();
  if (uploaded_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(uploaded_));
  if (losses_ready_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaEventDestroy(losses_ready_));
  if (device_block_ != nullptr) backend_.FreeDevice(device_block_);
  if (host_block_ != nullptr) backend_.FreeHost(host_block_);
}

absl::Status LlamaCudaModel::WaitEvent(cudaEvent_t event, const char* what) const {
  PO_ASSIGN_OR_RETURN(const bool done, internal::PollUntil(
                                           [event]() -> absl::StatusOr<bool> {
                                             const cudaError_t error = cudaEventQuery(event);
                                             if (error == cudaErrorNotReady) return false;
                                             PO_CUDA_RETURN_IF_ERROR(error);
                                             return true;
                                           },
                                           options_.timeout_seconds));
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat("llama cuda model: ", what, " not done after ",
                                                    options_.timeout_seconds, " s"));
  }
  return absl::OkStatus();
}

absl::Status LlamaCudaModel::BeginStep(std::int64_t step, int num_microbatches) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama cuda model: BeginStep: step = ", step, ": must be >= 0"));
  }
  if (num_microbatches < 1 || num_microbatches > options_.max_microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama cuda model: BeginStep: num_microbatches = ", num_microbatches,
                     ": must be in [1, max_microbatches = ", options_.max_microbatches, "]"));
  }
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  // The previous step's upload read the staging we are about to overwrite.
  PO_RETURN_IF_ERROR(WaitEvent(uploaded_, "the previous step's token upload"));
  for (int mb = 0; mb < num_microbatches; ++mb) {
    std::int32_t* ints = host_ints_ + mb * mb_ints_;  // tokens (N) | targets (N) | index
    data_->Microbatch(options_.data_seed, step, mb, options_.batch_size, options_.seq_len, ints,
                      ints + N_);
    const TokenRowIndex index = BuildTokenRowIndex(ints, N_);
    std::copy(index.ints.begin(), index.ints.end(), ints + 2 * std::int64_t{N_});
    segments_[mb] = index.segments;
  }
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_ints_, host_ints_,
                                          static_cast<std::size_t>(num_microbatches * mb_ints_ * 4),
                                          cudaMemcpyHostToDevice, stream_));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_, stream_));
  num_microbatches_ = num_microbatches;
  std::fill(has_loss_.begin(), has_loss_.end(), 0);
  return absl::OkStatus();
}

absl::Status LlamaCudaModel::CheckCall(const UnitCall& call, bool backward) const {
  return CheckUnitCall(shape_, call, backward, num_microbatches_, "llama cuda model");
}

absl::Status LlamaCudaModel::Forward(const UnitCall& call) {
  PO_RETURN_IF_ERROR(CheckCall(call, /*backward=*/false));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const auto* params = static_cast<const bf16*>(call.params);
  auto* out = static_cast<bf16*>(call.output);
  if (call.unit == EmbeddingUnit()) {
    return units_->EmbeddingForward(params, device_ints_ + call.mb * mb_ints_, out);
  }
  return units_->DecoderForward(params, static_cast<const bf16*>(call.input), out, call.workspace);
}

absl::Status LlamaCudaModel::Backward(const UnitCall& call) {
  PO_RETURN_IF_ERROR(CheckCall(call, /*backward=*/true));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const auto* params = static_cast<const bf16*>(call.params);
  const auto* input = static_cast<const bf16*>(call.input);
  const auto* dout = static_cast<const bf16*>(call.grad_output);
  auto* dx = static_cast<bf16*>(call.grad_input);
  const std::int32_t* ints = device_ints_ + call.mb * mb_ints_;  // tokens | targets | index
  if (call.unit == EmbeddingUnit()) {
    return units_->EmbeddingBackward(ints + 2 * std::int64_t{N_}, segments_[call.mb], dout,
                                     call.grad_accum);
  }
  if (call.unit == HeadUnit(config_)) {
    // The step's objective is the mean over its M * N tokens (LlamaCpuModel's scale).
    const float grad_scale =
        static_cast<float>(1.0 / (static_cast<double>(num_microbatches_) * N_));
    PO_RETURN_IF_ERROR(units_->HeadLossBackward(params, input, ints + N_, grad_scale, dx,
                                                call.grad_accum, device_losses_ + call.mb,
                                                call.workspace));
    has_loss_[call.mb] = 1;
    return absl::OkStatus();
  }
  return units_->DecoderBackward(params, input, dout, dx, call.grad_accum, call.workspace);
}

absl::StatusOr<double> LlamaCudaModel::StepLoss() {
  if (num_microbatches_ == 0) {
    return absl::FailedPreconditionError("llama cuda model: StepLoss before BeginStep");
  }
  for (int mb = 0; mb < num_microbatches_; ++mb) {
    if (!has_loss_[mb]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "llama cuda model: StepLoss: the head's Backward of mb ", mb, " has not run"));
    }
  }
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      host_losses_, device_losses_, static_cast<std::size_t>(num_microbatches_) * sizeof(double),
      cudaMemcpyDeviceToHost, stream_));
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(losses_ready_, stream_));
  PO_RETURN_IF_ERROR(WaitEvent(losses_ready_, "the loss download"));
  double sum = 0.0;
  for (int mb = 0; mb < num_microbatches_; ++mb) sum += host_losses_[mb];
  return sum / (static_cast<double>(num_microbatches_) * N_);
}

}  // namespace pipeoffload::llama::cuda
