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

GptCudaChunk::Region GptCudaChunk::MakeRegion(int num_layers, const LayerSavedLayout& layer,
                                              bool shared_layers, bool lean) const {
  const LayerDims& dims = context_.dims();
  const std::int64_t n = dims.N();
  const std::int64_t nc_bf16 = n * dims.C * 2;
  Region r;
  r.layer = layer;
  auto take = [&r](std::int64_t bytes) {
    const std::int64_t at = r.bytes;
    r.bytes += AlignSlot(bytes);
    return at;
  };
  if (first_) r.tokens = take(n * 4);
  for (int i = 0; i < num_layers; ++i) {
    r.layers.push_back(shared_layers && i > 0 ? r.layers.front() : take(layer.bytes));
  }
  if (last_) {
    r.lnf_in = take(nc_bf16);
    r.lnf_mean = take(n * 4);
    r.lnf_rstd = take(n * 4);
    r.lnf_out = lean ? kNoSlot : take(nc_bf16);
    r.logits = take(n * V_ * 2);
    r.lse = take(n * 4);
    r.targets = take(n * 4);
  }
  return r;
}

void GptCudaChunk::LayOut(int num_layers) {
  const LayerDims& dims = context_.dims();
  const std::int64_t n = dims.N();
  const std::int64_t nc_bf16 = n * dims.C * 2;
  const LayerSavedLayout layer = MakeLayerSavedLayout(dims);
  grad_layout_ = MakeLayerGradLayout(dims);
  saved_ = MakeRegion(num_layers, layer, /*shared_layers=*/false, /*lean=*/false);
  workspace_ = MakeRegion(num_layers, layer, /*shared_layers=*/true, /*lean=*/false);
  if (dims.lean_saved) {
    lean_.bytes = -1;
  } else {
    LayerDims lean_dims = dims;
    lean_dims.lean_saved = true;
    lean_ = MakeRegion(num_layers, MakeLayerSavedLayout(lean_dims), false, /*lean=*/true);
    // Every slot lean keeps, in layout order, merged into runs contiguous in both regions.
    const LayerSavedLayout sizes = LayerSlotBytes(dims);
    auto add = [this](std::int64_t from, std::int64_t to, std::int64_t bytes) {
      if (from == kNoSlot || to == kNoSlot) return;
      bytes = AlignSlot(bytes);
      if (!lean_copies_.empty()) {
        SlotCopy& back = lean_copies_.back();
        if (back.from + back.bytes == from && back.to + back.bytes == to) {
          back.bytes += bytes;
          return;
        }
      }
      lean_copies_.push_back(SlotCopy{from, to, bytes});
    };
    if (first_) add(lean_.tokens, saved_.tokens, n * 4);
    for (int i = 0; i < num_layers; ++i) {
      const auto l = static_cast<std::size_t>(i);
      for (const auto slot : kLayerSlots) {
        const std::int64_t from = lean_.layer.*slot;
        add(from == kNoSlot ? kNoSlot : lean_.layers[l] + from, saved_.layers[l] + layer.*slot,
            sizes.*slot);
      }
    }
    if (last_) {
      add(lean_.lnf_in, saved_.lnf_in, nc_bf16);
      add(lean_.lnf_mean, saved_.lnf_mean, n * 4);
      add(lean_.lnf_rstd, saved_.lnf_rstd, n * 4);
      add(lean_.logits, saved_.logits, n * V_ * 2);
      add(lean_.lse, saved_.lse, n * 4);
      add(lean_.targets, saved_.targets, n * 4);
    }
  }
  // The full retained block.
  std::int64_t cursor = 0;
  const bool input_in_saved = !first_ && (num_layers > 0 || last_);
  if (first_ || input_in_saved) {
    full_input_ = 0;
    cursor = AlignSlot(first_ ? n * 4 : nc_bf16);
  }
  if (last_) {
    full_targets_ = cursor;
    cursor += AlignSlot(n * 4);
  }
  full_bytes_ = cursor;

  std::int64_t split = saved_.bytes;
  auto take = [&split](std::int64_t bytes) {
    const std::int64_t at = split;
    split += AlignSlot(bytes);
    return at;
  };
  if (first_) d_x0_ = take(nc_bf16);
  for (int i = 0; i < num_layers; ++i) grad_slots_.push_back(take(grad_layout_.bytes));
  if (last_) d_lnf_out_ = take(nc_bf16);
  split_bytes_ = split - saved_.bytes;
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

absl::Status GptCudaChunk::CheckForward(const char* op, const char* region_name,
                                        const std::int32_t* tokens, const std::int32_t* targets,
                                        const bf16* input, const bf16* output, const void* region,
                                        const float* losses) const {
  if (region == nullptr || (first_ ? tokens == nullptr : input == nullptr) ||
      (last_ ? targets == nullptr || losses == nullptr : output == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptCudaChunk::", op, ": a required pointer is null (", region_name, ", ",
        first_ ? "tokens" : "input", ", ", last_ ? "targets and losses" : "output", ")"));
  }
  return absl::OkStatus();
}

bf16* GptCudaChunk::InputOf(const Region& r, std::byte* base, bf16* output) const {
  if (num_layers() > 0) return LayerActivationsAt(base + r.layers.front(), r.layer).x;
  return last_ ? At<bf16>(base, r.lnf_in) : output;
}

absl::Status GptCudaChunk::PlaceInputs(const Region& r, std::byte* base, const std::int32_t* tokens,
                                       const std::int32_t* targets, const bf16* input,
                                       bf16* output) {
  const LayerDims& d = context_.dims();
  const std::int64_t n = d.N();
  cudaStream_t s = context_.stream();
  if (first_) {
    PO_RETURN_IF_ERROR(Copy(At<std::int32_t>(base, r.tokens), tokens, n * 4, s));
  } else {
    PO_RETURN_IF_ERROR(Copy(InputOf(r, base, output), input, n * d.C * 2, s));
  }
  if (last_) PO_RETURN_IF_ERROR(Copy(At<std::int32_t>(base, r.targets), targets, n * 4, s));
  return absl::OkStatus();
}

absl::Status GptCudaChunk::Forward(const std::int32_t* tokens, const std::int32_t* targets,
                                   const bf16* input, bf16* output, std::byte* saved,
                                   float* losses) {
  PO_RETURN_IF_ERROR(
      CheckForward("Forward", "saved", tokens, targets, input, output, saved, losses));
  PO_RETURN_IF_ERROR(PlaceInputs(saved_, saved, tokens, targets, input, output));
  return ForwardPlaced(saved_, saved, output, losses);
}

absl::Status GptCudaChunk::ForwardPlaced(const Region& r, std::byte* base, bf16* output,
                                         float* losses) {
  const LayerDims& d = context_.dims();
  const int N = d.N();
  cudaStream_t s = context_.stream();
  const int num_layers = this->num_layers();
  if (first_) {
    PO_RETURN_IF_ERROR(EncoderForward(InputOf(r, base, output), At<std::int32_t>(base, r.tokens),
                                      W(kTokenEmbeddingId), W(kPositionEmbeddingId), d.B, d.T, d.C,
                                      s));
  }
  for (int i = 0; i < num_layers; ++i) {
    const auto l = static_cast<std::size_t>(i);
    bf16* out = i + 1 < num_layers ? LayerActivationsAt(base + r.layers[l + 1], r.layer).x
                : last_            ? At<bf16>(base, r.lnf_in)
                                   : output;
    PO_RETURN_IF_ERROR(
        LayerForward(context_, Weights(i), LayerActivationsAt(base + r.layers[l], r.layer), out));
  }
  if (!last_) return absl::OkStatus();
  // A lean block does not keep lnf_out: the lean ln1 scratch is free once the layers are done.
  bf16* lnf_out = r.lnf_out != kNoSlot ? At<bf16>(base, r.lnf_out) : context_.lean_ln1_out();
  if (lnf_out == nullptr) {
    return absl::InvalidArgumentError(
        "GptCudaChunk: a lean forward needs the context's lean scratch (LayerDims::lean_scratch)");
  }
  PO_RETURN_IF_ERROR(LayerNormForward(lnf_out, At<float>(base, r.lnf_mean),
                                      At<float>(base, r.lnf_rstd), At<bf16>(base, r.lnf_in),
                                      W(lnf_w_id_), W(lnf_b_id_), N, d.C, s));
  bf16* logits = At<bf16>(base, r.logits);
  PO_RETURN_IF_ERROR(context_.linear().Forward(logits, lnf_out, W(head_id_), nullptr, nullptr,
                                               nullptr, {N, d.C, V_}));
  return SoftmaxCrossEntropyForward(losses, At<float>(base, r.lse), logits,
                                    At<std::int32_t>(base, r.targets), N, V_, s);
}

std::int64_t GptCudaChunk::RetainedBytes(Recompute mode) const {
  switch (mode) {
    case Recompute::kLean:
      return lean_.bytes;
    case Recompute::kFull:
      return full_bytes_;
    case Recompute::kNone:
      break;
  }
  return -1;
}

absl::Status GptCudaChunk::ForwardRetaining(const std::int32_t* tokens, const std::int32_t* targets,
                                            const bf16* input, bf16* output, std::byte* retained,
                                            float* losses, Recompute mode, std::byte* workspace) {
  PO_RETURN_IF_ERROR(CheckForward("ForwardRetaining", "retained", tokens, targets, input, output,
                                  retained, losses));
  if (RetainedBytes(mode) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GptCudaChunk::ForwardRetaining: mode ",
                                                   RecomputeName(mode),
                                                   " is not offered by this chunk"));
  }
  if (mode == Recompute::kLean) {
    PO_RETURN_IF_ERROR(PlaceInputs(lean_, retained, tokens, targets, input, output));
    return ForwardPlaced(lean_, retained, output, losses);
  }
  if (workspace == nullptr && workspace_.bytes > 0) {
    return absl::InvalidArgumentError("GptCudaChunk::ForwardRetaining(full): workspace is null");
  }
  const LayerDims& d = context_.dims();
  const std::int64_t n = d.N();
  cudaStream_t s = context_.stream();
  if (full_input_ != kNoSlot) {
    PO_RETURN_IF_ERROR(first_ ? Copy(retained + full_input_, tokens, n * 4, s)
                              : Copy(retained + full_input_, input, n * d.C * 2, s));
  }
  if (last_) PO_RETURN_IF_ERROR(Copy(retained + full_targets_, targets, n * 4, s));
  PO_RETURN_IF_ERROR(PlaceInputs(workspace_, workspace, tokens, targets, input, output));
  return ForwardPlaced(workspace_, workspace, output, losses);
}

absl::Status GptCudaChunk::RecomputeSaved(const std::byte* retained, std::byte* saved,
                                          Recompute mode, bf16* scratch_output,
                                          float* scratch_losses) {
  if (retained == nullptr || saved == nullptr ||
      (last_ ? scratch_losses == nullptr : scratch_output == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptCudaChunk::RecomputeSaved: a required pointer is null (retained, saved, ",
                     last_ ? "scratch_losses" : "scratch_output", ")"));
  }
  if (RetainedBytes(mode) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GptCudaChunk::RecomputeSaved: mode ",
                                                   RecomputeName(mode),
                                                   " is not offered by this chunk"));
  }
  const LayerDims& d = context_.dims();
  const std::int64_t n = d.N();
  cudaStream_t s = context_.stream();
  if (mode == Recompute::kFull) {
    if (full_input_ != kNoSlot) {
      void* to = first_ ? static_cast<void*>(At<std::int32_t>(saved, saved_.tokens))
                        : static_cast<void*>(InputOf(saved_, saved, scratch_output));
      PO_RETURN_IF_ERROR(Copy(to, retained + full_input_, first_ ? n * 4 : n * d.C * 2, s));
    }
    if (last_) {
      PO_RETURN_IF_ERROR(
          Copy(At<std::int32_t>(saved, saved_.targets), retained + full_targets_, n * 4, s));
    }
    return ForwardPlaced(saved_, saved, scratch_output, scratch_losses);
  }
  for (const SlotCopy& copy : lean_copies_) {
    PO_RETURN_IF_ERROR(Copy(saved + copy.to, retained + copy.from, copy.bytes, s));
  }
  for (int i = 0; i < num_layers(); ++i) {
    PO_RETURN_IF_ERROR(RecomputeLeanSlots(
        context_, Weights(i),
        LayerActivationsAt(saved + saved_.layers[static_cast<std::size_t>(i)], saved_.layer)));
  }
  if (!last_) return absl::OkStatus();
  return LayerNormApply(At<bf16>(saved, saved_.lnf_out), At<bf16>(saved, saved_.lnf_in),
                        W(lnf_w_id_), W(lnf_b_id_), At<float>(saved, saved_.lnf_mean),
                        At<float>(saved, saved_.lnf_rstd), static_cast<int>(n), d.C, s);
}

absl::Status GptCudaChunk::HeadBackwardWeight(std::byte* saved, bool split) {
  const LayerDims& d = context_.dims();
  const int N = d.N();
  PO_RETURN_IF_ERROR(context_.linear().BackwardWeight(
      G(head_id_), At<bf16>(saved, saved_.logits), At<bf16>(saved, saved_.lnf_out), {N, d.C, V_}));
  return LayerNormBackwardWeight(G(lnf_w_id_), G(lnf_b_id_), context_.norm_scratch(),
                                 LnfOutGrad(saved, split), At<bf16>(saved, saved_.lnf_in),
                                 At<float>(saved, saved_.lnf_mean),
                                 At<float>(saved, saved_.lnf_rstd), N, d.C, context_.stream());
}

absl::Status GptCudaChunk::EncoderBackwardWeight(const Region& r, std::byte* saved, bool split) {
  const LayerDims& d = context_.dims();
  return EncoderBackward(G(kTokenEmbeddingId), G(kPositionEmbeddingId), EmbeddingGrad(saved, split),
                         At<std::int32_t>(saved, r.tokens), d.B, d.T, d.C, context_.stream());
}

const char* GptCudaChunk::WhyNotLean() const {
  if (last_) {
    return "the chunk holds the head, whose weight gradient reads lnf_out, which the lean block "
           "does not keep (rebuild it with RecomputeSaved)";
  }
  if (lean_.bytes <= 0) {
    return "the context's dims are lean_saved, so the chunk keeps no lean retained block (its "
           "saved region is lean already: pass EntryLayout::kSaved)";
  }
  if (context_.lean_ln1_out() == nullptr) {
    return "the context has no lean scratch to recompute ln1, ln2 and gelu(fch) into "
           "(LayerDims::lean_scratch)";
  }
  return nullptr;
}

absl::Status GptCudaChunk::Backward(const bf16* grad_output, bf16* grad_input, std::byte* saved,
                                    bool with_weight_grad, float dloss, EntryLayout layout) {
  if (saved == nullptr || (!last_ && grad_output == nullptr) ||
      (!first_ && grad_input == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptCudaChunk::Backward: a required pointer is null (saved",
        last_ ? "" : ", grad_output", first_ ? "" : ", grad_input", ")"));
  }
  const bool lean = layout == EntryLayout::kLeanRetained;
  if (lean) {
    const char* why = WhyNotLean();
    if (why == nullptr && !with_weight_grad) {
      why = "a split backward leaves W's output gradients after the saved layout's "
            "SavedBytes(false) bytes, which a lean block does not have (rebuild it with "
            "RecomputeSaved)";
    }
    if (why != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptCudaChunk::Backward cannot read a lean retained block: ", why));
    }
  }
  // Where the forward activations are; a lean block's layers lack ln1, ln2 and g, which
  // LayerBackwardWeight recomputes into the lean scratch.
  const Region& r = lean ? lean_ : saved_;
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
    bf16* dlogits = At<bf16>(saved, saved_.logits);
    const auto* targets = At<std::int32_t>(saved, saved_.targets);
    PO_RETURN_IF_ERROR(SoftmaxCrossEntropyBackward(dlogits, dlogits, At<float>(saved, saved_.lse),
                                                   targets, dloss, N, V_, s));
    bf16* d_lnf_out = LnfOutGrad(saved, split);
    PO_RETURN_IF_ERROR(context_.linear().BackwardInput(d_lnf_out, dlogits, W(head_id_), nullptr,
                                                       {N, d.C, V_}));
    PO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dout_last, 0, static_cast<std::size_t>(nc_bytes), s));
    PO_RETURN_IF_ERROR(LayerNormBackwardInput(dout_last, d_lnf_out, At<bf16>(saved, saved_.lnf_in),
                                              W(lnf_w_id_), At<float>(saved, saved_.lnf_mean),
                                              At<float>(saved, saved_.lnf_rstd), N, d.C, s));
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
        LayerActivationsAt(saved + r.layers[static_cast<std::size_t>(i)], r.layer);
    PO_RETURN_IF_ERROR(LayerBackwardInput(context_, Weights(i), a, g, dinp));
    if (with_weight_grad) {
      PO_RETURN_IF_ERROR(LayerBackwardWeight(context_, Weights(i), WeightGrads(i), a, g));
    }
  }
  if (first_ && with_weight_grad) PO_RETURN_IF_ERROR(EncoderBackwardWeight(r, saved, split));
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
        LayerActivationsAt(saved + saved_.layers[static_cast<std::size_t>(i)], saved_.layer),
        GradsOf(i, saved, /*split=*/true)));
  }
  if (first_) PO_RETURN_IF_ERROR(EncoderBackwardWeight(saved_, saved, /*split=*/true));
  return absl::OkStatus();
}

}  // namespace pipeoffload::gpt::cuda
