// Token data: the synthetic corpus and sampler agree with the GPT example's bit for bit, every
// file format reads back the ids written, and bad files (FIFOs, truncated llm.c files, odd
// sizes, oversized files) are refused with the path named and without blocking.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <string>
#include <tuple>
#include <vector>

#include "examples/gpt/gpt_config.h"
#include "examples/gpt/gpt_data.h"
#include "examples/llama/llama_data.h"
#include "tests/llama/io_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama {
namespace {

using testing::AppendLittleEndian;
using testing::CheckError;
using testing::TempDir;
using testing::WriteBytes;

TokenData Read(const std::string& path, DataFormat format) {
  absl::StatusOr<TokenData> data = TokenData::FromFile(path, format);
  INFO(path << ": " << data.status().ToString());
  REQUIRE(data.ok());
  return *std::move(data);
}

// Every token of `data` in order, through the sampler: with T = size - 1 the only window
// starts at 0, so the tokens are data[0, n-1) and the last target is data[n-1].
std::vector<std::int32_t> AllTokens(const TokenData& data) {
  const int T = static_cast<int>(data.size() - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(T));
  std::vector<std::int32_t> targets(static_cast<std::size_t>(T));
  data.Microbatch(1, 0, 0, 1, T, tokens.data(), targets.data());
  tokens.push_back(targets.back());
  return tokens;
}

std::string LlmcFile(int version, const std::vector<std::uint32_t>& ids, std::int32_t count) {
  std::string bytes;
  std::int32_t header[256] = {};
  header[0] = 20240520;
  header[1] = version;
  header[2] = count;
  for (std::int32_t word : header) AppendLittleEndian(&bytes, word);
  for (std::uint32_t id : ids) {
    if (version == 1) {
      AppendLittleEndian(&bytes, static_cast<std::uint16_t>(id));
    } else {
      AppendLittleEndian(&bytes, id);
    }
  }
  return bytes;
}

TEST_CASE("the synthetic corpus, its entropy and its microbatches are the GPT example's",
          "[llama][data]") {
  const TokenData data = TokenData::Synthetic();
  const gpt::GptData gpt_data = gpt::GptData::Synthetic();
  REQUIRE(data.size() == gpt_data.size());
  CHECK(data.name() == "synthetic");
  CHECK(data.UnigramEntropyNats() == gpt_data.UnigramEntropyNats());  // bit for bit
  CHECK(data.max_token() < 128);
  const int B = 3;
  const int T = 17;
  for (const auto& [seed, step, mb] :
       {std::tuple<std::uint64_t, std::int64_t, int>{7, 0, 0}, {7, 5, 2}, {123456789, 99, 7}}) {
    std::vector<std::int32_t> a_tok(B * T, -1), a_tgt(B * T, -1);
    std::vector<std::int32_t> b_tok(B * T, -2), b_tgt(B * T, -2);
    data.Microbatch(seed, step, mb, B, T, a_tok.data(), a_tgt.data());
    gpt_data.Microbatch(seed, step, mb, B, T, b_tok.data(), b_tgt.data());
    INFO("seed " << seed << " step " << step << " mb " << mb);
    CHECK(a_tok == b_tok);
    CHECK(a_tgt == b_tgt);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t + 1 < T; ++t) CHECK(a_tgt[b * T + t] == a_tok[b * T + t + 1]);
    }
  }
  std::vector<std::int32_t> s0(B * T), s1(B * T), unused(B * T);
  data.Microbatch(7, 0, 0, B, T, s0.data(), unused.data());
  data.Microbatch(7, 1, 0, B, T, s1.data(), unused.data());
  CHECK(s0 != s1);
}

TEST_CASE("every token file format reads back the ids written", "[llama][data]") {
  TempDir dir;
  const std::vector<std::uint32_t> ids = {0, 1, 255, 256, 4095, 65535, 7, 300};

  WriteBytes(dir.File("text.txt"), std::string("hi\xFF\x00!", 5));
  const TokenData text = Read(dir.File("text.txt"), DataFormat::kAuto);
  CHECK(AllTokens(text) == std::vector<std::int32_t>{'h', 'i', 255, 0, '!'});
  CHECK(text.name() == dir.File("text.txt"));

  std::string u16;
  for (std::uint32_t id : ids) AppendLittleEndian(&u16, static_cast<std::uint16_t>(id));
  WriteBytes(dir.File("u16.bin"), u16);
  const std::vector<std::int32_t> expected(ids.begin(), ids.end());
  CHECK(AllTokens(Read(dir.File("u16.bin"), DataFormat::kU16)) == expected);
  CHECK(Read(dir.File("u16.bin"), DataFormat::kU16).max_token() == 65535);
  // Read as bytes, the same file is twice as many tokens.
  CHECK(Read(dir.File("u16.bin"), DataFormat::kBytes).size() == 16);

  std::vector<std::uint32_t> wide = ids;
  wide.push_back(128255);
  wide.push_back(4000000000u);
  std::string u32;
  for (std::uint32_t id : wide) AppendLittleEndian(&u32, id);
  WriteBytes(dir.File("u32.bin"), u32);
  const TokenData big = Read(dir.File("u32.bin"), DataFormat::kU32);
  CHECK(big.size() == 10);
  CHECK(big.max_token() == 4000000000u);

  for (int version : {1, 2}) {
    INFO("llm.c version " << version);
    const std::string path = dir.File("llmc" + std::to_string(version) + ".bin");
    WriteBytes(path, LlmcFile(version, ids, static_cast<std::int32_t>(ids.size())));
    CHECK(AllTokens(Read(path, DataFormat::kAuto)) == expected);  // auto-detected
    CHECK(AllTokens(Read(path, DataFormat::kLlmc)) == expected);
  }
}

TEST_CASE("bad token files are refused with the path and the reason", "[llama][data]") {
  TempDir dir;
  const std::vector<std::uint32_t> ids = {1, 2, 3, 4};
  const std::string good = LlmcFile(1, ids, 4);

  WriteBytes(dir.File("truncated.bin"), good.substr(0, good.size() - 1));
  CheckError(TokenData::FromFile(dir.File("truncated.bin")).status(),
             absl::StatusCode::kInvalidArgument,
             {dir.File("truncated.bin"), "4 tokens", "truncated"});
  WriteBytes(dir.File("long.bin"), good + "xx");
  CheckError(TokenData::FromFile(dir.File("long.bin"), DataFormat::kLlmc).status(),
             absl::StatusCode::kInvalidArgument, {dir.File("long.bin"), "1034 bytes"});
  WriteBytes(dir.File("v3.bin"), LlmcFile(3, {}, 0));
  CheckError(TokenData::FromFile(dir.File("v3.bin")).status(), absl::StatusCode::kInvalidArgument,
             {dir.File("v3.bin"), "version 3"});
  WriteBytes(dir.File("nomagic.bin"), std::string(2048, 'a'));
  CheckError(TokenData::FromFile(dir.File("nomagic.bin"), DataFormat::kLlmc).status(),
             absl::StatusCode::kInvalidArgument, {dir.File("nomagic.bin"), "magic"});
  WriteBytes(dir.File("short.bin"), "abc");
  CheckError(TokenData::FromFile(dir.File("short.bin"), DataFormat::kLlmc).status(),
             absl::StatusCode::kInvalidArgument, {dir.File("short.bin"), "header"});
  CheckError(TokenData::FromFile(dir.File("short.bin"), DataFormat::kU16).status(),
             absl::StatusCode::kInvalidArgument, {dir.File("short.bin"), "whole number"});
  WriteBytes(dir.File("one.bin"), "a");
  CheckError(TokenData::FromFile(dir.File("one.bin")).status(), absl::StatusCode::kInvalidArgument,
             {dir.File("one.bin"), "at least 2"});
  WriteBytes(dir.File("empty.bin"), "");
  CheckError(TokenData::FromFile(dir.File("empty.bin")).status(),
             absl::StatusCode::kInvalidArgument, {dir.File("empty.bin"), "0 tokens"});
  CheckError(TokenData::FromFile(dir.File("missing.bin")).status(), absl::StatusCode::kNotFound,
             {dir.File("missing.bin")});
  CheckError(TokenData::FromFile(dir.path()).status(), absl::StatusCode::kInvalidArgument,
             {dir.path(), "directory"});
  CheckError(TokenData::FromFile("/dev/null").status(), absl::StatusCode::kInvalidArgument,
             {"/dev/null", "character device"});
}

TEST_CASE("a file over the size limit is refused before it is read", "[llama][data]") {
  TempDir dir;
  const std::string path = dir.File("huge.bin");
  // A sparse file: one byte past the limit, no data blocks written.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  const bool sized = ::ftruncate(fd, TokenData::kMaxDataFileBytes + 1) == 0;
  ::close(fd);
  REQUIRE(sized);
  CheckError(TokenData::FromFile(path).status(), absl::StatusCode::kResourceExhausted,
             {path, "limit"});
}

TEST_CASE("a FIFO is refused without blocking", "[llama][data]") {
  TempDir dir;
  const std::string path = dir.File("fifo");
  REQUIRE(::mkfifo(path.c_str(), 0644) == 0);
  // A reader that opened the FIFO would wait for a writer forever; the guard below turns that
  // into a failure (and then unblocks it by opening the write end) instead of a hung test.
  std::future<absl::Status> result =
      std::async(std::launch::async, [&] { return TokenData::FromFile(path).status(); });
  const bool returned = result.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  if (!returned) {
    const int writer = ::open(path.c_str(), O_WRONLY);
    if (writer >= 0) ::close(writer);
  }
  REQUIRE(returned);
  CheckError(result.get(), absl::StatusCode::kInvalidArgument, {path, "FIFO"});
}

TEST_CASE("CheckCompatible names the first out-of-vocabulary id and where it is", "[llama][data]") {
  const TokenData data = TokenData::FromTokens({3, 1, 4, 1, 5, 9, 2, 6}, "pi");
  CHECK(data.CheckCompatible(10, 7).ok());
  CheckError(data.CheckCompatible(10, 8), absl::StatusCode::kInvalidArgument,
             {"pi", "8 tokens", "seq_len 8"});
  CheckError(data.CheckCompatible(6, 4), absl::StatusCode::kInvalidArgument,
             {"pi", "token id 9 at position 5", "vocab_size 6"});
  CheckError(data.CheckCompatible(0, 4), absl::StatusCode::kInvalidArgument, {"vocab_size 0"});
}

TEST_CASE("unigram entropy, with small and with huge ids", "[llama][data]") {
  CHECK(TokenData::FromTokens({4, 4, 4, 4}, "one").UnigramEntropyNats() == 0.0);
  CHECK(TokenData::FromTokens({0, 7, 0, 7}, "two").UnigramEntropyNats() ==
        Catch::Approx(std::log(2.0)).epsilon(1e-15));
  // Ids past the dense-table range take the sorted path; with the counts in the same id order
  // (1, 2, 3 occurrences) the sum is the same, bit for bit.
  const double dense = TokenData::FromTokens({1, 2, 2, 3, 3, 3}, "d").UnigramEntropyNats();
  const double sparse =
      TokenData::FromTokens({1u << 30, 1u << 25, 5, 1u << 30, 1u << 25, 1u << 30}, "s")
          .UnigramEntropyNats();
  CHECK(dense == sparse);
  CHECK(dense == Catch::Approx(-(std::log(1.0 / 6) / 6 + std::log(2.0 / 6) * 2 / 6 +
                                 std::log(3.0 / 6) * 3 / 6))
                     .epsilon(1e-14));
}

TEST_CASE("ParseDataFormat", "[llama][data]") {
  CHECK(*ParseDataFormat("auto") == DataFormat::kAuto);
  CHECK(*ParseDataFormat("bytes") == DataFormat::kBytes);
  CHECK(*ParseDataFormat("u16") == DataFormat::kU16);
  CHECK(*ParseDataFormat("u32") == DataFormat::kU32);
  CHECK(*ParseDataFormat("llmc") == DataFormat::kLlmc);
  CheckError(ParseDataFormat("u8").status(), absl::StatusCode::kInvalidArgument,
             {"u8", "auto, bytes, u16, u32 or llmc"});
}

}  // namespace
}  // namespace pipeoffload::llama
