// Training data for the GPT example: a byte corpus (the embedded synthetic default or a text
// file) and deterministic microbatch sampling, so every pipeline rank can fetch microbatch i of
// step s on its own (stage 0 needs the tokens, the last stage the targets) and get the same bytes.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_GPT_DATA_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_GPT_DATA_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_config.h"

namespace pipeoffload::gpt {

class GptData {
 public:
  // The default corpus: 64 KiB of English-like sentences from a small fixed grammar (articles,
  // adjectives, nouns, verbs, prepositional phrases), generated from a fixed seed, so the same on
  // every run and machine. Byte-level; a small model learns its words and sentence shape fast.
  static GptData Synthetic();
  // Any file, read as bytes (each byte one token). NotFound / InvalidArgument (empty) with the
  // path.
  [[nodiscard]] static absl::StatusOr<GptData> FromFile(const std::string& path);
  // A corpus from memory; `name` appears in error messages.
  static GptData FromBytes(std::string bytes, std::string name);

  // OK, or InvalidArgument when the corpus cannot feed `config`: fewer than seq_len + 1 bytes,
  // or a byte >= vocab_size (names the byte and its offset).
  [[nodiscard]] absl::Status CheckCompatible(const GptConfig& config) const;

  // Microbatch `mb` of step `step`: B windows of T+1 consecutive bytes at offsets drawn from
  // DeriveSeed({seed, step, mb}); tokens (B,T) = window[0..T), targets (B,T) = window[1..T].
  // A pure function of its arguments. REQUIRES: CheckCompatible for (B, T).
  void Microbatch(std::uint64_t seed, std::int64_t step, int mb, int B, int T, std::int32_t* tokens,
                  std::int32_t* targets) const;

  // Entropy of the corpus's byte distribution, in nats per token (the loss a model that learned
  // only unigram frequencies would reach) and in bits.
  double UnigramEntropyNats() const { return entropy_nats_; }
  double UnigramEntropyBits() const;

  std::int64_t size() const { return static_cast<std::int64_t>(bytes_.size()); }
  const std::string& name() const { return name_; }
  const std::string& bytes() const { return bytes_; }

 private:
  GptData(std::string bytes, std::string name);

  std::string bytes_;
  std::string name_;
  double entropy_nats_ = 0.0;
};

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_GPT_DATA_H_
