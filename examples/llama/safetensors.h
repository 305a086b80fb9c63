// Hugging Face safetensors files: a reader that validates the whole header before any tensor
// data is touched and reads tensors into fp32, a sharded-checkpoint view (a directory with
// model.safetensors.index.json, or one model.safetensors), and a streaming writer that never
// leaves a half-written file under a final name. Nothing here knows about Llama.
//
// Format (github.com/huggingface/safetensors, README "Format"): an 8-byte little-endian u64 N,
// N bytes of JSON {"<name>": {"dtype": "BF16", "shape": [d0, ...], "data_offsets": [b, e]},
// "__metadata__": {"<key>": "<string>"}}, then the data; [b, e) is relative to the data start,
// e - b = prod(shape) * sizeof(dtype), row-major, little-endian, and (as the reference
// implementation enforces) the tensors tile the data exactly: no overlap, no gap, no tail.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_SAFETENSORS_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/llama/file_io.h"

namespace pipeoffload::llama {

// The safetensors dtypes (the spec's names: "BOOL", "U8", ..., "F64"). Any of them may appear
// in a file that is read; BF16, F16 and F32 convert to fp32 and can be written.
enum class SafetensorsDtype : std::uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};
std::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
int SafetensorsDtypeBytes(SafetensorsDtype dtype);
// BF16, F16, F32: what ReadFloat32 converts and the writer produces.
bool IsFloatConvertible(SafetensorsDtype dtype);
// The spec's name ("BF16"). Errors: InvalidArgument naming `name` and listing the known names.
[[nodiscard]] absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(std::string_view name);

// IEEE binary16 <-> fp32. HalfBitsToFloat is exact (subnormals, infinities and NaN payloads
// kept); FloatToHalfBits rounds to nearest even, overflows to infinity (|x| >= 65520),
// rounds subnormals rather than flushing them, and keeps NaN a quiet NaN with the sign and the
// top 10 payload bits.
float HalfBitsToFloat(std::uint16_t bits);
std::uint16_t FloatToHalfBits(float value);

// "[4096, 128]".
std::string ShapeString(std::span<const std::int64_t> shape);

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<std::int64_t> shape;  // row-major; empty = a scalar
  std::int64_t begin = 0;           // data_offsets, relative to the data start
  std::int64_t end = 0;
  std::int64_t numel() const;
};

// Headers above this are refused before they are read (the reference implementation's
// MAX_HEADER_SIZE, 100,000,000 bytes).
inline constexpr std::int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One open .safetensors file. Open reads and validates the header in full and keeps the file
// open; tensor data is read only by ReadFloat32. Thread-safe after Open: concurrent reads use
// pread on one descriptor. Movable, not copyable.
class SafetensorsFile {
 public:
  // Errors, all naming `path` (and the tensor, where one is at fault): NotFound; InvalidArgument
  // for a non-regular file, a file shorter than 8 bytes, a header length over
  // kMaxSafetensorsHeaderBytes or past the end of the file, header JSON that does not parse,
  // nests deeper than 8 or is not an object, a tensor entry without dtype / shape /
  // data_offsets, an unknown dtype (the known ones listed), a negative dimension, an extent that
  // is not prod(shape) * sizeof(dtype), data past the end of the file (a truncated file),
  // overlapping tensors, bytes that belong to no tensor, and __metadata__ that is not an object
  // of strings.
  [[nodiscard]] static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  std::int64_t file_size() const { return file_.size; }
  // The tensors in data order.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor `name`.
  const SafetensorsTensorInfo* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads elements [first, first + out.size()) of `tensor` (one of tensors()), converted to fp32
  // exactly, into `out`, with pread in pieces of at most 64 MiB. REQUIRES: `tensor` belongs to
  // this file. Errors: InvalidArgument naming the file and tensor when the dtype is not BF16 /
  // F16 / F32 or the range is outside the tensor; DataLoss when the read fails.
  [[nodiscard]] absl::Status ReadFloat32(const SafetensorsTensorInfo& tensor, std::int64_t first,
                                         std::span<float> out) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  ReadOnlyFile file_;
  std::int64_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint of one or more safetensors files, every header opened once.
class SafetensorsCheckpoint {
 public:
  // `path` is a directory holding model.safetensors.index.json (sharded; the index wins) or
  // model.safetensors, a *.index.json file, or a .safetensors file. The index must be
  // {"weight_map": {"<tensor>": "<file in the same directory>"}, ...}; every file it names is
  // opened (SafetensorsFile::Open) and every tensor it maps must be in the file it names.
  // Errors: SafetensorsFile::Open's; NotFound when a directory holds neither file;
  // InvalidArgument naming the index for bad JSON, a weight_map that is missing or not an object
  // of strings, a file name with a '/' or "..", or a mapped tensor absent from its file.
  [[nodiscard]] static absl::StatusOr<SafetensorsCheckpoint> Open(const std::string& path);

  // The index file, or the single .safetensors file.
  const std::string& path() const { return path_; }
  int num_files() const { return static_cast<int>(files_.size()); }

  struct Entry {
    const SafetensorsFile* file = nullptr;
    const SafetensorsTensorInfo* info = nullptr;
  };
  // {nullptr, nullptr} when the checkpoint has no tensor `name`. Pointers live as long as the
  // checkpoint (moves included).
  Entry Find(std::string_view name) const;
  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;

 private:
  SafetensorsCheckpoint() = default;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
};

// What the writer will write: the tensors in file order.
struct SafetensorsTensorSpec {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kBF16;
  std::vector<std::int64_t> shape;
};

// Streams tensors into `dir`/<stem>.safetensors, or, when they exceed `max_shard_bytes`, into
// <stem>-00001-of-0000N.safetensors ... plus <stem>.safetensors.index.json (transformers'
// naming). Shards are filled in order as transformers does: a tensor that would push a
// non-empty shard past the limit starts the next one (a tensor larger than the limit gets a
// shard of its own). Every file is written under a temporary name in `dir`, fsync'ed, and
// renamed into place by Finish, shards first and the index last, so a reader never sees a
// half-written file under a final name; files of the same names are replaced. A writer
// destroyed before Finish succeeds removes its temporary files. Not thread-safe.
class SafetensorsWriter {
 public:
  // REQUIRES nothing; validates instead. `max_shard_bytes` <= 0: one file. `metadata` goes into
  // each file's __metadata__ (transformers wants {"format": "pt"}, which is added when absent).
  // Errors: InvalidArgument for an empty or duplicate name, a dtype other than BF16 / F16 / F32,
  // a negative dimension or a size that overflows; NotFound when `dir` does not exist.
  [[nodiscard]] static absl::StatusOr<SafetensorsWriter> Create(
      std::string dir, std::vector<SafetensorsTensorSpec> tensors, std::int64_t max_shard_bytes = 0,
      std::map<std::string, std::string> metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  ~SafetensorsWriter();

  // Writes the next tensor in spec order from fp32 `values` (prod(shape) of them), converted to
  // its dtype with round-to-nearest-even (FloatToBf16Bits / FloatToHalfBits; F32 bit-exact).
  // Errors: FailedPrecondition when `name` is not the next tensor (both named) or the writer
  // already failed or finished; InvalidArgument for a wrong value count; ResourceExhausted /
  // Internal from the file system, naming the file. After an error the writer is failed.
  [[nodiscard]] absl::Status Write(std::string_view name, std::span<const float> values);

  // Renames the files into place. Errors: FailedPrecondition naming the first tensor not
  // written; file-system errors naming the file.
  [[nodiscard]] absl::Status Finish();

  // The final file names (without the directory), shards in order, then the index if any.
  std::vector<std::string> FileNames() const;

 private:
  struct Shard {
    std::string name;  // final file name
    std::string temp_path;
    std::string header;  // JSON, padded with spaces to a multiple of 8 bytes
    std::size_t first_tensor = 0;
    std::size_t end_tensor = 0;  // one past the last
    UniqueFd fd;
    bool created = false;
  };

  SafetensorsWriter() = default;
  absl::Status WriteTensor(std::string_view name, std::span<const float> values);
  absl::Status OpenShard(Shard& shard);

  std::string dir_;
  std::string index_name_;  // empty when unsharded
  std::string index_json_;
  std::vector<SafetensorsTensorSpec> specs_;
  std::vector<std::size_t> shard_of_;  // per tensor
  std::vector<Shard> shards_;
  std::size_t next_ = 0;
  bool failed_ = false;
  bool finished_ = false;
};

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_SAFETENSORS_H_
