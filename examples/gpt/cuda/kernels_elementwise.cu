// Elementwise kernels: GELU forward and backward, the residual add, fp32 <-> bf16. Grid-stride
// loops over packs of kPack elements (128-bit loads) when every pointer is 16-byte aligned, over
// single elements otherwise; the thread whose pack index lands on the ragged end does the tail.
// Each output element depends on its own inputs only, so aliasing an output with an input of the
// same element (GeluBackward's dinp = dout, Add's out = a) is safe.
#include "examples/gpt/cuda/kernels_device.cuh"
#include "examples/gpt/cuda/kernels_launch.h"

namespace pipeoffload::gpt::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// The GELU arithmetic of the CPU reference (kernels_cpu.cc) in the same order, rounded
// explicitly (__f*_rn): no multiply-add contraction, so the packed and the scalar kernels (and
// the CPU, up to expf) compute the same bits. 0.5 * (1 + tanh(u)) is 1 / (1 + exp(-2u)).
__device__ __forceinline__ float HalfOnePlusTanh(float u) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(__fmul_rn(-2.0f, u))));
}

// sqrt(2/pi) (x + 0.044715 x^3).
__device__ __forceinline__ float GeluArgument(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  return __fmul_rn(kGeluScale, __fadd_rn(x, cube));
}

struct GeluForwardOp {
  __device__ float operator()(float x) const {
    return __fmul_rn(x, HalfOnePlusTanh(GeluArgument(x)));
  }
};

struct GeluBackwardOp {
  // d/dx: s + x * 2 s (1 - s) * sqrt(2/pi) * (1 + 3 * 0.044715 x^2), with s = 0.5 (1 + tanh u).
  __device__ float operator()(float x, float dy) const {
    const float s = HalfOnePlusTanh(GeluArgument(x));
    const float sech2 = __fmul_rn(__fmul_rn(2.0f, s), __fsub_rn(1.0f, s));
    const float slope = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * kGeluCubic, x), x));
    const float local = __fadd_rn(s, __fmul_rn(__fmul_rn(__fmul_rn(x, sech2), kGeluScale), slope));
    return __fmul_rn(local, dy);
  }
};

struct AddOp {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};

// out[i] = op(a[i]) over bf16.
template <int kVec, typename Op>
__global__ void UnaryKernel(__nv_bfloat16* out, const __nv_bfloat16* a, std::int64_t n, Op op) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x * kVec;
  std::int64_t i = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVec;
  for (; i + kVec <= n; i += stride) {
    float x[kVec];
    LoadBf16<kVec>(a + i, x);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = op(x[k]);
    StoreBf16<kVec>(out + i, x);
  }
  for (; i < n; ++i) out[i] = __float2bfloat16_rn(op(__bfloat162float(a[i])));
}

// out[i] = op(a[i], b[i]) over bf16.
template <int kVec, typename Op>
__global__ void BinaryKernel(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b,
                             std::int64_t n, Op op) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x * kVec;
  std::int64_t i = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVec;
  for (; i + kVec <= n; i += stride) {
    float x[kVec];
    float y[kVec];
    LoadBf16<kVec>(a + i, x);
    LoadBf16<kVec>(b + i, y);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = op(x[k], y[k]);
    StoreBf16<kVec>(out + i, x);
  }
  for (; i < n; ++i) {
    out[i] = __float2bfloat16_rn(op(__bfloat162float(a[i]), __bfloat162float(b[i])));
  }
}

template <int kVec>
__global__ void Fp32ToBf16Kernel(__nv_bfloat16* out, const float* in, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x * kVec;
  std::int64_t i = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVec;
  for (; i + kVec <= n; i += stride) {
    float x[kVec];
    LoadF32<kVec>(in + i, x);
    StoreBf16<kVec>(out + i, x);
  }
  for (; i < n; ++i) out[i] = __float2bfloat16_rn(in[i]);
}

template <int kVec>
__global__ void Bf16ToFp32Kernel(float* out, const __nv_bfloat16* in, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x * kVec;
  std::int64_t i = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVec;
  for (; i + kVec <= n; i += stride) {
    float x[kVec];
    LoadBf16<kVec>(in + i, x);
    StoreF32<kVec>(out + i, x);
  }
  for (; i < n; ++i) out[i] = __bfloat162float(in[i]);
}

template <typename Op>
cudaError_t LaunchUnary(bf16* out, const bf16* a, std::int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (CanPack(0, out, a)) {
    UnaryKernel<kPack>
        <<<GridFor((n + kPack - 1) / kPack, kThreads), kThreads, 0, stream>>>(out, a, n, op);
  } else {
    UnaryKernel<1><<<GridFor(n, kThreads), kThreads, 0, stream>>>(out, a, n, op);
  }
  return cudaGetLastError();
}

template <typename Op>
cudaError_t LaunchBinary(bf16* out, const bf16* a, const bf16* b, std::int64_t n, Op op,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (CanPack(0, out, a, b)) {
    BinaryKernel<kPack>
        <<<GridFor((n + kPack - 1) / kPack, kThreads), kThreads, 0, stream>>>(out, a, b, n, op);
  } else {
    BinaryKernel<1><<<GridFor(n, kThreads), kThreads, 0, stream>>>(out, a, b, n, op);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGeluForward(bf16* out, const bf16* inp, std::int64_t n, cudaStream_t stream) {
  return LaunchUnary(out, inp, n, GeluForwardOp{}, stream);
}

cudaError_t LaunchGeluBackward(bf16* dinp, const bf16* inp, const bf16* dout, std::int64_t n,
                               cudaStream_t stream) {
  return LaunchBinary(dinp, inp, dout, n, GeluBackwardOp{}, stream);
}

cudaError_t LaunchAdd(bf16* out, const bf16* a, const bf16* b, std::int64_t n,
                      cudaStream_t stream) {
  return LaunchBinary(out, a, b, n, AddOp{}, stream);
}

cudaError_t LaunchFp32ToBf16(bf16* out, const float* in, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (CanPack(0, out, in)) {
    Fp32ToBf16Kernel<kPack>
        <<<GridFor((n + kPack - 1) / kPack, kThreads), kThreads, 0, stream>>>(out, in, n);
  } else {
    Fp32ToBf16Kernel<1><<<GridFor(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchBf16ToFp32(float* out, const bf16* in, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (CanPack(0, out, in)) {
    Bf16ToFp32Kernel<kPack>
        <<<GridFor((n + kPack - 1) / kPack, kThreads), kThreads, 0, stream>>>(out, in, n);
  } else {
    Bf16ToFp32Kernel<1><<<GridFor(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  }
  return cudaGetLastError();
}

}  // namespace pipeoffload::gpt::cuda::internal
