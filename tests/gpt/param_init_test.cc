// ParameterBlock::Allocate's blocked, threaded init against the serial formula it must keep:
// every tensor of at most kInitBlock elements draws exactly the serial stream
// Rng(DeriveSeed({seed, id})) of before; a larger tensor's block b >= 1 draws from
// Rng(DeriveSeed({seed, id, b})); and the bits never depend on the number of threads. The
// expectations are computed here from rng.h directly, not through InitBlockSeed, so a wrong seed
// rule in the library cannot agree with itself.
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_params.h"
#include "examples/gpt/rng.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

constexpr std::uint64_t kSeed = 1234;

// `count` draws of N(0, std) from `seed`, as the serial init wrote them.
std::vector<float> SerialDraws(std::uint64_t seed, std::int64_t count, float std) {
  Rng rng(seed);
  std::vector<float> out(static_cast<std::size_t>(count));
  for (float& x : out) x = static_cast<float>(static_cast<double>(std) * rng.Normal());
  return out;
}

TensorSpec Normal(std::int64_t rows, std::int64_t cols, float std) {
  TensorSpec spec;
  spec.rows = rows;
  spec.cols = cols;
  spec.init_std = std;
  return spec;
}

TensorSpec Constant(std::int64_t rows, float value) {
  TensorSpec spec;
  spec.rows = rows;
  spec.init_value = value;
  return spec;
}

// Bitwise equality of `count` floats (memcmp: -0 vs 0 and NaNs count as different).
bool SameBits(const float* a, const float* b, std::int64_t count) {
  return std::memcmp(a, b, static_cast<std::size_t>(count) * sizeof(float)) == 0;
}

std::vector<float> Values(const ParameterBlock& block) {
  return std::vector<float>(block.param(0), block.param(0) + block.numel());
}

TEST_CASE("init: a tensor past one block keeps block 0's serial stream, block 1 its own seed",
          "[gpt][param_init]") {
  constexpr int kId = 7;
  constexpr std::int64_t kCount = kInitBlock + 5;
  constexpr float kStd = 0.02f;
  const int threads = GENERATE(1, 2, 5);
  CAPTURE(threads);
  ParameterBlock block;
  block.Add(kId, Normal(kCount, 1, kStd), /*mirror=*/false);
  block.Allocate(kSeed, threads);
  REQUIRE(block.numel() == kCount);

  const std::vector<float> block0 = SerialDraws(DeriveSeed({kSeed, kId}), kInitBlock, kStd);
  CHECK(SameBits(block.param(0), block0.data(), kInitBlock));
  const std::vector<float> block1 = SerialDraws(DeriveSeed({kSeed, kId, 1}), 5, kStd);
  CHECK(SameBits(block.param(0) + kInitBlock, block1.data(), 5));
  // Not the serial stream continued: the rule really changed past the first block.
  const std::vector<float> serial = SerialDraws(DeriveSeed({kSeed, kId}), kCount, kStd);
  CHECK_FALSE(SameBits(block.param(0) + kInitBlock, serial.data() + kInitBlock, 5));
  CHECK(InitBlockSeed(kSeed, kId, 0) == DeriveSeed({kSeed, kId}));
  CHECK(InitBlockSeed(kSeed, kId, 3) == DeriveSeed({kSeed, kId, 3}));
}

TEST_CASE("init: the bits do not depend on the thread count", "[gpt][param_init]") {
  // Tensors of 1, 2 and 3 blocks, constants between them, ids not in local order, a mirror.
  auto build = [](int threads) {
    ParameterBlock block;
    block.Add(3, Normal(kInitBlock + 5, 1, 0.5f), false);
    block.Add(1, Constant(7, 1.0f), false);
    block.Add(9, Normal(2 * kInitBlock + 1, 1, 0.02f), false);
    block.Add(4, Normal(kInitBlock, 1, 0.1f), false);
    block.Add(2, Constant(kInitBlock + 3, 0.25f), false);
    block.Add(3, Normal(kInitBlock + 5, 1, 0.5f), /*mirror=*/true);
    block.Allocate(kSeed, threads);
    return block;
  };
  const ParameterBlock one = build(1);
  const std::vector<float> reference = Values(one);
  for (int threads : {2, 3, 8, 0}) {
    CAPTURE(threads);
    const ParameterBlock many = build(threads);
    REQUIRE(many.numel() == one.numel());
    CHECK(SameBits(many.param(0), reference.data(), one.numel()));
  }

  // Each piece is what the rule says.
  const int t9 = one.Find(9, false);
  for (std::int64_t b = 0; b < 3; ++b) {
    CAPTURE(b);
    const std::uint64_t seed =
        b == 0 ? DeriveSeed({kSeed, 9}) : DeriveSeed({kSeed, 9, static_cast<std::uint64_t>(b)});
    const std::int64_t count = b < 2 ? kInitBlock : 1;
    const std::vector<float> expected = SerialDraws(seed, count, 0.02f);
    CHECK(SameBits(one.param(t9) + b * kInitBlock, expected.data(), count));
  }
  // A tensor of exactly kInitBlock elements is one block: the serial stream.
  const std::vector<float> t4 = SerialDraws(DeriveSeed({kSeed, 4}), kInitBlock, 0.1f);
  CHECK(SameBits(one.param(one.Find(4, false)), t4.data(), kInitBlock));
  // Constants, across their block boundary.
  const float* ones = one.param(one.Find(1, false));
  for (int i = 0; i < 7; ++i) CHECK(ones[i] == 1.0f);
  const float* quarter = one.param(one.Find(2, false));
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < kInitBlock + 3; ++i) wrong += quarter[i] != 0.25f;
  CHECK(wrong == 0);
  // The mirror has its original's bits.
  CHECK(SameBits(one.param(one.Find(3, true)), one.param(one.Find(3, false)), kInitBlock + 5));
}

TEST_CASE("init: every tensor of a small GPT is the serial formula, bit for bit",
          "[gpt][param_init]") {
  // The default config (every tensor under one block) and a wider one whose largest tensor
  // (wte, 256 x 4096 = kInitBlock) is exactly one block.
  GptConfig config;
  SECTION("default") {}
  SECTION("C 4096, 1 layer, T 32") {
    config.n_embd = 4096;
    config.n_head = 64;
    config.n_layer = 1;
  }
  const std::vector<TensorSpec> specs = GptTensorSpecs(config);
  for (int threads : {1, 4}) {
    CAPTURE(threads);
    ParameterBlock block;
    for (int id = 0; id < static_cast<int>(specs.size()); ++id) {
      if (specs[static_cast<std::size_t>(id)].numel() <= kInitBlock) {
        block.Add(id, specs[static_cast<std::size_t>(id)], false);
      }
    }
    REQUIRE(block.tensors().size() >= 10);
    block.Allocate(config.seed, threads);
    for (int local = 0; local < static_cast<int>(block.tensors().size()); ++local) {
      const ParamTensor& tensor = block.tensors()[static_cast<std::size_t>(local)];
      CAPTURE(tensor.id, tensor.spec.name);
      const std::int64_t n = tensor.spec.numel();
      std::vector<float> expected(static_cast<std::size_t>(n), tensor.spec.init_value);
      if (tensor.spec.init_std > 0.0f) {
        expected = SerialDraws(DeriveSeed({config.seed, static_cast<std::uint64_t>(tensor.id)}),
                               n, tensor.spec.init_std);
      }
      CHECK(SameBits(block.param(local), expected.data(), n));
    }
  }
}

TEST_CASE("init: gradients and moments start at zero; a copied block is independent",
          "[gpt][param_init]") {
  ParameterBlock block;
  block.Add(0, Normal(3 * kInitBlock, 1, 0.02f), false);
  block.Add(1, Constant(10, 1.0f), false);
  block.Allocate(kSeed, 2);
  std::int64_t nonzero = 0;
  for (std::int64_t i = 0; i < block.numel(); ++i) nonzero += block.grad(0)[i] != 0.0f;
  CHECK(nonzero == 0);
  // AdamW with zero gradients and no decay leaves the values: m and v were zero.
  const std::vector<float> before = Values(block);
  AdamWConfig config;
  config.weight_decay = 0.0f;
  block.AdamWStep(config, 1);
  CHECK(SameBits(block.param(0), before.data(), block.numel()));

  ParameterBlock copy = block;
  REQUIRE(copy.numel() == block.numel());
  CHECK(copy.param(0) != block.param(0));
  CHECK(SameBits(copy.param(0), block.param(0), block.numel()));
  copy.param(1)[0] = 5.0f;
  copy.grad(0)[0] = 1.0f;
  CHECK(block.param(1)[0] == 1.0f);
  CHECK(block.grad(0)[0] == 0.0f);
  ParameterBlock moved = std::move(copy);
  CHECK(moved.param(1)[0] == 5.0f);
  CHECK(moved.Hashes().size() == 2);

  ParameterBlock empty;
  empty.Allocate(kSeed);
  CHECK(empty.numel() == 0);
  CHECK(empty.Hashes().empty());
}

}  // namespace
}  // namespace pipeoffload::gpt
