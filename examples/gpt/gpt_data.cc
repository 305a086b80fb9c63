// The embedded synthetic corpus, file loading, microbatch sampling and unigram entropy.
#include "examples/gpt/gpt_data.h"

#include <array>
#include <cmath>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/gpt/rng.h"
#include "lib/base/bounded_file.h"
#include "lib/base/check.h"

namespace pipeoffload::gpt {
namespace {

// Size and seed of the default corpus. The seed is fixed (not the run's --seed) so that every
// run trains on the same text and losses are comparable across seeds.
constexpr std::int64_t kSyntheticBytes = 64 * 1024;
constexpr std::uint64_t kSyntheticSeed = 0x5EED'C0A9'0001ull;

template <std::size_t N>
const char* Pick(Rng& rng, const std::array<const char*, N>& words) {
  return words[rng.Below(N)];
}

// "the quick fox chases a red ball near the river." -- a noun phrase, a verb, a noun phrase and
// sometimes a prepositional phrase; every fourth sentence or so ends the line.
std::string MakeSyntheticCorpus() {
  static constexpr std::array<const char*, 6> kDeterminers = {"the", "a",   "every",
                                                              "my",  "one", "this"};
  static constexpr std::array<const char*, 10> kAdjectives = {
      "small", "red", "quick", "lazy", "happy", "old", "bright", "quiet", "brave", "green"};
  static constexpr std::array<const char*, 12> kNouns = {"cat",   "dog",   "bird",  "fox",
                                                         "tree",  "river", "house", "child",
                                                         "robot", "apple", "ball",  "garden"};
  static constexpr std::array<const char*, 8> kVerbs = {"sees",    "likes", "chases", "finds",
                                                        "follows", "draws", "hears",  "jumps over"};
  static constexpr std::array<const char*, 5> kPrepositions = {"near", "in", "under", "behind",
                                                               "with"};
  Rng rng(kSyntheticSeed);
  std::string text;
  text.reserve(kSyntheticBytes + 128);
  auto noun_phrase = [&] {
    text += Pick(rng, kDeterminers);
    text += ' ';
    if (rng.Below(2) == 0) {
      text += Pick(rng, kAdjectives);
      text += ' ';
    }
    text += Pick(rng, kNouns);
  };
  while (static_cast<std::int64_t>(text.size()) < kSyntheticBytes) {
    noun_phrase();
    text += ' ';
    text += Pick(rng, kVerbs);
    text += ' ';
    noun_phrase();
    if (rng.Below(3) == 0) {
      text += ' ';
      text += Pick(rng, kPrepositions);
      text += ' ';
      noun_phrase();
    }
    text += rng.Below(4) == 0 ? ".\n" : ". ";
  }
  text.resize(kSyntheticBytes);
  return text;
}

}  // namespace

GptData::GptData(std::string bytes, std::string name)
    : bytes_(std::move(bytes)), name_(std::move(name)) {
  std::array<std::int64_t, 256> counts{};
  for (unsigned char byte : bytes_) ++counts[byte];
  const double total = static_cast<double>(bytes_.size());
  for (std::int64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / total;
    entropy_nats_ -= p * std::log(p);
  }
}

GptData GptData::Synthetic() { return GptData(MakeSyntheticCorpus(), "synthetic"); }

GptData GptData::FromBytes(std::string bytes, std::string name) {
  return GptData(std::move(bytes), std::move(name));
}

absl::StatusOr<GptData> GptData::FromFile(const std::string& path) {
  // Byte-level tokens may be any byte, NUL included, so the file is read as binary.
  absl::StatusOr<std::string> read =
      ReadBoundedFile(path, {"data file", kMaxDataFileBytes, /*text=*/false});
  if (!read.ok()) return read.status();
  std::string bytes = *std::move(read);
  if (bytes.empty())
    return absl::InvalidArgumentError(absl::StrCat("data file '", path, "' is empty"));
  return GptData(std::move(bytes), path);
}

absl::Status GptData::CheckCompatible(const GptConfig& config) const {
  if (size() < std::int64_t{config.seq_len} + 1) {
    return absl::InvalidArgumentError(absl::StrCat("data '", name_, "' has ", size(),
                                                   " bytes; seq_len ", config.seq_len,
                                                   " needs at least ", config.seq_len + 1));
  }
  for (std::int64_t i = 0; i < size(); ++i) {
    const int token = static_cast<unsigned char>(bytes_[static_cast<std::size_t>(i)]);
    if (token >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "data '%s' has byte 0x%02X at offset %d, not below vocab_size %d (byte-level tokens "
          "need vocab_size 256)",
          name_, token, i, config.vocab_size));
    }
  }
  return absl::OkStatus();
}

void GptData::Microbatch(std::uint64_t seed, std::int64_t step, int mb, int B, int T,
                         std::int32_t* tokens, std::int32_t* targets) const {
  PO_CHECK(size() >= std::int64_t{T} + 1);
  // Domain tag 'data' keeps these streams apart from the parameter-init streams of the same seed.
  Rng rng(DeriveSeed(
      {0x64617461ull, seed, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(mb)}));
  const std::uint64_t num_offsets = static_cast<std::uint64_t>(size() - T);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes_.data());
  for (int b = 0; b < B; ++b) {
    const std::int64_t offset = static_cast<std::int64_t>(rng.Below(num_offsets));
    for (int t = 0; t < T; ++t) {
      tokens[std::int64_t{b} * T + t] = data[offset + t];
      targets[std::int64_t{b} * T + t] = data[offset + t + 1];
    }
  }
}

double GptData::UnigramEntropyBits() const { return entropy_nats_ / std::log(2.0); }

}  // namespace pipeoffload::gpt
