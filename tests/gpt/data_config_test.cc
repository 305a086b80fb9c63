// Data sampling and corpus checks, config and pipeline-shape validation, the layer split, AdamW
// against its formula, and the checksum's combination rules.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/gpt_params.h"
#include "examples/gpt/gpt_stage_model.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

using Catch::Approx;  // Catch2 v3 has no global Approx

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("microbatches are a pure function of (seed, step, mb)", "[gpt][data]") {
  const GptData data = GptData::Synthetic();
  const int B = 3, T = 10;
  auto fetch = [&](std::uint64_t seed, std::int64_t step, int mb) {
    std::vector<std::int32_t> tokens(B * T), targets(B * T);
    data.Microbatch(seed, step, mb, B, T, tokens.data(), targets.data());
    return std::pair{tokens, targets};
  };
  const auto a = fetch(1, 4, 2);
  CHECK(a == fetch(1, 4, 2));
  CHECK(a.first != fetch(1, 4, 3).first);
  CHECK(a.first != fetch(1, 5, 2).first);
  CHECK(a.first != fetch(2, 4, 2).first);
  for (int b = 0; b < B; ++b) {
    // Each row is a window of the corpus, and targets are the tokens shifted by one.
    std::string window;
    for (int t = 0; t < T; ++t) window += static_cast<char>(a.first[b * T + t]);
    window += static_cast<char>(a.second[b * T + T - 1]);
    CHECK(data.bytes().find(window) != std::string::npos);
    for (int t = 0; t + 1 < T; ++t) CHECK(a.second[b * T + t] == a.first[b * T + t + 1]);
  }
}

TEST_CASE("the synthetic corpus is fixed and its entropy is reported", "[gpt][data]") {
  const GptData a = GptData::Synthetic();
  const GptData b = GptData::Synthetic();
  CHECK(a.size() == 65536);
  CHECK(a.bytes() == b.bytes());
  CHECK(a.bytes().find("the ") != std::string::npos);
  // English-like text over ~27 symbols: between 2.5 and 3.3 nats (3.6 - 4.8 bits).
  CHECK(a.UnigramEntropyNats() > 2.5);
  CHECK(a.UnigramEntropyNats() < 3.3);
  CHECK(a.UnigramEntropyBits() == Approx(a.UnigramEntropyNats() / std::log(2.0)));
  CHECK(GptData::FromBytes("aabb", "x").UnigramEntropyNats() == Approx(std::log(2.0)));
  CHECK(GptData::FromBytes("aaaa", "x").UnigramEntropyNats() == 0.0);
  CHECK(GptData::FromBytes("abcd", "x").UnigramEntropyBits() == Approx(2.0));
}

TEST_CASE("data files load as bytes and bad data gives clear errors", "[gpt][data]") {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("gpt_data_test_" + std::to_string(static_cast<long long>(::getpid())) + ".txt"))
          .string();
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello\xE2\x82\xAC world";
  }
  auto loaded = GptData::FromFile(path);
  REQUIRE(loaded.ok());
  CHECK(loaded->bytes() == "hello\xE2\x82\xAC world");
  GptConfig config;
  config.seq_len = 8;
  CHECK(loaded->CheckCompatible(config).ok());
  config.vocab_size = 128;
  absl::Status s = loaded->CheckCompatible(config);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "0xE2 at offset 5"));
  config.vocab_size = 256;
  config.seq_len = 32;
  s = loaded->CheckCompatible(config);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "needs at least 33"));
  { std::ofstream out(path, std::ios::binary | std::ios::trunc); }
  CHECK(GptData::FromFile(path).status().code() == absl::StatusCode::kInvalidArgument);
  std::remove(path.c_str());
  auto missing = GptData::FromFile("no/such/file.txt");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(Contains(missing.status(), "no/such/file.txt"));
}

TEST_CASE("bad configs and pipeline shapes are rejected with the field named", "[gpt][config]") {
  GptConfig good;
  REQUIRE(ValidateGptConfig(good).ok());
  struct Case {
    void (*mutate)(GptConfig&);
    const char* expected;
  };
  const Case cases[] = {
      {[](GptConfig& c) { c.n_head = 3; }, "not a multiple of n_head"},
      {[](GptConfig& c) { c.n_layer = 0; }, "n_layer = 0"},
      {[](GptConfig& c) { c.seq_len = -4; }, "seq_len = -4"},
      {[](GptConfig& c) { c.vocab_size = 1; }, "vocab_size = 1"},
      {[](GptConfig& c) { c.batch_size = 0; }, "batch_size = 0"},
      {[](GptConfig& c) { c.num_microbatches = 0; }, "num_microbatches = 0"},
      {[](GptConfig& c) { c.optimizer.learning_rate = -1.0f; }, "learning_rate"},
      {[](GptConfig& c) { c.optimizer.beta1 = 1.0f; }, "beta1"},
      {[](GptConfig& c) { c.optimizer.weight_decay = NAN; }, "weight_decay"},
  };
  for (const Case& c : cases) {
    GptConfig config = good;
    c.mutate(config);
    const absl::Status s = ValidateGptConfig(config);
    CAPTURE(c.expected, s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(s, c.expected));
  }
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  CHECK(GptStageModel::Create(good, 4, 2, 3, data).ok());  // 8 virtual stages, 4 layers: fine
  auto too_many = GptStageModel::Create(good, 1 << 10, 8, 0, data);
  CHECK(too_many.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(too_many.status(), "8192 virtual stages"));
  CHECK(GptStageModel::Create(good, 2, 1, 2, data).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(GptStageModel::Create(good, 0, 1, 0, data).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(GptStageModel::Create(good, 1, 1, 0, nullptr).status().code() ==
        absl::StatusCode::kInvalidArgument);
  GptConfig small_vocab = good;
  small_vocab.vocab_size = 100;  // the synthetic corpus has 'y' = 121
  CHECK(Contains(GptStageModel::Create(small_vocab, 1, 1, 0, data).status(), "vocab_size 100"));
}

TEST_CASE("layers split as evenly as possible, contiguously, empty chunks last", "[gpt][config]") {
  for (int n_layer = 1; n_layer <= 24; ++n_layer) {
    for (int L = 1; L <= n_layer + 4; ++L) {
      CAPTURE(n_layer, L);
      int next = 0;
      int smallest = n_layer, largest = 0;
      for (int l = 0; l < L; ++l) {
        const LayerRange r = VirtualStageLayers(n_layer, L, l);
        CHECK(r.begin == next);
        next = r.end;
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
      }
      CHECK(next == n_layer);
      CHECK(largest - smallest <= 1);
      CHECK(smallest == (L <= n_layer ? n_layer / L : 0));
      CHECK(VirtualStageLayers(n_layer, L, 0).size() == largest);  // extras go first
    }
  }
  GptConfig config;
  config.n_layer = 3;
  CHECK(GptTensorSpecs(config).size() == 2 + 3 * 12 + 2 + 1);
  config.tied_embeddings = true;
  CHECK(GptTensorSpecs(config).size() == 2 + 3 * 12 + 2);
  CHECK(HeadWeightId(config) == -1);
}

TEST_CASE("AdamW follows its formula", "[gpt][optimizer]") {
  TensorSpec matrix;
  matrix.rows = 3;
  matrix.cols = 5;
  matrix.init_std = 0.5f;
  matrix.weight_decay = true;
  TensorSpec vector;
  vector.rows = 4;
  vector.init_value = 0.25f;
  ParameterBlock block;
  block.Add(0, matrix, false);
  block.Add(1, vector, false);
  block.Allocate(42);
  AdamWConfig config;
  config.learning_rate = 0.01f;
  config.weight_decay = 0.1f;
  const std::int64_t n = block.numel();
  std::vector<double> p(block.param(0), block.param(0) + n), m(n, 0.0), v(n, 0.0);
  for (int t = 1; t <= 3; ++t) {
    for (std::int64_t i = 0; i < n; ++i) block.grad(0)[i] = std::sin(0.7 * i + t) * 0.3f;
    for (std::int64_t i = 0; i < n; ++i) {
      const double g = block.grad(0)[i];
      const double wd = i < matrix.numel() ? 0.1 : 0.0;  // vectors do not decay
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.95 * v[i] + 0.05 * g * g;
      const double m_hat = m[i] / (1 - std::pow(0.9, t));
      const double v_hat = v[i] / (1 - std::pow(0.95, t));
      p[i] -= 0.01 * (m_hat / (std::sqrt(v_hat) + 1e-8) + wd * p[i]);
    }
    block.AdamWStep(config, t);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(block.param(0)[i] == Approx(p[i]).epsilon(1e-5));
  }
}

TEST_CASE("tensor hashes combine in id order, regardless of which stage sent them",
          "[gpt][checksum]") {
  const std::vector<TensorHash> hashes = {{0, 11}, {1, 22}, {2, 33}};
  auto base = CombineTensorHashes(hashes, 3);
  REQUIRE(base.ok());
  auto shuffled = CombineTensorHashes({{2, 33}, {0, 11}, {1, 22}}, 3);
  REQUIRE(shuffled.ok());
  CHECK(*shuffled == *base);
  CHECK(*CombineTensorHashes({{0, 11}, {1, 22}, {2, 34}}, 3) != *base);
  CHECK(*CombineTensorHashes({{0, 22}, {1, 11}, {2, 33}}, 3) != *base);  // order matters
  absl::StatusOr<std::uint64_t> missing = CombineTensorHashes({{0, 11}, {2, 33}}, 3);
  CHECK(missing.status().code() == absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::uint64_t> repeated = CombineTensorHashes({{0, 11}, {0, 11}, {2, 33}}, 3);
  CHECK(repeated.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(repeated.status(), "tensor id 1"));
  // FNV-1a 64 test vectors (Fowler, Noll, Vo): "" and "a".
  CHECK(Fnv1a64("", 0) == 0xCBF29CE484222325ull);
  CHECK(Fnv1a64("a", 1) == 0xAF63DC4C8601EC8Cull);
}

}  // namespace
}  // namespace pipeoffload::gpt
