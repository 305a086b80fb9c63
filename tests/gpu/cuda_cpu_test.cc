// What the CUDA backend and the NCCL transport promise on any machine, GPU or not (label cpu):
// a missing GPU or driver is a clean FailedPrecondition, never a crash; accessors refuse other
// backends; options are checked before anything starts; CUDA and NCCL errors map to the right
// Status codes; and the bounded poll behind every wait keeps its deadline.
// Run alone with `cuda_cpu_tests "[cuda_cpu]"`.
#include <chrono>
#include <string>

#include "lib/backend/cuda/cuda_status.h"
#include "lib/backend/cuda/sm_copy_kernel.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/cuda.h"
#include "pipeoffload/cuda_stream.h"
#include "pipeoffload/transport.h"
#include "tests/testing/catch.h"

#ifdef PO_HAVE_NCCL_TRANSPORT
#include "lib/transport/nccl/nccl_status.h"
#endif

namespace pipeoffload {
namespace {

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("the CUDA backend starts on a GPU and fails cleanly without one", "[cuda_cpu]") {
  const absl::StatusOr<int> count = CudaDeviceCount();
  INFO(count.status().ToString());
  REQUIRE(count.ok());
  if (*count == 0) {
    const absl::Status status = CreateCudaBackend().status();
    INFO(status.ToString());
    CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(status, "no usable CUDA device"));
  } else {
    CHECK(CreateCudaBackend().ok());
    const absl::Status missing = CreateCudaBackend({*count}).status();
    CHECK(missing.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(missing, "visible"));
  }
  CHECK(CreateCudaBackend({-1}).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("stream accessors refuse backends that are not CUDA backends", "[cuda_cpu]") {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateCpuBackend();
  REQUIRE(cpu.ok());
  CHECK(CudaComputeStream(**cpu).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CudaQueueStream((*cpu)->queue(QueueKind::kH2D)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const absl::Status device = CudaBackendDevice(**cpu).status();
  CHECK(device.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(device, "cpu"));
}

TEST_CASE("CUDA errors become ResourceExhausted or Internal, naming the call", "[cuda_cpu]") {
  const absl::Status oom = internal::CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)",
                                                "file.cc", 12);
  CHECK(oom.code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(oom, "cudaMalloc(&p, n) failed"));
  CHECK(Contains(oom, "cudaErrorMemoryAllocation"));
  CHECK(Contains(oom, "file.cc:12"));
  const absl::Status other =
      internal::CudaStatus(cudaErrorInvalidValue, "cudaMemcpyAsync(...)", "file.cc", 3);
  CHECK(other.code() == absl::StatusCode::kInternal);
  CHECK(Contains(other, "cudaErrorInvalidValue"));
}

TEST_CASE("LaunchSmCopy refuses sizes it is not for before touching the device", "[cuda_cpu]") {
  alignas(4) char buffer[8] = {};
  CHECK(internal::LaunchSmCopy(buffer, buffer, 6, nullptr) == cudaErrorInvalidValue);
  CHECK(internal::LaunchSmCopy(buffer, buffer, -4, nullptr) == cudaErrorInvalidValue);
  CHECK(internal::LaunchSmCopy(buffer, buffer, internal::kMaxSmCopyBytes + 4, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(internal::LaunchSmCopy(buffer, buffer, 0, nullptr) == cudaSuccess);  // nothing to do
}

TEST_CASE("PollUntil keeps its deadline and passes errors through", "[cuda_cpu]") {
  int calls = 0;
  absl::StatusOr<bool> ready = internal::PollUntil(
      [&]() -> absl::StatusOr<bool> { return ++calls == 3; }, 10.0);
  CHECK(ready.ok());
  CHECK(*ready);
  CHECK(calls == 3);

  calls = 0;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<bool> never = internal::PollUntil(
      [&]() -> absl::StatusOr<bool> {
        ++calls;
        return false;
      },
      0.05);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(never.ok());
  CHECK_FALSE(*never);
  CHECK(waited >= 0.05);
  CHECK(waited < 5.0);
  CHECK(calls > 1);

  calls = 0;
  absl::StatusOr<bool> once = internal::PollUntil(
      [&]() -> absl::StatusOr<bool> {
        ++calls;
        return false;
      },
      0.0);
  CHECK_FALSE(*once);
  CHECK(calls == 1);  // a zero timeout still looks once

  absl::StatusOr<bool> failed = internal::PollUntil(
      []() -> absl::StatusOr<bool> { return absl::InternalError("boom"); }, 10.0);
  CHECK(failed.status().code() == absl::StatusCode::kInternal);
}

#ifdef PO_HAVE_NCCL_TRANSPORT
TEST_CASE("NCCL transport options are checked before MPI or NCCL start", "[cuda_cpu][nccl]") {
  auto code = [](auto edit) {
    NcclTransportOptions options;
    edit(options);
    const absl::Status status = CreateNcclTransport(options).status();
    INFO(status.ToString());
    return status.code();
  };
  CHECK(code([](NcclTransportOptions& o) { o.device = -2; }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code([](NcclTransportOptions& o) { o.init_timeout_seconds = 0; }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code([](NcclTransportOptions& o) { o.enqueue_timeout_seconds = -1; }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(code([](NcclTransportOptions& o) { o.max_pending_messages = 0; }) ==
        absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> local = CreateLocalTransports(1);
  REQUIRE(local.ok());
  CHECK(NcclTransportDevice(*(*local)[0]).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("NCCL errors become InvalidArgument, Unavailable or Internal", "[cuda_cpu][nccl]") {
  const absl::Status usage = internal::NcclStatus(ncclInvalidUsage, "nccl transport rank 1",
                                                  "ncclSend");
  CHECK(usage.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(usage, "nccl transport rank 1: ncclSend failed"));
  CHECK(internal::NcclStatus(ncclInvalidArgument, "w", "c").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(internal::NcclStatus(ncclRemoteError, "w", "c").code() ==
        absl::StatusCode::kUnavailable);
  CHECK(internal::NcclStatus(ncclSystemError, "w", "c").code() ==
        absl::StatusCode::kUnavailable);
  CHECK(internal::NcclStatus(ncclUnhandledCudaError, "w", "c").code() ==
        absl::StatusCode::kInternal);
  CHECK(internal::NcclStatus(ncclInternalError, "w", "c").code() ==
        absl::StatusCode::kInternal);
}
#endif  // PO_HAVE_NCCL_TRANSPORT

}  // namespace
}  // namespace pipeoffload
