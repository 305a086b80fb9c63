// Deterministic initial parameters of the Llama model's units, as Hugging Face's
// LlamaPreTrainedModel._init_weights: RMSNorm weights 1, biases 0, every matrix (the embedding
// included) N(0, initializer_range). The bits depend only on (seed, unit, tensor, block): each
// tensor is cut into blocks of kLlamaInitBlock elements, each drawn from its own stream, so any
// number of threads gives the same values and an 8B model's units fill at memory speed.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_INIT_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_INIT_H_

#include <cstdint>
#include <vector>

#include "examples/llama/llama_config.h"

namespace pipeoffload::llama {

// Elements per init block (2^20).
inline constexpr std::int64_t kLlamaInitBlock = std::int64_t{1} << 20;

// The seed of block `block` of tensor `tensor` (its index in UnitTensors(config, unit)):
// gpt::DeriveSeed({seed, unit, tensor, block}). Element i of the block is
// float(initializer_range * Normal()) of gpt::Rng(that seed)'s i-th draw (examples/gpt/rng.h).
std::uint64_t LlamaInitBlockSeed(std::uint64_t seed, int unit, int tensor, std::int64_t block);

// Writes unit `unit`'s initial parameters into params (UnitParamCount(config, unit) floats, the
// flat layout of UnitTensors). `threads` workers draw the blocks (0: hardware concurrency;
// never more than there are blocks); the result does not depend on it.
// REQUIRES: ValidateLlamaConfig(config).ok(), 0 <= unit < NumUnits(config), params non-null.
void InitUnitParams(const LlamaConfig& config, int unit, std::uint64_t seed, float* params,
                    int threads = 1);
// The same into a new vector.
std::vector<float> InitUnitParams(const LlamaConfig& config, int unit, std::uint64_t seed,
                                  int threads = 1);

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_INIT_H_
