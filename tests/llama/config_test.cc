// The table of named shapes (validation, parameter counts against published figures), and
// config.json: real files parse to the right fields, HfConfigJson round-trips, errors name the
// field and the file.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "examples/llama/llama_config.h"
#include "examples/llama/llama_config_io.h"
#include "tests/llama/io_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama {
namespace {

using testing::CheckError;
using testing::CheckSameArchitecture;

LlamaConfig Named(const std::string& name) {
  absl::StatusOr<LlamaConfig> config = LlamaConfigByName(name);
  INFO(name << ": " << config.status().ToString());
  REQUIRE(config.ok());
  return *config;
}

TEST_CASE("every named config validates, is found by its name, and names are unique",
          "[llama][config]") {
  const std::vector<std::string> names = LlamaConfigNames();
  REQUIRE(names.size() == 16);
  std::set<std::string> seen;
  for (const std::string& name : names) {
    INFO(name);
    CHECK(seen.insert(name).second);
    const LlamaConfig config = Named(name);
    CHECK(config.name == name);
    const absl::Status valid = ValidateLlamaConfig(config);
    INFO(valid.ToString());
    CHECK(valid.ok());
    CHECK(CheckHfExpressible(config).ok());
  }
  for (const char* expected :
       {"tiny", "tiny-tied", "tiny-qwen3", "tiny-qwen2", "llama3-8b", "llama3.1-8b", "llama3.2-1b",
        "llama3.2-3b", "llama2-7b", "llama2-13b", "llama3-70b", "mistral-7b", "qwen2.5-7b",
        "qwen3-4b", "qwen3-8b", "qwen3-14b"}) {
    CHECK(seen.contains(expected));
  }
  CheckError(LlamaConfigByName("llama4-8b").status(), absl::StatusCode::kNotFound,
             {"llama4-8b", "llama3-8b", "qwen3-14b"});
}

TEST_CASE("total parameter counts match the published checkpoints", "[llama][config]") {
  // The safetensors "total" parameter counts Hugging Face lists for each model (quoted in many
  // public repositories; found with the search tool): Meta-Llama-3-8B / Llama-3.1-8B
  // 8,030,261,248; Llama-3.2-1B 1,235,814,400; Llama-3.2-3B 3,212,749,824; Llama-2-7b
  // 6,738,415,616; Llama-2-13b 13,015,864,320; Llama-3(.1/.3)-70B 70,553,706,496; Mistral-7B
  // 7,241,732,096; Qwen2.5-7B 7,615,616,512; Qwen3-4B 4,022,468,096; Qwen3-8B 8,190,735,360;
  // Qwen3-14B 14,768,307,200. Each equals the sum over UnitTensors (tied heads counted once),
  // so a wrong table entry or a wrong tensor list changes one of them.
  const std::pair<const char*, std::int64_t> expected[] = {
      {"llama3-8b", 8'030'261'248},   {"llama3.1-8b", 8'030'261'248},
      {"llama3.2-1b", 1'235'814'400}, {"llama3.2-3b", 3'212'749'824},
      {"llama2-7b", 6'738'415'616},   {"llama2-13b", 13'015'864'320},
      {"llama3-70b", 70'553'706'496}, {"mistral-7b", 7'241'732'096},
      {"qwen2.5-7b", 7'615'616'512},  {"qwen3-4b", 4'022'468'096},
      {"qwen3-8b", 8'190'735'360},    {"qwen3-14b", 14'768'307'200},
  };
  for (const auto& [name, count] : expected) {
    INFO(name);
    CHECK(TotalParamCount(Named(name)) == count);
  }
}

TEST_CASE("the named configs carry each family's switches", "[llama][config]") {
  const LlamaConfig tiny = Named("tiny");
  CheckSameArchitecture(tiny, LlamaConfig{});
  CHECK(Named("tiny-tied").tie_word_embeddings);
  CHECK(Named("tiny-qwen3").qk_norm);
  CHECK_FALSE(Named("tiny-qwen3").attention_bias);
  CHECK(Named("tiny-qwen2").attention_bias);

  const LlamaConfig l31 = Named("llama3.1-8b");
  CHECK(l31.rope_scaling == RopeScaling::kLlama3);
  CHECK(l31.rope_factor == 8.0f);
  CHECK(l31.rope_original_max_positions == 8192);
  CHECK(Named("llama3-8b").rope_scaling == RopeScaling::kNone);
  CHECK(Named("llama3.2-1b").rope_factor == 32.0f);
  CHECK(Named("llama3.2-1b").head_dim == 64);
  CHECK(Named("llama3.2-3b").tie_word_embeddings);
  CHECK(Named("qwen2.5-7b").attention_bias);
  CHECK(Named("qwen2.5-7b").rms_norm_eps == 1e-6f);
  const LlamaConfig q4 = Named("qwen3-4b");
  CHECK(q4.qk_norm);
  CHECK(q4.tie_word_embeddings);
  CHECK(q4.head_dim == 128);
  CHECK(q4.head_dim != q4.hidden_size / q4.num_heads);  // 2560 / 32 = 80: head_dim is explicit
  CHECK_FALSE(Named("qwen3-8b").tie_word_embeddings);
  CHECK(Named("mistral-7b").model_type == "mistral");
}

TEST_CASE("HfConfigJson round-trips every named config through ParseHfConfig", "[llama][config]") {
  for (const std::string& name : LlamaConfigNames()) {
    const LlamaConfig config = Named(name);
    const std::string json = HfConfigJson(config);
    absl::StatusOr<LlamaConfig> parsed = ParseHfConfig(json, "roundtrip.json");
    INFO(name << "\n" << json << "\n" << parsed.status().ToString());
    REQUIRE(parsed.ok());
    CHECK(parsed->name == "config.json");
    CheckSameArchitecture(config, *parsed);

    const nlohmann::json doc = nlohmann::json::parse(json);
    const char* architecture = config.model_type == "qwen3"     ? "Qwen3ForCausalLM"
                               : config.model_type == "qwen2"   ? "Qwen2ForCausalLM"
                               : config.model_type == "mistral" ? "MistralForCausalLM"
                                                                : "LlamaForCausalLM";
    CHECK(doc["architectures"] == nlohmann::json::array({architecture}));
    CHECK(doc["torch_dtype"] == "bfloat16");
    CHECK(doc["hidden_act"] == "silu");
  }
  // Floats are written as their shortest decimals, as transformers writes them.
  const std::string tiny = HfConfigJson(LlamaConfig{}, "float32");
  CHECK(tiny.find("\"rms_norm_eps\": 1e-05") != std::string::npos);
  CHECK(tiny.find("\"initializer_range\": 0.02") != std::string::npos);
  CHECK(tiny.find("\"torch_dtype\": \"float32\"") != std::string::npos);
  const std::string l31 = HfConfigJson(Named("llama3.1-8b"));
  CHECK(l31.find("\"rope_type\": \"llama3\"") != std::string::npos);
  CHECK(l31.find("\"rope_theta\": 500000.0") != std::string::npos);
}

// meta-llama/Llama-3.1-8B's config.json as quoted in [A] of llama_config_io.cc.
constexpr const char* kLlama31Json = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Qwen/Qwen2.5-7B's ([A]): no head_dim, no attention_bias, an unused sliding_window.
constexpr const char* kQwen25Json = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false,
  "use_sliding_window": false, "vocab_size": 152064})";

// Qwen/Qwen3-4B's ([A]): head_dim explicit, integer rope_theta, rms_norm_eps as 0.000001.
constexpr const char* kQwen34Json = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "rms_norm_eps": 0.000001, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.2", "use_cache": false, "use_sliding_window": false,
  "vocab_size": 151936})";

TEST_CASE("real config.json files parse to the table's shapes", "[llama][config]") {
  const std::pair<const char*, const char*> files[] = {
      {kLlama31Json, "llama3.1-8b"}, {kQwen25Json, "qwen2.5-7b"}, {kQwen34Json, "qwen3-4b"}};
  for (const auto& [json, name] : files) {
    absl::StatusOr<LlamaConfig> parsed = ParseHfConfig(json, name);
    INFO(name << ": " << parsed.status().ToString());
    REQUIRE(parsed.ok());
    CheckSameArchitecture(Named(name), *parsed);
  }
}

TEST_CASE("config.json defaults: head_dim, kv heads, tying, qwen2 biases", "[llama][config]") {
  absl::StatusOr<LlamaConfig> c = ParseHfConfig(
      R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
          "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
          "num_key_value_heads": null, "head_dim": null})",
      "defaults.json");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->head_dim == 8);
  CHECK(c->num_kv_heads == 8);
  CHECK_FALSE(c->tie_word_embeddings);
  CHECK_FALSE(c->attention_bias);
  CHECK(c->rope_scaling == RopeScaling::kNone);
  CHECK(c->rms_norm_eps == 1e-6f);  // transformers' LlamaConfig default
  CHECK(c->rope_theta == 10000.0f);
  CHECK(c->max_position_embeddings == 2048);

  const char* qwen2 = R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
      "rope_scaling": {"rope_type": "default"}})";
  absl::StatusOr<LlamaConfig> q = ParseHfConfig(qwen2, "qwen2.json");
  REQUIRE(q.ok());
  CHECK(q->attention_bias);
  CHECK(q->rope_scaling == RopeScaling::kNone);
  CHECK(q->max_position_embeddings == 32768);
  std::string no_bias = qwen2;
  no_bias.insert(1, "\"attention_bias\": false, ");
  absl::StatusOr<LlamaConfig> q_no_bias = ParseHfConfig(no_bias, "qwen2.json");
  REQUIRE(q_no_bias.ok());
  CHECK_FALSE(q_no_bias->attention_bias);
  // The older spelling of the rotary type.
  std::string old_key = kLlama31Json;
  old_key.replace(old_key.find("\"rope_type\""), 11, "\"type\"");
  absl::StatusOr<LlamaConfig> l = ParseHfConfig(old_key, "old.json");
  REQUIRE(l.ok());
  CHECK(l->rope_scaling == RopeScaling::kLlama3);
}

std::string Edited(std::string json, const std::string& from, const std::string& to) {
  const std::size_t at = json.find(from);
  REQUIRE(at != std::string::npos);
  return json.replace(at, from.size(), to);
}

TEST_CASE("config.json errors name the field and the file", "[llama][config]") {
  const std::string good = kLlama31Json;
  CheckError(
      ParseHfConfig(Edited(good, "\"vocab_size\": 128256", "\"vocab\": 1"), "a.json").status(),
      absl::StatusCode::kInvalidArgument, {"a.json", "vocab_size", "missing"});
  CheckError(
      ParseHfConfig(Edited(good, "\"hidden_size\": 4096", "\"hidden_size\": \"4096\""), "b.json")
          .status(),
      absl::StatusCode::kInvalidArgument, {"b.json", "hidden_size", "expected an integer"});
  CheckError(
      ParseHfConfig(Edited(good, "\"hidden_size\": 4096", "\"hidden_size\": 4096.5"), "c.json")
          .status(),
      absl::StatusCode::kInvalidArgument, {"c.json", "hidden_size", "integer"});
  CheckError(ParseHfConfig(Edited(good, "\"llama3\"", "\"yarn\""), "d.json").status(),
             absl::StatusCode::kInvalidArgument, {"d.json", "rope_type", "yarn", "llama3"});
  CheckError(ParseHfConfig(Edited(good, "\"factor\": 8.0,", ""), "e.json").status(),
             absl::StatusCode::kInvalidArgument, {"e.json", "rope_scaling.factor"});
  CheckError(
      ParseHfConfig(Edited(good, "\"model_type\": \"llama\"", "\"model_type\": \"gpt2\""), "f.json")
          .status(),
      absl::StatusCode::kInvalidArgument, {"f.json", "model_type", "gpt2"});
  CheckError(ParseHfConfig(Edited(good, "\"silu\"", "\"gelu\""), "g.json").status(),
             absl::StatusCode::kInvalidArgument, {"g.json", "hidden_act", "gelu"});
  CheckError(ParseHfConfig(Edited(good, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"),
                           "h.json")
                 .status(),
             absl::StatusCode::kInvalidArgument, {"h.json", "num_key_value_heads", "5"});
  CheckError(ParseHfConfig(good.substr(0, good.size() - 10), "i.json").status(),
             absl::StatusCode::kInvalidArgument, {"i.json", "JSON syntax error"});
  CheckError(ParseHfConfig("[1, 2]", "j.json").status(), absl::StatusCode::kInvalidArgument,
             {"j.json", "expected an object"});
  CheckError(
      ParseHfConfig(Edited(good, "\"rope_scaling\": {", "\"rope_scaling\": 3, \"x\": {"), "k.json")
          .status(),
      absl::StatusCode::kInvalidArgument, {"k.json", "rope_scaling"});
}

TEST_CASE("ParseHfConfigFile reads a file, and says which one is missing", "[llama][config]") {
  testing::TempDir dir;
  const LlamaConfig config = Named("qwen3-8b");
  testing::WriteBytes(dir.File("config.json"), HfConfigJson(config));
  absl::StatusOr<LlamaConfig> parsed = ParseHfConfigFile(dir.File("config.json"));
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  CheckSameArchitecture(config, *parsed);

  CheckError(ParseHfConfigFile(dir.File("nope.json")).status(), absl::StatusCode::kNotFound,
             {dir.File("nope.json")});
  CheckError(ParseHfConfigFile(dir.path()).status(), absl::StatusCode::kInvalidArgument,
             {dir.path(), "directory"});
  testing::WriteBytes(dir.File("bad.json"), "{\"model_type\": \"llama\"}");
  CheckError(ParseHfConfigFile(dir.File("bad.json")).status(), absl::StatusCode::kInvalidArgument,
             {dir.File("bad.json"), "vocab_size"});
}

TEST_CASE("CheckHfExpressible refuses q/k norms outside qwen3", "[llama][config]") {
  LlamaConfig config;
  config.qk_norm = true;
  CheckError(CheckHfExpressible(config), absl::StatusCode::kInvalidArgument, {"qk_norm", "llama"});
  config.model_type = "qwen3";
  CHECK(CheckHfExpressible(config).ok());
  config.qk_norm = false;
  CheckError(CheckHfExpressible(config), absl::StatusCode::kInvalidArgument, {"qk_norm"});
  config = LlamaConfig{};
  config.model_type = "gemma";
  CheckError(CheckHfExpressible(config), absl::StatusCode::kInvalidArgument, {"gemma"});
}

}  // namespace
}  // namespace pipeoffload::llama
