// GptCudaStageModel (see gpt_cuda_stage_model.h). Invariants:
//  - Every CUDA call runs with the backend's device current (ScopedDevice) and enqueues on
//    the backend's compute stream, so the executor's events order it with offload copies.
//  - All device memory is allocated in Create (through the context's DeviceAllocations) and
//    freed after the destructor has waited for the stream; nothing allocates per step.
//  - tokens_/targets_/losses_ hold microbatch mb at offset mb * N; they are rewritten only by
//    StartIteration, on the stream, so kernels of the previous step that read them are done.
//  - Created without optimizer state: no chunk holds a master, m or v once Create returns
//    (initial_masters_ has one host copy per chunk instead, until taken); DropOptimizerState
//    brings a model created with it to the same place, without the host copies.
#include "examples/gpt/cuda/gpt_cuda_stage_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/optimizer_schedule.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload::gpt::cuda {
namespace {

constexpr double kWaitSeconds = 120.0;

}  // namespace

absl::StatusOr<std::unique_ptr<GptCudaStageModel>> GptCudaStageModel::Create(
    Backend& backend, const GptConfig& config, int num_stages, int chunks_per_stage, int stage,
    std::shared_ptr<const GptData> data, const GptCudaStageOptions& options) {
  PO_RETURN_IF_ERROR(ValidateGptConfig(config));
  PO_RETURN_IF_ERROR(ValidatePipelineShape(num_stages, chunks_per_stage, stage));
  PO_RETURN_IF_ERROR(ValidatePlacement(options.placement, chunks_per_stage));
  if (data == nullptr) return absl::InvalidArgumentError("GptCudaStageModel needs a data source");
  PO_RETURN_IF_ERROR(data->CheckCompatible(config));
  PO_ASSIGN_OR_RETURN(const int device, CudaBackendDevice(backend));
  PO_ASSIGN_OR_RETURN(cudaStream_t stream, CudaComputeStream(backend));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device));
  std::unique_ptr<GptCudaStageModel> model(
      new GptCudaStageModel(backend, config, num_stages, stage, std::move(data), device, stream));
  LayerDims dims{config.batch_size, config.seq_len, config.n_embd, config.n_head};
  dims.lean_saved = options.lean_saved;
  dims.lean_scratch = options.recompute;
  PO_ASSIGN_OR_RETURN(model->context_, GptCudaContext::Create(dims, device, stream));
  const VirtualStageMap map{options.placement, num_stages, chunks_per_stage};
  for (int c = 0; c < chunks_per_stage; ++c) {
    PO_ASSIGN_OR_RETURN(std::unique_ptr<GptCudaChunk> chunk,
                        GptCudaChunk::CreateGpt(config, map.virtual_stage(stage, c),
                                                map.num_virtual_stages(), *model->context_));
    if (!options.with_optimizer_state) {
      // CreateGpt always allocates the state to upload the init: keep the masters on the host
      // and give the GPU memory back before the next chunk takes its own.
      PO_ASSIGN_OR_RETURN(std::vector<float> masters, chunk->params().DownloadMasters(stream));
      PO_RETURN_IF_ERROR(chunk->params().DropOptimizerState(stream));
      model->initial_masters_.push_back(std::move(masters));
      model->masters_taken_.push_back(false);
    }
    model->chunks_.push_back(std::move(chunk));
  }
  const std::int64_t mn = std::int64_t{config.num_microbatches} * dims.N();
  DeviceAllocations& memory = model->context_->allocations();
  PO_ASSIGN_OR_RETURN(model->tokens_, memory.AllocateArray<std::int32_t>(mn));
  PO_ASSIGN_OR_RETURN(model->targets_, memory.AllocateArray<std::int32_t>(mn));
  PO_ASSIGN_OR_RETURN(model->losses_, memory.AllocateArray<float>(mn));
  if (options.recompute) {
    std::int64_t workspace = 0;
    for (const auto& c : model->chunks_)
      workspace = std::max(workspace, c->ForwardWorkspaceBytes());
    PO_ASSIGN_OR_RETURN(void* block, memory.Allocate(std::max<std::int64_t>(workspace, 256)));
    model->recompute_workspace_ = static_cast<std::byte*>(block);
    PO_ASSIGN_OR_RETURN(model->recompute_output_,
                        memory.AllocateArray<bf16>(std::int64_t{dims.N()} * dims.C));
    PO_ASSIGN_OR_RETURN(model->recompute_losses_, memory.AllocateArray<float>(dims.N()));
  }
  model->host_tokens_.resize(static_cast<std::size_t>(mn));
  model->host_targets_.resize(static_cast<std::size_t>(mn));
  PO_RETURN_IF_ERROR(WaitForStream(stream, kWaitSeconds, "GptCudaStageModel::Create"));
  return model;
}

GptCudaStageModel::GptCudaStageModel(Backend& backend, const GptConfig& config, int num_stages,
                                     int stage, std::shared_ptr<const GptData> data, int device,
                                     cudaStream_t stream)
    : backend_(backend),
      config_(config),
      num_stages_(num_stages),
      stage_(stage),
      num_tensors_(static_cast<int>(GptTensorSpecs(config).size())),
      data_(std::move(data)),
      device_(device),
      stream_(stream) {}

GptCudaStageModel::~GptCudaStageModel() {
  internal::ScopedDevice guard;
  if (!guard.Enter(device_).ok()) return;
  // Teardown: queued kernels may still use our buffers.
  static_cast<void>(WaitForStream(stream_, kWaitSeconds, "~GptCudaStageModel"));
  chunks_.clear();
  context_.reset();
}

std::int64_t GptCudaStageModel::SavedBytes(int chunk, bool split_backward) const {
  if (chunk < 0 || chunk >= chunks_per_stage()) return 0;
  return chunks_[static_cast<std::size_t>(chunk)]->SavedBytes(split_backward);
}

std::int64_t GptCudaStageModel::BoundaryBytes() const {
  return std::int64_t{config_.batch_size} * config_.seq_len * config_.n_embd * 2;
}

absl::Status GptCudaStageModel::CheckCall(const char* op, int mb, int chunk,
                                          const void* saved) const {
  if (mb < 0 || mb >= config_.num_microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": mb ", mb, " is out of range [0, ", config_.num_microbatches, ")"));
  }
  PO_RETURN_IF_ERROR(CheckChunk(op, chunk));
  if (saved == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": saved is null"));
  if (step_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": StartIteration was not called before the first compute op"));
  }
  return absl::OkStatus();
}

absl::Status GptCudaStageModel::Forward(int mb, int chunk, const void* input, void* output,
                                        void* saved) {
  PO_RETURN_IF_ERROR(CheckCall("Forward", mb, chunk, saved));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const std::int64_t at = std::int64_t{mb} * context_->dims().N();
  GptCudaChunk& c = *chunks_[static_cast<std::size_t>(chunk)];
  lean_entries_.Forget(mb, chunk);  // a fresh entry in the full layout
  return Annotate(
      c.Forward(tokens_ + at, targets_ + at, static_cast<const bf16*>(input),
                static_cast<bf16*>(output), static_cast<std::byte*>(saved), losses_ + at),
      absl::StrCat("Forward(mb ", mb, ", chunk ", chunk, ")"));
}

absl::Status GptCudaStageModel::Backward(int mb, int chunk, const void* grad_output,
                                         void* grad_input, void* saved, bool with_weight_grad) {
  PO_RETURN_IF_ERROR(CheckCall("Backward", mb, chunk, saved));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  // d(objective)/d(token loss): the mean over m microbatches of each one's mean over N tokens.
  const double tokens = static_cast<double>(config_.batch_size) * config_.seq_len;
  const float dloss = static_cast<float>(1.0 / (tokens * config_.num_microbatches));
  return Annotate(chunks_[static_cast<std::size_t>(chunk)]->Backward(
                      static_cast<const bf16*>(grad_output), static_cast<bf16*>(grad_input),
                      static_cast<std::byte*>(saved), with_weight_grad, dloss,
                      lean_entries_.Take(mb, chunk)),
                  absl::StrCat("Backward(mb ", mb, ", chunk ", chunk, ")"));
}

absl::Status GptCudaStageModel::BackwardWeight(int mb, int chunk, void* saved) {
  PO_RETURN_IF_ERROR(CheckCall("BackwardWeight", mb, chunk, saved));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  lean_entries_.Forget(mb, chunk);  // W ends the entry
  return Annotate(
      chunks_[static_cast<std::size_t>(chunk)]->BackwardWeight(static_cast<std::byte*>(saved)),
      absl::StrCat("BackwardWeight(mb ", mb, ", chunk ", chunk, ")"));
}

std::int64_t GptCudaStageModel::RetainedBytes(int chunk, Recompute mode,
                                              bool /*split_backward*/) const {
  // W's inputs are B's outputs: never part of what F keeps.
  if (recompute_workspace_ == nullptr || chunk < 0 || chunk >= chunks_per_stage()) return -1;
  return chunks_[static_cast<std::size_t>(chunk)]->RetainedBytes(mode);
}

bool GptCudaStageModel::BackwardReadsRetained(int chunk, Recompute mode,
                                              bool split_backward) const {
  return mode == Recompute::kLean && !split_backward && RetainedBytes(chunk, mode, false) > 0 &&
         chunks_[static_cast<std::size_t>(chunk)]->BackwardReadsLean();
}

absl::Status GptCudaStageModel::ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                                 void* retained, Recompute mode) {
  PO_RETURN_IF_ERROR(CheckCall("ForwardRetaining", mb, chunk, retained));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const std::int64_t at = std::int64_t{mb} * context_->dims().N();
  lean_entries_.Wrote(mb, chunk, mode == Recompute::kLean);
  return Annotate(
      chunks_[static_cast<std::size_t>(chunk)]->ForwardRetaining(
          tokens_ + at, targets_ + at, static_cast<const bf16*>(input), static_cast<bf16*>(output),
          static_cast<std::byte*>(retained), losses_ + at, mode, recompute_workspace_),
      absl::StrCat("ForwardRetaining(mb ", mb, ", chunk ", chunk, ", ", RecomputeName(mode), ")"));
}

absl::Status GptCudaStageModel::RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                                               Recompute mode) {
  PO_RETURN_IF_ERROR(CheckCall("RecomputeSaved", mb, chunk, saved));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  lean_entries_.Forget(mb, chunk);  // B reads the rebuilt full entry
  return Annotate(
      chunks_[static_cast<std::size_t>(chunk)]->RecomputeSaved(
          static_cast<const std::byte*>(retained), static_cast<std::byte*>(saved), mode,
          recompute_output_, recompute_losses_),
      absl::StrCat("RecomputeSaved(mb ", mb, ", chunk ", chunk, ", ", RecomputeName(mode), ")"));
}

absl::Status GptCudaStageModel::StartIteration(std::int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("StartIteration: step ", step, " < 0"));
  }
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  step_ = step;
  lean_entries_.Clear();
  for (auto& c : chunks_) PO_RETURN_IF_ERROR(c->params().ZeroGrads(stream_));
  const bool needs_data = chunks_.front()->is_first() || chunks_.back()->is_last();
  if (!needs_data) return absl::OkStatus();
  const int n = context_->dims().N();
  for (int mb = 0; mb < config_.num_microbatches; ++mb) {
    const std::size_t at = static_cast<std::size_t>(mb) * static_cast<std::size_t>(n);
    data_->Microbatch(config_.seed, step, mb, config_.batch_size, config_.seq_len,
                      host_tokens_.data() + at, host_targets_.data() + at);
  }
  // From pageable memory: the call returns once the bytes are staged, so the host vectors
  // may be refilled next step; the device buffers are written in stream order.
  const std::size_t bytes = host_tokens_.size() * sizeof(std::int32_t);
  PO_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(tokens_, host_tokens_.data(), bytes, cudaMemcpyHostToDevice, stream_));
  PO_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(targets_, host_targets_.data(), bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status GptCudaStageModel::OptimizerStep(float grad_scale) {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  if (!has_optimizer_state() && holds_parameters()) return NoOptimizerStateError("OptimizerStep");
  if (!std::isfinite(grad_scale) || !(grad_scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("OptimizerStep on stage ", stage_,
                                                   ": grad_scale = ", grad_scale,
                                                   " must be finite and > 0"));
  }
  // The step counts once every chunk took it.
  const std::int64_t t = optimizer_steps_ + 1;
  AdamWConfig adamw = config_.optimizer;
  adamw.learning_rate = LearningRateAt(config_.optimizer, t);
  for (auto& c : chunks_) {
    PO_RETURN_IF_ERROR(Annotate(c->params().AdamWStep(adamw, t, stream_, grad_scale),
                                absl::StrCat("OptimizerStep on stage ", stage_)));
  }
  optimizer_steps_ = t;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorSquareSum>> GptCudaStageModel::GradSquareSums() const {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  std::vector<TensorSquareSum> sums;
  for (const auto& c : chunks_) {
    PO_ASSIGN_OR_RETURN(std::vector<TensorSquareSum> part, c->params().GradSquareSums(stream_));
    sums.insert(sums.end(), part.begin(), part.end());
  }
  return sums;
}

absl::Status GptCudaStageModel::CheckChunk(const char* op, int chunk) const {
  if (chunk < 0 || chunk >= chunks_per_stage()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": chunk ", chunk, " is out of range [0, ",
                                                   chunks_per_stage(), ") on stage ", stage_));
  }
  return absl::OkStatus();
}

bool GptCudaStageModel::holds_parameters() const {
  for (const auto& c : chunks_) {
    if (!c->params().tensors().empty()) return true;
  }
  return false;
}

absl::Status GptCudaStageModel::NoOptimizerStateError(const char* op) const {
  return absl::FailedPreconditionError(absl::StrCat(
      op, ": stage ", stage_, " keeps no optimizer state on the GPU (",
      initial_masters_.empty() ? "dropped by DropOptimizerState" : "created without it",
      "): an optimizer-offload engine owns the fp32 master, m and v; read them there"));
}

bool GptCudaStageModel::has_optimizer_state() const {
  for (const auto& c : chunks_) {
    if (c->params().has_optimizer_state()) return true;
  }
  return false;
}

std::int64_t GptCudaStageModel::optimizer_state_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& c : chunks_) bytes += c->params().optimizer_state_bytes();
  return bytes;
}

std::int64_t GptCudaStageModel::device_bytes() const {
  return context_->allocations().total_bytes() + optimizer_state_bytes();
}

absl::Status GptCudaStageModel::DropOptimizerState() {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  for (auto& c : chunks_) PO_RETURN_IF_ERROR(c->params().DropOptimizerState(stream_));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> GptCudaStageModel::TakeInitialMasters(int chunk) {
  PO_RETURN_IF_ERROR(CheckChunk("TakeInitialMasters", chunk));
  if (initial_masters_.empty()) {
    return absl::FailedPreconditionError(
        "TakeInitialMasters: the model was created with its optimizer state on the GPU; read "
        "the masters with DownloadMasters");
  }
  const auto c = static_cast<std::size_t>(chunk);
  if (masters_taken_[c]) {
    return absl::FailedPreconditionError(
        absl::StrCat("TakeInitialMasters: chunk ", chunk, "'s masters were already taken"));
  }
  masters_taken_[c] = true;
  return std::exchange(initial_masters_[c], std::vector<float>());
}

absl::StatusOr<std::vector<float>> GptCudaStageModel::DownloadMasters(int chunk) const {
  PO_RETURN_IF_ERROR(CheckChunk("DownloadMasters", chunk));
  if (!has_optimizer_state() && holds_parameters()) return NoOptimizerStateError("DownloadMasters");
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  return chunks_[static_cast<std::size_t>(chunk)]->params().DownloadMasters(stream_);
}

bool GptCudaStageModel::holds_loss() const { return chunks_.back()->is_last(); }

absl::Status GptCudaStageModel::Synchronize(double timeout_seconds) const {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  return WaitForStream(stream_, timeout_seconds, "GptCudaStageModel::Synchronize");
}

absl::StatusOr<std::vector<double>> GptCudaStageModel::Losses() const {
  if (!holds_loss()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", stage_, " does not hold the last virtual stage's loss"));
  }
  PO_RETURN_IF_ERROR(Synchronize());
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const std::int64_t n = context_->dims().N();
  std::vector<float> all(static_cast<std::size_t>(n * config_.num_microbatches));
  PO_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(all.data(), losses_, all.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<double> means;
  for (int mb = 0; mb < config_.num_microbatches; ++mb) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < n; ++i) sum += all[static_cast<std::size_t>(mb * n + i)];
    means.push_back(sum / static_cast<double>(n));
  }
  return means;
}

absl::StatusOr<std::pair<const GptCudaChunk*, int>> GptCudaStageModel::FindTensor(int id) const {
  for (const auto& c : chunks_) {
    const int local = c->params().Find(id);
    if (local >= 0) return std::pair<const GptCudaChunk*, int>{c.get(), local};
  }
  return absl::NotFoundError(absl::StrCat("tensor ", id, " is not on stage ", stage_));
}

absl::StatusOr<std::vector<float>> GptCudaStageModel::DownloadMaster(int id) const {
  PO_ASSIGN_OR_RETURN(auto found, FindTensor(id));
  if (!has_optimizer_state()) return NoOptimizerStateError("DownloadMaster");
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  return found.first->params().DownloadMaster(found.second, stream_);
}

absl::StatusOr<std::vector<float>> GptCudaStageModel::DownloadWeight(int id) const {
  PO_ASSIGN_OR_RETURN(auto found, FindTensor(id));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  return found.first->params().DownloadWeight(found.second, stream_);
}

absl::StatusOr<std::vector<float>> GptCudaStageModel::DownloadGrad(int id) const {
  PO_ASSIGN_OR_RETURN(auto found, FindTensor(id));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  return found.first->params().DownloadGrad(found.second, stream_);
}

absl::StatusOr<std::vector<TensorHash>> GptCudaStageModel::ParameterHashes() const {
  std::vector<TensorHash> hashes;
  for (const auto& c : chunks_) {
    for (int local = 0; local < static_cast<int>(c->params().tensors().size()); ++local) {
      PO_ASSIGN_OR_RETURN(
          std::vector<float> values,
          DownloadMaster(c->params().tensors()[static_cast<std::size_t>(local)].id));
      hashes.push_back(
          {c->params().tensors()[static_cast<std::size_t>(local)].id,
           Fnv1a64(values.data(), static_cast<std::int64_t>(values.size() * sizeof(float)))});
    }
  }
  return hashes;
}

}  // namespace pipeoffload::gpt::cuda
