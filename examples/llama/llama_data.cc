// Token streams: the GPT example's synthetic corpus, token files (bytes, raw u16/u32, llm.c),
// the sampler and the unigram entropy. Files are read once, whole, in large pieces.
#include "examples/llama/llama_data.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/rng.h"
#include "examples/llama/file_io.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and read by memcpy");

// llm.c's dev/data/data_common.py: a 256 x int32 header, magic 20240520, version 1 for uint16
// tokens (GPT-2) or 2 for uint32 (Llama 3), the token count at [2].
constexpr std::int64_t kLlmcHeaderInts = 256;
constexpr std::int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;
constexpr std::int32_t kLlmcMagic = 20240520;

// Tokens are widened into the destination in pieces of this many file bytes.
constexpr std::int64_t kPieceBytes = std::int64_t{16} << 20;

// Reads `count` little-endian ids of `width` bytes (1, 2 or 4) starting at `offset`.
absl::Status ReadIds(const ReadOnlyFile& file, const std::string& path, std::int64_t offset,
                     std::int64_t count, int width, std::vector<std::uint32_t>* tokens) {
  tokens->resize(static_cast<std::size_t>(count));
  if (width == 4) {  // straight into place
    return PreadFully(file.fd.get(), offset,
                      std::span<char>(reinterpret_cast<char*>(tokens->data()),
                                      static_cast<std::size_t>(count) * 4),
                      path);
  }
  std::vector<char> piece(static_cast<std::size_t>(std::min(kPieceBytes, count * width)));
  for (std::int64_t first = 0; first < count;) {
    const std::int64_t n = std::min<std::int64_t>(count - first, kPieceBytes / width);
    const std::span<char> bytes(piece.data(), static_cast<std::size_t>(n * width));
    PO_RETURN_IF_ERROR(PreadFully(file.fd.get(), offset + first * width, bytes, path));
    const auto* u8 = reinterpret_cast<const unsigned char*>(piece.data());
    std::uint32_t* out = tokens->data() + first;
    if (width == 1) {
      for (std::int64_t i = 0; i < n; ++i) out[i] = u8[i];
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<std::uint32_t>(u8[2 * i]) |
                 (static_cast<std::uint32_t>(u8[2 * i + 1]) << 8);
      }
    }
    first += n;
  }
  return absl::OkStatus();
}

// The llm.c header: the token width and count, checked against the file size.
absl::Status ParseLlmcHeader(const ReadOnlyFile& file, const std::string& path, int* width,
                             std::int64_t* count) {
  if (file.size < kLlmcHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("data file '", path, "' has ", file.size,
                                                   " bytes, less than the llm.c header (",
                                                   kLlmcHeaderBytes, ")"));
  }
  std::int32_t header[kLlmcHeaderInts];
  PO_RETURN_IF_ERROR(PreadFully(
      file.fd.get(), 0, std::span<char>(reinterpret_cast<char*>(header), sizeof(header)), path));
  if (header[0] != kLlmcMagic) {
    return absl::InvalidArgumentError(absl::StrCat("data file '", path, "': llm.c magic is ",
                                                   header[0], ", expected ", kLlmcMagic));
  }
  if (header[1] != 1 && header[1] != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file '", path, "': llm.c version ", header[1],
                     " is not supported (1 = uint16 tokens, 2 = uint32)"));
  }
  *width = header[1] == 1 ? 2 : 4;
  *count = header[2];
  const std::int64_t expected = kLlmcHeaderBytes + *count * *width;
  if (*count < 0 || expected != file.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file '", path, "': the llm.c header says ", header[2], " tokens of ",
                     *width, " bytes (", expected, " bytes with the header) but the file has ",
                     file.size, " bytes (truncated or not an llm.c file?)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "bytes") return DataFormat::kBytes;
  if (name == "u16") return DataFormat::kU16;
  if (name == "u32") return DataFormat::kU32;
  if (name == "llmc") return DataFormat::kLlmc;
  return absl::InvalidArgumentError(absl::StrCat("unknown data format '", std::string(name),
                                                 "'; expected auto, bytes, u16, u32 or llmc"));
}

TokenData::TokenData(std::vector<std::uint32_t> tokens, std::string name)
    : tokens_(std::move(tokens)), name_(std::move(name)) {
  for (std::uint32_t token : tokens_) max_token_ = std::max(max_token_, token);
  // Counts in id order, summed in id order: for byte data the same sum, in the same order, as
  // GptData's, so the two entropies agree bit for bit.
  std::vector<std::int64_t> counts;
  if (max_token_ < (1u << 24)) {
    counts.assign(std::size_t{max_token_} + 1, 0);
    for (std::uint32_t token : tokens_) ++counts[token];
  } else {  // ids too large for a dense table: count runs of a sorted copy
    std::vector<std::uint32_t> sorted = tokens_;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size();) {
      std::size_t j = i;
      while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
      counts.push_back(static_cast<std::int64_t>(j - i));
      i = j;
    }
  }
  const double total = static_cast<double>(tokens_.size());
  for (std::int64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / total;
    entropy_nats_ -= p * std::log(p);
  }
}

TokenData TokenData::Synthetic() {
  const gpt::GptData corpus = gpt::GptData::Synthetic();
  const std::string& bytes = corpus.bytes();
  std::vector<std::uint32_t> tokens(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    tokens[i] = static_cast<unsigned char>(bytes[i]);
  }
  return TokenData(std::move(tokens), "synthetic");
}

TokenData TokenData::FromTokens(std::vector<std::uint32_t> tokens, std::string name) {
  return TokenData(std::move(tokens), std::move(name));
}

absl::StatusOr<TokenData> TokenData::FromFile(const std::string& path, DataFormat format) {
  PO_ASSIGN_OR_RETURN(ReadOnlyFile file, OpenRegularFile(path, "data file", kMaxDataFileBytes));
  if (format == DataFormat::kAuto) {
    std::int32_t magic = 0;
    if (file.size >= kLlmcHeaderBytes) {
      PO_RETURN_IF_ERROR(
          PreadFully(file.fd.get(), 0, std::span<char>(reinterpret_cast<char*>(&magic), 4), path));
    }
    format = magic == kLlmcMagic ? DataFormat::kLlmc : DataFormat::kBytes;
  }
  int width = 1;
  std::int64_t offset = 0;
  std::int64_t count = 0;
  switch (format) {
    case DataFormat::kLlmc:
      PO_RETURN_IF_ERROR(ParseLlmcHeader(file, path, &width, &count));
      offset = kLlmcHeaderBytes;
      break;
    case DataFormat::kU16:
    case DataFormat::kU32:
      width = format == DataFormat::kU16 ? 2 : 4;
      if (file.size % width != 0) {
        return absl::InvalidArgumentError(absl::StrCat("data file '", path, "' has ", file.size,
                                                       " bytes, not a whole number of ", width,
                                                       "-byte token ids"));
      }
      count = file.size / width;
      break;
    case DataFormat::kBytes:
    case DataFormat::kAuto:
      count = file.size;
      break;
  }
  if (count < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file '", path, "' holds ", count, " tokens; at least 2 are needed"));
  }
  std::vector<std::uint32_t> tokens;
  PO_RETURN_IF_ERROR(ReadIds(file, path, offset, count, width, &tokens));
  return TokenData(std::move(tokens), path);
}

absl::Status TokenData::CheckCompatible(int vocab_size, int seq_len) const {
  if (vocab_size <= 0 || seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("data '", name_, "': vocab_size ", vocab_size,
                                                   " and seq_len ", seq_len, " must be positive"));
  }
  if (size() < std::int64_t{seq_len} + 1) {
    return absl::InvalidArgumentError(absl::StrCat("data '", name_, "' has ", size(),
                                                   " tokens; seq_len ", seq_len, " needs at least ",
                                                   seq_len + 1));
  }
  if (max_token_ >= static_cast<std::uint32_t>(vocab_size)) {
    const auto it = std::find_if(tokens_.begin(), tokens_.end(), [&](std::uint32_t token) {
      return token >= static_cast<std::uint32_t>(vocab_size);
    });
    return absl::InvalidArgumentError(
        absl::StrCat("data '", name_, "' has token id ", *it, " at position ", it - tokens_.begin(),
                     ", not below vocab_size ", vocab_size, " (largest id ", max_token_, ")"));
  }
  return absl::OkStatus();
}

void TokenData::Microbatch(std::uint64_t seed, std::int64_t step, int mb, int B, int T,
                           std::int32_t* tokens, std::int32_t* targets) const {
  PO_CHECK(size() >= std::int64_t{T} + 1);
  // GptData::Microbatch's stream (domain tag 'data', then seed, step, mb) and draw order, so
  // byte data gives the GPT example's microbatches exactly (data_test checks it).
  gpt::Rng rng(gpt::DeriveSeed(
      {0x64617461ull, seed, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(mb)}));
  const std::uint64_t num_offsets = static_cast<std::uint64_t>(size() - T);
  for (int b = 0; b < B; ++b) {
    const std::int64_t offset = static_cast<std::int64_t>(rng.Below(num_offsets));
    const std::uint32_t* window = tokens_.data() + offset;
    std::int32_t* row_tokens = tokens + std::int64_t{b} * T;
    std::int32_t* row_targets = targets + std::int64_t{b} * T;
    for (int t = 0; t < T; ++t) {
      row_tokens[t] = static_cast<std::int32_t>(window[t]);
      row_targets[t] = static_cast<std::int32_t>(window[t + 1]);
    }
  }
}

}  // namespace pipeoffload::llama
