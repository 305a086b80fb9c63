// The table of named shapes (each entry's numbers copied from the model's Hugging Face
// config.json, source cited beside it), config.json parsing and writing. The file read is the
// only I/O (ParseHfConfigFile).
#include "examples/llama/llama_config_io.h"

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/llama/file_io.h"
#include "examples/llama/llama_config.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"
#include "lib/ir/json_fields.h"

namespace pipeoffload::llama {
namespace {

using internal::Json;

// One row of the table. rope_factor 0 means no rotary scaling; otherwise Llama 3.1's scaling
// with that factor and low/high frequency factors 1 and 4 over an original context of 8192
// (the values every Llama 3.1 / 3.2 config.json carries).
struct Entry {
  const char* name;
  const char* model_type;
  int vocab_size;
  int hidden_size;
  int intermediate_size;
  int num_layers;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int max_positions;
  float rms_norm_eps;
  float rope_theta;
  float rope_factor;
  bool tied;
};

// Sources (config.json contents as quoted in public repositories, found with the search tool):
//  [A] citsjtu2020/LLM-Prof sglang/Model_Config.md: Llama-3.1-8B, Llama-3.2-3B, Qwen2.5-7B,
//      Qwen3-4B, Qwen3-8B, Qwen3-14B config.json files verbatim.
//  [B] kevinstephano/thunder_model_blocks hf_llama/llama_config.py: Llama-3.2-1B(-Instruct).
//  [C] a dump of meta-llama/Meta-Llama-3-8B-Instruct's LlamaConfig (same architecture fields as
//      the base model; a second source lists Meta-Llama-3-8B's own config.json with the same
//      sizes, rope_theta 500000.0 and max_position_embeddings 8192).
//  [D] meta-llama/Llama-2-7b-hf and Llama-2-13b-hf config dumps (transformers 4.39-4.45 logs):
//      rms_norm_eps 1e-05, rope_theta 10000.0, max_position_embeddings 4096.
//  [E] meta-llama/Meta-Llama-3-70B(-Instruct) config (transformers 4.40-4.43).
//  [F] a MistralConfig dump of mistralai/Mistral-7B-v0.1 (transformers 4.37.2). Its
//      "sliding_window": 4096 is not modelled: attention here is full causal, which equals
//      Mistral's for sequences up to 4096 tokens.
constexpr Entry kTable[] = {
    // {name, model_type, V, H, F, L, NH, NKV, hd, max_position_embeddings, rms_norm_eps,
    //  rope_theta, llama3 rope factor (0: none), tie_word_embeddings}
    {"llama3-8b", "llama", 128256, 4096, 14336, 32, 32, 8, 128, 8192, 1e-5f, 500000.0f, 0.0f,
     false},  // [C]
    {"llama3.1-8b", "llama", 128256, 4096, 14336, 32, 32, 8, 128, 131072, 1e-5f, 500000.0f, 8.0f,
     false},  // [A]
    {"llama3.2-1b", "llama", 128256, 2048, 8192, 16, 32, 8, 64, 131072, 1e-5f, 500000.0f, 32.0f,
     true},  // [B]
    {"llama3.2-3b", "llama", 128256, 3072, 8192, 28, 24, 8, 128, 131072, 1e-5f, 500000.0f, 32.0f,
     true},  // [A]
    {"llama2-7b", "llama", 32000, 4096, 11008, 32, 32, 32, 128, 4096, 1e-5f, 10000.0f, 0.0f,
     false},  // [D]
    {"llama2-13b", "llama", 32000, 5120, 13824, 40, 40, 40, 128, 4096, 1e-5f, 10000.0f, 0.0f,
     false},  // [D]
    {"llama3-70b", "llama", 128256, 8192, 28672, 80, 64, 8, 128, 8192, 1e-5f, 500000.0f, 0.0f,
     false},  // [E]
    {"mistral-7b", "mistral", 32000, 4096, 14336, 32, 32, 8, 128, 32768, 1e-5f, 10000.0f, 0.0f,
     false},  // [F]
    {"qwen2.5-7b", "qwen2", 152064, 3584, 18944, 28, 28, 4, 128, 131072, 1e-6f, 1000000.0f, 0.0f,
     false},  // [A]; qwen2: q/k/v biases
    {"qwen3-4b", "qwen3", 151936, 2560, 9728, 36, 32, 8, 128, 40960, 1e-6f, 1000000.0f, 0.0f,
     true},  // [A]; qwen3: q/k norms
    {"qwen3-8b", "qwen3", 151936, 4096, 12288, 36, 32, 8, 128, 40960, 1e-6f, 1000000.0f, 0.0f,
     false},  // [A]
    {"qwen3-14b", "qwen3", 151936, 5120, 17408, 40, 40, 8, 128, 40960, 1e-6f, 1000000.0f, 0.0f,
     false},  // [A]
};

constexpr const char* kModelTypes[] = {"llama", "mistral", "qwen2", "qwen3"};

bool KnownModelType(std::string_view type) {
  for (std::string_view known : kModelTypes) {
    if (type == known) return true;
  }
  return false;
}

const char* ArchitectureOf(std::string_view type) {
  if (type == "mistral") return "MistralForCausalLM";
  if (type == "qwen2") return "Qwen2ForCausalLM";
  if (type == "qwen3") return "Qwen3ForCausalLM";
  return "LlamaForCausalLM";
}

// transformers' class defaults for fields a config.json may omit: max_position_embeddings
// LlamaConfig 2048, MistralConfig 4096 * 32, Qwen2Config / Qwen3Config 32768; rms_norm_eps 1e-6
// and rope_theta 10000 in all four. (LlamaConfig's signature as quoted in
// Esmail-ibraheem/Axon X-Llama/config.py; MistralConfig's in huggingface/trl PR #7204; the
// Qwen classes' from transformers' configuration_qwen2/3.py, not re-checked here.)
int DefaultMaxPositions(std::string_view type) {
  if (type == "mistral") return 4096 * 32;
  if (type == "qwen2" || type == "qwen3") return 32768;
  return 2048;
}

LlamaConfig FromEntry(const Entry& e) {
  LlamaConfig c;
  c.name = e.name;
  c.model_type = e.model_type;
  c.vocab_size = e.vocab_size;
  c.hidden_size = e.hidden_size;
  c.intermediate_size = e.intermediate_size;
  c.num_layers = e.num_layers;
  c.num_heads = e.num_heads;
  c.num_kv_heads = e.num_kv_heads;
  c.head_dim = e.head_dim;
  c.max_position_embeddings = e.max_positions;
  c.rms_norm_eps = e.rms_norm_eps;
  c.rope_theta = e.rope_theta;
  if (e.rope_factor > 0.0f) {
    c.rope_scaling = RopeScaling::kLlama3;
    c.rope_factor = e.rope_factor;
    c.rope_low_freq_factor = 1.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_original_max_positions = 8192;
  }
  c.tie_word_embeddings = e.tied;
  c.attention_bias = c.model_type == "qwen2";
  c.qk_norm = c.model_type == "qwen3";
  c.initializer_range = 0.02f;  // every source above
  return c;
}

// The tests' models: LlamaConfig{} and its variants for each architectural switch.
std::vector<LlamaConfig> TinyConfigs() {
  std::vector<LlamaConfig> tiny(4);
  tiny[1].name = "tiny-tied";
  tiny[1].tie_word_embeddings = true;
  tiny[2].name = "tiny-qwen3";
  tiny[2].model_type = "qwen3";
  tiny[2].qk_norm = true;
  tiny[2].attention_bias = false;
  tiny[3].name = "tiny-qwen2";
  tiny[3].model_type = "qwen2";
  tiny[3].attention_bias = true;
  return tiny;
}

const std::vector<LlamaConfig>& AllConfigs() {
  static const std::vector<LlamaConfig>* const configs = [] {
    auto* all = new std::vector<LlamaConfig>(TinyConfigs());
    for (const Entry& e : kTable) all->push_back(FromEntry(e));
    return all;
  }();
  return *configs;
}

// ---- parsing ----

// Reads member `key` when present and not null (config.json writes null for "use default").
template <typename T>
absl::Status ReadOptional(const Json& doc, std::string_view key, T* out) {
  const Json* member = internal::FindMember(doc, key);
  if (member == nullptr || member->is_null()) return absl::OkStatus();
  return internal::ReadValue(*member, key, out);
}

absl::Status ReadOptionalFloat(const Json& doc, std::string_view key, float* out) {
  double read = 0.0;
  const Json* member = internal::FindMember(doc, key);
  if (member == nullptr || member->is_null()) return absl::OkStatus();
  PO_RETURN_IF_ERROR(internal::ReadValue(*member, key, &read));
  *out = static_cast<float>(read);
  return absl::OkStatus();
}

absl::Status ParseRopeScaling(const Json& doc, LlamaConfig* c) {
  const Json* scaling = internal::FindMember(doc, "rope_scaling");
  c->rope_scaling = RopeScaling::kNone;
  if (scaling == nullptr || scaling->is_null()) return absl::OkStatus();
  if (!scaling->is_object()) {
    return internal::FieldError("rope_scaling", absl::StrCat("expected an object or null, got ",
                                                             internal::JsonKind(*scaling)));
  }
  // transformers reads "rope_type", and "type" in files written before it was renamed.
  std::string type;
  const Json* type_member = internal::FindMember(*scaling, "rope_type");
  std::string type_path = "rope_scaling.rope_type";
  if (type_member == nullptr) {
    type_member = internal::FindMember(*scaling, "type");
    type_path = "rope_scaling.type";
  }
  if (type_member == nullptr) {
    return internal::FieldError("rope_scaling", "has neither \"rope_type\" nor \"type\"");
  }
  PO_RETURN_IF_ERROR(internal::ReadValue(*type_member, type_path, &type));
  if (type == "default") return absl::OkStatus();
  if (type != "llama3") {
    return internal::FieldError(
        type_path, absl::StrCat("rotary scaling '", type,
                                "' is not supported; supported: \"default\", \"llama3\""));
  }
  c->rope_scaling = RopeScaling::kLlama3;
  double factor = 0.0, low = 0.0, high = 0.0;
  PO_RETURN_IF_ERROR(internal::ReadMember(*scaling, "rope_scaling", "factor", &factor));
  PO_RETURN_IF_ERROR(internal::ReadMember(*scaling, "rope_scaling", "low_freq_factor", &low));
  PO_RETURN_IF_ERROR(internal::ReadMember(*scaling, "rope_scaling", "high_freq_factor", &high));
  PO_RETURN_IF_ERROR(internal::ReadMember(*scaling, "rope_scaling",
                                          "original_max_position_embeddings",
                                          &c->rope_original_max_positions));
  c->rope_factor = static_cast<float>(factor);
  c->rope_low_freq_factor = static_cast<float>(low);
  c->rope_high_freq_factor = static_cast<float>(high);
  return absl::OkStatus();
}

// Fields that would change the computation if set to something this model does not do.
absl::Status RejectUnsupported(const Json& doc) {
  std::string act = "silu";
  PO_RETURN_IF_ERROR(ReadOptional(doc, "hidden_act", &act));
  if (act != "silu") {
    return internal::FieldError("hidden_act",
                                absl::StrCat("'", act, "' is not supported (SwiGLU uses silu)"));
  }
  bool flag = false;
  PO_RETURN_IF_ERROR(ReadOptional(doc, "mlp_bias", &flag));
  if (flag) return internal::FieldError("mlp_bias", "true is not supported");
  flag = false;
  PO_RETURN_IF_ERROR(ReadOptional(doc, "use_sliding_window", &flag));
  if (flag) {
    return internal::FieldError("use_sliding_window",
                                "true is not supported (attention here is full causal)");
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaConfig> ParseDocument(const Json& doc) {
  if (!doc.is_object()) {
    return internal::FieldError("",
                                absl::StrCat("expected an object, got ", internal::JsonKind(doc)));
  }
  LlamaConfig c;
  c.name = "config.json";
  PO_RETURN_IF_ERROR(internal::ReadMember(doc, "", "model_type", &c.model_type));
  if (!KnownModelType(c.model_type)) {
    return internal::FieldError(
        "model_type", absl::StrCat("'", c.model_type,
                                   "' is not supported; expected one of llama, mistral, qwen2, "
                                   "qwen3"));
  }
  PO_RETURN_IF_ERROR(RejectUnsupported(doc));
  PO_RETURN_IF_ERROR(internal::ReadMember(doc, "", "vocab_size", &c.vocab_size));
  PO_RETURN_IF_ERROR(internal::ReadMember(doc, "", "hidden_size", &c.hidden_size));
  PO_RETURN_IF_ERROR(internal::ReadMember(doc, "", "intermediate_size", &c.intermediate_size));
  PO_RETURN_IF_ERROR(internal::ReadMember(doc, "", "num_hidden_layers", &c.num_layers));
  PO_RETURN_IF_ERROR(internal::ReadMember(doc, "", "num_attention_heads", &c.num_heads));
  if (c.num_heads <= 0) {
    return internal::FieldError("num_attention_heads",
                                absl::StrCat(c.num_heads, " must be positive"));
  }
  c.num_kv_heads = c.num_heads;
  PO_RETURN_IF_ERROR(ReadOptional(doc, "num_key_value_heads", &c.num_kv_heads));
  c.head_dim = c.hidden_size / c.num_heads;
  PO_RETURN_IF_ERROR(ReadOptional(doc, "head_dim", &c.head_dim));
  c.rms_norm_eps = 1e-6f;
  PO_RETURN_IF_ERROR(ReadOptionalFloat(doc, "rms_norm_eps", &c.rms_norm_eps));
  c.rope_theta = 10000.0f;
  PO_RETURN_IF_ERROR(ReadOptionalFloat(doc, "rope_theta", &c.rope_theta));
  PO_RETURN_IF_ERROR(ParseRopeScaling(doc, &c));
  c.max_position_embeddings = DefaultMaxPositions(c.model_type);
  PO_RETURN_IF_ERROR(ReadOptional(doc, "max_position_embeddings", &c.max_position_embeddings));
  c.initializer_range = 0.02f;
  PO_RETURN_IF_ERROR(ReadOptionalFloat(doc, "initializer_range", &c.initializer_range));
  c.tie_word_embeddings = false;
  PO_RETURN_IF_ERROR(ReadOptional(doc, "tie_word_embeddings", &c.tie_word_embeddings));
  c.attention_bias = c.model_type == "qwen2";
  PO_RETURN_IF_ERROR(ReadOptional(doc, "attention_bias", &c.attention_bias));
  c.qk_norm = c.model_type == "qwen3";
  PO_RETURN_IF_ERROR(ValidateLlamaConfig(c));
  return c;
}

// ---- writing ----

// The shortest decimal that reads back as `value` (std::to_chars), as a JSON number; if the
// decimal -> double -> float path rounds twice to a different float, the exact double instead.
Json FloatJson(float value) {
  char text[64];
  const std::to_chars_result result = std::to_chars(text, text + sizeof(text), value);
  PO_CHECK(result.ec == std::errc());
  *result.ptr = '\0';
  double shortest = std::strtod(text, nullptr);
  if (static_cast<float>(shortest) != value) shortest = static_cast<double>(value);
  return shortest;
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfigByName(std::string_view name) {
  for (const LlamaConfig& config : AllConfigs()) {
    if (config.name == name) return config;
  }
  return absl::NotFoundError(absl::StrCat("no model shape named '", std::string(name),
                                          "'; known: ", internal::JoinNames(LlamaConfigNames())));
}

std::vector<std::string> LlamaConfigNames() {
  std::vector<std::string> names;
  for (const LlamaConfig& config : AllConfigs()) names.push_back(config.name);
  return names;
}

absl::StatusOr<LlamaConfig> ParseHfConfig(std::string_view json_text,
                                          std::string_view source_name) {
  const std::string context = absl::StrCat("config '", std::string(source_name), "'");
  absl::StatusOr<Json> doc = internal::ParseJsonText(json_text);
  if (!doc.ok()) return Annotate(doc.status(), context);
  absl::StatusOr<LlamaConfig> config = ParseDocument(*doc);
  if (!config.ok()) return Annotate(config.status(), context);
  return config;
}

absl::StatusOr<LlamaConfig> ParseHfConfigFile(const std::string& path) {
  // A config.json is a few KB; 16 MiB only stops a wrong path from reading a checkpoint.
  PO_ASSIGN_OR_RETURN(ReadOnlyFile file,
                      OpenRegularFile(path, "config file", std::int64_t{16} << 20));
  std::string text(static_cast<std::size_t>(file.size), '\0');
  PO_RETURN_IF_ERROR(PreadFully(file.fd.get(), 0, std::span<char>(text), path));
  return ParseHfConfig(text, path);
}

absl::Status CheckHfExpressible(const LlamaConfig& config) {
  PO_RETURN_IF_ERROR(ValidateLlamaConfig(config));
  if (!KnownModelType(config.model_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama config: model_type = ", config.model_type,
                     ": config.json supports llama, mistral, qwen2, qwen3"));
  }
  const bool qwen3 = config.model_type == "qwen3";
  if (config.qk_norm != qwen3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama config: qk_norm = ", config.qk_norm ? "true" : "false", " with model_type ",
        config.model_type, ": in transformers exactly the qwen3 family has q/k norms"));
  }
  return absl::OkStatus();
}

std::string HfConfigJson(const LlamaConfig& c, std::string_view torch_dtype) {
  PO_CHECK_MSG(CheckHfExpressible(c).ok(), CheckHfExpressible(c).ToString());
  // nlohmann::json keeps keys sorted, as transformers' save_pretrained writes them.
  Json doc;
  doc["architectures"] = Json::array({ArchitectureOf(c.model_type)});
  doc["attention_bias"] = c.attention_bias;
  doc["attention_dropout"] = 0.0;
  doc["head_dim"] = c.head_dim;
  doc["hidden_act"] = "silu";
  doc["hidden_size"] = c.hidden_size;
  doc["initializer_range"] = FloatJson(c.initializer_range);
  doc["intermediate_size"] = c.intermediate_size;
  doc["max_position_embeddings"] = c.max_position_embeddings;
  if (c.model_type == "llama") doc["mlp_bias"] = false;
  doc["model_type"] = c.model_type;
  doc["num_attention_heads"] = c.num_heads;
  doc["num_hidden_layers"] = c.num_layers;
  doc["num_key_value_heads"] = c.num_kv_heads;
  doc["rms_norm_eps"] = FloatJson(c.rms_norm_eps);
  if (c.rope_scaling == RopeScaling::kLlama3) {
    doc["rope_scaling"] = Json{{"factor", FloatJson(c.rope_factor)},
                               {"high_freq_factor", FloatJson(c.rope_high_freq_factor)},
                               {"low_freq_factor", FloatJson(c.rope_low_freq_factor)},
                               {"original_max_position_embeddings", c.rope_original_max_positions},
                               {"rope_type", "llama3"}};
  } else {
    doc["rope_scaling"] = nullptr;
  }
  doc["rope_theta"] = FloatJson(c.rope_theta);
  if (c.model_type != "llama") doc["sliding_window"] = nullptr;
  if (c.model_type == "qwen2" || c.model_type == "qwen3") doc["use_sliding_window"] = false;
  doc["tie_word_embeddings"] = c.tie_word_embeddings;
  doc["torch_dtype"] = std::string(torch_dtype);
  doc["use_cache"] = true;
  doc["vocab_size"] = c.vocab_size;
  return doc.dump(2) + "\n";
}

}  // namespace pipeoffload::llama
