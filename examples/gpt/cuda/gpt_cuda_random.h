// Deterministic fills of device memory for the layer stack (gpt_layer_stack.h): parameters,
// the fixed input and the fixed output gradient of a benchmark, drawn on the GPU because a host
// draw of h = 8192 layers (805 M parameters each) would take longer than the benchmark.
// Free of Abseil (a .cu file implements them): launchers return the launch's cudaError_t.
//
// Element i of a normal fill depends only on (seed, i): a counter-based hash (SplitMix64's
// finalizer) gives two uniforms, Box-Muller turns them into a standard normal, times `stddev`,
// rounded to bf16. Not the CPU model's stream (examples/gpt/rng.h): the full GPT initializes
// from the CPU model's values instead (gpt_cuda_params.h).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_RANDOM_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_RANDOM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipeoffload::gpt::cuda {

// out[i] = bf16(stddev * normal(seed, i)) for i < n. n >= 0.
cudaError_t LaunchFillNormalBf16(__nv_bfloat16* out, std::int64_t n, float stddev,
                                 std::uint64_t seed, cudaStream_t stream);
// out[i] = bf16(value) for i < n.
cudaError_t LaunchFillConstantBf16(__nv_bfloat16* out, std::int64_t n, float value,
                                   cudaStream_t stream);

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_CUDA_RANDOM_H_
