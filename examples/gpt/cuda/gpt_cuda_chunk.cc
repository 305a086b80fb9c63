// One virtual stage of the GPT on the GPU (see gpt_cuda_chunk.h for the saved layout). The
// control flow mirrors GptChunk (examples/gpt/gpt_chunk.cc) line by line, so the two read side
// by side; the differences are the dtypes (bf16 activations), the fused residual adds, and that
// an unsplit backward reads the boundary gradient in place instead of copying it.
#include "examples/gpt/cuda/gpt_cuda_chunk.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/gpt_params.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt::cuda {
namespace {

absl::Status Copy(void* dst, const void* src, std::int64_t bytes, cudaStream_t stream) {
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes),
                                          cudaMemcpyDeviceToDevice, stream));
  return absl::OkStatus();
}

template <typename T>
T* At(std::byte* base, std::int64_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptCudaChunk>> GptCudaChunk::CreateGpt(
    const GptConfig& config, int virtual_stage, int num_virtual_stages,
    GptCudaContext& context) {
  PO_RETURN_IF_ERROR(ValidateGptConfig(config));
  PO_RETURN_IF_ERROR(ValidatePipelineShape(num_virtual_stages, 1, virtual_stage));
  if (config.tied_embeddings) {
    return absl::UnimplementedError(
        "the CUDA GPT supports untied embeddings only (set tied_embeddings = false)");
  }
  const LayerDims& dims = context.dims();
  if (dims.B != config.batch_size || dims.T != config.seq_len || dims.C != config.n_embd ||
      dims.NH != config.n_head) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context dims B=", dims.B, " T=", dims.T, " C=", dims.C, " NH=", dims.NH,
        " do not match the config's ", config.batch_size, ", ", config.seq_len, ", ",
        config.n_embd, ", ", config.n_head));
  }
  if (config.vocab_size % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size ", config.vocab_size,
        " must be a multiple of 8 for the CUDA head (pad the vocabulary, as llm.c does)"));
  }
  const bool first = virtual_stage == 0;
  const bool last = virtual_stage == num_virtual_stages - 1;
  std::unique_ptr<GptCudaChunk> chunk(
      new GptCudaChunk(context, first, last, config.vocab_size));
  const LayerRange layers = VirtualStageLayers(config.n_layer, num_virtual_stages, virtual_stage);
  chunk->first_layer_ = layers.begin;

  // The CPU model's parameters of this virtual stage: the same Add order as GptChunk, so the
  // same values (each tensor draws from its own id's stream).
  const std::vector<TensorSpec> specs = GptTensorSpecs(config);
  std::vector<std::pair<int, TensorSpec>> ours;
  if (first) {
    ours.push_back({kTokenEmbeddingId, specs[kTokenEmbeddingId]});
    ours.push_back({kPositionEmbeddingId, specs[kPositionEmbeddingId]});
  }
  for (int l = layers.begin; l < layers.end; ++l) {
    const int first_id = LayerTensorId(l, TensorKind::kLn1Weight);
    for (int k = 0; k < kTensorsPerLayer; ++k) {
      ours.push_back({first_id + k, specs[static_cast<std::size_t>(first_id + k)]});
    }
  }
  if (last) {
    chunk->lnf_w_id_ = LnfWeightId(config);
    chunk->lnf_b_id_ = LnfBiasId(config);
    chunk->head_id_ = HeadWeightId(config);
    for (int id : {chunk->lnf_w_id_, chunk->lnf_b_id_, chunk->head_id_}) {
      ours.push_back({id, specs[static_cast<std::size_t>(id)]});
    }
  }
  ParameterBlock host;
  for (const auto& [id, spec] : ours) host.Add(id, spec, /*mirror=*/false);
  host.Allocate(config.seed);
  PO_ASSIGN_OR_RETURN(chunk->params_,
                      DeviceParameters::Create(LayOutTensors(ours), /*with_optimizer_state=*/true,
                                               context.allocations(), context.stream()));
  PO_RETURN_IF_ERROR(chunk->params_->UploadFrom(host, context.stream()));
  chunk->LayOut(layers.size());
  return chunk;
}

absl::StatusOr<std::unique_ptr<GptCudaChunk>> GptCudaChunk::CreateLayerStack(
    int first_layer, int num_layers, int total_layers, std::uint64_t seed,
    GptCudaContext& context) {
  if (num_layers < 1 || first_layer < 0 || first_layer + num_layers > total_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", first_layer, ", ",
                                                   first_layer + num_layers, ") of ",
                                                   total_layers, " make no chunk"));
  }
  std::unique_ptr<GptCudaChunk> chunk(new GptCudaChunk(context, false, false, 0));
  chunk->first_layer_ = first_layer;
  std::vector<std::pair<int, TensorSpec>> ours;
  for (int l = first_layer; l < first_layer + num_layers; ++l) {
    const std::vector<TensorSpec> specs = LayerTensorSpecs(context.dims().C, l, total_layers);
    const int first_id = LayerTensorId(l, TensorKind::kLn1Weight);
    for (int k = 0; k < kTensorsPerLayer; ++k) {
      ours.push_back({first_id + k, specs[static_cast<std::size_t>(k)]});
    }
  }
  PO_ASSIGN_OR_RETURN(chunk->params_,
                      DeviceParameters::Create(LayOutTensors(ours), /*with_optimizer_state=*/false,
                                               context.allocations(), context.stream()));
  PO_RETURN_IF_ERROR(chunk->params_->FillRandom(seed, context.stream()));
  chunk->LayOut(num_layers);
  return chunk;
}

void GptCudaChunk::LayOut(int num_layers) {
  const LayerDims& dims = context_.dims();
  const std::int64_t n = dims.N();
  const std::int64_t nc_bf16 = n * dims.C * 2;
  layer_layout_ = MakeLayerSavedLayout(dims);
  grad_layout_ = MakeLayerGradLayout(dims);
  std::int64_t cursor = 0;
  auto take = [&cursor](std::int64_t bytes) {
    const std::int64_t at = cursor;
    cursor += AlignSlot(bytes);
    return at;
  };
  if (first_) tokens_ = take(n * 4);
  for (int i = 0; i < num_layers; ++i) layer_slots_.push_back(take(layer_layout_.bytes));
  if (last_) {
    lnf_in_ = take(nc_bf16);
    lnf_mean_ = take(n * 4);
    lnf_rstd_ = take(n * 4);
    lnf_out_ = take(nc_bf16);
    logits_ = take(n * V_ * 2);
    lse_ = take(n * 4);
    targets_ = take(n * 4);
  }
  saved_bytes_ = cursor;
  if (first_) d_x0_ = take(nc_bf16);
  for (int i = 0; i < num_layers; ++i) grad_slots_.push_back(take(grad_layout_.bytes));
  if (last_) d_lnf_out_ = take(nc_bf16);
  split_bytes_ = cursor - saved_bytes_;
}

LayerWeights GptCudaChunk::Weights(int local_layer) const {
  const int l = first_layer_ + local_layer;
  auto t = [&](TensorKind kind) { return W(LayerTensorId(l, kind)); };
  return LayerWeights{t(TensorKind::kLn1Weight), t(TensorKind::kLn1Bias),
                      t(TensorKind::kQkvWeight), t(TensorKind::kQkvBias),
                      t(TensorKind::kAttnProjWeight), t(TensorKind::kAttnProjBias),
                      t(TensorKind::kLn2Weight), t(TensorKind::kLn2Bias),
                      t(TensorKind::kFcWeight), t(TensorKind::kFcBias),
                      t(TensorKind::kFcProjWeight), t(TensorKind::kFcProjBias)};
}

LayerWeightGrads GptCudaChunk::WeightGrads(int local_layer) const {
  const int l = first_layer_ + local_layer;
  auto t = [&](TensorKind kind) { return G(LayerTensorId(l, kind)); };
  return LayerWeightGrads{t(TensorKind::kLn1Weight), t(TensorKind::kLn1Bias),
                          t(TensorKind::kQkvWeight), t(TensorKind::kQkvBias),
                          t(TensorKind::kAttnProjWeight), t(TensorKind::kAttnProjBias),
                          t(TensorKind::kLn2Weight), t(TensorKind::kLn2Bias),
                          t(TensorKind::kFcWeight), t(TensorKind::kFcBias),
                          t(TensorKind::kFcProjWeight), t(TensorKind::kFcProjBias)};
}

LayerGradBuffers GptCudaChunk::GradsOf(int local_layer, std::byte* saved, bool split,
                                       const bf16* dout_override) const {
  if (split) {
    return LayerGradBuffersAt(saved + grad_slots_[static_cast<std::size_t>(local_layer)],
                              grad_layout_, dout_override);
  }
  // Ping-pong: layer i's dout and layer i-1's dout (its input gradient) never coincide.
  return LayerGradBuffersAt(context_.unsplit_grads(), grad_layout_,
                            dout_override != nullptr ? dout_override
                                                     : context_.ping_pong(local_layer & 1));
}

bf16* GptCudaChunk::EmbeddingGrad(std::byte* saved, bool split) const {
  // Unsplit: the ping-pong slot of "layer -1", the one layer 0 writes its input gradient into.
  return split ? At<bf16>(saved, d_x0_) : context_.ping_pong(1);
}

bf16* GptCudaChunk::LnfOutGrad(std::byte* saved, bool split) const {
  return split ? At<bf16>(saved, d_lnf_out_) : context_.d_atty();
}

absl::Status GptCudaChunk::Forward(const std::int32_t* tokens, const std::int32_t* targets,
                                   const bf16* input, bf16* output, std::byte* saved,
                                   float* losses) {
  if (saved == nullptr || (first_ ? tokens == nullptr : input == nullptr) ||
      (last_ ? targets == nullptr || losses == nullptr : output == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptCudaChunk::Forward: a required pointer is null (saved, ",
        first_ ? "tokens" : "input", ", ", last_ ? "targets and losses" : "output", ")"));
  }
  const LayerDims& d = context_.dims();
  const int N = d.N();
  const std::int64_t nc_bytes = std::int64_t{N} * d.C * 2;
  cudaStream_t s = context_.stream();
  const int num_layers = this->num_layers();
  bf16* x0 = num_layers > 0 ? LayerActivationsAt(saved + layer_slots_[0], layer_layout_).x
             : last_        ? At<bf16>(saved, lnf_in_)
                            : output;
  if (first_) {
    auto* saved_tokens = At<std::int32_t>(saved, tokens_);
    PO_RETURN_IF_ERROR(Copy(saved_tokens, tokens, std::int64_t{N} * 4, s));
    PO_RETURN_IF_ERROR(EncoderForward(x0, saved_tokens, W(kTokenEmbeddingId),
                                      W(kPositionEmbeddingId), d.B, d.T, d.C, s));
  } else {
    PO_RETURN_IF_ERROR(Copy(x0, input, nc_bytes, s));
  }
  for (int i = 0; i < num_layers; ++i) {
    bf16* out = i + 1 < num_layers
                    ? LayerActivationsAt(saved + layer_slots_[static_cast<std::size_t>(i) + 1],
                                         layer_layout_).x
                : last_ ? At<bf16>(saved, lnf_in_)
                        : output;
    PO_RETURN_IF_ERROR(LayerForward(
        context_, Weights(i),
        LayerActivationsAt(saved + layer_slots_[static_cast<std::size_t>(i)], layer_layout_),
        out));
  }
  if (!last_) return absl::OkStatus();
  auto* saved_targets = At<std::int32_t>(saved, targets_);
  PO_RETURN_IF_ERROR(Copy(saved_targets, targets, std::int64_t{N} * 4, s));
  PO_RETURN_IF_ERROR(LayerNormForward(At<bf16>(saved, lnf_out_), At<float>(saved, lnf_mean_),
                                      At<float>(saved, lnf_rstd_), At<bf16>(saved, lnf_in_),
                                      W(lnf_w_id_), W(lnf_b_id_), N, d.C, s));
  bf16* logits = At<bf16>(saved, logits_);
  PO_RETURN_IF_ERROR(context_.linear().Forward(logits, At<bf16>(saved, lnf_out_), W(head_id_),
                                               nullptr, nullptr, nullptr, {N, d.C, V_}));
  return SoftmaxCrossEntropyForward(losses, At<float>(saved, lse_), logits, saved_targets, N, V_,
                                    s);
}

absl::Status GptCudaChunk::HeadBackwardWeight(std::byte* saved, bool split) {
  const LayerDims& d = context_.dims();
  const int N = d.N();
  PO_RETURN_IF_ERROR(context_.linear().BackwardWeight(G(head_id_), At<bf16>(saved, logits_),
                                                      At<bf16>(saved, lnf_out_), {N, d.C, V_}));
  return LayerNormBackwardWeight(G(lnf_w_id_), G(lnf_b_id_), context_.norm_scratch(),
                                 LnfOutGrad(saved, split), At<bf16>(saved, lnf_in_),
                                 At<float>(saved, lnf_mean_), At<float>(saved, lnf_rstd_), N, d.C,
                                 context_.stream());
}

absl::Status GptCudaChunk::EncoderBackwardWeight(std::byte* saved, bool split) {
  const LayerDims& d = context_.dims();
  return EncoderBackward(G(kTokenEmbeddingId), G(kPositionEmbeddingId),
                         EmbeddingGrad(saved, split), At<std::int32_t>(saved, tokens_), d.B, d.T,
                         d.C, context_.stream());
}

absl::Status GptCudaChunk::Backward(const bf16* grad_output, bf16* grad_input, std::byte* saved,
                                    bool with_weight_grad, float dloss) {
  if (saved == nullptr || (!last_ && grad_output == nullptr) ||
      (!first_ && grad_input == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptCudaChunk::Backward: a required pointer is null (saved",
        last_ ? "" : ", grad_output", first_ ? "" : ", grad_input", ")"));
  }
  const LayerDims& d = context_.dims();
  const int N = d.N();
  const std::int64_t nc_bytes = std::int64_t{N} * d.C * 2;
  cudaStream_t s = context_.stream();
  const bool split = !with_weight_grad;
  const int num_layers = this->num_layers();
  // Gradient of the chunk's input; with no layers it is also the gradient of its output.
  bf16* input_grad = first_ ? EmbeddingGrad(saved, split) : grad_input;
  // Where the last layer's output gradient comes from: written here (last chunk, or copied
  // for W when split), or read in place from the boundary buffer (unsplit).
  const bf16* dout_in_place = nullptr;
  if (last_) {
    bf16* dout_last =
        num_layers > 0 ? const_cast<bf16*>(GradsOf(num_layers - 1, saved, split).dout) : input_grad;
    bf16* dlogits = At<bf16>(saved, logits_);
    const auto* targets = At<std::int32_t>(saved, targets_);
    PO_RETURN_IF_ERROR(SoftmaxCrossEntropyBackward(dlogits, dlogits, At<float>(saved, lse_),
                                                   targets, dloss, N, V_, s));
    bf16* d_lnf_out = LnfOutGrad(saved, split);
    PO_RETURN_IF_ERROR(context_.linear().BackwardInput(d_lnf_out, dlogits, W(head_id_), nullptr,
                                                       {N, d.C, V_}));
    PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dout_last, 0, static_cast<std::size_t>(nc_bytes), s));
    PO_RETURN_IF_ERROR(LayerNormBackwardInput(dout_last, d_lnf_out, At<bf16>(saved, lnf_in_),
                                              W(lnf_w_id_), At<float>(saved, lnf_mean_),
                                              At<float>(saved, lnf_rstd_), N, d.C, s));
    if (with_weight_grad) PO_RETURN_IF_ERROR(HeadBackwardWeight(saved, split));
  } else if (split || num_layers == 0) {
    bf16* dout_last =
        num_layers > 0 ? const_cast<bf16*>(GradsOf(num_layers - 1, saved, split).dout) : input_grad;
    PO_RETURN_IF_ERROR(Copy(dout_last, grad_output, nc_bytes, s));
  } else {
    dout_in_place = grad_output;
  }
  for (int i = num_layers - 1; i >= 0; --i) {
    const LayerGradBuffers g =
        GradsOf(i, saved, split, i == num_layers - 1 ? dout_in_place : nullptr);
    bf16* dinp = i > 0 ? const_cast<bf16*>(GradsOf(i - 1, saved, split).dout) : input_grad;
    const LayerActivations a =
        LayerActivationsAt(saved + layer_slots_[static_cast<std::size_t>(i)], layer_layout_);
    PO_RETURN_IF_ERROR(LayerBackwardInput(context_, Weights(i), a, g, dinp));
    if (with_weight_grad) {
      PO_RETURN_IF_ERROR(LayerBackwardWeight(context_, Weights(i), WeightGrads(i), a, g));
    }
  }
  if (first_ && with_weight_grad) PO_RETURN_IF_ERROR(EncoderBackwardWeight(saved, split));
  return absl::OkStatus();
}

absl::Status GptCudaChunk::BackwardWeight(std::byte* saved) {
  if (saved == nullptr) {
    return absl::InvalidArgumentError("GptCudaChunk::BackwardWeight: saved is null");
  }
  if (last_) PO_RETURN_IF_ERROR(HeadBackwardWeight(saved, /*split=*/true));
  for (int i = num_layers() - 1; i >= 0; --i) {
    PO_RETURN_IF_ERROR(LayerBackwardWeight(
        context_, Weights(i), WeightGrads(i),
        LayerActivationsAt(saved + layer_slots_[static_cast<std::size_t>(i)], layer_layout_),
        GradsOf(i, saved, /*split=*/true)));
  }
  if (first_) PO_RETURN_IF_ERROR(EncoderBackwardWeight(saved, /*split=*/true));
  return absl::OkStatus();
}

}  // namespace pipeoffload::gpt::cuda
