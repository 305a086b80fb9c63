// Llama checkpoints: save then load reproduces every unit (fp32 bit for bit, bf16 / fp16 to
// their rounding) for each architecture switch, single-file and sharded, with any number of
// reader threads; a checkpoint that does not match the config is refused before anything is
// loaded; a save never leaves a half-written directory.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "examples/llama/llama_checkpoint.h"
#include "examples/llama/llama_config.h"
#include "examples/llama/llama_config_io.h"
#include "examples/llama/safetensors.h"
#include "pipeoffload/adam.h"
#include "tests/llama/io_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama {
namespace {

using testing::Bits;
using testing::CheckError;
using testing::CheckSameArchitecture;
using testing::TempDir;
using testing::TestValues;

LlamaConfig Named(const std::string& name) {
  absl::StatusOr<LlamaConfig> config = LlamaConfigByName(name);
  REQUIRE(config.ok());
  return *config;
}

// Deterministic parameters, one flat array per unit.
std::vector<std::vector<float>> ModelValues(const LlamaConfig& config) {
  std::vector<std::vector<float>> units;
  for (int u = 0; u < NumUnits(config); ++u) {
    units.push_back(TestValues(UnitParamCount(config, u), 1000 + u, 0.5f));
  }
  units[0][0] = 1.0f + 0x1.0p-8f;  // a bf16 tie, which must round to even
  return units;
}

GetUnitFn Getter(const std::vector<std::vector<float>>& units) {
  return [&units](int u, std::span<float> out) {
    const std::vector<float>& unit = units[static_cast<std::size_t>(u)];
    REQUIRE(out.size() == unit.size());
    REQUIRE(std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); }));
    std::copy(unit.begin(), unit.end(), out.begin());
    return absl::OkStatus();
  };
}

// Loads `path` and returns each unit as set_unit received it, checking the order of calls.
std::vector<std::vector<float>> Load(const std::string& path, const LlamaConfig& config,
                                     int threads) {
  std::vector<std::vector<float>> loaded;
  const absl::Status status = LoadLlamaCheckpoint(
      path, config,
      [&](int u, std::span<const float> params) {
        REQUIRE(u == static_cast<int>(loaded.size()));
        REQUIRE(static_cast<std::int64_t>(params.size()) == UnitParamCount(config, u));
        loaded.emplace_back(params.begin(), params.end());
        return absl::OkStatus();
      },
      threads);
  INFO(status.ToString());
  REQUIRE(status.ok());
  REQUIRE(static_cast<int>(loaded.size()) == NumUnits(config));
  return loaded;
}

float Rounded(float v, SafetensorsDtype dtype) {
  if (dtype == SafetensorsDtype::kBF16) return Bf16BitsToFloat(FloatToBf16Bits(v));
  if (dtype == SafetensorsDtype::kF16) return HalfBitsToFloat(FloatToHalfBits(v));
  return v;
}

void CheckUnitsEqual(const std::vector<std::vector<float>>& got,
                     const std::vector<std::vector<float>>& written, SafetensorsDtype dtype) {
  REQUIRE(got.size() == written.size());
  for (std::size_t u = 0; u < got.size(); ++u) {
    REQUIRE(got[u].size() == written[u].size());
    for (std::size_t i = 0; i < got[u].size(); ++i) {
      const float want = Rounded(written[u][i], dtype);
      if (Bits(got[u][i]) != Bits(want)) {
        INFO("unit " << u << " element " << i << ": got " << got[u][i] << " want " << want);
        CHECK(Bits(got[u][i]) == Bits(want));
        return;
      }
    }
  }
}

TEST_CASE("save then load reproduces every unit, for each architecture and dtype",
          "[llama][checkpoint]") {
  for (const char* name : {"tiny", "tiny-tied", "tiny-qwen3", "tiny-qwen2"}) {
    const LlamaConfig config = Named(name);
    const auto units = ModelValues(config);
    for (SafetensorsDtype dtype :
         {SafetensorsDtype::kBF16, SafetensorsDtype::kF16, SafetensorsDtype::kF32}) {
      INFO(name << " " << SafetensorsDtypeName(dtype));
      TempDir parent;
      const std::string dir = parent.File("ckpt");
      const absl::Status saved = SaveLlamaCheckpoint(dir, config, Getter(units), dtype);
      INFO(saved.ToString());
      REQUIRE(saved.ok());
      CHECK(TempDir::ListDir(dir) == std::vector<std::string>{"config.json", "model.safetensors"});
      CHECK(parent.Entries() == std::vector<std::string>{"ckpt"});  // no temporary left
      CheckUnitsEqual(Load(dir, config, 1), units, dtype);

      absl::StatusOr<LlamaConfig> written = ParseHfConfigFile(dir + "/config.json");
      REQUIRE(written.ok());
      CheckSameArchitecture(config, *written);

      absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir);
      REQUIRE(checkpoint.ok());
      CHECK((checkpoint->Find("lm_head.weight").info != nullptr) != config.tie_word_embeddings);
      CHECK((checkpoint->Find("model.layers.0.self_attn.q_norm.weight").info != nullptr) ==
            config.qk_norm);
      CHECK((checkpoint->Find("model.layers.3.self_attn.v_proj.bias").info != nullptr) ==
            config.attention_bias);
      const SafetensorsCheckpoint::Entry q =
          checkpoint->Find("model.layers.2.self_attn.q_proj.weight");
      REQUIRE(q.info != nullptr);
      CHECK(q.info->shape == std::vector<std::int64_t>{64, 64});
      CHECK(q.info->dtype == dtype);
    }
  }
}

TEST_CASE("sharded checkpoints and threaded loads give the same units", "[llama][checkpoint]") {
  // Wide enough that the loader splits units between readers (it gives each at least 2^20
  // elements): the embedding and the head are 32768 x 128 = 4 Mi elements, four readers' worth.
  LlamaConfig config = Named("tiny");
  config.vocab_size = 32768;
  config.hidden_size = 128;
  config.head_dim = 32;
  config.num_layers = 2;
  REQUIRE(ValidateLlamaConfig(config).ok());
  const auto units = ModelValues(config);
  TempDir parent;
  const std::string dir = parent.File("sharded");
  // The embedding alone is 8 MiB in bf16: a 3 MB limit gives it, the layers and the head
  // shards of their own.
  REQUIRE(SaveLlamaCheckpoint(dir, config, Getter(units), SafetensorsDtype::kBF16, 3'000'000).ok());
  const std::vector<std::string> files = TempDir::ListDir(dir);
  CHECK(files == std::vector<std::string>{"config.json", "model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors",
                                          "model.safetensors.index.json"});
  for (int threads : {1, 2, 3, 7}) {
    INFO("threads " << threads);
    CheckUnitsEqual(Load(dir, config, threads), units, SafetensorsDtype::kBF16);
  }
  CheckError(LoadLlamaCheckpoint(
                 dir, config, [](int, std::span<const float>) { return absl::OkStatus(); }, 0),
             absl::StatusCode::kInvalidArgument, {"threads = 0"});
}

TEST_CASE("a tied config ignores lm_head.weight; an untied one requires it",
          "[llama][checkpoint]") {
  const LlamaConfig untied = Named("tiny");
  const LlamaConfig tied = Named("tiny-tied");
  const auto units = ModelValues(untied);
  TempDir parent;
  const std::string with_head = parent.File("untied");
  REQUIRE(SaveLlamaCheckpoint(with_head, untied, Getter(units), SafetensorsDtype::kF32).ok());
  // Loaded as the tied model: the head unit is the final norm alone.
  const auto tied_units = Load(with_head, tied, 1);
  CHECK(tied_units.back().size() == static_cast<std::size_t>(untied.hidden_size));
  CHECK(std::equal(tied_units.back().begin(), tied_units.back().end(), units.back().begin()));

  const std::string without_head = parent.File("tied");
  const auto tied_values = ModelValues(tied);
  REQUIRE(SaveLlamaCheckpoint(without_head, tied, Getter(tied_values)).ok());
  CheckError(CheckLlamaCheckpoint(without_head, untied), absl::StatusCode::kInvalidArgument,
             {"'lm_head.weight'", without_head, "[256, 64]"});
}

// Rewrites the checkpoint at `dir` as one F32 file with tensor `name` replaced by one of
// shape `shape` and dtype `dtype` (or dropped when `shape` is empty).
void RewriteWith(const std::string& dir, const std::string& name,
                 const std::vector<std::int64_t>& shape, SafetensorsDtype dtype) {
  absl::StatusOr<SafetensorsCheckpoint> original = SafetensorsCheckpoint::Open(dir);
  REQUIRE(original.ok());
  std::vector<SafetensorsTensorSpec> specs;
  for (const std::string& tensor : original->TensorNames()) {
    const SafetensorsTensorInfo& info = *original->Find(tensor).info;
    if (tensor != name) {
      specs.push_back({tensor, SafetensorsDtype::kF32, info.shape});
    } else if (!shape.empty()) {
      specs.push_back({tensor, dtype, shape});
    }
  }
  TempDir scratch;
  absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(scratch.path(), specs);
  REQUIRE(writer.ok());
  for (const SafetensorsTensorSpec& spec : specs) {
    std::int64_t n = 1;
    for (std::int64_t d : spec.shape) n *= d;
    REQUIRE(writer->Write(spec.name, std::vector<float>(static_cast<std::size_t>(n), 0.5f)).ok());
  }
  REQUIRE(writer->Finish().ok());
  const std::string bytes = testing::ReadBytes(scratch.File("model.safetensors"));
  testing::WriteBytes(dir + "/model.safetensors", bytes);
}

TEST_CASE("a checkpoint that does not match is refused before anything is loaded",
          "[llama][checkpoint]") {
  const LlamaConfig config = Named("tiny");
  const auto units = ModelValues(config);
  TempDir parent;
  int calls = 0;
  const SetUnitFn count_calls = [&](int, std::span<const float>) {
    ++calls;
    return absl::OkStatus();
  };
  const std::string q = "model.layers.3.self_attn.q_proj.weight";

  const std::string missing = parent.File("missing");
  REQUIRE(SaveLlamaCheckpoint(missing, config, Getter(units), SafetensorsDtype::kF32).ok());
  RewriteWith(missing, q, {}, SafetensorsDtype::kF32);
  CheckError(LoadLlamaCheckpoint(missing, config, count_calls), absl::StatusCode::kInvalidArgument,
             {"'" + q + "'", missing + "/model.safetensors", "[64, 64]"});

  const std::string transposed = parent.File("shape");
  REQUIRE(SaveLlamaCheckpoint(transposed, config, Getter(units), SafetensorsDtype::kF32).ok());
  const std::string up = "model.layers.1.mlp.up_proj.weight";
  RewriteWith(transposed, up, {64, 176}, SafetensorsDtype::kF32);
  CheckError(LoadLlamaCheckpoint(transposed, config, count_calls),
             absl::StatusCode::kInvalidArgument,
             {"'" + up + "'", transposed + "/model.safetensors", "[64, 176]", "[176, 64]"});

  const std::string wrong_dtype = parent.File("dtype");
  REQUIRE(SaveLlamaCheckpoint(wrong_dtype, config, Getter(units), SafetensorsDtype::kF32).ok());
  RewriteWith(wrong_dtype, "model.norm.weight", {64}, SafetensorsDtype::kF32);
  // (An I64 tensor cannot be written by our writer; hand-patch the dtype string instead.)
  std::string bytes = testing::ReadBytes(wrong_dtype + "/model.safetensors");
  const std::string entry = "\"model.norm.weight\":{\"data_offsets\":";
  REQUIRE(bytes.find(entry) != std::string::npos);
  std::size_t at = bytes.find("\"dtype\":\"F32\"", bytes.find(entry));
  REQUIRE(at != std::string::npos);
  bytes.replace(at, 13, "\"dtype\":\"I32\"");
  testing::WriteBytes(wrong_dtype + "/model.safetensors", bytes);
  CheckError(LoadLlamaCheckpoint(wrong_dtype, config, count_calls),
             absl::StatusCode::kInvalidArgument, {"'model.norm.weight'", "I32", "BF16"});

  const std::string truncated = parent.File("truncated");
  REQUIRE(
      SaveLlamaCheckpoint(truncated, config, Getter(units), SafetensorsDtype::kBF16, 40'000).ok());
  const std::string last_shard = truncated + "/" + TempDir::ListDir(truncated).end()[-2];
  const std::string shard_bytes = testing::ReadBytes(last_shard);
  testing::WriteBytes(last_shard, shard_bytes.substr(0, shard_bytes.size() - 2));
  CheckError(LoadLlamaCheckpoint(truncated, config, count_calls),
             absl::StatusCode::kInvalidArgument, {last_shard, "truncated"});

  CheckError(LoadLlamaCheckpoint(parent.File("nothing"), config, count_calls),
             absl::StatusCode::kNotFound, {parent.File("nothing")});
  CHECK(calls == 0);
}

TEST_CASE("callback errors stop the load and the save, annotated with the unit",
          "[llama][checkpoint]") {
  const LlamaConfig config = Named("tiny");
  const auto units = ModelValues(config);
  TempDir parent;
  const std::string dir = parent.File("ckpt");
  REQUIRE(SaveLlamaCheckpoint(dir, config, Getter(units)).ok());
  int calls = 0;
  CheckError(LoadLlamaCheckpoint(dir, config,
                                 [&](int u, std::span<const float>) {
                                   ++calls;
                                   return u == 2 ? absl::DataLossError("store full")
                                                 : absl::OkStatus();
                                 }),
             absl::StatusCode::kDataLoss, {"set_unit(2)", "store full"});
  CHECK(calls == 3);

  const std::string failed = parent.File("failed");
  CheckError(SaveLlamaCheckpoint(failed, config,
                                 [&](int u, std::span<float> out) {
                                   if (u == 3) return absl::UnavailableError("gpu lost");
                                   std::copy(units[u].begin(), units[u].end(), out.begin());
                                   return absl::OkStatus();
                                 }),
             absl::StatusCode::kUnavailable, {"get_unit(3)", "gpu lost"});
  CHECK(parent.Entries() == std::vector<std::string>{"ckpt"});  // nothing left of the failed save
}

TEST_CASE("save refuses a non-empty destination and replaces an empty one", "[llama][checkpoint]") {
  const LlamaConfig config = Named("tiny");
  const auto units = ModelValues(config);
  TempDir parent;
  const std::string busy = parent.File("busy");
  REQUIRE(::mkdir(busy.c_str(), 0755) == 0);
  testing::WriteBytes(busy + "/notes.txt", "keep me");
  CheckError(SaveLlamaCheckpoint(busy, config, Getter(units)),
             absl::StatusCode::kFailedPrecondition, {busy, "not empty"});
  CHECK(TempDir::ListDir(busy) == std::vector<std::string>{"notes.txt"});
  testing::WriteBytes(parent.File("file"), "x");
  CheckError(SaveLlamaCheckpoint(parent.File("file"), config, Getter(units)),
             absl::StatusCode::kFailedPrecondition, {"not a directory"});

  const std::string empty = parent.File("empty");
  REQUIRE(::mkdir(empty.c_str(), 0755) == 0);
  REQUIRE(SaveLlamaCheckpoint(empty + "/", config, Getter(units)).ok());
  CheckUnitsEqual(Load(empty, config, 2), units, SafetensorsDtype::kBF16);
  CHECK(parent.Entries() == std::vector<std::string>{"busy", "empty", "file"});

  LlamaConfig odd = config;
  odd.qk_norm = true;  // a llama with q/k norms has no config.json spelling
  CheckError(SaveLlamaCheckpoint(parent.File("odd"), odd, Getter(units)),
             absl::StatusCode::kInvalidArgument, {"qk_norm"});
  CheckError(SaveLlamaCheckpoint(parent.File("i8"), config, Getter(units), SafetensorsDtype::kI8),
             absl::StatusCode::kInvalidArgument, {"I8"});
}

}  // namespace
}  // namespace pipeoffload::llama
