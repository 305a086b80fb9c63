// po_stage's job (rank_transport.h). MPI code is compiled only when the library links the MPI
// transport (PO_C_API_WITH_MPI), NCCL code only with the NCCL transport (PO_C_API_WITH_NCCL);
// lib/c_api/CMakeLists.txt sets them.
#include "lib/c_api/rank_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

#ifdef PO_C_API_WITH_NCCL
#include "pipeoffload/cuda.h"
#endif

namespace pipeoffload::c_api {
namespace {

absl::Status CheckBackend(const po_pipeline_options& options, std::int32_t wanted,
                          const char* transport, const char* why) {
  if (options.backend == wanted) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      transport, " needs po_pipeline_options.backend = ",
      wanted == PO_BACKEND_CPU ? "PO_BACKEND_CPU" : "PO_BACKEND_CUDA", " (got ", options.backend,
      "): ", why));
}

absl::StatusOr<std::unique_ptr<RankGroup>> JoinGroup(const po_pipeline_options& options) {
#ifdef PO_C_API_WITH_MPI
  // A rank whose callback failed meets the others after each iteration at once, while they
  // may still wait for its messages for up to wait_timeout_seconds: the group waits longer.
  return CreateMpiRankGroup(2 * options.wait_timeout_seconds + 10);
#else
  (void)options;
  return absl::UnimplementedError(
      "this libpipeoffload_c was built without MPI (install Open MPI's development files and "
      "reconfigure), so a stage cannot join a job of several processes");
#endif
}

}  // namespace

absl::StatusOr<RankJob> JoinRankJob(std::int32_t transport, const po_pipeline_options& options,
                                    int max_chunks) {
  (void)max_chunks;  // only the MPI transport's tags need it
  if (transport != PO_TRANSPORT_MPI && transport != PO_TRANSPORT_NCCL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown transport ", transport, "; expected PO_TRANSPORT_MPI (0) or PO_TRANSPORT_NCCL (1)"));
  }
  if (transport == PO_TRANSPORT_MPI) {
    PO_RETURN_IF_ERROR(CheckBackend(
        options, PO_BACKEND_CPU, "PO_TRANSPORT_MPI",
        "MPI carries host buffers (the Open MPI here is not CUDA-aware); GPUs talk through "
        "PO_TRANSPORT_NCCL"));
    if (options.cuda_device != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "po_pipeline_options.cuda_device is ", options.cuda_device,
          ", but PO_TRANSPORT_MPI runs on the CPU backend (leave it 0)"));
    }
  } else {
    PO_RETURN_IF_ERROR(CheckBackend(options, PO_BACKEND_CUDA, "PO_TRANSPORT_NCCL",
                                    "NCCL moves device memory between GPUs"));
  }
  RankJob job;
  PO_ASSIGN_OR_RETURN(job.group, JoinGroup(options));
  if (transport == PO_TRANSPORT_MPI) {
#ifdef PO_C_API_WITH_MPI
    MpiTransportOptions mpi;
    mpi.max_chunks = max_chunks;
    PO_ASSIGN_OR_RETURN(job.transport, CreateMpiTransport(mpi));
#endif
    return job;
  }
#ifdef PO_C_API_WITH_NCCL
  NcclTransportOptions nccl;
  nccl.device = options.cuda_device;  // -1: the local index, NcclTransportOptions' rule
  nccl.init_timeout_seconds = options.wait_timeout_seconds;
  nccl.enqueue_timeout_seconds = options.wait_timeout_seconds;
  PO_ASSIGN_OR_RETURN(job.transport, CreateNcclTransport(nccl));
  PO_ASSIGN_OR_RETURN(const int device, NcclTransportDevice(*job.transport));
  PO_ASSIGN_OR_RETURN(job.backend, CreateCudaBackend(CudaBackendOptions{device}));
  return job;
#else
  return absl::UnimplementedError(
      "PO_TRANSPORT_NCCL: this libpipeoffload_c was built without the NCCL transport "
      "(configure with -DPO_WITH_CUDA=ON where NCCL and MPI are found)");
#endif
}

}  // namespace pipeoffload::c_api
