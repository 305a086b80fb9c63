// Config validation and the model's static structure (tensor list, layer split).
#include "examples/gpt/gpt_config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/check.h"

namespace pipeoffload::gpt {
namespace {

// Upper bounds keep every buffer size well inside int64 and every per-row index inside int;
// they are far above anything a CPU example trains.
constexpr int kMaxVocab = 1 << 20;
constexpr int kMaxSeqLen = 1 << 14;
constexpr int kMaxEmbd = 1 << 14;
constexpr int kMaxLayers = 1 << 10;
constexpr int kMaxBatch = 1 << 16;
constexpr int kMaxMicrobatches = 1 << 20;

absl::Status CheckRange(const char* field, std::int64_t value, std::int64_t lo, std::int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig.", field, " = ", value, " is out of range [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckFinitePositive(const char* field, float value) {
  if (!std::isfinite(value) || value <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptConfig.optimizer.", field, " = ", value, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGptConfig(const GptConfig& config) {
  if (auto s = CheckRange("vocab_size", config.vocab_size, 2, kMaxVocab); !s.ok()) return s;
  if (auto s = CheckRange("seq_len", config.seq_len, 1, kMaxSeqLen); !s.ok()) return s;
  if (auto s = CheckRange("n_embd", config.n_embd, 1, kMaxEmbd); !s.ok()) return s;
  if (auto s = CheckRange("n_head", config.n_head, 1, config.n_embd); !s.ok()) return s;
  if (auto s = CheckRange("n_layer", config.n_layer, 1, kMaxLayers); !s.ok()) return s;
  if (auto s = CheckRange("batch_size", config.batch_size, 1, kMaxBatch); !s.ok()) return s;
  if (auto s = CheckRange("num_microbatches", config.num_microbatches, 1, kMaxMicrobatches);
      !s.ok()) {
    return s;
  }
  if (config.n_embd % config.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptConfig.n_embd = ", config.n_embd, " is not a multiple of n_head = ", config.n_head));
  }
  const AdamWConfig& opt = config.optimizer;
  if (auto s = CheckFinitePositive("learning_rate", opt.learning_rate); !s.ok()) return s;
  if (auto s = CheckFinitePositive("epsilon", opt.epsilon); !s.ok()) return s;
  for (auto [field, beta] : {std::pair{"beta1", opt.beta1}, std::pair{"beta2", opt.beta2}}) {
    if (!(beta >= 0.0f && beta < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptConfig.optimizer.", field, " = ", beta, " must be in [0, 1)"));
    }
  }
  if (!(opt.weight_decay >= 0.0f && std::isfinite(opt.weight_decay))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptConfig.optimizer.weight_decay = ", opt.weight_decay, " must be finite and >= 0"));
  }
  for (auto [field, steps] : {std::pair{"warmup_steps", opt.warmup_steps},
                              std::pair{"decay_steps", opt.decay_steps}}) {
    if (steps < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptConfig.optimizer.", field, " = ", steps, " must be >= 0"));
    }
  }
  if (!(opt.min_learning_rate >= 0.0f && opt.min_learning_rate <= opt.learning_rate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptConfig.optimizer.min_learning_rate = ", opt.min_learning_rate,
        " must be in [0, learning_rate = ", opt.learning_rate, "]"));
  }
  if (!(opt.clip_norm >= 0.0f && std::isfinite(opt.clip_norm))) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig.optimizer.clip_norm = ",
                                                   opt.clip_norm, " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

int LayerTensorId(int layer, TensorKind kind) {
  const int offset = static_cast<int>(kind) - static_cast<int>(TensorKind::kLn1Weight);
  PO_CHECK(offset >= 0 && offset < kTensorsPerLayer);
  return 2 + layer * kTensorsPerLayer + offset;
}

int LnfWeightId(const GptConfig& config) { return 2 + config.n_layer * kTensorsPerLayer; }
int LnfBiasId(const GptConfig& config) { return LnfWeightId(config) + 1; }
int HeadWeightId(const GptConfig& config) {
  return config.tied_embeddings ? -1 : LnfWeightId(config) + 2;
}

namespace {

// GPT-2 init (Radford et al. 2019, section 2.3): N(0, 0.02) for weights, 0.01 for positions,
// and residual projections scaled by 1/sqrt(2 * n_layer) (two residual adds per block).
constexpr float kInitStd = 0.02f;

TensorSpec MakeSpec(TensorKind kind, int layer, std::int64_t rows, std::int64_t cols, float std,
                    float value, std::string name) {
  TensorSpec spec;
  spec.kind = kind;
  spec.layer = layer;
  spec.rows = rows;
  spec.cols = cols;
  spec.init_std = std;
  spec.init_value = value;
  spec.weight_decay = cols > 1;
  spec.name = std::move(name);
  return spec;
}

}  // namespace

std::vector<TensorSpec> LayerTensorSpecs(std::int64_t C, int layer, int total_layers) {
  const std::int64_t c = C;
  const float residual_std = kInitStd / std::sqrt(2.0f * static_cast<float>(total_layers));
  const std::string p = absl::StrCat("h.", layer, ".");
  std::vector<TensorSpec> specs;
  auto add = [&](TensorKind kind, std::int64_t rows, std::int64_t cols, float std, float value,
                 const char* name) {
    specs.push_back(MakeSpec(kind, layer, rows, cols, std, value, p + name));
  };
  add(TensorKind::kLn1Weight, c, 1, 0.0f, 1.0f, "ln1.w");
  add(TensorKind::kLn1Bias, c, 1, 0.0f, 0.0f, "ln1.b");
  add(TensorKind::kQkvWeight, 3 * c, c, kInitStd, 0.0f, "qkv.w");
  add(TensorKind::kQkvBias, 3 * c, 1, 0.0f, 0.0f, "qkv.b");
  add(TensorKind::kAttnProjWeight, c, c, residual_std, 0.0f, "attn_proj.w");
  add(TensorKind::kAttnProjBias, c, 1, 0.0f, 0.0f, "attn_proj.b");
  add(TensorKind::kLn2Weight, c, 1, 0.0f, 1.0f, "ln2.w");
  add(TensorKind::kLn2Bias, c, 1, 0.0f, 0.0f, "ln2.b");
  add(TensorKind::kFcWeight, 4 * c, c, kInitStd, 0.0f, "fc.w");
  add(TensorKind::kFcBias, 4 * c, 1, 0.0f, 0.0f, "fc.b");
  add(TensorKind::kFcProjWeight, c, 4 * c, residual_std, 0.0f, "fc_proj.w");
  add(TensorKind::kFcProjBias, c, 1, 0.0f, 0.0f, "fc_proj.b");
  return specs;
}

std::vector<TensorSpec> GptTensorSpecs(const GptConfig& config) {
  const std::int64_t c = config.n_embd;
  const std::int64_t v = config.vocab_size;
  std::vector<TensorSpec> specs;
  specs.push_back(MakeSpec(TensorKind::kTokenEmbedding, -1, v, c, kInitStd, 0.0f, "wte"));
  specs.push_back(
      MakeSpec(TensorKind::kPositionEmbedding, -1, config.seq_len, c, 0.01f, 0.0f, "wpe"));
  for (int l = 0; l < config.n_layer; ++l) {
    for (TensorSpec& spec : LayerTensorSpecs(c, l, config.n_layer)) {
      specs.push_back(std::move(spec));
    }
  }
  specs.push_back(MakeSpec(TensorKind::kLnfWeight, -1, c, 1, 0.0f, 1.0f, "lnf.w"));
  specs.push_back(MakeSpec(TensorKind::kLnfBias, -1, c, 1, 0.0f, 0.0f, "lnf.b"));
  if (!config.tied_embeddings) {
    specs.push_back(MakeSpec(TensorKind::kHeadWeight, -1, v, c, kInitStd, 0.0f, "head.w"));
  }
  return specs;
}

LayerRange VirtualStageLayers(int n_layer, int num_virtual_stages, int virtual_stage) {
  PO_CHECK(num_virtual_stages >= 1 && virtual_stage >= 0 && virtual_stage < num_virtual_stages);
  const int base = n_layer / num_virtual_stages;
  const int extra = n_layer % num_virtual_stages;
  LayerRange range;
  range.begin = virtual_stage * base + std::min(virtual_stage, extra);
  range.end = range.begin + base + (virtual_stage < extra ? 1 : 0);
  return range;
}

absl::Status ValidatePipelineShape(int num_stages, int chunks_per_stage, int stage) {
  if (num_stages < 1 || chunks_per_stage < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline shape num_stages = ", num_stages,
                                                   ", chunks_per_stage = ", chunks_per_stage,
                                                   ": both must be >= 1"));
  }
  if (stage < 0 || stage >= num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " is out of range [0, ", num_stages, ")"));
  }
  const std::int64_t virtual_stages = std::int64_t{num_stages} * chunks_per_stage;
  if (virtual_stages > kMaxVirtualStages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_stages ", num_stages, " x chunks_per_stage ", chunks_per_stage, " = ", virtual_stages,
        " virtual stages; at most ", kMaxVirtualStages, " are supported"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePlacement(Placement placement, int chunks_per_stage) {
  if (placement == Placement::kV && chunks_per_stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement v needs chunks_per_stage == 2 (got ", chunks_per_stage, ")"));
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::gpt
