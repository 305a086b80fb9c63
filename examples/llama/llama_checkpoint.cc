// Llama checkpoints: the tensor-by-tensor validation against UnitTensors, the unit-at-a-time
// threaded load, and the all-or-nothing save through a temporary directory.
#include "examples/llama/llama_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/llama/file_io.h"
#include "examples/llama/llama_config_io.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama {
namespace {

// A unit's tensor and where the checkpoint keeps it.
struct Located {
  LlamaTensor tensor;
  SafetensorsCheckpoint::Entry entry;
};

std::vector<std::int64_t> HfShape(const LlamaTensor& t) {
  if (t.cols == 1) return {t.rows};
  return {t.rows, t.cols};
}

// Every unit's tensors, located and checked (shape, dtype) before anything is read.
absl::StatusOr<std::vector<std::vector<Located>>> LocateAll(const SafetensorsCheckpoint& checkpoint,
                                                            const LlamaConfig& config) {
  std::vector<std::vector<Located>> units(static_cast<std::size_t>(NumUnits(config)));
  for (int u = 0; u < NumUnits(config); ++u) {
    for (LlamaTensor& t : UnitTensors(config, u)) {
      const std::vector<std::int64_t> want = HfShape(t);
      const SafetensorsCheckpoint::Entry entry = checkpoint.Find(t.hf_name);
      if (entry.info == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint '", checkpoint.path(), "' has no tensor '", t.hf_name, "' (shape ",
            ShapeString(want), ", needed by config '", config.name, "')"));
      }
      if (entry.info->shape != want) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.hf_name, "' in '",
                                                       entry.file->path(), "' has shape ",
                                                       ShapeString(entry.info->shape), "; config '",
                                                       config.name, "' needs ", ShapeString(want)));
      }
      if (!IsFloatConvertible(entry.info->dtype)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.hf_name, "' in '", entry.file->path(), "' has dtype ",
            std::string(SafetensorsDtypeName(entry.info->dtype)), "; BF16, F16 or F32 is needed"));
      }
      units[static_cast<std::size_t>(u)].push_back({std::move(t), entry});
    }
  }
  return units;
}

// Reads elements [begin, end) of the unit's flat array (its tensors back to back) into
// unit[begin, end).
absl::Status ReadRange(const std::vector<Located>& tensors, std::int64_t begin, std::int64_t end,
                       std::span<float> unit) {
  for (const Located& l : tensors) {
    const std::int64_t lo = std::max(begin, l.tensor.offset);
    const std::int64_t hi = std::min(end, l.tensor.offset + l.tensor.numel());
    if (lo >= hi) continue;
    PO_RETURN_IF_ERROR(l.entry.file->ReadFloat32(
        *l.entry.info, lo - l.tensor.offset,
        unit.subspan(static_cast<std::size_t>(lo), static_cast<std::size_t>(hi - lo))));
  }
  return absl::OkStatus();
}

// One unit, its elements split evenly between `threads` readers; small units stay on the
// calling thread (a thread per few KB costs more than it saves).
absl::Status ReadUnit(const std::vector<Located>& tensors, std::span<float> unit, int threads) {
  constexpr std::int64_t kMinElementsPerThread = std::int64_t{1} << 20;
  const std::int64_t total = static_cast<std::int64_t>(unit.size());
  const int n =
      static_cast<int>(std::clamp<std::int64_t>(total / kMinElementsPerThread, 1, threads));
  if (n == 1) return ReadRange(tensors, 0, total, unit);
  std::vector<absl::Status> statuses(static_cast<std::size_t>(n));
  std::vector<std::thread> readers;
  readers.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const std::int64_t begin = total * i / n;
    const std::int64_t end = total * (i + 1) / n;
    readers.emplace_back([&, i, begin, end] {
      statuses[static_cast<std::size_t>(i)] = ReadRange(tensors, begin, end, unit);
    });
  }
  for (std::thread& reader : readers) reader.join();
  for (const absl::Status& status : statuses) PO_RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

std::int64_t LargestUnit(const LlamaConfig& config) {
  std::int64_t largest = 0;
  for (int u = 0; u < NumUnits(config); ++u) {
    largest = std::max(largest, UnitParamCount(config, u));
  }
  return largest;
}

const char* TorchDtype(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF16:
      return "float16";
    case SafetensorsDtype::kF32:
      return "float32";
    default:
      return "bfloat16";
  }
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// OK when `dir` does not exist or is an empty directory.
absl::Status CheckDestination(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("cannot stat checkpoint directory '", dir, "': ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint destination '", dir, "' exists and is not a directory"));
  }
  std::error_code error;
  if (!std::filesystem::is_empty(dir, error) || error) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint directory '", dir,
                     "' exists and is not empty; refusing to overwrite (choose a new directory)"));
  }
  return absl::OkStatus();
}

// Everything of the checkpoint, into the (new, empty) directory `dir`.
absl::Status WriteCheckpointFiles(const std::string& dir, const LlamaConfig& config,
                                  const GetUnitFn& get_unit, SafetensorsDtype dtype,
                                  std::int64_t max_shard_bytes) {
  PO_RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(dir, "config.json"), HfConfigJson(config, TorchDtype(dtype))));
  std::vector<SafetensorsTensorSpec> specs;
  for (int u = 0; u < NumUnits(config); ++u) {
    for (const LlamaTensor& t : UnitTensors(config, u)) {
      specs.push_back({t.hf_name, dtype, HfShape(t)});
    }
  }
  PO_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                      SafetensorsWriter::Create(dir, std::move(specs), max_shard_bytes));
  std::vector<float> buffer(static_cast<std::size_t>(LargestUnit(config)));
  for (int u = 0; u < NumUnits(config); ++u) {
    const std::span<float> unit(buffer.data(), static_cast<std::size_t>(UnitParamCount(config, u)));
    std::fill(unit.begin(), unit.end(), std::numeric_limits<float>::quiet_NaN());
    PO_RETURN_IF_ERROR(Annotate(get_unit(u, unit), absl::StrCat("get_unit(", u, ")")));
    for (const LlamaTensor& t : UnitTensors(config, u)) {
      PO_RETURN_IF_ERROR(writer.Write(
          t.hf_name,
          unit.subspan(static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel()))));
    }
  }
  return writer.Finish();
}

}  // namespace

absl::Status CheckLlamaCheckpoint(const std::string& path, const LlamaConfig& config) {
  PO_RETURN_IF_ERROR(ValidateLlamaConfig(config));
  PO_ASSIGN_OR_RETURN(const SafetensorsCheckpoint checkpoint, SafetensorsCheckpoint::Open(path));
  return LocateAll(checkpoint, config).status();
}

absl::Status LoadLlamaCheckpoint(const std::string& path, const LlamaConfig& config,
                                 const SetUnitFn& set_unit, int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint load: threads = ", threads, " must be at least 1"));
  }
  PO_RETURN_IF_ERROR(ValidateLlamaConfig(config));
  PO_ASSIGN_OR_RETURN(const SafetensorsCheckpoint checkpoint, SafetensorsCheckpoint::Open(path));
  PO_ASSIGN_OR_RETURN(const std::vector<std::vector<Located>> units, LocateAll(checkpoint, config));
  std::vector<float> buffer(static_cast<std::size_t>(LargestUnit(config)));
  for (int u = 0; u < NumUnits(config); ++u) {
    const std::span<float> unit(buffer.data(), static_cast<std::size_t>(UnitParamCount(config, u)));
    PO_RETURN_IF_ERROR(ReadUnit(units[static_cast<std::size_t>(u)], unit, threads));
    PO_RETURN_IF_ERROR(Annotate(set_unit(u, unit), absl::StrCat("set_unit(", u, ")")));
  }
  return absl::OkStatus();
}

absl::Status SaveLlamaCheckpoint(const std::string& dir_in, const LlamaConfig& config,
                                 const GetUnitFn& get_unit, SafetensorsDtype dtype,
                                 std::int64_t max_shard_bytes) {
  PO_RETURN_IF_ERROR(CheckHfExpressible(config));
  if (!IsFloatConvertible(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint save: dtype ",
                                                   std::string(SafetensorsDtypeName(dtype)),
                                                   " cannot be written (BF16, F16, F32 can)"));
  }
  const std::string dir = StripTrailingSlashes(dir_in);
  PO_RETURN_IF_ERROR(CheckDestination(dir));
  const std::string temp = TemporarySibling(dir);
  if (::mkdir(temp.c_str(), 0755) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot create directory '", temp, "': ", std::strerror(errno)));
  }
  absl::Status status = WriteCheckpointFiles(temp, config, get_unit, dtype, max_shard_bytes);
  if (status.ok()) status = SyncDirectory(temp);
  // rename(2) onto an empty directory replaces it; onto one that gained files since
  // CheckDestination it fails (ENOTEMPTY), and nothing is overwritten.
  if (status.ok() && ::rename(temp.c_str(), dir.c_str()) != 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat("cannot rename '", temp, "' to '", dir, "': ", std::strerror(errno)));
  }
  if (!status.ok()) {
    std::error_code ignored;
    std::filesystem::remove_all(temp, ignored);
    return status;
  }
  return SyncDirectory(DirName(dir));
}

}  // namespace pipeoffload::llama
