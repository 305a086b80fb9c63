// The GPT example's configuration, its validation, and the model's static structure: the
// canonical list of parameter tensors and how the layers are cut into virtual stages.
// Pure functions of the config; no I/O, no parameter values (gpt_params.h owns those).
//
// Notation: B = batch_size (sequences per microbatch), T = seq_len, C = n_embd, NH = n_head,
// V = vocab_size, m = num_microbatches, L = p * v virtual stages (reference/pipeoffload.md §0).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_GPT_CONFIG_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_GPT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::gpt {

// AdamW (Loshchilov & Hutter 2019): decoupled weight decay, bias-corrected moments.
struct AdamWConfig {
  float learning_rate = 3e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;  // GPT-2/3 practice for short runs
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;  // applied to matrices only (embeddings, linear weights, head)
  // The learning-rate schedule (LearningRateAt, optimizer_schedule.h): linear warm-up over the
  // first warmup_steps updates, then cosine decay to min_learning_rate at update decay_steps
  // (0: no decay, learning_rate after the warm-up). All zero (the default): a constant rate.
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 0;
  float min_learning_rate = 0.0f;
  // Global gradient-norm clipping: every gradient is multiplied by min(1, clip_norm / norm),
  // norm the L2 norm over ALL parameters of the model (every stage), before the update.
  // 0: off.
  float clip_norm = 0.0f;
};

struct GptConfig {
  int vocab_size = 256;       // V; byte-level tokens need 256
  int seq_len = 32;           // T
  int n_embd = 64;            // C
  int n_head = 4;             // NH; C % NH == 0
  int n_layer = 8;            // p = 4 stages x v = 2 chunks: one layer per chunk
  int batch_size = 4;         // B: sequences per microbatch
  int num_microbatches = 8;   // m: the step's gradient is the mean over m microbatches
  std::uint64_t seed = 1234;  // parameter init and microbatch sampling
  // Tied: the LM head reuses the token embedding (V, C). When the head and the embedding sit on
  // different virtual stages, each keeps a copy; see GptStageModel for the gradient exchange.
  bool tied_embeddings = false;
  AdamWConfig optimizer;
};

// OK, or InvalidArgument naming the first bad field and its value. Also rejects configs whose
// buffers would overflow the 32-bit index arithmetic of the kernels.
[[nodiscard]] absl::Status ValidateGptConfig(const GptConfig& config);

// One parameter tensor in the model's canonical order (embeddings, layer 0 .. n_layer-1, final
// LN, head). The index into GptTensorSpecs() is the tensor's global id: it seeds the tensor's
// init stream and orders the checksum, so both are independent of the pipeline split.
enum class TensorKind : std::uint8_t {
  kTokenEmbedding,     // wte  (V, C)
  kPositionEmbedding,  // wpe  (T, C)
  kLn1Weight,          // (C)
  kLn1Bias,            // (C)
  kQkvWeight,          // (3C, C)  llm.c layout: out = inp @ W^T + b
  kQkvBias,            // (3C)
  kAttnProjWeight,     // (C, C)
  kAttnProjBias,       // (C)
  kLn2Weight,          // (C)
  kLn2Bias,            // (C)
  kFcWeight,           // (4C, C)
  kFcBias,             // (4C)
  kFcProjWeight,       // (C, 4C)
  kFcProjBias,         // (C)
  kLnfWeight,          // (C)
  kLnfBias,            // (C)
  kHeadWeight,         // (V, C), untied only
};
inline constexpr int kTensorsPerLayer = 12;

struct TensorSpec {
  TensorKind kind = TensorKind::kTokenEmbedding;
  int layer = -1;  // -1 outside the blocks
  std::int64_t rows = 0;
  std::int64_t cols = 1;      // 1 for vectors
  float init_std = 0.0f;      // normal(0, std) when > 0
  float init_value = 0.0f;    // constant otherwise (1 for LN weights, 0 for biases)
  bool weight_decay = false;  // matrices decay, vectors do not
  std::string name;           // "h.3.qkv.w"
  std::int64_t numel() const { return rows * cols; }
};

// Every parameter tensor, in canonical order. REQUIRES: ValidateGptConfig(config).ok().
std::vector<TensorSpec> GptTensorSpecs(const GptConfig& config);

// The 12 specs of layer `layer` of width C in canonical order (kLn1Weight .. kFcProjBias), with
// GPT-2's init (N(0, 0.02) matrices, the two residual projections scaled by
// 1/sqrt(2 total_layers)): GptTensorSpecs' layers, and what models not built from a GptConfig
// (the CUDA layer stack) use.
std::vector<TensorSpec> LayerTensorSpecs(std::int64_t C, int layer, int total_layers);

// Global id of layer `layer`'s tensor `kind` (kLn1Weight .. kFcProjBias).
int LayerTensorId(int layer, TensorKind kind);
// Global ids of the non-layer tensors.
inline constexpr int kTokenEmbeddingId = 0;
inline constexpr int kPositionEmbeddingId = 1;
int LnfWeightId(const GptConfig& config);
int LnfBiasId(const GptConfig& config);
int HeadWeightId(const GptConfig& config);  // -1 when tied

// Layers [begin, end) of virtual stage `virtual_stage` of `num_virtual_stages`: as even as
// possible, the first n_layer % L virtual stages take one extra layer (so with L > n_layer the
// last L - n_layer virtual stages hold none). Virtual stage 0 also holds the embeddings, virtual
// stage L-1 the final LN, head and loss.
struct LayerRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};
LayerRange VirtualStageLayers(int n_layer, int num_virtual_stages, int virtual_stage);

// OK, or InvalidArgument for a pipeline shape that makes no sense (p or v < 1, stage out of
// range, more than kMaxVirtualStages virtual stages). Fewer layers than virtual stages is fine.
inline constexpr int kMaxVirtualStages = 1 << 12;
[[nodiscard]] absl::Status ValidatePipelineShape(int num_stages, int chunks_per_stage, int stage);
// OK, or InvalidArgument for placement v with chunks_per_stage != 2 (VirtualStageMap's contract).
[[nodiscard]] absl::Status ValidatePlacement(Placement placement, int chunks_per_stage);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_GPT_CONFIG_H_
