// The backends of a po_pipeline and the stream integers its callbacks get (c_api.h,
// "Buffers and streams"). The only place of the C ABI that knows about CUDA.
#ifndef PIPEOFFLOAD_LIB_C_API_STAGE_BACKENDS_H_
#define PIPEOFFLOAD_LIB_C_API_STAGE_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/c_api.h"

namespace pipeoffload::c_api {

// The backends for `num_stages` stages of `kind` (PO_BACKEND_*): none for the CPU (the
// pipeline then gives every stage a CPU backend of its own), one CUDA backend per stage on
// `cuda_device` for CUDA. Errors: InvalidArgument for an unknown kind; Unimplemented for CUDA in
// a build without it; CreateCudaBackend's.
[[nodiscard]] absl::StatusOr<std::vector<std::unique_ptr<Backend>>> CreateStageBackends(
    std::int32_t kind, std::int32_t cuda_device, int num_stages);

// po_compute_args.stream for a stage on `backend`: 0 for null (a CPU backend of the stage's
// own), the compute stream's cudaStream_t for a CUDA backend.
[[nodiscard]] absl::StatusOr<std::uint64_t> ComputeStreamHandle(const Backend* backend);

}  // namespace pipeoffload::c_api

#endif  // PIPEOFFLOAD_LIB_C_API_STAGE_BACKENDS_H_
