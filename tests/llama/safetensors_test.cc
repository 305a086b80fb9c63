// safetensors: a hand-assembled file parses to known values, the writer round-trips fp32 bit
// for bit and bf16 / fp16 to exactly their rounding, sharding and the index work, every kind of
// bad header is refused naming the file and the tensor, and nothing half-written is ever left
// under a final name.
#include "examples/llama/safetensors.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeoffload/adam.h"
#include "tests/llama/io_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::llama {
namespace {

using testing::AppendLittleEndian;
using testing::Bits;
using testing::CheckError;
using testing::TempDir;
using testing::TestValues;
using testing::WriteBytes;

// A file from a header text and data bytes, assembled by hand.
std::string Assemble(const std::string& header, const std::string& data) {
  std::string bytes;
  AppendLittleEndian(&bytes, static_cast<std::uint64_t>(header.size()));
  return bytes + header + data;
}

std::vector<float> ReadAll(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsTensorInfo* info = file.Find(name);
  REQUIRE(info != nullptr);
  std::vector<float> out(static_cast<std::size_t>(info->numel()),
                         std::numeric_limits<float>::quiet_NaN());
  const absl::Status status = file.ReadFloat32(*info, 0, out);
  INFO(status.ToString());
  REQUIRE(status.ok());
  return out;
}

// Element-wise bit equality, printing the first differing element.
void CheckBitsEqual(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (Bits(got[i]) != Bits(want[i])) {
      INFO("element " << i << ": got " << got[i] << " want " << want[i]);
      CHECK(Bits(got[i]) == Bits(want[i]));
      return;
    }
  }
}

TEST_CASE("a hand-assembled 2x3 F32 file parses to its values", "[llama][safetensors]") {
  TempDir dir;
  // 1, -2, 0.5, 3.25, -0, 65504 as little-endian IEEE bytes.
  const std::string data(
      "\x00\x00\x80\x3F"
      "\x00\x00\x00\xC0"
      "\x00\x00\x00\x3F"
      "\x00\x00\x50\x40"
      "\x00\x00\x00\x80"
      "\x00\xE0\x7F\x47",
      24);
  const std::string header = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                             R"("__metadata__":{"format":"pt","note":"hand-made"}})";
  WriteBytes(dir.File("w.safetensors"), Assemble(header, data));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(dir.File("w.safetensors"));
  INFO(file.status().ToString());
  REQUIRE(file.ok());
  REQUIRE(file->tensors().size() == 1);
  const SafetensorsTensorInfo& w = file->tensors()[0];
  CHECK(w.name == "w");
  CHECK(w.dtype == SafetensorsDtype::kF32);
  CHECK(w.shape == std::vector<std::int64_t>{2, 3});
  CHECK(w.numel() == 6);
  CHECK(file->metadata() ==
        std::map<std::string, std::string>{{"format", "pt"}, {"note", "hand-made"}});
  CheckBitsEqual(ReadAll(*file, "w"), {1.0f, -2.0f, 0.5f, 3.25f, -0.0f, 65504.0f});
  // A sub-range read starts at the right element.
  std::vector<float> part(2);
  REQUIRE(file->ReadFloat32(w, 3, part).ok());
  CheckBitsEqual(part, {3.25f, -0.0f});
  CheckError(file->ReadFloat32(w, 5, part), absl::StatusCode::kInvalidArgument,
             {dir.File("w.safetensors"), "'w'", "outside"});
  CHECK(file->Find("v") == nullptr);
}

TEST_CASE("half-precision conversion is exact one way and rounds to nearest even the other",
          "[llama][safetensors]") {
  // Known encodings: subnormals, the largest half, infinities.
  CHECK(HalfBitsToFloat(0x0001) == 0x1.0p-24f);
  CHECK(HalfBitsToFloat(0x03FF) == 1023 * 0x1.0p-24f);
  CHECK(HalfBitsToFloat(0x0400) == 0x1.0p-14f);
  CHECK(HalfBitsToFloat(0x3C00) == 1.0f);
  CHECK(HalfBitsToFloat(0xC000) == -2.0f);
  CHECK(HalfBitsToFloat(0x7BFF) == 65504.0f);
  CHECK(HalfBitsToFloat(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(HalfBitsToFloat(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(Bits(HalfBitsToFloat(0x8000)) == 0x80000000u);
  CHECK(std::isnan(HalfBitsToFloat(0x7E00)));
  CHECK(Bits(HalfBitsToFloat(0x7D01)) == 0x7FA02000u);  // a signalling payload kept
  // Every non-NaN half survives the round trip; NaNs stay NaN.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfBitsToFloat(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(HalfBitsToFloat(FloatToHalfBits(f))));
    } else if (FloatToHalfBits(f) != h) {
      INFO("half 0x" << std::hex << h);
      CHECK(FloatToHalfBits(f) == h);
    }
  }
  // Rounding: ties to even, at the normal and the subnormal ends and at overflow.
  CHECK(FloatToHalfBits(1.0f + 0x1.0p-11f) == 0x3C00);      // tie, down to even
  CHECK(FloatToHalfBits(1.0f + 3 * 0x1.0p-11f) == 0x3C02);  // tie, up to even
  CHECK(FloatToHalfBits(1.0f + 0x1.0p-11f + 0x1.0p-20f) == 0x3C01);
  CHECK(FloatToHalfBits(65519.0f) == 0x7BFF);
  CHECK(FloatToHalfBits(65520.0f) == 0x7C00);  // rounds past the largest: inf
  CHECK(FloatToHalfBits(-1e10f) == 0xFC00);
  CHECK(FloatToHalfBits(0x1.0p-25f) == 0x0000);  // tie between 0 and 2^-24
  CHECK(FloatToHalfBits(std::nextafter(0x1.0p-25f, 1.0f)) == 0x0001);
  CHECK(FloatToHalfBits(3 * 0x1.0p-25f) == 0x0002);           // tie, up to even
  CHECK(FloatToHalfBits(0x1.0p-14f - 0x1.0p-26f) == 0x0400);  // carries into the normals
  CHECK(FloatToHalfBits(-0x1.0p-30f) == 0x8000);
  CHECK(FloatToHalfBits(std::numeric_limits<float>::quiet_NaN()) == 0x7E00);
#if defined(__FLT16_MAX__) && !defined(__CUDACC__)
  // The compiler's own conversion (libgcc's __truncsfhf2, round to nearest even) as the oracle,
  // over a stride through every fp32 bit pattern.
  for (std::uint64_t x = 0; x <= 0xFFFFFFFFull; x += 4099) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(x));
    if (std::isnan(f)) continue;
    __extension__ const _Float16 h = static_cast<_Float16>(f);
    const std::uint16_t want = std::bit_cast<std::uint16_t>(h);
    if (FloatToHalfBits(f) != want) {
      INFO("float bits 0x" << std::hex << x);
      CHECK(FloatToHalfBits(f) == want);
      break;
    }
  }
#endif
}

// Writes `tensors` with `dtype` into `dir` and returns the values written.
std::map<std::string, std::vector<float>> WriteCheckpoint(
    const std::string& dir,
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& shapes,
    SafetensorsDtype dtype, std::int64_t max_shard_bytes, std::vector<std::string>* files) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const auto& [name, shape] : shapes) specs.push_back({name, dtype, shape});
  absl::StatusOr<SafetensorsWriter> writer =
      SafetensorsWriter::Create(dir, specs, max_shard_bytes, {{"origin", "test"}});
  INFO(writer.status().ToString());
  REQUIRE(writer.ok());
  std::map<std::string, std::vector<float>> values;
  std::uint64_t seed = 1;
  for (const SafetensorsTensorSpec& spec : specs) {
    std::int64_t n = 1;
    for (std::int64_t d : spec.shape) n *= d;
    std::vector<float> v = TestValues(n, seed++, 3.0f);
    if (n >= 4) {               // values that exercise rounding and the edges
      v[0] = 1.0f + 0x1.0p-8f;  // a bf16 tie
      v[1] = -0.0f;
      v[2] = 1e-8f;     // subnormal in fp16
      v[3] = 70000.0f;  // past fp16's range
    }
    const absl::Status status = writer->Write(spec.name, v);
    INFO(status.ToString());
    REQUIRE(status.ok());
    values[spec.name] = std::move(v);
  }
  REQUIRE(writer->Finish().ok());
  if (files != nullptr) *files = writer->FileNames();
  return values;
}

float Rounded(float v, SafetensorsDtype dtype) {
  if (dtype == SafetensorsDtype::kBF16) return Bf16BitsToFloat(FloatToBf16Bits(v));
  if (dtype == SafetensorsDtype::kF16) return HalfBitsToFloat(FloatToHalfBits(v));
  return v;
}

const std::vector<std::pair<std::string, std::vector<std::int64_t>>> kShapes = {
    {"model.embed_tokens.weight", {64, 16}},
    {"model.norm.weight", {16}},
    {"scalar", {}},
    {"empty", {0, 5}},
    {"lm_head.weight", {64, 16}},
};

TEST_CASE("single-file round trip: F32 bit for bit, BF16 and F16 to exactly their rounding",
          "[llama][safetensors]") {
  for (SafetensorsDtype dtype :
       {SafetensorsDtype::kF32, SafetensorsDtype::kBF16, SafetensorsDtype::kF16}) {
    INFO("dtype " << SafetensorsDtypeName(dtype));
    TempDir dir;
    std::vector<std::string> files;
    const auto values = WriteCheckpoint(dir.path(), kShapes, dtype, 0, &files);
    CHECK(files == std::vector<std::string>{"model.safetensors"});
    CHECK(dir.Entries() == std::vector<std::string>{"model.safetensors"});  // no temporaries
    absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir.path());
    INFO(checkpoint.status().ToString());
    REQUIRE(checkpoint.ok());
    CHECK(checkpoint->num_files() == 1);
    CHECK(checkpoint->TensorNames().size() == kShapes.size());
    for (const auto& [name, written] : values) {
      INFO(name);
      const SafetensorsCheckpoint::Entry entry = checkpoint->Find(name);
      REQUIRE(entry.info != nullptr);
      CHECK(entry.info->dtype == dtype);
      CHECK(entry.file->metadata().at("format") == "pt");
      CHECK(entry.file->metadata().at("origin") == "test");
      std::vector<float> want;
      for (float v : written) want.push_back(Rounded(v, dtype));
      CheckBitsEqual(ReadAll(*entry.file, name), want);
    }
  }
}

TEST_CASE("sharded round trip: shards in order, the index maps every tensor",
          "[llama][safetensors]") {
  TempDir dir;
  std::vector<std::string> files;
  // 64 x 16 BF16 = 2048 bytes: each embedding-sized tensor fills a 2500-byte shard.
  const auto values = WriteCheckpoint(dir.path(), kShapes, SafetensorsDtype::kBF16, 2500, &files);
  const std::vector<std::string> expected = {"model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json"};
  CHECK(files == expected);
  CHECK(dir.Entries() == expected);
  const nlohmann::json index =
      nlohmann::json::parse(testing::ReadBytes(dir.File("model.safetensors.index.json")));
  CHECK(index["weight_map"]["model.embed_tokens.weight"] == expected[0]);
  CHECK(index["weight_map"]["empty"] == expected[0]);
  CHECK(index["weight_map"]["lm_head.weight"] == expected[1]);
  CHECK(index["metadata"]["total_size"] == 2048 + 32 + 2 + 0 + 2048);
  absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(dir.path());
  INFO(checkpoint.status().ToString());
  REQUIRE(checkpoint.ok());
  CHECK(checkpoint->num_files() == 2);
  CHECK(checkpoint->path() == dir.File("model.safetensors.index.json"));
  for (const auto& [name, written] : values) {
    const SafetensorsCheckpoint::Entry entry = checkpoint->Find(name);
    REQUIRE(entry.info != nullptr);
    std::vector<float> want;
    for (float v : written) want.push_back(Rounded(v, SafetensorsDtype::kBF16));
    CheckBitsEqual(ReadAll(*entry.file, name), want);
  }
  // The index file itself opens the same checkpoint.
  CHECK(SafetensorsCheckpoint::Open(dir.File("model.safetensors.index.json")).ok());
  // A tensor larger than the limit gets a shard of its own.
  TempDir small;
  WriteCheckpoint(small.path(), kShapes, SafetensorsDtype::kF32, 100, &files);
  // embed (4096 bytes) | norm + scalar + empty (68) | lm_head (4096), and the index.
  CHECK(files == std::vector<std::string>{
                     "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
}

struct BadHeader {
  const char* what;
  std::string header;
  std::string data;
  std::vector<std::string> message;  // fragments the error must contain
};

TEST_CASE("bad headers are refused, naming the file and the tensor", "[llama][safetensors]") {
  const std::string f32x2 = std::string(8, '\0');
  const std::vector<BadHeader> cases = {
      {"bad JSON", R"({"a":{"dtype":"F32",)", f32x2, {"JSON syntax error"}},
      {"not an object", "[1]", "", {"must be a JSON object"}},
      {"unknown dtype",
       R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})",
       f32x2,
       {"tensor 'a'", "Q4", "BF16", "F32"}},
      {"missing shape",
       R"({"a":{"dtype":"F32","data_offsets":[0,8]}})",
       f32x2,
       {"tensor 'a'", "shape", "missing"}},
      {"negative dimension",
       R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
       f32x2,
       {"tensor 'a'", "negative"}},
      {"extent not numel * size",
       R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       f32x2,
       {"tensor 'a'", "12"}},
      {"overlapping offsets",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, '\0'),
       {"tensor 'b'", "overlaps tensor 'a'"}},
      {"a gap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       std::string(12, '\0'),
       {"tensor 'b'", "[4, 8)"}},
      {"trailing bytes",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       f32x2,
       {"cover 4 of the 8"}},
      {"data past the end (truncated)",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       f32x2,
       {"tensor 'a'", "truncated"}},
      {"bad metadata", R"({"__metadata__":{"n":3}})", "", {"__metadata__.n"}},
      {"deep nesting", std::string(20, '[') + std::string(20, ']'), "", {"deeper"}},
      {"bad data_offsets",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",
       f32x2,
       {"tensor 'a'", "data_offsets"}},
  };
  TempDir dir;
  for (const BadHeader& c : cases) {
    INFO(c.what);
    const std::string path = dir.File("bad.safetensors");
    WriteBytes(path, Assemble(c.header, c.data));
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    std::vector<std::string_view> parts(c.message.begin(), c.message.end());
    parts.push_back(path);
    CheckError(file.status(), absl::StatusCode::kInvalidArgument, parts);
  }
  // The length field itself.
  const std::string path = dir.File("len.safetensors");
  std::string bytes;
  AppendLittleEndian(&bytes, std::uint64_t{1000});
  WriteBytes(path, bytes + "{}");
  CheckError(SafetensorsFile::Open(path).status(), absl::StatusCode::kInvalidArgument,
             {path, "header length 1000", "remaining 2 bytes"});
  bytes.clear();
  AppendLittleEndian(&bytes, std::uint64_t{1} << 40);
  WriteBytes(path, bytes + "{}");
  CheckError(SafetensorsFile::Open(path).status(), absl::StatusCode::kInvalidArgument,
             {path, "header length"});
  WriteBytes(path, "1234");
  CheckError(SafetensorsFile::Open(path).status(), absl::StatusCode::kInvalidArgument,
             {path, "too short"});
  CheckError(SafetensorsFile::Open(dir.File("none.safetensors")).status(),
             absl::StatusCode::kNotFound, {dir.File("none.safetensors")});
}

TEST_CASE("a truncated file written by the writer is caught at open", "[llama][safetensors]") {
  TempDir dir;
  WriteCheckpoint(dir.path(), kShapes, SafetensorsDtype::kBF16, 0, nullptr);
  const std::string path = dir.File("model.safetensors");
  const std::string bytes = testing::ReadBytes(path);
  WriteBytes(path, bytes.substr(0, bytes.size() - 1));
  // The last tensor in the data is lm_head.weight.
  CheckError(SafetensorsCheckpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
             {path, "'lm_head.weight'", "truncated"});
}

TEST_CASE("a tensor of a non-float dtype is listed but not converted", "[llama][safetensors]") {
  TempDir dir;
  std::string data;
  AppendLittleEndian(&data, std::int64_t{42});
  WriteBytes(dir.File("i.safetensors"),
             Assemble(R"({"step":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", data));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(dir.File("i.safetensors"));
  REQUIRE(file.ok());
  std::vector<float> out(1);
  CheckError(file->ReadFloat32(*file->Find("step"), 0, out), absl::StatusCode::kInvalidArgument,
             {dir.File("i.safetensors"), "'step'", "I64", "BF16, F16, F32"});
}

TEST_CASE("index errors name the index and the tensor", "[llama][safetensors]") {
  TempDir dir;
  WriteCheckpoint(dir.path(), {{"a", {4}}}, SafetensorsDtype::kF32, 0, nullptr);
  const std::string index = dir.File("model.safetensors.index.json");
  WriteBytes(index, R"({"weight_map": {"a": "model.safetensors", "b": "model.safetensors"}})");
  CheckError(SafetensorsCheckpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
             {index, "'b'", "no such tensor"});
  WriteBytes(index, R"({"weight_map": {"a": "../model.safetensors"}})");
  CheckError(SafetensorsCheckpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
             {index, "../model.safetensors"});
  WriteBytes(index, R"({"metadata": {}})");
  CheckError(SafetensorsCheckpoint::Open(dir.path()).status(), absl::StatusCode::kInvalidArgument,
             {index, "weight_map"});
  WriteBytes(index, R"({"weight_map": {"a": "other.safetensors"}})");
  CheckError(SafetensorsCheckpoint::Open(dir.path()).status(), absl::StatusCode::kNotFound,
             {dir.File("other.safetensors")});
  TempDir empty;
  CheckError(SafetensorsCheckpoint::Open(empty.path()).status(), absl::StatusCode::kNotFound,
             {empty.path(), "model.safetensors"});
}

TEST_CASE("the writer refuses bad specs and out-of-order writes", "[llama][safetensors]") {
  TempDir dir;
  using Dt = SafetensorsDtype;
  CheckError(
      SafetensorsWriter::Create(dir.path(), {{"a", Dt::kF32, {2}}, {"a", Dt::kF32, {2}}}).status(),
      absl::StatusCode::kInvalidArgument, {"'a'", "twice"});
  CheckError(SafetensorsWriter::Create(dir.path(), {{"a", Dt::kI64, {2}}}).status(),
             absl::StatusCode::kInvalidArgument, {"'a'", "I64"});
  CheckError(SafetensorsWriter::Create(dir.path(), {{"a", Dt::kF32, {-1}}}).status(),
             absl::StatusCode::kInvalidArgument, {"'a'", "[-1]"});
  CheckError(SafetensorsWriter::Create(dir.File("no/such"), {{"a", Dt::kF32, {2}}}).status(),
             absl::StatusCode::kNotFound, {"no/such"});

  absl::StatusOr<SafetensorsWriter> writer =
      SafetensorsWriter::Create(dir.path(), {{"a", Dt::kF32, {2}}, {"b", Dt::kBF16, {3}}});
  REQUIRE(writer.ok());
  const std::vector<float> two = {1, 2};
  CheckError(writer->Write("b", two), absl::StatusCode::kFailedPrecondition,
             {"expected tensor 'a'", "got 'b'"});
  CheckError(writer->Write("a", two), absl::StatusCode::kFailedPrecondition, {"failed"});

  absl::StatusOr<SafetensorsWriter> short_count =
      SafetensorsWriter::Create(dir.path(), {{"a", Dt::kF32, {3}}});
  REQUIRE(short_count.ok());
  CheckError(short_count->Write("a", two), absl::StatusCode::kInvalidArgument,
             {"'a'", "got 2 values", "[3]"});
}

TEST_CASE("nothing half-written appears under a final name", "[llama][safetensors]") {
  TempDir dir;
  using Dt = SafetensorsDtype;
  const std::vector<float> four = {1, 2, 3, 4};
  {
    absl::StatusOr<SafetensorsWriter> writer =
        SafetensorsWriter::Create(dir.path(), {{"a", Dt::kF32, {4}}, {"b", Dt::kF32, {4}}});
    REQUIRE(writer.ok());
    REQUIRE(writer->Write("a", four).ok());
    // Mid-way: only a temporary file exists.
    const std::vector<std::string> entries = dir.Entries();
    REQUIRE(entries.size() == 1);
    CHECK(entries[0].find("model.safetensors.tmp.") == 0);
    CheckError(writer->Finish(), absl::StatusCode::kFailedPrecondition,
               {"'b'", "2 of 2", "never written"});
  }
  CHECK(dir.Entries().empty());  // the abandoned writer removed its temporary
  {
    absl::StatusOr<SafetensorsWriter> writer = SafetensorsWriter::Create(
        dir.path(), {{"a", Dt::kF32, {4}}, {"b", Dt::kF32, {4}}}, /*max_shard_bytes=*/16);
    REQUIRE(writer.ok());
    REQUIRE(writer->Write("a", four).ok());
    REQUIRE(writer->Write("b", four).ok());
    CHECK(dir.Entries().size() == 2);  // two temporary shards, no index yet
    for (const std::string& name : dir.Entries()) CHECK(name.find(".tmp.") != std::string::npos);
    REQUIRE(writer->Finish().ok());
    CHECK(writer->Finish().code() == absl::StatusCode::kFailedPrecondition);
  }
  CHECK(dir.Entries() == std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                  "model-00002-of-00002.safetensors",
                                                  "model.safetensors.index.json"});
}

}  // namespace
}  // namespace pipeoffload::llama
