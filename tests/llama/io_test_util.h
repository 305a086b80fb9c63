// Helpers for llama_io_tests: a scratch directory under /tmp removed at scope exit, small file
// writers, deterministic test values, and a field-by-field LlamaConfig comparison.
#ifndef PIPEOFFLOAD_TESTS_LLAMA_IO_TEST_UTIL_H_
#define PIPEOFFLOAD_TESTS_LLAMA_IO_TEST_UTIL_H_

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "examples/gpt/rng.h"
#include "examples/llama/llama_config.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama::testing {

class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/po_llama_io_test_XXXXXX";
    const char* made = ::mkdtemp(name);
    REQUIRE(made != nullptr);
    path_ = made;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(std::string_view name) const { return path_ + "/" + std::string(name); }
  // Names of the directory's entries, sorted.
  std::vector<std::string> Entries() const { return ListDir(path_); }

  static std::vector<std::string> ListDir(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

inline void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <typename T>
void AppendLittleEndian(std::string* out, T value) {
  static_assert(std::endian::native == std::endian::little);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

// `n` floats from N(0, 1) scaled by `scale`, a pure function of `seed`.
inline std::vector<float> TestValues(std::int64_t n, std::uint64_t seed, float scale = 1.0f) {
  gpt::Rng rng(seed);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = static_cast<float>(rng.Normal()) * scale;
  return values;
}

inline std::uint32_t Bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// `status` has `code` and a message containing every one of `parts` (what is wrong, the file,
// the tensor...).
inline void CheckError(const absl::Status& status, absl::StatusCode code,
                       const std::vector<std::string_view>& parts) {
  const std::string message(status.message());
  INFO("status: " << status.ToString());
  CHECK(status.code() == code);
  for (std::string_view part : parts) {
    INFO("expected in the message: " << part);
    CHECK(message.find(part) != std::string::npos);
  }
}

// Every field but `name` (a parsed config is called "config.json"); floats bit for bit.
inline void CheckSameArchitecture(const LlamaConfig& a, const LlamaConfig& b) {
  INFO("configs " << a.name << " and " << b.name);
  CHECK(a.model_type == b.model_type);
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.hidden_size == b.hidden_size);
  CHECK(a.intermediate_size == b.intermediate_size);
  CHECK(a.num_layers == b.num_layers);
  CHECK(a.num_heads == b.num_heads);
  CHECK(a.num_kv_heads == b.num_kv_heads);
  CHECK(a.head_dim == b.head_dim);
  CHECK(Bits(a.rms_norm_eps) == Bits(b.rms_norm_eps));
  CHECK(Bits(a.rope_theta) == Bits(b.rope_theta));
  CHECK(a.rope_scaling == b.rope_scaling);
  if (a.rope_scaling == RopeScaling::kLlama3) {
    CHECK(Bits(a.rope_factor) == Bits(b.rope_factor));
    CHECK(Bits(a.rope_low_freq_factor) == Bits(b.rope_low_freq_factor));
    CHECK(Bits(a.rope_high_freq_factor) == Bits(b.rope_high_freq_factor));
    CHECK(a.rope_original_max_positions == b.rope_original_max_positions);
  }
  CHECK(a.max_position_embeddings == b.max_position_embeddings);
  CHECK(a.tie_word_embeddings == b.tie_word_embeddings);
  CHECK(a.attention_bias == b.attention_bias);
  CHECK(a.qk_norm == b.qk_norm);
  CHECK(Bits(a.initializer_range) == Bits(b.initializer_range));
}

}  // namespace pipeoffload::llama::testing

#endif  // PIPEOFFLOAD_TESTS_LLAMA_IO_TEST_UTIL_H_
