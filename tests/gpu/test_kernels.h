// Small kernels for the GPU tests: a spin that keeps a stream busy for a set time (so a missing
// event wait shows up as wrong data, the GPU twin of the CPU backend's injected delays), and the
// toy model's elementwise forward and backward.
#ifndef PIPEOFFLOAD_TESTS_GPU_TEST_KERNELS_H_
#define PIPEOFFLOAD_TESTS_GPU_TEST_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::testing {

// Enqueues one thread that busy-waits `seconds` on the GPU's global timer.
cudaError_t LaunchSpin(cudaStream_t stream, double seconds);

// y[i] = fma(a[i], x[i], b[i]), i < n, rounded exactly as std::fmaf. (n) fp32 each
cudaError_t LaunchAffineForward(const float* x, const float* a, const float* b, float* y,
                                std::int64_t n, cudaStream_t stream);

// gx[i] = a[i] * gy[i] (when gx is not null); ga[i] = fma(gy[i], x[i], ga[i]);
// gb[i] += gy[i]. Every operation rounds once, so a CPU loop with std::fmaf matches bitwise.
cudaError_t LaunchAffineBackward(const float* x, const float* gy, const float* a, float* gx,
                                 float* ga, float* gb, std::int64_t n, cudaStream_t stream);

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_GPU_TEST_KERNELS_H_
