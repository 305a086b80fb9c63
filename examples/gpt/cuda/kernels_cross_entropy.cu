// The softmax cross-entropy over the vocabulary, forward and backward.
//
// Every row is one block; its maximum and sum are deterministic block reductions
// (kernels_device.cuh). The backward recomputes the probabilities as exp(x - lse) from the
// forward's log-sum-exp.
#include "examples/gpt/cuda/kernels_device.cuh"
#include "examples/gpt/cuda/kernels_launch.h"

namespace pipeoffload::gpt::cuda::internal {
namespace {

constexpr int kThreads = 256;

// lse[n] = log sum_v exp(logits[n, v]); losses[n] = lse[n] - logits[n, targets[n]]. Grid: N.
// Packs as in kernels_device.cuh's LoadPack: the same bits whether or not the row is aligned.
template <bool kAligned>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const __nv_bfloat16* logits,
                                          const std::int32_t* targets, int V) {
  const std::int64_t n = blockIdx.x;
  const __nv_bfloat16* z = logits + n * V;
  const int first = threadIdx.x * kPack;
  constexpr int kStep = kThreads * kPack;
  float max_logit = -INFINITY;
  for (int v = first; v < V; v += kStep) {
    float x[kPack];
    const int count = LoadPack<kAligned>(z, v, V, x);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) max_logit = fmaxf(max_logit, x[k]);
    }
  }
  max_logit = BlockMax(max_logit);
  float sum = 0.0f;
  for (int v = first; v < V; v += kStep) {
    float x[kPack];
    const int count = LoadPack<kAligned>(z, v, V, x);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      if (k < count) sum = __fadd_rn(sum, expf(x[k] - max_logit));
    }
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0) {
    const float row_lse = max_logit + logf(sum);
    const std::int32_t target = targets[n];
    lse[n] = row_lse;
    // A target outside the vocabulary poisons its loss rather than reading out of bounds.
    losses[n] = (target >= 0 && target < V) ? row_lse - __bfloat162float(z[target]) : NAN;
  }
}

// dlogits[n, v] = (exp(logits[n, v] - lse[n]) - [v == target]) * dloss. Grid: N.
template <bool kAligned>
__global__ void CrossEntropyBackwardKernel(__nv_bfloat16* dlogits, const __nv_bfloat16* logits,
                                           const float* lse, const std::int32_t* targets,
                                           float dloss, int V) {
  const std::int64_t n = blockIdx.x;
  const float row_lse = lse[n];
  const std::int32_t target = targets[n];
  for (int v = threadIdx.x * kPack; v < V; v += kThreads * kPack) {
    float x[kPack];
    LoadPack<kAligned>(logits + n * V, v, V, x);
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float onehot = (v + k == target) ? 1.0f : 0.0f;
      x[k] = (expf(x[k] - row_lse) - onehot) * dloss;
    }
    StorePack<kAligned>(dlogits + n * V, v, V, x);
  }
}

}  // namespace

cudaError_t LaunchCrossEntropyForward(float* losses, float* lse, const bf16* logits,
                                      const std::int32_t* targets, int N, int V,
                                      cudaStream_t stream) {
  if (CanPack(V, logits)) {
    CrossEntropyForwardKernel<true><<<N, kThreads, 0, stream>>>(losses, lse, logits, targets, V);
  } else {
    CrossEntropyForwardKernel<false><<<N, kThreads, 0, stream>>>(losses, lse, logits, targets, V);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyBackward(bf16* dlogits, const bf16* logits, const float* lse,
                                       const std::int32_t* targets, float dloss, int N, int V,
                                       cudaStream_t stream) {
  if (CanPack(V, dlogits, logits)) {
    CrossEntropyBackwardKernel<true>
        <<<N, kThreads, 0, stream>>>(dlogits, logits, lse, targets, dloss, V);
  } else {
    CrossEntropyBackwardKernel<false>
        <<<N, kThreads, 0, stream>>>(dlogits, logits, lse, targets, dloss, V);
  }
  return cudaGetLastError();
}

}  // namespace pipeoffload::gpt::cuda::internal
