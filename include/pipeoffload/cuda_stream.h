// The raw CUDA streams behind a CUDA backend's queues, for trainers whose StageModel launches
// kernels (a CUDA StageModel launches on the compute stream, so the executor's events order its
// work with the copies). This header includes the CUDA runtime API; cuda.h does not.
#ifndef PIPEOFFLOAD_CUDA_STREAM_H_
#define PIPEOFFLOAD_CUDA_STREAM_H_

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"

namespace pipeoffload {

// The stream of `queue` (any lane, CreateQueue's included). It stays valid as long as the
// backend; do not destroy it, and do not synchronize the device or the legacy default stream
// from work meant to overlap (the streams are non-blocking, so the default stream does not
// order them). Errors: InvalidArgument when the queue's backend is not a CUDA backend or has
// no such lane.
[[nodiscard]] absl::StatusOr<cudaStream_t> CudaQueueStream(const Queue& queue);

// CudaQueueStream(backend.queue(QueueKind::kCompute)).
[[nodiscard]] absl::StatusOr<cudaStream_t> CudaComputeStream(const Backend& backend);

// The CUDA ordinal of a CUDA backend. Errors: InvalidArgument for other backends.
[[nodiscard]] absl::StatusOr<int> CudaBackendDevice(const Backend& backend);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_CUDA_STREAM_H_
