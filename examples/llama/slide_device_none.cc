// slide_device.h in a build without CUDA: there is no GPU to train on.
#include "examples/llama/slide_device.h"

namespace pipeoffload::llama {
namespace {

absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "--backend cuda: this build has no CUDA (configure with nvcc available, PO_WITH_CUDA=ON)");
}

}  // namespace

bool CudaInBuild() { return false; }

bool CudaGpuAvailable() { return false; }
absl::StatusOr<SlideGpu> OpenCudaGpu() { return NoCuda(); }
absl::StatusOr<std::unique_ptr<SlidingModel>> CreateCudaLlama(Backend&, const LlamaConfig&,
                                                              const TokenData&,
                                                              const SlideModelOptions&) {
  return NoCuda();
}
absl::StatusOr<SlidingModelShape> PlanCudaLlamaShape(const LlamaConfig&, const SlideModelOptions&) {
  return NoCuda();
}

}  // namespace pipeoffload::llama
