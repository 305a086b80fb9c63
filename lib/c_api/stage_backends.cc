// The backends a po_pipeline runs on (po_pipeline_options.backend) and the compute queue each
// stage's callbacks get as an integer (po_compute_args.stream). CUDA code is compiled only when
// the library is built with the CUDA backend (PO_C_API_WITH_CUDA, lib/c_api/CMakeLists.txt).
#include "lib/c_api/stage_backends.h"

#include "absl/strings/str_cat.h"

#ifdef PO_C_API_WITH_CUDA
#include "pipeoffload/cuda.h"
#include "pipeoffload/cuda_stream.h"
#endif

namespace pipeoffload::c_api {

absl::StatusOr<std::vector<std::unique_ptr<Backend>>> CreateStageBackends(
    std::int32_t kind, std::int32_t cuda_device, int num_stages) {
  std::vector<std::unique_ptr<Backend>> backends;
  switch (kind) {
    case PO_BACKEND_CPU:
      return backends;  // LocalPipeline gives each stage a CPU backend of its own
    case PO_BACKEND_CUDA:
#ifdef PO_C_API_WITH_CUDA
      for (int d = 0; d < num_stages; ++d) {
        absl::StatusOr<std::unique_ptr<Backend>> backend =
            CreateCudaBackend(CudaBackendOptions{cuda_device});
        if (!backend.ok()) return backend.status();
        backends.push_back(*std::move(backend));
      }
      return backends;
#else
      (void)cuda_device;
      (void)num_stages;
      return absl::UnimplementedError(
          "po_pipeline_options.backend is PO_BACKEND_CUDA, but this libpipeoffload_c was built "
          "without CUDA (configure with -DPO_WITH_CUDA=ON where nvcc is found)");
#endif
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "po_pipeline_options.backend: unknown backend ", kind,
          "; expected PO_BACKEND_CPU (0) or PO_BACKEND_CUDA (1)"));
  }
}

absl::StatusOr<std::uint64_t> ComputeStreamHandle(const Backend* backend) {
  if (backend == nullptr) return 0;  // a CPU backend: callbacks compute on their own thread
#ifdef PO_C_API_WITH_CUDA
  absl::StatusOr<cudaStream_t> stream = CudaComputeStream(*backend);
  if (!stream.ok()) return stream.status();
  return reinterpret_cast<std::uint64_t>(*stream);
#else
  return absl::InternalError(absl::StrCat("backend ", backend->Name(),
                                          " given to a library built without CUDA"));
#endif
}

}  // namespace pipeoffload::c_api
