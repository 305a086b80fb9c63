// The optimizer-offload engine suite (tests/optim/optimizer_offload_test.cc) on the GPU: its
// backend is a CUDA backend of device 0 (offload_engine_backend.h), so the engine's kernels,
// its four streams and its pinned memory are what the bit-for-bit checks see. Without a GPU the
// binary exits 77 (gpu_main.cc) before any of this runs. Tags: [offload][engine].
#include "tests/gpu/gpu_test_util.h"
#include "tests/optim/offload_engine_backend.h"

namespace pipeoffload::testing {

std::string EngineBackendKind() { return "cuda"; }

// No injected delays on CUDA: the streams' own concurrency is the test.
std::unique_ptr<Backend> NewEngineBackend(std::uint64_t /*seed*/) { return NewCudaBackend(0); }

}  // namespace pipeoffload::testing
