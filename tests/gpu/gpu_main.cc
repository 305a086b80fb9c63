// Main of the GPU test binaries (and of the Catch-based GPU benchmarks, bench/cuda): without a
// usable GPU it prints why and exits with PO_NO_GPU_EXIT_CODE, which CTest's SKIP_RETURN_CODE
// turns into "skipped" (Catch2 v2 has no SKIP). Catch's queries that run no case (--help, -h,
// -?, --list-*, -l) answer without a GPU too, so `gpt_cuda_perf_bench --help` works anywhere. With PO_GPU_TESTS_WITH_MPI it also owns MPI for the whole run, so the NCCL transports
// the tests create one after another never finalize it (MPI cannot be initialized twice).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string_view>

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

namespace {

// Catch's help and listing options: they print and exit without running a case.
bool RunsNoCase(int argc, char* argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-?" || arg == "-l" ||
        arg.rfind("--list", 0) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char* argv[]) {
  if (RunsNoCase(argc, argv)) return Catch::Session().run(argc, argv);
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
