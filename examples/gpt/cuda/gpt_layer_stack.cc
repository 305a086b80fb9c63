// The benchmark's GPT layer stack (see gpt_layer_stack.h). A thin StageModel over layer-only
// GptCudaChunks: it substitutes the fixed random input on virtual stage 0 (input == null), the
// fixed random gradient on the last virtual stage (grad_output == null), and scratch for the
// outputs the runtime does not want (output / grad_input == null).
#include "examples/gpt/cuda/gpt_layer_stack.h"

#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/gpt_cuda_chunk.h"
#include "examples/gpt/cuda/gpt_cuda_layer.h"
#include "examples/gpt/cuda/gpt_cuda_random.h"
#include "examples/gpt/rng.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload::gpt::cuda {
namespace {

constexpr double kWaitSeconds = 120.0;
constexpr int kMaxLayersPerChunk = 256;

LayerDims DimsOf(const LayerStackShape& shape) {
  LayerDims dims{shape.batch, static_cast<int>(shape.seq), static_cast<int>(shape.hidden),
                 shape.heads, shape.lean_saved};
  dims.lean_scratch = shape.recompute;
  return dims;
}

class CudaGptLayerStack final : public StageModel {
 public:
  CudaGptLayerStack(const LayerStackShape& shape, int device, cudaStream_t stream)
      : shape_(shape), device_(device), stream_(stream) {}

  ~CudaGptLayerStack() override {
    internal::ScopedDevice guard;
    if (!guard.Enter(device_).ok()) return;
    static_cast<void>(WaitForStream(stream_, kWaitSeconds, "~CudaGptLayerStack"));
    chunks_.clear();
    context_.reset();
  }

  absl::Status Init();
  absl::StatusOr<std::vector<std::uint64_t>> GradHashes();

  std::int64_t SavedBytes(int chunk, bool split_backward) const override {
    if (chunk < 0 || chunk >= static_cast<int>(chunks_.size())) return 0;
    return chunks_[static_cast<std::size_t>(chunk)]->SavedBytes(split_backward);
  }
  std::int64_t BoundaryBytes() const override { return shape_.BoundaryBytes(); }

  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override {
    PO_RETURN_IF_ERROR(CheckCall("Forward", mb, chunk, saved));
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    const bf16* in = input != nullptr ? static_cast<const bf16*>(input) : fixed_input_;
    bf16* out = output != nullptr ? static_cast<bf16*>(output) : scratch_output_;
    lean_entries_.Forget(mb, chunk);  // a fresh entry in the full layout
    return chunks_[static_cast<std::size_t>(chunk)]->Forward(nullptr, nullptr, in, out,
                                                             static_cast<std::byte*>(saved),
                                                             nullptr);
  }

  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input,
                        void* saved, bool with_weight_grad) override {
    PO_RETURN_IF_ERROR(CheckCall("Backward", mb, chunk, saved));
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    const bf16* dout =
        grad_output != nullptr ? static_cast<const bf16*>(grad_output) : fixed_grad_;
    bf16* dinp = grad_input != nullptr ? static_cast<bf16*>(grad_input) : scratch_output_;
    return chunks_[static_cast<std::size_t>(chunk)]->Backward(
        dout, dinp, static_cast<std::byte*>(saved), with_weight_grad, /*dloss=*/0.0f,
        lean_entries_.Take(mb, chunk));
  }

  std::int64_t RetainedBytes(int chunk, Recompute mode, bool /*split_backward*/) const override {
    if (!shape_.recompute || chunk < 0 || chunk >= static_cast<int>(chunks_.size())) return -1;
    return chunks_[static_cast<std::size_t>(chunk)]->RetainedBytes(mode);
  }

  absl::Status ForwardRetaining(int mb, int chunk, const void* input, void* output, void* retained,
                                Recompute mode) override {
    PO_RETURN_IF_ERROR(CheckCall("ForwardRetaining", mb, chunk, retained));
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    const bf16* in = input != nullptr ? static_cast<const bf16*>(input) : fixed_input_;
    bf16* out = output != nullptr ? static_cast<bf16*>(output) : scratch_output_;
    lean_entries_.Wrote(mb, chunk, mode == Recompute::kLean);
    return chunks_[static_cast<std::size_t>(chunk)]->ForwardRetaining(
        nullptr, nullptr, in, out, static_cast<std::byte*>(retained), nullptr, mode,
        recompute_workspace_);
  }

  absl::Status RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                              Recompute mode) override {
    PO_RETURN_IF_ERROR(CheckCall("RecomputeSaved", mb, chunk, saved));
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    lean_entries_.Forget(mb, chunk);  // B reads the rebuilt full entry
    return chunks_[static_cast<std::size_t>(chunk)]->RecomputeSaved(
        static_cast<const std::byte*>(retained), static_cast<std::byte*>(saved), mode,
        scratch_output_, nullptr);
  }

  // Lean entries of an unsplit backward: B reads the lean block in place (no head here, so every
  // chunk can), remembered per entry from ForwardRetaining.
  bool BackwardReadsRetained(int chunk, Recompute mode, bool split_backward) const override {
    return mode == Recompute::kLean && !split_backward && RetainedBytes(chunk, mode, false) > 0 &&
           chunks_[static_cast<std::size_t>(chunk)]->BackwardReadsLean();
  }

  absl::Status BackwardWeight(int mb, int chunk, void* saved) override {
    PO_RETURN_IF_ERROR(CheckCall("BackwardWeight", mb, chunk, saved));
    internal::ScopedDevice guard;
    PO_RETURN_IF_ERROR(guard.Enter(device_));
    lean_entries_.Forget(mb, chunk);  // W ends the entry
    return chunks_[static_cast<std::size_t>(chunk)]->BackwardWeight(
        static_cast<std::byte*>(saved));
  }

 private:
  absl::Status CheckCall(const char* op, int mb, int chunk, const void* saved) const {
    if (mb < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": mb ", mb, " < 0"));
    if (chunk < 0 || chunk >= static_cast<int>(chunks_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": chunk ", chunk,
                                                     " is out of range [0, ", chunks_.size(),
                                                     ")"));
    }
    if (saved == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": saved is null"));
    return absl::OkStatus();
  }

  const LayerStackShape shape_;
  const int device_;
  const cudaStream_t stream_;
  std::unique_ptr<GptCudaContext> context_;  // before the chunks: they use its memory
  std::vector<std::unique_ptr<GptCudaChunk>> chunks_;
  bf16* fixed_input_ = nullptr;     // (B,T,C): virtual stage 0's input
  bf16* fixed_grad_ = nullptr;      // (B,T,C): the last virtual stage's output gradient
  bf16* scratch_output_ = nullptr;  // (B,T,C): outputs nobody reads
  std::byte* recompute_workspace_ = nullptr;  // shape.recompute: ForwardRetaining(kFull)'s
  LeanRetainedEntries lean_entries_;           // entries holding a lean retained block
};

absl::Status CudaGptLayerStack::Init() {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  PO_ASSIGN_OR_RETURN(context_, GptCudaContext::Create(DimsOf(shape_), device_, stream_));
  const int layers = shape_.layers_per_chunk;
  const int total = layers * shape_.chunks_per_stage;
  for (int c = 0; c < shape_.chunks_per_stage; ++c) {
    PO_ASSIGN_OR_RETURN(std::unique_ptr<GptCudaChunk> chunk,
                        GptCudaChunk::CreateLayerStack(c * layers, layers, total,
                                                       DeriveSeed({shape_.seed, 1}), *context_));
    chunks_.push_back(std::move(chunk));
  }
  const std::int64_t elements = shape_.BoundaryBytes() / 2;
  DeviceAllocations& memory = context_->allocations();
  PO_ASSIGN_OR_RETURN(fixed_input_, memory.AllocateArray<bf16>(elements));
  PO_ASSIGN_OR_RETURN(fixed_grad_, memory.AllocateArray<bf16>(elements));
  PO_ASSIGN_OR_RETURN(scratch_output_, memory.AllocateArray<bf16>(elements));
  if (shape_.recompute) {
    // Every chunk has the same layers, so the same workspace.
    PO_ASSIGN_OR_RETURN(void* workspace, memory.Allocate(chunks_.front()->ForwardWorkspaceBytes()));
    recompute_workspace_ = static_cast<std::byte*>(workspace);
  }
  // Inputs of unit scale, as an embedding's output; gradients of the scale a loss gives.
  PO_CUDA_RETURN_IF_ERROR(
      LaunchFillNormalBf16(fixed_input_, elements, 1.0f, DeriveSeed({shape_.seed, 2}), stream_));
  PO_CUDA_RETURN_IF_ERROR(
      LaunchFillNormalBf16(fixed_grad_, elements, 1e-3f, DeriveSeed({shape_.seed, 3}), stream_));
  PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch_output_, 0,
                                          static_cast<std::size_t>(shape_.BoundaryBytes()),
                                          stream_));
  return WaitForStream(stream_, kWaitSeconds, "CreateCudaGptLayerStack");
}

absl::StatusOr<std::vector<std::uint64_t>> CudaGptLayerStack::GradHashes() {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  std::vector<std::uint64_t> hashes;
  for (const std::unique_ptr<GptCudaChunk>& chunk : chunks_) {
    const DeviceParameters& params = chunk->params();
    for (int local = 0; local < static_cast<int>(params.tensors().size()); ++local) {
      PO_ASSIGN_OR_RETURN(const std::vector<float> grad, params.DownloadGrad(local, stream_));
      std::uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bit
      for (const float value : grad) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &value, sizeof(bits));
        for (int byte = 0; byte < 4; ++byte) {
          hash = (hash ^ ((bits >> (8 * byte)) & 0xffu)) * 1099511628211ull;
        }
      }
      hashes.push_back(hash);
    }
  }
  return hashes;
}

}  // namespace

std::int64_t LayerStackShape::SavedBytes() const {
  return MakeLayerSavedLayout(DimsOf(*this)).bytes * layers_per_chunk;
}

std::int64_t LayerStackShape::RetainedBytes(Recompute mode) const {
  if (!recompute) return -1;
  if (mode == Recompute::kFull) return AlignSlot(BoundaryBytes());
  if (mode != Recompute::kLean || lean_saved) return -1;
  LayerDims lean = DimsOf(*this);
  lean.lean_saved = true;
  return MakeLayerSavedLayout(lean).bytes * layers_per_chunk;
}

std::int64_t LayerStackShape::BoundaryBytes() const {
  return std::int64_t{batch} * seq * hidden * 2;
}

double LayerStackShape::ForwardFlops() const {
  return LayerForwardFlops(DimsOf(*this)) * layers_per_chunk;
}

absl::Status CheckLayerStackShape(const LayerStackShape& shape) {
  if (shape.hidden <= 0 || shape.hidden % 64 != 0 || shape.hidden > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden must be a positive multiple of 64 up to 65536, got ", shape.hidden));
  }
  if (shape.heads <= 0 || shape.hidden % shape.heads != 0 ||
      (shape.hidden / shape.heads != 64 && shape.hidden / shape.heads != 128)) {
    return absl::InvalidArgumentError(absl::StrCat("heads must divide hidden into heads of 64 or ",
                                                   "128 channels, got hidden ", shape.hidden,
                                                   " heads ", shape.heads));
  }
  if (shape.seq <= 0 || shape.seq % 8 != 0 || shape.seq > kMaxAttentionT) {
    return absl::InvalidArgumentError(absl::StrCat("seq must be a positive multiple of 8 up to ",
                                                   kMaxAttentionT, ", got ", shape.seq));
  }
  if (shape.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be at least 1, got ", shape.batch));
  }
  if (shape.layers_per_chunk < 1 || shape.layers_per_chunk > kMaxLayersPerChunk) {
    return absl::InvalidArgumentError(absl::StrCat("layers_per_chunk must be in [1, ",
                                                   kMaxLayersPerChunk, "], got ",
                                                   shape.layers_per_chunk));
  }
  if (shape.chunks_per_stage < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunks_per_stage must be at least 1, got ", shape.chunks_per_stage));
  }
  if (std::int64_t{shape.batch} * shape.seq * 4 * shape.hidden >
      std::numeric_limits<std::int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", shape.batch, " x seq ", shape.seq, " x 4 hidden ", 4 * shape.hidden,
        " elements exceed the kernels' 32-bit indexing"));
  }
  return CheckLayerDims(DimsOf(shape));
}

absl::StatusOr<std::unique_ptr<StageModel>> CreateCudaGptLayerStack(
    Backend& backend, const LayerStackShape& shape) {
  PO_RETURN_IF_ERROR(CheckLayerStackShape(shape));
  PO_ASSIGN_OR_RETURN(const int device, CudaBackendDevice(backend));
  PO_ASSIGN_OR_RETURN(cudaStream_t stream, CudaComputeStream(backend));
  auto model = std::make_unique<CudaGptLayerStack>(shape, device, stream);
  PO_RETURN_IF_ERROR(model->Init());
  return std::unique_ptr<StageModel>(std::move(model));
}

absl::StatusOr<std::vector<std::uint64_t>> LayerStackGradHashes(StageModel& model) {
  auto* stack = dynamic_cast<CudaGptLayerStack*>(&model);
  if (stack == nullptr) {
    return absl::InvalidArgumentError(
        "LayerStackGradHashes: the model was not made by CreateCudaGptLayerStack");
  }
  return stack->GradHashes();
}

}  // namespace pipeoffload::gpt::cuda
