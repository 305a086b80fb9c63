// libFuzzer target: the safetensors reader of layer sliding (examples/llama/safetensors.h), which
// opens the Hugging Face checkpoints a user names. The input becomes a file (the reader takes a
// path); an accepted file must describe tensors in data order that tile the data exactly, each
// of prod(shape) * sizeof(dtype) bytes, and every tensor of a float dtype reads back in full.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/llama/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// One scratch file per process, rewritten for every input.
const std::string& ScratchPath() {
  static const std::string path = "/tmp/po_fuzz_safetensors_" + std::to_string(::getpid());
  return path;
}

bool WriteScratch(const std::uint8_t* data, std::size_t size) {
  std::FILE* file = std::fopen(ScratchPath().c_str(), "wb");
  if (file == nullptr) return false;
  const bool written = size == 0 || std::fwrite(data, 1, size, file) == size;
  return std::fclose(file) == 0 && written;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using pipeoffload::llama::SafetensorsDtype;
  using pipeoffload::llama::SafetensorsFile;
  if (!WriteScratch(data, size)) return 0;
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(ScratchPath());
  if (!file.ok()) return 0;
  std::int64_t next = 0;
  for (const auto& tensor : file->tensors()) {
    PO_FUZZ_CHECK(tensor.begin == next, "tensors do not tile the data in order");
    PO_FUZZ_CHECK(tensor.end >= tensor.begin, "a tensor ends before it begins");
    next = tensor.end;
    PO_FUZZ_CHECK(file->Find(tensor.name) == &tensor, "Find does not return the tensor");
    const bool floats = tensor.dtype == SafetensorsDtype::kF32 ||
                        tensor.dtype == SafetensorsDtype::kBF16 ||
                        tensor.dtype == SafetensorsDtype::kF16;
    if (!floats) continue;
    std::vector<float> values(static_cast<std::size_t>(tensor.numel()));
    PO_FUZZ_CHECK(file->ReadFloat32(tensor, 0, values).ok(), "an accepted tensor does not read");
  }
  PO_FUZZ_CHECK(next <= file->file_size(), "tensors past the end of the file");
  return 0;
}
