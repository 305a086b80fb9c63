// Training data for the Llama example: a token stream (the embedded synthetic byte corpus, any
// file read as bytes, or a token file of uint16 / uint32 ids) and deterministic microbatch
// sampling: microbatch mb of step s is a pure function of (seed, s, mb), so the sliding engine,
// the plain trainer and every test see the same tokens.
//
// Token files (the llm.c / nanoGPT `.bin` conventions):
//  - llm.c: a 256-int32 header (magic 20240520, version 1 = uint16 tokens or 2 = uint32, token
//    count at header[2]), then the tokens;
//  - nanoGPT: no header, raw little-endian uint16 ids (`--data-format u16`) or uint32 (`u32`).
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_DATA_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_DATA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload::llama {

// How to read a --data file.
enum class DataFormat : std::uint8_t {
  kAuto,   // llm.c header if the file starts with its magic, else bytes
  kBytes,  // every byte one token (vocab >= 256)
  kU16,    // raw uint16 ids (nanoGPT)
  kU32,    // raw uint32 ids
  kLlmc,   // llm.c header required
};
// "auto", "bytes", "u16", "u32", "llmc". Errors: InvalidArgument listing the names.
[[nodiscard]] absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name);

class TokenData {
 public:
  // The default corpus: GPT example's synthetic English-like byte corpus (64 KiB, fixed seed).
  static TokenData Synthetic();
  // Reads `path` whole. Limits: a regular file (not a FIFO or device), at most
  // kMaxDataFileBytes, at least 2 tokens; a token file's size must be a whole number of ids
  // and an llm.c file's header must match its size. Errors: NotFound / InvalidArgument /
  // ResourceExhausted naming the path and the problem.
  [[nodiscard]] static absl::StatusOr<TokenData> FromFile(const std::string& path,
                                                          DataFormat format = DataFormat::kAuto);
  static TokenData FromTokens(std::vector<std::uint32_t> tokens, std::string name);

  static constexpr std::int64_t kMaxDataFileBytes = std::int64_t{16} << 30;

  // OK, or InvalidArgument when the data cannot feed sequences of `seq_len` for a vocabulary
  // of `vocab_size`: fewer than seq_len + 1 tokens, or an id >= vocab_size (naming the id and
  // its position).
  [[nodiscard]] absl::Status CheckCompatible(int vocab_size, int seq_len) const;

  // Microbatch `mb` of step `step`: B windows of T+1 consecutive tokens at offsets drawn from
  // (seed, step, mb); tokens (B,T) = window[0..T), targets (B,T) = window[1..T].
  // REQUIRES: CheckCompatible for (vocab, T).
  void Microbatch(std::uint64_t seed, std::int64_t step, int mb, int B, int T,
                  std::int32_t* tokens, std::int32_t* targets) const;

  // Entropy of the token distribution in nats (the loss of a unigram model).
  double UnigramEntropyNats() const { return entropy_nats_; }
  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::uint32_t max_token() const { return max_token_; }
  const std::string& name() const { return name_; }

 private:
  TokenData(std::vector<std::uint32_t> tokens, std::string name);

  std::vector<std::uint32_t> tokens_;
  std::string name_;
  std::uint32_t max_token_ = 0;
  double entropy_nats_ = 0.0;
};

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_LLAMA_DATA_H_
