// slide_device.h with CUDA: the CUDA backend, LlamaCudaModel, and cudaMemGetInfo.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "examples/llama/cuda/llama_cuda_model.h"
#include "examples/llama/slide_device.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda.h"

namespace pipeoffload::llama {
namespace {

cuda::LlamaCudaModelOptions CudaOptions(const SlideModelOptions& options) {
  cuda::LlamaCudaModelOptions o;
  o.batch_size = options.batch;
  o.seq_len = options.seq;
  o.max_microbatches = options.microbatches;
  o.data_seed = options.data_seed;
  o.ce_chunk_rows = options.ce_chunk_rows;
  return o;
}

absl::StatusOr<std::pair<std::int64_t, std::int64_t>> MemInfo() {
  std::size_t free = 0, total = 0;
  const cudaError_t error = cudaMemGetInfo(&free, &total);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemGetInfo: ", cudaGetErrorString(error)));
  }
  return std::make_pair(static_cast<std::int64_t>(free), static_cast<std::int64_t>(total));
}

}  // namespace

bool CudaInBuild() { return true; }

bool CudaGpuAvailable() {
  const absl::StatusOr<int> count = CudaDeviceCount();
  return count.ok() && *count > 0;
}

absl::StatusOr<SlideGpu> OpenCudaGpu() {
  if (!CudaGpuAvailable()) {
    return absl::FailedPreconditionError("--backend cuda: no CUDA device is visible");
  }
  SlideGpu gpu;
  PO_ASSIGN_OR_RETURN(gpu.backend, CreateCudaBackend({}));
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) gpu.name = prop.name;
  PO_ASSIGN_OR_RETURN(const auto info, MemInfo());
  gpu.free_bytes = info.first;
  gpu.total_bytes = info.second;
  const std::int64_t used_at_open = info.second - info.first;
  gpu.bytes_in_use = [used_at_open]() -> std::int64_t {
    const absl::StatusOr<std::pair<std::int64_t, std::int64_t>> now = MemInfo();
    if (!now.ok()) return -1;
    return now->second - now->first - used_at_open;
  };
  return gpu;
}

absl::StatusOr<std::unique_ptr<SlidingModel>> CreateCudaLlama(Backend& backend,
                                                              const LlamaConfig& config,
                                                              const TokenData& data,
                                                              const SlideModelOptions& options) {
  PO_ASSIGN_OR_RETURN(std::unique_ptr<cuda::LlamaCudaModel> model,
                      cuda::LlamaCudaModel::Create(backend, config, data, CudaOptions(options)));
  return std::unique_ptr<SlidingModel>(std::move(model));
}

absl::StatusOr<SlidingModelShape> PlanCudaLlamaShape(const LlamaConfig& config,
                                                     const SlideModelOptions& options) {
  return cuda::LlamaCudaModel::PlanShape(config, CudaOptions(options));
}

}  // namespace pipeoffload::llama
