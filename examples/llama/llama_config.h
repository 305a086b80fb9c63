// The Llama example's configuration: the architecture (Llama, Mistral, Qwen2 and Qwen3 share it:
// RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP), shapes by name from a table
// of Hugging Face config.json values or from a config.json file, validation, and the model's
// static structure: the parameter tensors of each unit (embedding, decoder layers, head) in the
// flat order the layer-sliding engine stores them, with their Hugging Face names.
// Pure functions of the config except ParseHfConfigFile (reads one file); no parameter values.
//
// Notation: H = hidden_size, F = intermediate_size, NH = num_heads, NKV = num_kv_heads,
// hd = head_dim, V = vocab_size, L = num_layers; B sequences of T tokens per microbatch,
// N = B * T rows.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CONFIG_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload::llama {

// Rotary embedding frequency scaling (config.json "rope_scaling").
enum class RopeScaling : std::uint8_t {
  kNone,    // inv_freq[i] = theta^(-2i/hd)
  kLlama3,  // Llama 3.1's: low frequencies divided by `factor`, a smooth band in between
};

struct LlamaConfig {
  std::string name = "tiny";       // the table's name, or "config.json" for a parsed file
  std::string model_type = "llama";  // config.json "model_type": llama, mistral, qwen2, qwen3
  int vocab_size = 256;            // V
  int hidden_size = 64;            // H
  int intermediate_size = 176;     // F (SwiGLU width)
  int num_layers = 4;              // L decoder layers
  int num_heads = 4;               // NH query heads
  int num_kv_heads = 2;            // NKV key/value heads; NH % NKV == 0 (GQA)
  int head_dim = 16;               // hd; rotary pairs (i, i + hd/2), so hd is even
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::kNone;
  // kLlama3 parameters (config.json rope_scaling.{factor, low_freq_factor, high_freq_factor,
  // original_max_position_embeddings}).
  float rope_factor = 8.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int rope_original_max_positions = 8192;
  int max_position_embeddings = 2048;
  bool tie_word_embeddings = false;  // the LM head reuses embed_tokens (V, H)
  bool attention_bias = false;       // q/k/v projections carry biases (Qwen2)
  bool qk_norm = false;              // RMSNorm over hd on each q and k head before RoPE (Qwen3)
  float initializer_range = 0.02f;   // N(0, std) init of matrices (config.json)
};

// OK, or InvalidArgument naming the first bad field and its value: non-positive sizes, an odd
// head_dim, NH % NKV != 0, non-finite or non-positive eps / theta, bad rope_scaling
// parameters, and sizes whose products overflow the int64 element counts.
[[nodiscard]] absl::Status ValidateLlamaConfig(const LlamaConfig& config);

// Shapes by name: "tiny" (the tests' model), "llama3-8b", "llama3.1-8b", "llama3.2-1b",
// "llama3.2-3b", "llama2-7b", "llama2-13b", "mistral-7b", "qwen2.5-7b", "qwen3-4b", "qwen3-8b",
// "qwen3-14b", ... (LlamaConfigNames lists them). Values are those of the models' Hugging Face
// config.json files. Errors: NotFound listing the names.
[[nodiscard]] absl::StatusOr<LlamaConfig> LlamaConfigByName(std::string_view name);
std::vector<std::string> LlamaConfigNames();

// A Hugging Face config.json (text or file). Reads the fields above (head_dim defaults to
// hidden_size / num_attention_heads, num_key_value_heads to num_attention_heads); model_type
// must be one of llama, mistral, qwen2, qwen3 (qwen3 turns qk_norm on, qwen2 attention_bias).
// Errors: InvalidArgument naming the file and the field (missing, wrong type, unsupported
// rope_scaling type, bad value); NotFound for a missing file.
[[nodiscard]] absl::StatusOr<LlamaConfig> ParseHfConfig(std::string_view json_text,
                                                        std::string_view source_name);
[[nodiscard]] absl::StatusOr<LlamaConfig> ParseHfConfigFile(const std::string& path);

// Rotary inverse frequencies (hd / 2 floats): theta^(-2i/hd), and with kLlama3 scaling the
// frequencies of wavelength > original_max / low_freq_factor divided by factor, those of
// wavelength < original_max / high_freq_factor kept, a linear blend between (as transformers'
// _compute_llama3_parameters). Computed in double, rounded once.
std::vector<float> RopeInvFreq(const LlamaConfig& config);

// The layer-sliding units of the model: unit 0 the token embedding, units 1..L the decoder
// layers, unit L+1 the head (final norm, LM head unless tied, loss).
inline int NumUnits(const LlamaConfig& config) { return config.num_layers + 2; }
inline int EmbeddingUnit() { return 0; }
inline int LayerUnit(int layer) { return layer + 1; }
inline int HeadUnit(const LlamaConfig& config) { return config.num_layers + 1; }

// One parameter tensor of a unit, at `offset` elements into the unit's flat parameter array.
struct LlamaTensor {
  std::string hf_name;  // "model.layers.3.self_attn.q_proj.weight"
  std::int64_t rows = 0;
  std::int64_t cols = 1;  // 1 for vectors
  std::int64_t offset = 0;
  bool weight_decay = false;  // matrices decay; norms and biases do not (HF Trainer's rule)
  bool is_norm = false;       // RMSNorm weight: initialized to 1
  std::int64_t numel() const { return rows * cols; }
};

// The tensors of `unit`, in flat order, with offsets. A decoder unit is
//   input_layernorm (H) | q_proj (NH*hd, H) | k_proj (NKV*hd, H) | v_proj (NKV*hd, H)
//   [| q_proj.bias (NH*hd) | k_proj.bias (NKV*hd) | v_proj.bias (NKV*hd)]   attention_bias
//   [| q_norm (hd) | k_norm (hd)]                                          qk_norm
//   | o_proj (H, NH*hd) | post_attention_layernorm (H) | gate_proj (F, H) | up_proj (F, H)
//   | down_proj (H, F)
// so q, k, v form one (NH+2NKV)*hd x H matrix and gate, up one 2F x H matrix (one GEMM each).
// The embedding unit is embed_tokens (V, H); the head unit is norm (H) [| lm_head (V, H)] (the
// lm_head only when untied: a tied head reads the embedding unit's parameters).
// REQUIRES: ValidateLlamaConfig(config).ok(), 0 <= unit < NumUnits(config).
std::vector<LlamaTensor> UnitTensors(const LlamaConfig& config, int unit);
// Elements of the unit's flat parameter array (the sum of its tensors).
std::int64_t UnitParamCount(const LlamaConfig& config, int unit);
// All parameters of the model (a tied head's weight counted once).
std::int64_t TotalParamCount(const LlamaConfig& config);

// Training FLOPs per token, the metric SlideFormer and Megatron report (recompute not counted):
// 3 x forward, forward = 2 x (matrix parameters of the layers and the LM head; the embedding is
// a gather) + 4 * T * NH * hd per layer (attention scores and values over the full T x T).
// Llama-3-8B at T = 2048: 48.2e9 (SlideFormer's 240 TFLOP/s at 4,967 tokens/s is 48.3e9).
double ModelFlopsPerToken(const LlamaConfig& config, int seq_len);

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_CONFIG_H_
