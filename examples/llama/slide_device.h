// What slide_train needs of a GPU, behind functions that also link without CUDA
// (slide_device_cuda.cc with CUDA, slide_device_none.cc without): the backend, the model on it,
// its shape without a device (--dry-run), and the device memory the process holds.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_DEVICE_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "examples/llama/llama_config.h"
#include "examples/llama/llama_data.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::llama {

struct SlideModelOptions {
  int batch = 1;
  int seq = 256;
  int microbatches = 1;
  std::uint64_t data_seed = 1;
  int ce_chunk_rows = 0;
};

// A CUDA device opened for training.
struct SlideGpu {
  std::unique_ptr<Backend> backend;
  std::int64_t total_bytes = 0;
  std::int64_t free_bytes = 0;  // when opened (the CUDA context exists by then)
  std::string name;             // "NVIDIA H200"
  // Device bytes in use now beyond those in use when the device was opened: everything this
  // process allocated since (engine, model, cuBLAS), the context excluded.
  std::function<std::int64_t()> bytes_in_use;
};

// Whether this build has CUDA and a GPU is visible.
bool CudaGpuAvailable();
// Whether this build has CUDA (a GPU run can be planned here even without a GPU).
bool CudaInBuild();
// Device 0. Errors: FailedPrecondition without CUDA in the build or without a GPU.
[[nodiscard]] absl::StatusOr<SlideGpu> OpenCudaGpu();
// The bf16 model on a CUDA backend (LlamaCudaModel). Errors: its Create's.
[[nodiscard]] absl::StatusOr<std::unique_ptr<SlidingModel>> CreateCudaLlama(
    Backend& backend, const LlamaConfig& config, const TokenData& data,
    const SlideModelOptions& options);
// Its shape, without a device. Errors: FailedPrecondition without CUDA in the build.
[[nodiscard]] absl::StatusOr<SlidingModelShape> PlanCudaLlamaShape(const LlamaConfig& config,
                                                                   const SlideModelOptions& options);

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_SLIDE_DEVICE_H_
