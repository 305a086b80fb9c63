// The CUDA TrainStage (see train_stage_cuda.h). Invariants:
//  - Every CUDA call runs with the backend's device current (ScopedDevice) and everything the
//    stage enqueues goes on the backend's compute stream, after the model's kernels.
//  - With optimizer offload, the engines own the fp32 master, m and v: the model is created
//    without its own (nothing of it stays on the GPU), its masters at creation go to the
//    engines (TakeInitialMasters), hashes come from the engines, and the model's OptimizerStep
//    is never called.
//  - Each engine gets every gradient of its chunk exactly once per step, as one range (so its
//    gradient norm is exactly reproducible).
#include "examples/gpt/train_cuda/train_stage_cuda.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/gpt/cuda/gpt_cuda_stage_model.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/gpt/optimizer_schedule.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda_stream.h"
#include "pipeoffload/optimizer_offload.h"

namespace pipeoffload::gpt {
namespace {

using cuda::bf16;
using cuda::DeviceParameters;
using cuda::GptCudaStageModel;
using cuda::GptCudaStageOptions;

// Stage creations of this process one at a time, so that each one's cudaMemGetInfo difference
// sees its own allocations (stages as threads on one GPU would otherwise overlap).
std::mutex creation_mutex;

// Bytes of device memory in use on the current device.
absl::StatusOr<std::int64_t> DeviceUsedBytes() {
  std::size_t free_bytes = 0, total_bytes = 0;
  PO_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<std::int64_t>(total_bytes - free_bytes);
}

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
      DeviceParameters& params = model_->chunk(c).params();
      const std::int64_t n = params.padded_elements();
      // The fp32 masters the model was created with, padding zero (its Adam keeps it zero).
      PO_ASSIGN_OR_RETURN(std::vector<float> initial, model_->TakeInitialMasters(c));
      if (n == 0) continue;
      if (params.tensors().front().offset != 0 || static_cast<std::int64_t>(initial.size()) != n) {
        return absl::InternalError("the chunk's masters do not cover its flat arrays");
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
      engine_options.max_grad_norm = 0.0;  // the stage clips by the global norm (OptimizerStep)
      engine_options.cpu.threads = cpu_threads;
      engine_options.timeout_seconds = std::max(600.0, options_.watchdog_seconds);
      // The working copy the kernels read: the engine rewrites it in place at every step.
      auto* weights = reinterpret_cast<std::uint16_t*>(params.mutable_weights());
      absl::StatusOr<std::unique_ptr<OptimizerOffload>> engine = OptimizerOffload::Create(
          backend_, engine_options, initial,
          std::span<std::uint16_t>(weights, static_cast<std::size_t>(n)));
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
  bool holds_loss() const override { return model_->holds_loss(); }
  absl::StatusOr<std::vector<double>> Losses() override { return model_->Losses(); }
  absl::Status ExchangeTiedGrad(RankGroup&) override { return absl::OkStatus(); }

  // From the fp32 accumulators on the GPU, with or without engines (so the norm is the same
  // whatever holds the optimizer state).
  absl::StatusOr<std::vector<TensorSquareSum>> GradSquareSums() override {
    return model_->GradSquareSums();
  }

  absl::Status OptimizerStep(float grad_scale) override {
    const double start = backend_.NowSeconds();
    absl::Status status = offloaded() ? OffloadedStep(grad_scale) : GpuStep(grad_scale);
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

  // The model's device memory (weights, gradients, its AdamW state if it has one, scratch,
  // token buffers) plus the engines' device state, gradients and scratch and our bf16
  // gradients.
  std::int64_t ModelStateBytes() const override {
    const CudaStageMemory memory = Memory();
    return memory.model_bytes + memory.engine_state_bytes + memory.engine_other_bytes;
  }

  std::string Describe() const override {
    const CudaStageMemory memory = Memory();
    std::string text = absl::StrCat(
        backend_.Name(), ", bf16 GPT; ", memory.model_bytes, " B of model memory on the GPU; ",
        "GPU optimizer state ", memory.optimizer_state_bytes(), " B (model ",
        memory.model_optimizer_bytes, " B, engines ", memory.engine_state_bytes, " B); ",
        memory.measured_bytes, " B of GPU memory taken at creation (cudaMemGetInfo)");
    if (!offloaded()) return absl::StrCat(text, "; AdamW state on the GPU");
    std::int64_t pinned = 0, subgroups = 0, on_gpu = 0;
    for (const ChunkEngine& entry : engines_) {
      pinned += entry.engine->memory().pinned_host_bytes;
      subgroups += entry.engine->num_subgroups();
      for (SubgroupPlace place : entry.engine->placement()) on_gpu += place != SubgroupPlace::kCpu;
    }
    absl::StrAppend(&text, "; optimizer offload ",
                    TrainOptimizerOffloadName(options_.optimizer_offload), ": ", engines_.size(),
                    " engine(s), ", subgroups, " subgroups (", on_gpu, " on the GPU), pinned host ",
                    pinned, " B, engines' GPU gradients and scratch ", memory.engine_other_bytes,
                    " B");
    return text;
  }

  CudaStageMemory Memory() const {
    CudaStageMemory memory;
    memory.model_bytes = model_->device_bytes();
    memory.model_optimizer_bytes = model_->optimizer_state_bytes();
    memory.engine_other_bytes = scratch_.total_bytes();
    for (const ChunkEngine& entry : engines_) {
      const OptimizerMemory engine = entry.engine->memory();
      memory.engine_state_bytes += engine.device_state_bytes;
      memory.engine_other_bytes += engine.device_grad_bytes + engine.device_scratch_bytes;
    }
    memory.measured_bytes = measured_bytes_;
    return memory;
  }
  void set_measured_bytes(std::int64_t bytes) { measured_bytes_ = bytes; }

 private:
  bool offloaded() const { return options_.optimizer_offload != TrainOptimizerOffload::kNone; }

  // GPU AdamW (the model's), waited for so its time is counted here.
  absl::Status GpuStep(float grad_scale) {
    PO_RETURN_IF_ERROR(model_->OptimizerStep(grad_scale));
    return model_->Synchronize(options_.watchdog_seconds);
  }

  // Every chunk's fp32 gradients rounded to bf16 and handed over, then every engine's step.
  // The engines clip nothing themselves (max_grad_norm 0: each sees one chunk, not the
  // model): the global scale reaches them as loss_scale = 1 / grad_scale, which divides
  // every gradient. Their rate is the schedule's for this step (SetLearningRate), the same
  // LearningRateAt the GPU's own AdamW uses.
  absl::Status OffloadedStep(float grad_scale) {
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    const float rate = LearningRateAt(options_.config.optimizer, ++offloaded_steps_);
    for (ChunkEngine& entry : engines_) {
      const std::int64_t n = entry.params->padded_elements();
      PO_RETURN_IF_ERROR(cuda::Fp32ToBf16(entry.grad_bf16, entry.params->grad(0), n, stream_));
      PO_RETURN_IF_ERROR(entry.engine->AddGradients(
          reinterpret_cast<const std::uint16_t*>(entry.grad_bf16), 0, n));
    }
    for (ChunkEngine& entry : engines_) {
      PO_RETURN_IF_ERROR(entry.engine->SetLearningRate(rate));
      PO_ASSIGN_OR_RETURN(const OptimizerStepResult result,
                          entry.engine->Step(1.0f / grad_scale));
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
  std::int64_t offloaded_steps_ = 0;  // the engines' steps so far (the schedule's t)
  double last_optimizer_seconds_ = 0.0;
  std::int64_t measured_bytes_ = 0;  // cudaMemGetInfo's difference across creation
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainStage>> CreateCudaTrainStage(const TrainOptions& options,
                                                                 const TrainStageSpec& spec,
                                                                 Backend& backend,
                                                                 int cpu_threads) {
  PO_ASSIGN_OR_RETURN(const int device, CudaBackendDevice(backend));
  PO_ASSIGN_OR_RETURN(const cudaStream_t stream, CudaComputeStream(backend));
  const bool offload = options.optimizer_offload != TrainOptimizerOffload::kNone;
  const std::lock_guard<std::mutex> lock(creation_mutex);
  std::int64_t used_before = 0;
  {
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device));
    PO_ASSIGN_OR_RETURN(used_before, DeviceUsedBytes());
  }
  absl::StatusOr<std::unique_ptr<GptCudaStageModel>> model = GptCudaStageModel::Create(
      backend, spec.config, spec.num_stages, spec.chunks_per_stage, spec.stage, spec.data,
      GptCudaStageOptions{.with_optimizer_state = !offload,
                          .lean_saved = options.lean_saved,
                          .recompute = options.recompute != Recompute::kNone,
                          .placement = spec.placement});
  if (!model.ok()) {
    if (model.status().code() == absl::StatusCode::kUnimplemented) {
      return absl::InvalidArgumentError(
          absl::StrCat("--backend cuda cannot train this model: ", model.status().message()));
    }
    return Annotate(model.status(), "the CUDA GPT (--backend cuda)");
  }
  auto stage =
      std::make_unique<CudaTrainStage>(options, backend, device, stream, *std::move(model));
  if (offload) PO_RETURN_IF_ERROR(stage->CreateEngines(cpu_threads));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device));
  PO_ASSIGN_OR_RETURN(const std::int64_t used_after, DeviceUsedBytes());
  stage->set_measured_bytes(used_after - used_before);
  return std::unique_ptr<TrainStage>(std::move(stage));
}

absl::StatusOr<CudaStageMemory> GetCudaStageMemory(const TrainStage& stage) {
  const auto* cuda_stage = dynamic_cast<const CudaTrainStage*>(&stage);
  if (cuda_stage == nullptr) {
    return absl::InvalidArgumentError(
        "GetCudaStageMemory: the stage was not made by CreateCudaTrainStage");
  }
  return cuda_stage->Memory();
}

}  // namespace pipeoffload::gpt
