// The streaming safetensors writer: plans shards and headers up front, converts fp32 to the
// file dtype piece by piece, and renames finished files into place.
//
// Invariants:
//  - A file exists under its final name only after Finish: until then shards live under
//    TemporarySibling names, each created (O_EXCL) when its first tensor is written and
//    fsync'ed and closed after its last.
//  - Tensors are written in spec order, each exactly once; shard_of_[i] never decreases in i.
//  - Once failed_, every call but the destructor returns FailedPrecondition; the destructor
//    unlinks every temporary file not yet renamed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/llama/safetensors.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/adam.h"

namespace pipeoffload::llama {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kStem = "model";

// fp32 values converted per piece: 2 MiB of 16-bit output, so the staging buffer stays small.
constexpr std::int64_t kConvertElements = std::int64_t{1} << 20;

absl::Status SpecError(const SafetensorsTensorSpec& spec, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors writer: tensor '", spec.name, "': ", std::string(what)));
}

// The header of a shard holding specs[first, end), offsets from 0, padded with spaces to a
// multiple of 8 bytes as the reference writer does (so the data starts 8-byte aligned).
std::string ShardHeader(const std::vector<SafetensorsTensorSpec>& specs, std::size_t first,
                        std::size_t end, const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  header["__metadata__"] = metadata;
  std::int64_t offset = 0;
  for (std::size_t i = first; i < end; ++i) {
    const SafetensorsTensorSpec& spec = specs[i];
    std::int64_t bytes = SafetensorsDtypeBytes(spec.dtype);
    for (std::int64_t dim : spec.shape) bytes *= dim;
    header[spec.name] = {{"dtype", std::string(SafetensorsDtypeName(spec.dtype))},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Create(
    std::string dir, std::vector<SafetensorsTensorSpec> tensors, std::int64_t max_shard_bytes,
    std::map<std::string, std::string> metadata) {
  // The directory must exist: the writer creates files, never directories.
  struct stat dir_stat {};
  if (::stat(dir.c_str(), &dir_stat) != 0 || !S_ISDIR(dir_stat.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat("safetensors writer: '", dir, "' is not an existing directory"));
  }
  std::set<std::string_view> names;
  std::vector<std::int64_t> sizes;
  std::int64_t total = 0;
  for (const SafetensorsTensorSpec& spec : tensors) {
    if (spec.name.empty() || spec.name == "__metadata__") {
      return SpecError(spec, "is not a usable tensor name");
    }
    if (!names.insert(spec.name).second) return SpecError(spec, "appears twice");
    if (!IsFloatConvertible(spec.dtype)) {
      return SpecError(spec, absl::StrCat("dtype ", std::string(SafetensorsDtypeName(spec.dtype)),
                                          " cannot be written (BF16, F16, F32 can)"));
    }
    std::int64_t bytes = SafetensorsDtypeBytes(spec.dtype);
    for (std::int64_t dim : spec.shape) {
      if (dim < 0 || (dim > 0 && bytes > (std::int64_t{1} << 56) / dim)) {
        return SpecError(
            spec, absl::StrCat("shape ", ShapeString(spec.shape), " is negative or too large"));
      }
      bytes *= dim;
    }
    sizes.push_back(bytes);
    total += bytes;
  }
  metadata.emplace("format", "pt");

  SafetensorsWriter writer;
  writer.dir_ = std::move(dir);
  writer.specs_ = std::move(tensors);
  // transformers' sharding: fill in order, start a new shard when the next tensor would push a
  // non-empty one past the limit.
  std::vector<std::pair<std::size_t, std::size_t>> ranges{{0, 0}};
  std::int64_t shard_bytes = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (max_shard_bytes > 0 && ranges.back().second > ranges.back().first &&
        shard_bytes + sizes[i] > max_shard_bytes) {
      ranges.push_back({i, i});
      shard_bytes = 0;
    }
    ranges.back().second = i + 1;
    shard_bytes += sizes[i];
    writer.shard_of_.push_back(ranges.size() - 1);
  }
  const std::size_t n = ranges.size();
  Json weight_map = Json::object();
  for (std::size_t s = 0; s < n; ++s) {
    Shard shard;
    shard.name = n == 1
                     ? absl::StrCat(std::string(kStem), ".safetensors")
                     : absl::StrFormat("%s-%05d-of-%05d.safetensors", std::string(kStem), s + 1, n);
    shard.temp_path = TemporarySibling(JoinPath(writer.dir_, shard.name));
    shard.first_tensor = ranges[s].first;
    shard.end_tensor = ranges[s].second;
    shard.header = ShardHeader(writer.specs_, shard.first_tensor, shard.end_tensor, metadata);
    for (std::size_t i = shard.first_tensor; i < shard.end_tensor; ++i) {
      weight_map[writer.specs_[i].name] = shard.name;
    }
    writer.shards_.push_back(std::move(shard));
  }
  if (n > 1) {
    writer.index_name_ = absl::StrCat(std::string(kStem), ".safetensors.index.json");
    const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    writer.index_json_ = index.dump(2) + "\n";
  }
  return writer;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : dir_(std::move(other.dir_)),
      index_name_(std::move(other.index_name_)),
      index_json_(std::move(other.index_json_)),
      specs_(std::move(other.specs_)),
      shard_of_(std::move(other.shard_of_)),
      shards_(std::move(other.shards_)),
      next_(other.next_),
      failed_(other.failed_),
      finished_(other.finished_) {
  other.shards_.clear();  // the moved-from writer owns no temporary files
}

SafetensorsWriter::~SafetensorsWriter() {
  if (finished_) return;
  for (Shard& shard : shards_) {
    if (!shard.created) continue;
    shard.fd = UniqueFd();  // close before unlinking; a close error no longer matters
    ::unlink(shard.temp_path.c_str());
  }
}

absl::Status SafetensorsWriter::OpenShard(Shard& shard) {
  const int fd = ::open(shard.temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create '", shard.temp_path, "': ", std::strerror(errno)));
  }
  shard.fd = UniqueFd(fd);
  shard.created = true;
  char length[8];
  std::uint64_t n = shard.header.size();
  for (char& byte : length) {
    byte = static_cast<char>(n & 0xFF);
    n >>= 8;
  }
  PO_RETURN_IF_ERROR(WriteFully(shard.fd.get(), length, shard.temp_path));
  return WriteFully(shard.fd.get(), shard.header, shard.temp_path);
}

absl::Status SafetensorsWriter::Write(std::string_view name, std::span<const float> values) {
  if (failed_ || finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors writer for '", dir_, "' has ", failed_ ? "failed" : "finished",
                     "; cannot write tensor '", std::string(name), "'"));
  }
  absl::Status status = WriteTensor(name, values);
  if (!status.ok()) failed_ = true;
  return status;
}

absl::Status SafetensorsWriter::WriteTensor(std::string_view name, std::span<const float> values) {
  if (next_ >= specs_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors writer: all ", specs_.size(),
                                                      " tensors are written; got '",
                                                      std::string(name), "'"));
  }
  const SafetensorsTensorSpec& spec = specs_[next_];
  if (name != spec.name) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors writer: expected tensor '",
                                                      spec.name, "' next, got '", std::string(name),
                                                      "'"));
  }
  std::int64_t numel = 1;
  for (std::int64_t dim : spec.shape) numel *= dim;
  if (static_cast<std::int64_t>(values.size()) != numel) {
    return SpecError(spec, absl::StrCat("got ", values.size(), " values for shape ",
                                        ShapeString(spec.shape), " (", numel, ")"));
  }
  Shard& shard = shards_[shard_of_[next_]];
  if (!shard.created) PO_RETURN_IF_ERROR(OpenShard(shard));
  const std::string context = absl::StrCat("tensor '", spec.name, "'");
  if (spec.dtype == SafetensorsDtype::kF32) {
    PO_RETURN_IF_ERROR(
        Annotate(WriteFully(shard.fd.get(),
                            std::span<const char>(reinterpret_cast<const char*>(values.data()),
                                                  values.size_bytes()),
                            shard.temp_path),
                 context));
  } else {
    std::vector<std::uint16_t> piece(
        static_cast<std::size_t>(std::min<std::int64_t>(kConvertElements, numel)));
    for (std::int64_t done = 0; done < numel;) {
      const std::int64_t n = std::min<std::int64_t>(kConvertElements, numel - done);
      const float* src = values.data() + done;
      if (spec.dtype == SafetensorsDtype::kBF16) {
        for (std::int64_t i = 0; i < n; ++i) piece[i] = FloatToBf16Bits(src[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) piece[i] = FloatToHalfBits(src[i]);
      }
      PO_RETURN_IF_ERROR(
          Annotate(WriteFully(shard.fd.get(),
                              std::span<const char>(reinterpret_cast<const char*>(piece.data()),
                                                    static_cast<std::size_t>(n) * 2),
                              shard.temp_path),
                   context));
      done += n;
    }
  }
  ++next_;
  if (next_ == shard.end_tensor) {
    PO_RETURN_IF_ERROR(SyncFd(shard.fd.get(), shard.temp_path));
    PO_RETURN_IF_ERROR(shard.fd.Close(shard.temp_path));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (failed_ || finished_) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors writer for '", dir_, "' has ",
                                                      failed_ ? "failed" : "finished already"));
  }
  if (next_ < specs_.size()) {
    failed_ = true;
    return absl::FailedPreconditionError(absl::StrCat("safetensors writer: tensor '",
                                                      specs_[next_].name, "' (", next_ + 1, " of ",
                                                      specs_.size(), ") was never written"));
  }
  absl::Status status;
  for (Shard& shard : shards_) {
    if (!shard.created) {  // a shard with no tensors: only the empty checkpoint has one
      status = OpenShard(shard);
      if (status.ok()) status = SyncFd(shard.fd.get(), shard.temp_path);
      if (status.ok()) status = shard.fd.Close(shard.temp_path);
    }
    const std::string final_path = JoinPath(dir_, shard.name);
    if (status.ok() && ::rename(shard.temp_path.c_str(), final_path.c_str()) != 0) {
      status = absl::InternalError(absl::StrCat("cannot rename '", shard.temp_path, "' to '",
                                                final_path, "': ", std::strerror(errno)));
    }
    if (!status.ok()) break;
  }
  if (status.ok() && !index_name_.empty()) {
    status = WriteFileAtomically(JoinPath(dir_, index_name_), index_json_);
  }
  if (status.ok()) status = SyncDirectory(dir_);
  if (!status.ok()) {
    failed_ = true;
    return status;
  }
  finished_ = true;
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsWriter::FileNames() const {
  std::vector<std::string> names;
  for (const Shard& shard : shards_) names.push_back(shard.name);
  if (!index_name_.empty()) names.push_back(index_name_);
  return names;
}

}  // namespace pipeoffload::llama
