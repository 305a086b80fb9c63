// FillWordsKernel and its launcher (fill_kernel.h).
#include "lib/backend/cuda/fill_kernel.h"

#include <algorithm>

namespace pipeoffload::internal {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill every SM of an H200 (132) several times; a grid-stride loop covers the
// rest, so huge fills do not need huge grids.
constexpr std::int64_t kMaxBlocks = 4096;

__global__ void FillWordsKernel(std::uint32_t* words, std::uint32_t pattern,
                                std::int64_t num_words) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < num_words; i += stride) {
    words[i] = pattern;
  }
}

}  // namespace

cudaError_t LaunchFillWords(std::uint32_t* words, std::uint32_t pattern, std::int64_t num_words,
                            cudaStream_t stream) {
  if (num_words <= 0) return cudaSuccess;
  const std::int64_t blocks = std::min(kMaxBlocks, (num_words + kThreads - 1) / kThreads);
  FillWordsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(words, pattern,
                                                                          num_words);
  return cudaGetLastError();
}

}  // namespace pipeoffload::internal
