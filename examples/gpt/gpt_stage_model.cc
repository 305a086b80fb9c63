// GptStageModel: argument checks, saved-entry headers, data fetching, the tied-gradient exchange
// and the optimizer step around the chunks' math (see gpt_stage_model.h for the protocol).
//
// Saved entry states (the header's `state`), one entry per (mb, chunk) per iteration:
//   F writes kForwardDone -> B(with_weight_grad) checks it, writes kConsumed
//                         -> B(split) checks it, writes kAwaitingWeightGrad -> W checks, writes
//                            kConsumed.
//   ForwardRetaining writes kRetainedLean / kRetainedFull into the retained block's header;
//   RecomputeSaved checks it and writes kForwardDone into the rebuilt saved entry.
// Any other sequence (B twice, W without a split B, an entry of another mb, chunk or step) is
// FailedPrecondition; the header lives in the entry itself, so it survives offload and reload.
#include "examples/gpt/gpt_stage_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt {
namespace {

constexpr std::uint32_t kHeaderMagic = 0x53545047;  // "GPTS" little-endian
constexpr std::uint32_t kForwardDone = 1;
constexpr std::uint32_t kAwaitingWeightGrad = 2;
constexpr std::uint32_t kConsumed = 3;
constexpr std::uint32_t kRetainedLean = 4;
constexpr std::uint32_t kRetainedFull = 5;

std::uint32_t RetainedState(Recompute mode) {
  return mode == Recompute::kLean ? kRetainedLean : kRetainedFull;
}

struct SavedHeader {
  std::uint32_t magic;
  std::uint32_t state;
  std::int32_t mb;
  std::int32_t virtual_stage;
  std::int64_t step;
  std::uint64_t reserved;  // zero; keeps the payload 32-byte aligned relative to the entry
};
static_assert(sizeof(SavedHeader) == GptStageModel::kSavedHeaderBytes);

const char* StateName(std::uint32_t state) {
  switch (state) {
    case kForwardDone:
      return "forward done";
    case kAwaitingWeightGrad:
      return "awaiting weight grad";
    case kConsumed:
      return "consumed";
    case kRetainedLean:
      return "retained lean";
    case kRetainedFull:
      return "retained full";
    default:
      return "unknown";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptStageModel>> GptStageModel::Create(
    const GptConfig& config, int num_stages, int chunks_per_stage, int stage,
    std::shared_ptr<const GptData> data, Placement placement) {
  PO_RETURN_IF_ERROR(ValidateGptConfig(config));
  PO_RETURN_IF_ERROR(ValidatePipelineShape(num_stages, chunks_per_stage, stage));
  PO_RETURN_IF_ERROR(ValidatePlacement(placement, chunks_per_stage));
  if (data == nullptr) return absl::InvalidArgumentError("GptStageModel needs a data source");
  PO_RETURN_IF_ERROR(data->CheckCompatible(config));
  return std::unique_ptr<GptStageModel>(new GptStageModel(
      config, VirtualStageMap{placement, num_stages, chunks_per_stage}, stage, std::move(data)));
}

GptStageModel::GptStageModel(const GptConfig& config, const VirtualStageMap& map, int stage,
                             std::shared_ptr<const GptData> data)
    : config_(config),
      num_stages_(map.num_stages),
      stage_(stage),
      num_tensors_(static_cast<int>(GptTensorSpecs(config).size())),
      data_(std::move(data)),
      losses_(static_cast<std::size_t>(config.num_microbatches),
              std::numeric_limits<double>::quiet_NaN()) {
  for (int c = 0; c < map.chunks; ++c) {
    chunks_.push_back(
        std::make_unique<GptChunk>(config, map.virtual_stage(stage, c), map.num_virtual_stages()));
  }
  const std::size_t bt = static_cast<std::size_t>(config.batch_size) * config.seq_len;
  tokens_.resize(bt);
  targets_.resize(bt);
}

std::int64_t GptStageModel::SavedBytes(int chunk, bool split_backward) const {
  if (chunk < 0 || chunk >= chunks_per_stage()) return 0;
  return kSavedHeaderBytes + chunks_[static_cast<std::size_t>(chunk)]->SavedBytes(split_backward);
}

std::int64_t GptStageModel::BoundaryBytes() const {
  return std::int64_t{config_.batch_size} * config_.seq_len * config_.n_embd *
         std::int64_t{sizeof(float)};
}

absl::Status GptStageModel::CheckCall(const char* op, int mb, int chunk, const void* saved,
                                      const char* buffer) const {
  if (mb < 0 || mb >= config_.num_microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": mb ", mb, " is out of range [0, ", config_.num_microbatches, ")"));
  }
  if (chunk < 0 || chunk >= chunks_per_stage()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": chunk ", chunk, " is out of range [0, ",
                                                   chunks_per_stage(), ") on stage ", stage_));
  }
  if (saved == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", buffer, " is null"));
  if (reinterpret_cast<std::uintptr_t>(saved) % alignof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", buffer, " buffer is not ", alignof(float), "-byte aligned"));
  }
  if (step_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": StartIteration was not called before the first compute op"));
  }
  return absl::OkStatus();
}

void GptStageModel::WriteHeader(int mb, int chunk, void* saved, std::uint32_t state) const {
  SavedHeader header{
      kHeaderMagic, state, mb, chunks_[static_cast<std::size_t>(chunk)]->virtual_stage(), step_, 0};
  std::memcpy(saved, &header, sizeof(header));
}

absl::Status GptStageModel::CheckHeader(const char* op, int mb, int chunk, const void* saved,
                                        std::uint32_t expected_state) const {
  SavedHeader header;
  std::memcpy(&header, saved, sizeof(header));
  const int virtual_stage = chunks_[static_cast<std::size_t>(chunk)]->virtual_stage();
  if (header.magic != kHeaderMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, "(mb ", mb, ", chunk ", chunk,
                     "): saved entry was not written by Forward (bad magic)"));
  }
  if (header.mb != mb || header.virtual_stage != virtual_stage || header.step != step_) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, "(mb ", mb, ", chunk ", chunk, ", step ", step_,
                     "): saved entry belongs to mb ", header.mb, ", virtual stage ",
                     header.virtual_stage, " (expected ", virtual_stage, "), step ", header.step));
  }
  if (header.state != expected_state) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, "(mb ", mb, ", chunk ", chunk, "): saved entry is '",
                     StateName(header.state), "', expected '", StateName(expected_state), "'"));
  }
  return absl::OkStatus();
}

absl::Status GptStageModel::Forward(int mb, int chunk, const void* input, void* output,
                                    void* saved) {
  PO_RETURN_IF_ERROR(CheckCall("Forward", mb, chunk, saved));
  PO_RETURN_IF_ERROR(CheckForwardBuffers("Forward", mb, chunk, input, output));
  WriteHeader(mb, chunk, saved, kForwardDone);
  RunForward(mb, chunk, input, output, static_cast<std::byte*>(saved) + kSavedHeaderBytes);
  return absl::OkStatus();
}

absl::Status GptStageModel::CheckForwardBuffers(const char* op, int mb, int chunk,
                                                const void* input, const void* output) const {
  const GptChunk& c = *chunks_[static_cast<std::size_t>(chunk)];
  if (!c.is_first() && input == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, "(mb ", mb, ", chunk ", chunk,
                                                   "): input is null on virtual stage ",
                                                   c.virtual_stage()));
  }
  if (!c.is_last() && output == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, "(mb ", mb, ", chunk ", chunk,
                                                   "): output is null on virtual stage ",
                                                   c.virtual_stage()));
  }
  return absl::OkStatus();
}

void GptStageModel::RunForward(int mb, int chunk, const void* input, void* output,
                               std::byte* payload) {
  GptChunk& c = *chunks_[static_cast<std::size_t>(chunk)];
  if (c.is_first() || c.is_last()) {
    data_->Microbatch(config_.seed, step_, mb, config_.batch_size, config_.seq_len, tokens_.data(),
                      targets_.data());
  }
  const double loss = c.Forward(tokens_.data(), targets_.data(), static_cast<const float*>(input),
                                static_cast<float*>(output), payload);
  if (c.is_last()) losses_[static_cast<std::size_t>(mb)] = loss;
}

std::int64_t GptStageModel::RetainedBytes(int chunk, Recompute mode,
                                          bool /*split_backward*/) const {
  // The split-backward region is B's output, so the retained block never holds it.
  if (chunk < 0 || chunk >= chunks_per_stage() || mode == Recompute::kNone) return -1;
  return kSavedHeaderBytes + chunks_[static_cast<std::size_t>(chunk)]->RetainedBytes(mode);
}

absl::Status GptStageModel::ForwardRetaining(int mb, int chunk, const void* input, void* output,
                                             void* retained, Recompute mode) {
  PO_RETURN_IF_ERROR(CheckCall("ForwardRetaining", mb, chunk, retained, "retained"));
  PO_RETURN_IF_ERROR(CheckMode("ForwardRetaining", mb, chunk, mode));
  PO_RETURN_IF_ERROR(CheckForwardBuffers("ForwardRetaining", mb, chunk, input, output));
  GptChunk& c = *chunks_[static_cast<std::size_t>(chunk)];
  workspace_.resize(
      std::max(workspace_.size(), static_cast<std::size_t>(c.SavedBytes(/*split=*/false) / 4)));
  auto* workspace = reinterpret_cast<std::byte*>(workspace_.data());
  RunForward(mb, chunk, input, output, workspace);
  WriteHeader(mb, chunk, retained, RetainedState(mode));
  c.Retain(workspace, static_cast<std::byte*>(retained) + kSavedHeaderBytes, mode);
  return absl::OkStatus();
}

absl::Status GptStageModel::RecomputeSaved(int mb, int chunk, const void* retained, void* saved,
                                           Recompute mode) {
  PO_RETURN_IF_ERROR(CheckCall("RecomputeSaved", mb, chunk, saved));
  PO_RETURN_IF_ERROR(CheckCall("RecomputeSaved", mb, chunk, retained, "retained"));
  PO_RETURN_IF_ERROR(CheckMode("RecomputeSaved", mb, chunk, mode));
  PO_RETURN_IF_ERROR(CheckHeader("RecomputeSaved", mb, chunk, retained, RetainedState(mode)));
  chunks_[static_cast<std::size_t>(chunk)]->Rebuild(
      static_cast<const std::byte*>(retained) + kSavedHeaderBytes,
      static_cast<std::byte*>(saved) + kSavedHeaderBytes, mode);
  WriteHeader(mb, chunk, saved, kForwardDone);
  return absl::OkStatus();
}

absl::Status GptStageModel::CheckMode(const char* op, int mb, int chunk, Recompute mode) const {
  if (mode == Recompute::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, "(mb ", mb, ", chunk ", chunk, "): mode is none; expected lean or full"));
  }
  return absl::OkStatus();
}

absl::Status GptStageModel::Backward(int mb, int chunk, const void* grad_output, void* grad_input,
                                     void* saved, bool with_weight_grad) {
  PO_RETURN_IF_ERROR(CheckCall("Backward", mb, chunk, saved));
  PO_RETURN_IF_ERROR(CheckHeader("Backward", mb, chunk, saved, kForwardDone));
  GptChunk& c = *chunks_[static_cast<std::size_t>(chunk)];
  if (!c.is_last() && grad_output == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Backward(mb ", mb, ", chunk ", chunk,
                                                   "): grad_output is null on virtual stage ",
                                                   c.virtual_stage()));
  }
  if (!c.is_first() && grad_input == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Backward(mb ", mb, ", chunk ", chunk,
                                                   "): grad_input is null on virtual stage ",
                                                   c.virtual_stage()));
  }
  // d(objective)/d(token loss): the objective is the mean over the m microbatches of each
  // microbatch's mean over its N = B*T tokens.
  const double tokens = static_cast<double>(config_.batch_size) * config_.seq_len;
  const float dloss = static_cast<float>(1.0 / (tokens * config_.num_microbatches));
  c.Backward(static_cast<const float*>(grad_output), static_cast<float*>(grad_input),
             static_cast<std::byte*>(saved) + kSavedHeaderBytes, with_weight_grad, dloss);
  WriteHeader(mb, chunk, saved, with_weight_grad ? kConsumed : kAwaitingWeightGrad);
  return absl::OkStatus();
}

absl::Status GptStageModel::BackwardWeight(int mb, int chunk, void* saved) {
  PO_RETURN_IF_ERROR(CheckCall("BackwardWeight", mb, chunk, saved));
  PO_RETURN_IF_ERROR(CheckHeader("BackwardWeight", mb, chunk, saved, kAwaitingWeightGrad));
  chunks_[static_cast<std::size_t>(chunk)]->BackwardWeight(static_cast<std::byte*>(saved) +
                                                           kSavedHeaderBytes);
  WriteHeader(mb, chunk, saved, kConsumed);
  return absl::OkStatus();
}

void GptStageModel::StartIteration(std::int64_t step) {
  step_ = step;
  for (auto& c : chunks_) c->params().ZeroGrad();
  std::fill(losses_.begin(), losses_.end(), std::numeric_limits<double>::quiet_NaN());
  peer_tied_grad_set_ = false;
  gradients_finished_ = false;
}

bool GptStageModel::holds_loss() const { return chunks_.back()->is_last(); }

float* GptStageModel::EmbeddingPartGrad() const {
  GptChunk& first = *chunks_.front();
  if (!config_.tied_embeddings || !first.is_first()) return nullptr;
  return first.params().grad(first.params().Find(kTokenEmbeddingId, /*mirror=*/false));
}

float* GptStageModel::HeadPartGrad() const {
  GptChunk& last = *chunks_.back();
  if (!config_.tied_embeddings || !last.is_last()) return nullptr;
  return last.params().grad(last.params().Find(kTokenEmbeddingId, /*mirror=*/true));
}

bool GptStageModel::NeedsTiedGradExchange() const {
  return config_.tied_embeddings && chunks_.front()->is_first() != chunks_.back()->is_last();
}

std::int64_t GptStageModel::TiedGradElements() const {
  return std::int64_t{config_.vocab_size} * config_.n_embd;
}

const float* GptStageModel::TiedGradPart() const {
  const float* part = EmbeddingPartGrad();
  return part != nullptr ? part : HeadPartGrad();
}

absl::Status GptStageModel::SetPeerTiedGradPart(const float* part, std::int64_t elements) {
  if (!NeedsTiedGradExchange()) {
    return absl::InvalidArgumentError(absl::StrCat("SetPeerTiedGradPart on stage ", stage_,
                                                   ", which needs no tied-gradient exchange"));
  }
  if (part == nullptr || elements != TiedGradElements()) {
    return absl::InvalidArgumentError(absl::StrCat("SetPeerTiedGradPart: expected ",
                                                   TiedGradElements(), " floats (V x C), got ",
                                                   part == nullptr ? 0 : elements));
  }
  peer_tied_grad_.assign(part, part + elements);
  peer_tied_grad_set_ = true;
  return absl::OkStatus();
}

absl::Status GptStageModel::FinishGradients() {
  if (gradients_finished_) return absl::OkStatus();
  float* embedding_part = EmbeddingPartGrad();
  float* head_part = HeadPartGrad();
  if (embedding_part != nullptr || head_part != nullptr) {  // holds a copy of tied wte
    if (NeedsTiedGradExchange() && !peer_tied_grad_set_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "OptimizerStep on stage ", stage_,
          ": tied embeddings need the peer's gradient part (SetPeerTiedGradPart) first"));
    }
    const float* embedding = embedding_part != nullptr ? embedding_part : peer_tied_grad_.data();
    const float* head = head_part != nullptr ? head_part : peer_tied_grad_.data();
    // Sum into a temporary first: on one stage both outputs alias the inputs.
    std::vector<float> total(static_cast<std::size_t>(TiedGradElements()));
    for (std::size_t i = 0; i < total.size(); ++i) total[i] = embedding[i] + head[i];
    if (embedding_part != nullptr) std::copy(total.begin(), total.end(), embedding_part);
    if (head_part != nullptr) std::copy(total.begin(), total.end(), head_part);
  }
  gradients_finished_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorSquareSum>> GptStageModel::GradSquareSums() {
  PO_RETURN_IF_ERROR(FinishGradients());
  std::vector<TensorSquareSum> sums;
  for (const auto& c : chunks_) {
    std::vector<TensorSquareSum> part = c->params().GradSquareSums();
    sums.insert(sums.end(), part.begin(), part.end());
  }
  return sums;
}

absl::Status GptStageModel::OptimizerStep(float grad_scale) {
  if (!std::isfinite(grad_scale) || !(grad_scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("OptimizerStep on stage ", stage_,
                                                   ": grad_scale = ", grad_scale,
                                                   " must be finite and > 0"));
  }
  PO_RETURN_IF_ERROR(FinishGradients());
  ++optimizer_steps_;
  AdamWConfig adamw = config_.optimizer;
  adamw.learning_rate = LearningRateAt(config_.optimizer, optimizer_steps_);
  for (auto& c : chunks_) {
    if (grad_scale != 1.0f) c->params().ScaleGrads(grad_scale);
    c->params().AdamWStep(adamw, optimizer_steps_);
  }
  peer_tied_grad_set_ = false;
  gradients_finished_ = false;
  return absl::OkStatus();
}

std::vector<TensorHash> GptStageModel::ParameterHashes() const {
  std::vector<TensorHash> hashes;
  for (const auto& c : chunks_) {
    std::vector<TensorHash> part = c->params().Hashes();
    hashes.insert(hashes.end(), part.begin(), part.end());
  }
  return hashes;
}

}  // namespace pipeoffload::gpt
