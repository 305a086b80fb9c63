// The safetensors reader: dtypes and half-precision conversion, header validation, tensor
// reads into fp32, and the sharded-checkpoint view. The writer is in safetensors_writer.cc.
#include "examples/llama/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/base/check.h"
#include "lib/base/status_macros.h"
#include "lib/ir/json_fields.h"
#include "pipeoffload/adam.h"

namespace pipeoffload::llama {
namespace {

using internal::Json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and read by memcpy");

struct DtypeRow {
  SafetensorsDtype dtype;
  const char* name;
  int bytes;
};
// The spec's dtypes and widths (safetensors' Dtype enum).
constexpr DtypeRow kDtypes[] = {
    {SafetensorsDtype::kBool, "BOOL", 1},      {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},          {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1}, {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kU16, "U16", 2},        {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},      {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU32, "U32", 4},        {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kI64, "I64", 8},        {SafetensorsDtype::kU64, "U64", 8},
    {SafetensorsDtype::kF64, "F64", 8},
};

const DtypeRow& RowOf(SafetensorsDtype dtype) {
  for (const DtypeRow& row : kDtypes) {
    if (row.dtype == dtype) return row;
  }
  PO_CHECK_MSG(false, "unknown SafetensorsDtype");
  return kDtypes[0];
}

// Real headers nest three deep (root, tensor entry, shape array); anything much deeper is not
// a safetensors header, and refusing it keeps the JSON parser's work bounded.
constexpr int kMaxJsonDepth = 8;

// The deepest [ / { nesting of `text` outside strings.
int JsonDepth(std::string_view text) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return deepest;
}

// absl::string_view: Status::message() is one, and std::string converts to it.
absl::Status FileError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path, "': ", what));
}

absl::Status TensorError(const std::string& path, const std::string& tensor,
                         absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors file '", path, "': tensor '", tensor, "': ", what));
}

// a * b for non-negative a, b, or -1 on int64 overflow.
std::int64_t CheckedMul(std::int64_t a, std::int64_t b) {
  if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a) return -1;
  return a * b;
}

absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(const std::string& path,
                                                       const std::string& name, const Json& entry,
                                                       std::int64_t data_size) {
  if (!entry.is_object()) {
    return TensorError(path, name,
                       absl::StrCat("expected an object, got ", internal::JsonKind(entry)));
  }
  SafetensorsTensorInfo info;
  info.name = name;
  std::string dtype;
  std::vector<std::int64_t> offsets;
  absl::Status status = internal::ReadMember(entry, "", "dtype", &dtype);
  if (status.ok()) status = internal::ReadMember(entry, "", "shape", &info.shape);
  if (status.ok()) status = internal::ReadMember(entry, "", "data_offsets", &offsets);
  if (!status.ok()) return TensorError(path, name, status.message());
  absl::StatusOr<SafetensorsDtype> parsed = ParseSafetensorsDtype(dtype);
  if (!parsed.ok()) return TensorError(path, name, parsed.status().message());
  info.dtype = *parsed;
  std::int64_t bytes = SafetensorsDtypeBytes(info.dtype);
  for (std::int64_t dim : info.shape) {
    if (dim < 0) {
      return TensorError(
          path, name, absl::StrCat("shape ", ShapeString(info.shape), " has a negative dimension"));
    }
    bytes = CheckedMul(bytes, dim);
    if (bytes < 0) {
      return TensorError(path, name,
                         absl::StrCat("shape ", ShapeString(info.shape), " overflows int64"));
    }
  }
  if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0]) {
    return TensorError(path, name,
                       absl::StrCat("data_offsets ", ShapeString(offsets),
                                    " must be [begin, end] with 0 <= begin <= end"));
  }
  info.begin = offsets[0];
  info.end = offsets[1];
  if (info.end - info.begin != bytes) {
    return TensorError(
        path, name,
        absl::StrCat("data_offsets ", ShapeString(offsets), " span ", info.end - info.begin,
                     " bytes, but ", dtype, " ", ShapeString(info.shape), " needs ", bytes));
  }
  if (info.end > data_size) {
    return TensorError(
        path, name,
        absl::StrCat("data_offsets ", ShapeString(offsets), " end past the data section's ",
                     data_size, " bytes (is the file truncated?)"));
  }
  return info;
}

// Checks that the tensors, sorted by offset, tile [0, data_size) exactly.
absl::Status CheckTiling(const std::string& path, std::vector<SafetensorsTensorInfo>& tensors,
                         std::int64_t data_size) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::int64_t covered = 0;
  const SafetensorsTensorInfo* previous = nullptr;
  for (const SafetensorsTensorInfo& t : tensors) {
    if (t.begin < covered) {
      return TensorError(
          path, t.name,
          absl::StrCat("data [", t.begin, ", ", t.end, ") overlaps tensor '", previous->name, "' [",
                       previous->begin, ", ", previous->end, ")"));
    }
    if (t.begin > covered) {
      return TensorError(path, t.name,
                         absl::StrCat("data starts at ", t.begin, ", leaving bytes [", covered,
                                      ", ", t.begin, ") of no tensor"));
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != data_size) {
    return FileError(path, absl::StrCat("tensors cover ", covered, " of the ", data_size,
                                        " data bytes; the rest belongs to no tensor"));
  }
  return absl::OkStatus();
}

absl::Status ParseMetadata(const std::string& path, const Json& value,
                           std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return FileError(path, absl::StrCat("__metadata__ must be an object of strings, got ",
                                        internal::JsonKind(value)));
  }
  for (const auto& [key, member] : value.items()) {
    if (!member.is_string()) {
      return FileError(path, absl::StrCat("__metadata__.", key, " must be a string, got ",
                                          internal::JsonKind(member)));
    }
    (*metadata)[key] = member.get<std::string>();
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view SafetensorsDtypeName(SafetensorsDtype dtype) { return RowOf(dtype).name; }
int SafetensorsDtypeBytes(SafetensorsDtype dtype) { return RowOf(dtype).bytes; }

bool IsFloatConvertible(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kBF16 || dtype == SafetensorsDtype::kF16 ||
         dtype == SafetensorsDtype::kF32;
}

absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(std::string_view name) {
  std::vector<std::string_view> names;
  for (const DtypeRow& row : kDtypes) {
    if (name == row.name) return row.dtype;
    names.push_back(row.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", std::string(name),
                                                 "'; known: ", internal::JoinNames(names),
                                                 " (BF16, F16, F32 convert to fp32)"));
}

float HalfBitsToFloat(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  std::uint32_t bits;
  if (exponent == 0x1F) {  // infinity, or NaN with its payload in the top mantissa bits
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
    bits = sign | std::bit_cast<std::uint32_t>(magnitude);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t FloatToHalfBits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN: quiet, top payload bits kept
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (a >= 0x38800000u) {  // >= 2^-14: a normal half. Rebias 127 -> 15, round 13 bits away.
    const std::uint32_t rebiased = a - 0x38000000u;
    const std::uint32_t rounded = rebiased + 0xFFFu + ((rebiased >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (rounded >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 is a tie, to even 0)
  // Subnormal half: |x| / 2^-24 rounded to an integer, nearest even. |x| = m * 2^(e - 150)
  // with the implicit bit in m, so the quotient is m >> (126 - e); e in [102, 112].
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126 - e;
  std::uint32_t q = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u))) ++q;  // may carry into the smallest normal
  return static_cast<std::uint16_t>(sign | q);
}

std::string ShapeString(std::span<const std::int64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::int64_t SafetensorsTensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t dim : shape) n *= dim;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  PO_ASSIGN_OR_RETURN(file.file_, OpenRegularFile(path, "safetensors file"));
  if (file.file_.size < 8) {
    return FileError(
        path, absl::StrCat(file.file_.size, " bytes, too short for the 8-byte header length"));
  }
  unsigned char length_bytes[8];
  PO_RETURN_IF_ERROR(PreadFully(file.file_.fd.get(), 0,
                                std::span<char>(reinterpret_cast<char*>(length_bytes), 8), path));
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  const std::uint64_t room = static_cast<std::uint64_t>(file.file_.size - 8);
  if (header_length > static_cast<std::uint64_t>(kMaxSafetensorsHeaderBytes) ||
      header_length > room) {
    return FileError(
        path, absl::StrCat("header length ", header_length, " exceeds ",
                           header_length > room ? "the file's remaining " : "the limit of ",
                           header_length > room ? room : kMaxSafetensorsHeaderBytes, " bytes"));
  }
  std::string header(static_cast<std::size_t>(header_length), '\0');
  PO_RETURN_IF_ERROR(PreadFully(file.file_.fd.get(), 8, std::span<char>(header), path));
  if (JsonDepth(header) > kMaxJsonDepth) {
    return FileError(path, absl::StrCat("header JSON nests deeper than ", kMaxJsonDepth));
  }
  absl::StatusOr<Json> doc = internal::ParseJsonText(header);
  if (!doc.ok()) return FileError(path, absl::StrCat("header: ", doc.status().message()));
  if (!doc->is_object()) {
    return FileError(path,
                     absl::StrCat("header must be a JSON object, got ", internal::JsonKind(*doc)));
  }
  file.data_start_ = 8 + static_cast<std::int64_t>(header_length);
  const std::int64_t data_size = file.file_.size - file.data_start_;
  for (const auto& [key, value] : doc->items()) {
    if (key == "__metadata__") {
      PO_RETURN_IF_ERROR(ParseMetadata(path, value, &file.metadata_));
      continue;
    }
    PO_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, ParseTensorEntry(path, key, value, data_size));
    file.tensors_.push_back(std::move(info));
  }
  PO_RETURN_IF_ERROR(CheckTiling(path, file.tensors_, data_size));
  for (std::size_t i = 0; i < file.tensors_.size(); ++i) {
    file.by_name_.emplace(file.tensors_[i].name, i);
  }
  return file;
}

const SafetensorsTensorInfo* SafetensorsFile::Find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::ReadFloat32(const SafetensorsTensorInfo& t, std::int64_t first,
                                          std::span<float> out) const {
  if (!IsFloatConvertible(t.dtype)) {
    return TensorError(path_, t.name,
                       absl::StrCat("dtype ", std::string(SafetensorsDtypeName(t.dtype)),
                                    " does not convert to fp32 (supported: BF16, F16, F32)"));
  }
  const std::int64_t count = static_cast<std::int64_t>(out.size());
  if (first < 0 || first > t.numel() - count) {
    return TensorError(
        path_, t.name,
        absl::StrCat("elements [", first, ", ", first + count, ") are outside its ", t.numel()));
  }
  const int width = SafetensorsDtypeBytes(t.dtype);
  const std::int64_t at = data_start_ + t.begin + first * width;
  absl::Status status;
  if (t.dtype == SafetensorsDtype::kF32) {
    status =
        PreadFully(file_.fd.get(), at,
                   std::span<char>(reinterpret_cast<char*>(out.data()), out.size_bytes()), path_);
  } else {
    // 16-bit data: read a piece, widen it into place.
    constexpr std::int64_t kPieceElements = std::int64_t{8} << 20;
    std::vector<std::uint16_t> piece(static_cast<std::size_t>(std::min(kPieceElements, count)));
    for (std::int64_t done = 0; done < count && status.ok();) {
      const std::int64_t n = std::min<std::int64_t>(kPieceElements, count - done);
      status = PreadFully(
          file_.fd.get(), at + done * 2,
          std::span<char>(reinterpret_cast<char*>(piece.data()), static_cast<std::size_t>(n) * 2),
          path_);
      float* dst = out.data() + done;
      if (t.dtype == SafetensorsDtype::kBF16) {
        for (std::int64_t i = 0; i < n; ++i) dst[i] = Bf16BitsToFloat(piece[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) dst[i] = HalfBitsToFloat(piece[i]);
      }
      done += n;
    }
  }
  return Annotate(status, absl::StrCat("tensor '", t.name, "'"));
}

// ---- checkpoints ----

namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status IndexError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors index '", path, "': ", what));
}

// The index's weight_map: tensor -> shard file name (same directory).
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& path) {
  PO_ASSIGN_OR_RETURN(ReadOnlyFile file,
                      OpenRegularFile(path, "safetensors index", kMaxSafetensorsHeaderBytes));
  std::string text(static_cast<std::size_t>(file.size), '\0');
  PO_RETURN_IF_ERROR(PreadFully(file.fd.get(), 0, std::span<char>(text), path));
  if (JsonDepth(text) > kMaxJsonDepth) {
    return IndexError(path, absl::StrCat("JSON nests deeper than ", kMaxJsonDepth));
  }
  absl::StatusOr<Json> doc = internal::ParseJsonText(text);
  if (!doc.ok()) return IndexError(path, doc.status().message());
  const Json* weight_map = doc->is_object() ? internal::FindMember(*doc, "weight_map") : nullptr;
  if (weight_map == nullptr || !weight_map->is_object()) {
    return IndexError(path, "needs an object \"weight_map\": {\"<tensor>\": \"<file>\"}");
  }
  std::map<std::string, std::string> map;
  for (const auto& [tensor, file_name] : weight_map->items()) {
    if (!file_name.is_string()) {
      return IndexError(path, absl::StrCat("weight_map.", tensor, " must be a file name, got ",
                                           internal::JsonKind(file_name)));
    }
    const std::string name = file_name.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return IndexError(path, absl::StrCat("weight_map.", tensor, " = '", name,
                                           "' is not a file name in the index's directory"));
    }
    map.emplace(tensor, name);
  }
  return map;
}

}  // namespace

absl::StatusOr<SafetensorsCheckpoint> SafetensorsCheckpoint::Open(const std::string& path) {
  std::string index_path;
  std::string single_path;
  if (IsDirectory(path)) {
    if (Exists(JoinPath(path, kIndexName))) {
      index_path = JoinPath(path, kIndexName);
    } else if (Exists(JoinPath(path, kSingleName))) {
      single_path = JoinPath(path, kSingleName);
    } else {
      return absl::NotFoundError(absl::StrCat("checkpoint directory '", path, "' has neither ",
                                              std::string(kIndexName), " nor ",
                                              std::string(kSingleName)));
    }
  } else if (EndsWith(path, ".index.json")) {
    index_path = path;
  } else {
    single_path = path;
  }
  SafetensorsCheckpoint checkpoint;
  if (!single_path.empty()) {
    checkpoint.path_ = single_path;
    PO_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(single_path));
    checkpoint.files_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
    for (const SafetensorsTensorInfo& info : checkpoint.files_[0]->tensors()) {
      checkpoint.tensors_.emplace(info.name, Entry{checkpoint.files_[0].get(), &info});
    }
    return checkpoint;
  }
  checkpoint.path_ = index_path;
  PO_ASSIGN_OR_RETURN(const auto weight_map, ReadWeightMap(index_path));
  const std::string dir = DirName(index_path);
  std::map<std::string, const SafetensorsFile*> opened;
  for (const auto& [tensor, file_name] : weight_map) {
    if (!opened.contains(file_name)) {
      PO_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(JoinPath(dir, file_name)));
      checkpoint.files_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
      opened[file_name] = checkpoint.files_.back().get();
    }
    const SafetensorsFile* shard = opened[file_name];
    const SafetensorsTensorInfo* info = shard->Find(tensor);
    if (info == nullptr) {
      return IndexError(index_path, absl::StrCat("maps tensor '", tensor, "' to '", shard->path(),
                                                 "', which has no such tensor"));
    }
    checkpoint.tensors_.emplace(tensor, Entry{shard, info});
  }
  return checkpoint;
}

SafetensorsCheckpoint::Entry SafetensorsCheckpoint::Find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? Entry{} : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

}  // namespace pipeoffload::llama
