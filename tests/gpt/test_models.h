// Tiny GPT configs and corpora shared by the GPT tests.
#ifndef PIPEOFFLOAD_TESTS_GPT_TEST_MODELS_H_
#define PIPEOFFLOAD_TESTS_GPT_TEST_MODELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/rng.h"

namespace pipeoffload::gpt::testing {

// A model small enough for element-wise finite differences over every parameter.
inline GptConfig TinyConfig(bool tied) {
  GptConfig config;
  config.vocab_size = 16;
  config.seq_len = 6;
  config.n_embd = 8;
  config.n_head = 2;
  config.n_layer = 2;
  config.batch_size = 2;
  config.num_microbatches = 2;
  config.seed = 7;
  config.tied_embeddings = tied;
  return config;
}

// 4 KiB of tokens in [0, vocab) with some structure (a noisy counter), as raw bytes.
inline std::shared_ptr<const GptData> SmallVocabData(int vocab) {
  Rng rng(99);
  std::string bytes(4096, '\0');
  int state = 0;
  for (char& byte : bytes) {
    state = rng.Below(4) == 0 ? static_cast<int>(rng.Below(vocab)) : (state + 1) % vocab;
    byte = static_cast<char>(state);
  }
  return std::make_shared<const GptData>(GptData::FromBytes(std::move(bytes), "small-vocab"));
}

// A config for pipeline tests on the synthetic corpus: several layers, uneven splits possible.
inline GptConfig PipelineConfig(int n_layer, bool tied) {
  GptConfig config;
  config.vocab_size = 256;
  config.seq_len = 8;
  config.n_embd = 16;
  config.n_head = 2;
  config.n_layer = n_layer;
  config.batch_size = 2;
  config.num_microbatches = 3;
  config.seed = 2024;
  config.tied_embeddings = tied;
  config.optimizer.weight_decay = 0.1f;  // exercise the decay path in the bitwise comparisons
  return config;
}

}  // namespace pipeoffload::gpt::testing

#endif  // PIPEOFFLOAD_TESTS_GPT_TEST_MODELS_H_
