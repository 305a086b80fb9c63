// Blocked, threaded, deterministic init of the Llama units' parameters (llama_init.h).
#include "examples/llama/llama_init.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "examples/gpt/rng.h"
#include "lib/base/check.h"

namespace pipeoffload::llama {

std::uint64_t LlamaInitBlockSeed(std::uint64_t seed, int unit, int tensor, std::int64_t block) {
  return gpt::DeriveSeed({seed, static_cast<std::uint64_t>(unit),
                          static_cast<std::uint64_t>(tensor), static_cast<std::uint64_t>(block)});
}

void InitUnitParams(const LlamaConfig& config, int unit, std::uint64_t seed, float* params,
                    int threads) {
  PO_CHECK(params != nullptr);
  const std::vector<LlamaTensor> tensors = UnitTensors(config, unit);
  // Norms and biases are constant fills (cheap, done here); the normal draws are the work.
  struct Block {
    int tensor;
    std::int64_t index;
  };
  std::vector<Block> blocks;
  for (int t = 0; t < static_cast<int>(tensors.size()); ++t) {
    const LlamaTensor& tensor = tensors[t];
    float* p = params + tensor.offset;
    if (tensor.is_norm) {
      std::fill(p, p + tensor.numel(), 1.0f);
    } else if (tensor.cols == 1) {
      std::fill(p, p + tensor.numel(), 0.0f);  // q/k/v biases
    } else {
      for (std::int64_t b = 0; b * kLlamaInitBlock < tensor.numel(); ++b) {
        blocks.push_back({t, b});
      }
    }
  }
  const double std_dev = config.initializer_range;
  auto fill = [&](const Block& block) {
    const LlamaTensor& tensor = tensors[block.tensor];
    const std::int64_t begin = block.index * kLlamaInitBlock;
    const std::int64_t end = std::min(tensor.numel(), begin + kLlamaInitBlock);
    float* p = params + tensor.offset;
    gpt::Rng rng(LlamaInitBlockSeed(seed, unit, block.tensor, block.index));
    for (std::int64_t i = begin; i < end; ++i) p[i] = static_cast<float>(std_dev * rng.Normal());
  };
  const std::int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t workers = std::min(threads > 0 ? std::int64_t{threads} : hardware,
                                        static_cast<std::int64_t>(blocks.size()));
  if (workers <= 1) {
    for (const Block& block : blocks) fill(block);
    return;
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < blocks.size(); i = next.fetch_add(1)) {
      fill(blocks[i]);
    }
  };
  std::vector<std::thread> pool;
  for (std::int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();  // the calling thread is a worker too
  for (std::thread& thread : pool) thread.join();
}

std::vector<float> InitUnitParams(const LlamaConfig& config, int unit, std::uint64_t seed,
                                  int threads) {
  std::vector<float> params(static_cast<std::size_t>(UnitParamCount(config, unit)));
  InitUnitParams(config, unit, seed, params.data(), threads);
  return params;
}

}  // namespace pipeoffload::llama
