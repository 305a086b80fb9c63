// The CUDA consumer of an installed pipeoffload, built when the package has its CUDA targets
// (pipeoffload_WITH_CUDA): links the CUDA backend, the optimizer-offload engine with its GPU
// Adam (optim_offload, optim_cuda), layer sliding and, with NCCL, the NCCL transport, and on a
// GPU runs the relay pipeline (relay_pipeline.h) on two CUDA backends of device 0. Without a usable GPU it prints why and exits 77, which the CTest
// test package_consumer_cuda (label gpu) reports as skipped.
#include <cstdio>
#include <memory>
#include <vector>

#include "pipeoffload/cuda.h"
#include "pipeoffload/layer_sliding.h"
#include "pipeoffload/optimizer_offload.h"
#include "relay_pipeline.h"

namespace {
constexpr int kNoGpuExitCode = 77;  // tests/CMakeLists.txt's SKIP_RETURN_CODE
}  // namespace

int main() {
  // Linked from the installed archives whether or not a GPU is here.
  using CreateOffload = decltype(&pipeoffload::OptimizerOffload::Create);
  using CreateSliding = decltype(&pipeoffload::LayerSlidingEngine::Create);
  volatile CreateOffload create_offload = &pipeoffload::OptimizerOffload::Create;
  volatile CreateSliding create_sliding = &pipeoffload::LayerSlidingEngine::Create;
  if (create_offload == nullptr || create_sliding == nullptr) return 1;
#ifdef PO_CONSUMER_WITH_NCCL
  auto local = pipeoffload::CreateLocalTransports(1);
  if (!local.ok()) return relay::Report("cuda_consumer", local.status().ToString());
  if (pipeoffload::NcclTransportDevice(*(*local)[0]).ok()) {
    return relay::Report("cuda_consumer", "NcclTransportDevice accepted a local transport");
  }
#endif

  absl::StatusOr<int> count = pipeoffload::CudaDeviceCount();
  if (!count.ok() || *count == 0) {
    std::fprintf(stderr, "cuda_consumer: SKIPPED: no usable GPU (%s)\n",
                 count.ok() ? "0 devices" : count.status().ToString().c_str());
    return kNoGpuExitCode;
  }
  std::vector<std::unique_ptr<pipeoffload::Backend>> owned;
  std::vector<pipeoffload::Backend*> backends;
  for (int d = 0; d < 2; ++d) {
    auto backend = pipeoffload::CreateCudaBackend({0});
    if (!backend.ok()) return relay::Report("cuda_consumer", backend.status().ToString());
    owned.push_back(std::move(*backend));
    backends.push_back(owned.back().get());
  }
  return relay::RunRelayPipeline("cuda_consumer", backends);
}
