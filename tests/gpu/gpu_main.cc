// Main of the GPU test binaries: without a usable GPU it prints why and exits with
// PO_NO_GPU_EXIT_CODE, which CTest's SKIP_RETURN_CODE turns into "skipped" (Catch2 v2 has no
// SKIP). With PO_GPU_TESTS_WITH_MPI it also owns MPI for the whole run, so the NCCL transports
// the tests create one after another never finalize it (MPI cannot be initialized twice).
#include <cuda_runtime_api.h>

#include <cstdio>

#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#ifdef PO_GPU_TESTS_WITH_MPI
#include <mpi.h>
#endif

#ifndef PO_NO_GPU_EXIT_CODE
#error "PO_NO_GPU_EXIT_CODE must be defined by the build (tests/gpu/CMakeLists.txt)"
#endif

int main(int argc, char* argv[]) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    std::fprintf(stderr, "%s: SKIPPED: no usable GPU (cudaGetDeviceCount: %s, %d devices)\n",
                 argv[0], error == cudaSuccess ? "ok" : cudaGetErrorString(error), count);
    return PO_NO_GPU_EXIT_CODE;
  }
#ifdef PO_GPU_TESTS_WITH_MPI
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "%s: MPI_Init_thread failed\n", argv[0]);
    return 1;
  }
#endif
  const int result = Catch::Session().run(argc, argv);
#ifdef PO_GPU_TESTS_WITH_MPI
  MPI_Finalize();
#endif
  return result;
}
