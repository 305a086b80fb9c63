// The launchers of flash_attention_launch.h: grid shapes, dynamic shared memory and the head-dim
// dispatch of the kernels in flash_attention_kernels.cuh (instantiated here for hd 64 and 128).
#include <cuda_runtime.h>

#include "examples/common/cuda/flash_attention_kernels.cuh"
#include "examples/common/cuda/flash_attention_launch.h"

namespace pipeoffload::examples::cuda::internal {
namespace {

// Raises the kernel's dynamic shared memory limit past the default 48 KB and asks for the
// largest shared carveout (two forward blocks of 96 KB share one SM), then launches it.
template <typename Kernel>
cudaError_t Launch(Kernel kernel, dim3 grid, int threads, int smem_bytes, const FlashArgs& args,
                   cudaStream_t stream) {
  cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (error != cudaSuccess) return error;
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  if (error != cudaSuccess) return error;
  kernel<<<grid, threads, smem_bytes, stream>>>(args);
  return cudaGetLastError();
}

template <typename Tr>
cudaError_t Forward(const FlashArgs& args, cudaStream_t stream) {
  return Launch(flash::FlashForwardKernel<Tr>, Tr::Grid(args), Tr::kThreads,
                Tr::kSmemBytes, args, stream);
}

template <int kHeadDim>
cudaError_t ForwardVariant(const FlashArgs& args, int variant, cudaStream_t stream) {
  switch (variant) {
    case 0:
      return Forward<flash::ForwardTwoTiles<kHeadDim>>(args, stream);
    case 1:
      return Forward<flash::ForwardOneTile<kHeadDim>>(args, stream);
    case 2:
      return Forward<flash::ForwardOneTileWide<kHeadDim>>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <int kHeadDim>
cudaError_t BackwardDot(const FlashArgs& args, cudaStream_t stream) {
  flash::FlashBackwardDotKernel<kHeadDim>
      <<<flash::DotGrid<kHeadDim>(args), flash::kDotThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

template <int kHeadDim>
cudaError_t BackwardKV(const FlashArgs& args, cudaStream_t stream) {
  using Tr = flash::BackwardKVTraits<kHeadDim>;
  return Launch(flash::FlashBackwardKVKernel<kHeadDim>, Tr::Grid(args), Tr::kThreads,
                Tr::kSmemBytes, args, stream);
}

template <int kHeadDim>
cudaError_t BackwardQ(const FlashArgs& args, cudaStream_t stream) {
  using Tr = flash::BackwardQTraits<kHeadDim>;
  return Launch(flash::FlashBackwardQKernel<kHeadDim>, Tr::Grid(args), Tr::kThreads,
                Tr::kSmemBytes, args, stream);
}

}  // namespace

cudaError_t LaunchFlashForward(const FlashArgs& args, cudaStream_t stream) {
  return LaunchFlashForwardVariant(args, kFlashForwardDefaultVariant, stream);
}

cudaError_t LaunchFlashForwardVariant(const FlashArgs& args, int variant, cudaStream_t stream) {
  return args.hd == 64 ? ForwardVariant<64>(args, variant, stream)
                       : ForwardVariant<128>(args, variant, stream);
}

cudaError_t LaunchFlashBackwardDot(const FlashArgs& args, cudaStream_t stream) {
  return args.hd == 64 ? BackwardDot<64>(args, stream) : BackwardDot<128>(args, stream);
}

cudaError_t LaunchFlashBackwardKV(const FlashArgs& args, cudaStream_t stream) {
  return args.hd == 64 ? BackwardKV<64>(args, stream) : BackwardKV<128>(args, stream);
}

cudaError_t LaunchFlashBackwardQ(const FlashArgs& args, cudaStream_t stream) {
  return args.hd == 64 ? BackwardQ<64>(args, stream) : BackwardQ<128>(args, stream);
}

}  // namespace pipeoffload::examples::cuda::internal
