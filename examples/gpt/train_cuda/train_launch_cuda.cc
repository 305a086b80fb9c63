// The CUDA launchers of gpt_train (see train_stage_cuda.h): devices, backends and transports
// for the two layouts. NCCL parts only where po_transport_nccl is built
// (PO_GPT_TRAIN_WITH_NCCL).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/gpt/train_cuda/train_stage_cuda.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda.h"

namespace pipeoffload::gpt {
namespace {

// The launcher's local rank and ranks per host, or -1 where the launcher does not say.
int LocalEnv(const char* const* names) {
  for (const char* const* name = names; *name != nullptr; ++name) {
    if (const char* value = std::getenv(*name)) return std::atoi(value);
  }
  return -1;
}
int LocalRank() {
  static const char* const kNames[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", nullptr};
  return LocalEnv(kNames);
}
int LocalSize() {
  static const char* const kNames[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                       "MV2_COMM_WORLD_LOCAL_SIZE", nullptr};
  return LocalEnv(kNames);
}

// This rank's reason it cannot have a GPU of its own, or OK.
absl::Status CheckOwnGpu() {
  PO_ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (count == 0) return CheckCudaDevices(1, "--backend cuda");
  const int local_rank = LocalRank();
  if (local_rank >= count) {
    const int local_size = LocalSize();
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend cuda --transport mpi runs one rank per GPU, but local rank ", local_rank,
        " has none of its own: this host runs ",
        local_size > 0 ? absl::StrCat(local_size) : std::string("more"), " ranks and has ", count,
        " visible CUDA device(s) (NCCL cannot put two ranks on one GPU); start at most ", count,
        " ranks per host"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCudaDevices(int needed, const char* what) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return Annotate(count.status(), absl::StrCat(what, ": counting CUDA devices"));
  if (*count >= needed) return absl::OkStatus();
  std::string why = *count == 0 ? "no usable GPU: no NVIDIA driver, no GPU, or "
                                  "CUDA_VISIBLE_DEVICES hides them"
                                : "";
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    absl::StrAppend(&why, why.empty() ? "" : "; ", "CUDA_VISIBLE_DEVICES='", visible, "'");
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, " needs ", needed, " GPU(s), but CUDA sees ", *count,
                   why.empty() ? "" : absl::StrCat(" (", why, ")"),
                   *count == 0 ? "; use --backend cpu on this machine" : ""));
}

absl::StatusOr<CudaLocalRig> CreateCudaLocalRig(int num_stages, double timeout_seconds) {
  PO_RETURN_IF_ERROR(CheckCudaDevices(1, "--backend cuda --transport local"));
  if (num_stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("need at least one stage, got ", num_stages));
  }
  CudaLocalRig rig;
  std::vector<Backend*> backends;
  for (int d = 0; d < num_stages; ++d) {
    CudaBackendOptions backend_options;
    backend_options.device = 0;  // every stage on one GPU, each with its own streams
    PO_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCudaBackend(backend_options));
    backends.push_back(backend.get());
    rig.backends.push_back(std::move(backend));
  }
  PO_ASSIGN_OR_RETURN(rig.transports, CreateLocalTransports(backends, timeout_seconds));
  return rig;
}

absl::StatusOr<CudaMpiRank> CreateCudaMpiRank(RankGroup& group, const TrainOptions& options) {
  // Agree before NCCL: a rank without a GPU would leave the others waiting in its bootstrap.
  PO_RETURN_IF_ERROR(AllGatherChecked(group, CheckOwnGpu(), "", "setup (GPUs)").status());
#ifdef PO_GPT_TRAIN_WITH_NCCL
  NcclTransportOptions nccl;
  nccl.device = -1;  // the local rank's GPU
  nccl.init_timeout_seconds = std::max(120.0, options.watchdog_seconds);
  nccl.enqueue_timeout_seconds = options.watchdog_seconds;
  CudaMpiRank rank;
  PO_ASSIGN_OR_RETURN(rank.transport, CreateNcclTransport(nccl));
  PO_ASSIGN_OR_RETURN(const int device, NcclTransportDevice(*rank.transport));
  CudaBackendOptions backend_options;
  backend_options.device = device;
  PO_ASSIGN_OR_RETURN(rank.backend, CreateCudaBackend(backend_options));
  return rank;
#else
  static_cast<void>(options);
  return absl::UnimplementedError(
      "--backend cuda --transport mpi needs the NCCL transport, and this gpt_train was built "
      "without it (NCCL or MPI not found at configure time); use --transport local");
#endif
}

}  // namespace pipeoffload::gpt
