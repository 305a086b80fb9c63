// The CUDA TrainStage (see train_stage_cuda.h). Invariants:
//  - Every CUDA call runs with the backend's device current (ScopedDevice) and everything the
//    stage enqueues goes on the backend's compute stream, after the model's kernels.
//  - With optimizer offload, the engines own the fp32 master, m and v: the model's own master
//    is never read (hashes come from the engines), and the model's OptimizerStep is never
//    called, so its GPU AdamW never runs.
//  - Each engine gets every gradient of its chunk exactly once per step, as one range (so its
//    gradient norm is exactly reproducible).
#include "examples/gpt/train_cuda/train_stage_cuda.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/gpt/cuda/gpt_cuda_stage_model.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda_stream.h"
#include "pipeoffload/optimizer_offload.h"

namespace pipeoffload::gpt {
namespace {

using cuda::bf16;
using cuda::DeviceParameters;
using cuda::GptCudaStageModel;

// One chunk's optimizer-offload engine and its bf16 gradient scratch.
struct ChunkEngine {
  int chunk = 0;
  const DeviceParameters* params = nullptr;
  bf16* grad_bf16 = nullptr;  // padded_elements, from the stage's allocations
  std::unique_ptr<OptimizerOffload> engine;
};

absl::StatusOr<OffloadMode> EngineMode(TrainOptimizerOffload offload) {
  switch (offload) {
    case TrainOptimizerOffload::kCpu:
      return OffloadMode::kCpu;
    case TrainOptimizerOffload::kInterleaved:
      return OffloadMode::kInterleaved;
    case TrainOptimizerOffload::kStatic:
      return OffloadMode::kStatic;
    case TrainOptimizerOffload::kNone:
      break;
  }
  return absl::InvalidArgumentError("no optimizer-offload engine for --optimizer-offload none");
}

class CudaTrainStage final : public TrainStage {
 public:
  CudaTrainStage(const TrainOptions& options, Backend& backend, int device, cudaStream_t stream,
                 std::unique_ptr<GptCudaStageModel> model)
      : options_(options),
        backend_(backend),
        device_(device),
        stream_(stream),
        model_(std::move(model)),
        scratch_(device) {}

  ~CudaTrainStage() override {
    // The scratch may still be read by the engines' queued work: wait before it is freed.
    static_cast<void>(model_->Synchronize(options_.watchdog_seconds));
    engines_.clear();
  }

  // Creates one engine per chunk that holds parameters (a chunk without layers holds none).
  absl::Status CreateEngines(int cpu_threads) {
    PO_ASSIGN_OR_RETURN(const OffloadMode mode, EngineMode(options_.optimizer_offload));
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    const AdamWConfig& adamw = model_->config().optimizer;
    for (int c = 0; c < model_->chunks_per_stage(); ++c) {
      const DeviceParameters& params = model_->chunk(c).params();
      const std::int64_t n = params.padded_elements();
      if (n == 0) continue;
      if (params.tensors().front().offset != 0) {
        return absl::InternalError("the chunk's first tensor does not start its arrays");
      }
      // The fp32 masters the model was created with, padding zero (its Adam keeps it zero).
      std::vector<float> initial(static_cast<std::size_t>(n), 0.0f);
      for (const cuda::DeviceTensor& tensor : params.tensors()) {
        PO_ASSIGN_OR_RETURN(std::vector<float> master, model_->DownloadMaster(tensor.id));
        std::copy(master.begin(), master.end(),
                  initial.begin() + static_cast<std::ptrdiff_t>(tensor.offset));
      }
      OptimizerOffloadOptions engine_options;
      engine_options.num_params = n;
      engine_options.subgroup_size = std::min(options_.optimizer_subgroup, n);
      engine_options.mode = mode;
      engine_options.gpu_share = options_.gpu_share;
      engine_options.adam.learning_rate = adamw.learning_rate;
      engine_options.adam.beta1 = adamw.beta1;
      engine_options.adam.beta2 = adamw.beta2;
      engine_options.adam.epsilon = adamw.epsilon;
      engine_options.adam.weight_decay = 0.0f;  // refused with offload (train_options.cc)
      engine_options.adam.decoupled_weight_decay = true;
      engine_options.cpu.threads = cpu_threads;
      engine_options.device = device_;
      engine_options.timeout_seconds = std::max(600.0, options_.watchdog_seconds);
      // The working copy the kernels read: the engine rewrites it in place at every step.
      auto* weights = reinterpret_cast<std::uint16_t*>(const_cast<bf16*>(params.weight(0)));
      absl::StatusOr<std::unique_ptr<OptimizerOffload>> engine = OptimizerOffload::Create(
          engine_options, initial, std::span<std::uint16_t>(weights, static_cast<std::size_t>(n)));
      if (!engine.ok()) {
        return Annotate(engine.status(),
                        absl::StrCat("optimizer offload of chunk ", c, " (", n, " parameters)"));
      }
      ChunkEngine entry;
      entry.chunk = c;
      entry.params = &params;
      PO_ASSIGN_OR_RETURN(entry.grad_bf16, scratch_.AllocateArray<bf16>(n));
      entry.engine = *std::move(engine);
      engines_.push_back(std::move(entry));
    }
    return absl::OkStatus();
  }

  StageModel& model() override { return *model_; }
  Backend& backend() override { return backend_; }

  absl::Status StartIteration(std::int64_t step) override { return model_->StartIteration(step); }
  absl::Status FinishIteration(double timeout_seconds) override {
    return backend_.Synchronize(timeout_seconds);
  }
  bool holds_loss() const override { return model_->holds_loss(); }
  absl::StatusOr<std::vector<double>> Losses() override { return model_->Losses(); }
  absl::Status ExchangeTiedGrad(TrainGroup&) override { return absl::OkStatus(); }

  absl::Status OptimizerStep() override {
    const double start = backend_.NowSeconds();
    absl::Status status = offloaded() ? OffloadedStep() : GpuStep();
    last_optimizer_seconds_ = backend_.NowSeconds() - start;
    return status;
  }
  double last_optimizer_seconds() const override { return last_optimizer_seconds_; }

  absl::StatusOr<std::vector<TensorHash>> ParameterHashes() override {
    if (!offloaded()) return model_->ParameterHashes();
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    std::vector<TensorHash> hashes;
    for (ChunkEngine& entry : engines_) {
      for (const cuda::DeviceTensor& tensor : entry.params->tensors()) {
        std::vector<float> values(static_cast<std::size_t>(tensor.spec.numel()));
        PO_RETURN_IF_ERROR(entry.engine->ReadState(tensor.offset, tensor.spec.numel(),
                                                   values.data(), nullptr, nullptr));
        hashes.push_back({tensor.id, Fnv1a64(values.data(), static_cast<std::int64_t>(
                                                                values.size() * sizeof(float)))});
      }
    }
    return hashes;
  }
  int num_tensors() const override { return model_->num_tensors(); }

  // The model's device memory (weights, gradients, its own AdamW state, scratch, token
  // buffers) plus the engines' device state, gradients and scratch and our bf16 gradients.
  std::int64_t ModelStateBytes() const override {
    std::int64_t bytes = model_->device_bytes() + scratch_.total_bytes();
    for (const ChunkEngine& entry : engines_) {
      const OptimizerMemory memory = entry.engine->memory();
      bytes += memory.device_state_bytes + memory.device_grad_bytes + memory.device_scratch_bytes;
    }
    return bytes;
  }

  std::string Describe() const override {
    std::string text = absl::StrCat(backend_.Name(), ", bf16 GPT; ", model_->device_bytes(),
                                    " B of model memory on the GPU");
    if (!offloaded()) return absl::StrCat(text, "; AdamW state on the GPU");
    std::int64_t pinned = 0, device_state = 0, subgroups = 0, on_gpu = 0;
    for (const ChunkEngine& entry : engines_) {
      const OptimizerMemory memory = entry.engine->memory();
      pinned += memory.pinned_host_bytes;
      device_state +=
          memory.device_state_bytes + memory.device_grad_bytes + memory.device_scratch_bytes;
      subgroups += entry.engine->num_subgroups();
      for (SubgroupPlace place : entry.engine->placement()) on_gpu += place != SubgroupPlace::kCpu;
    }
    absl::StrAppend(&text, "; optimizer offload ",
                    TrainOptimizerOffloadName(options_.optimizer_offload), ": ", engines_.size(),
                    " engine(s), ", subgroups, " subgroups (", on_gpu, " on the GPU), pinned host ",
                    pinned, " B, GPU optimizer memory ", device_state, " B");
    return text;
  }

 private:
  bool offloaded() const { return options_.optimizer_offload != TrainOptimizerOffload::kNone; }

  // GPU AdamW (the model's), waited for so its time is counted here.
  absl::Status GpuStep() {
    PO_RETURN_IF_ERROR(model_->OptimizerStep());
    return model_->Synchronize(options_.watchdog_seconds);
  }

  // Every chunk's fp32 gradients rounded to bf16 and handed over, then every engine's step.
  absl::Status OffloadedStep() {
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    for (ChunkEngine& entry : engines_) {
      const std::int64_t n = entry.params->padded_elements();
      PO_RETURN_IF_ERROR(cuda::Fp32ToBf16(entry.grad_bf16, entry.params->grad(0), n, stream_));
      PO_RETURN_IF_ERROR(entry.engine->AddGradients(
          reinterpret_cast<const std::uint16_t*>(entry.grad_bf16), 0, n, stream_));
    }
    for (ChunkEngine& entry : engines_) {
      PO_ASSIGN_OR_RETURN(const OptimizerStepResult result, entry.engine->Step(1.0f, stream_));
      if (!result.applied) {
        return absl::DataLossError(absl::StrFormat(
            "chunk %d: the gradient norm is not finite (%g); the optimizer step was skipped",
            entry.chunk, result.grad_norm));
      }
    }
    return absl::OkStatus();
  }

  const TrainOptions options_;
  Backend& backend_;
  const int device_;
  const cudaStream_t stream_;
  const std::unique_ptr<GptCudaStageModel> model_;
  cuda::DeviceAllocations scratch_;  // the engines' bf16 gradients
  std::vector<ChunkEngine> engines_;
  double last_optimizer_seconds_ = 0.0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainStage>> CreateCudaTrainStage(const TrainOptions& options,
                                                                 const TrainStageSpec& spec,
                                                                 Backend& backend,
                                                                 int cpu_threads) {
  PO_ASSIGN_OR_RETURN(const int device, CudaBackendDevice(backend));
  PO_ASSIGN_OR_RETURN(const cudaStream_t stream, CudaComputeStream(backend));
  absl::StatusOr<std::unique_ptr<GptCudaStageModel>> model = GptCudaStageModel::Create(
      backend, spec.config, spec.num_stages, spec.chunks_per_stage, spec.stage, spec.data);
  if (!model.ok()) {
    if (model.status().code() == absl::StatusCode::kUnimplemented) {
      return absl::InvalidArgumentError(
          absl::StrCat("--backend cuda cannot train this model: ", model.status().message()));
    }
    return Annotate(model.status(), "the CUDA GPT (--backend cuda)");
  }
  auto stage =
      std::make_unique<CudaTrainStage>(options, backend, device, stream, *std::move(model));
  if (options.optimizer_offload != TrainOptimizerOffload::kNone) {
    PO_RETURN_IF_ERROR(stage->CreateEngines(cpu_threads));
  }
  return std::unique_ptr<TrainStage>(std::move(stage));
}

}  // namespace pipeoffload::gpt
