// The warp-level primitives of the flash attention kernels (flash_attention_kernels.cuh), each a
// single sm_80+ instruction or a short fixed sequence: ldmatrix, mma.sync m16n8k16 (bf16 in,
// fp32 accumulate), cp.async with zero fill, quad reductions, exp2. Only these touch PTX, so the
// kernels above them are plain C++ over fragments. Shared-memory operands are 32-bit shared
// addresses (SmemAddress).
#ifndef PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_DEVICE_CUH_
#define PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_DEVICE_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace pipeoffload::examples::cuda::flash {

// The block's dynamic shared memory (128-byte aligned: the swizzle works in 128-byte rows).
__device__ __forceinline__ unsigned char* SharedMemory() {
  extern __shared__ __align__(128) unsigned char flash_smem[];
  return flash_smem;
}

__device__ __forceinline__ std::uint32_t SmemAddress(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses (16 bytes each) of matrix i, and
// lane l receives in r[i] row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix i.
__device__ __forceinline__ void LdMatrixX4(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As LdMatrixX4, transposed: lane l receives in r[i] elements (row 2 (l % 4), column l / 4) and
// (row 2 (l % 4) + 1, column l / 4) of matrix i.
__device__ __forceinline__ void LdMatrixX4Trans(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d (16x8 fp32) += a (16x16 bf16, row-major fragment) * b (16x8 bf16, column fragment), in the
// register layouts of PTX ISA "Matrix Fragments for mma.m16n8k16" (g = lane / 4, q = lane % 4):
// a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..], a[2] = A[g][2q+8..], a[3] = A[g+8][2q+8..];
// b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g]; d[0..1] = D[g][2q..2q+1], d[2..3] = D[g+8][2q..].
__device__ __forceinline__ void Mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                    std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, asynchronously; when !valid nothing is read and the destination is
// zero-filled (src-size 0), so `src` only has to be some mapped address.
__device__ __forceinline__ void CpAsync16(std::uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// 4 bytes, as CpAsync16.
__device__ __forceinline__ void CpAsync4(std::uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight. Other
// threads' copies become visible only after a barrier that follows their own waits.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  // "memory": no shared-memory access may move across the wait.
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// 2^x, approximate (2 ulp), flushing subnormals; exp2(-inf) = +0.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float ShflXor(float value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}

// Max and sum over the 4 lanes of a quad (lanes 4g..4g+3 hold one row of an mma fragment).
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, ShflXor(x, 1));
  return fmaxf(x, ShflXor(x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += ShflXor(x, 1);
  return x + ShflXor(x, 2);
}

// Two floats as bf16 (round to nearest even) in one register, `lo` in the low half: the order
// of an mma fragment register (lower column first). cvt packs its first source in the upper half.
__device__ __forceinline__ std::uint32_t PackBf16(float lo, float hi) {
  std::uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}

// The bf16 in the low / high half of a register, exactly, as float (bf16 is fp32's top half).
__device__ __forceinline__ float Bf16Low(std::uint32_t packed) {
  return __uint_as_float(packed << 16);
}
__device__ __forceinline__ float Bf16High(std::uint32_t packed) {
  return __uint_as_float(packed & 0xffff0000u);
}

__device__ __forceinline__ void SyncWarp() { __syncwarp(); }

}  // namespace pipeoffload::examples::cuda::flash

#endif  // PIPEOFFLOAD_EXAMPLES_COMMON_CUDA_FLASH_ATTENTION_DEVICE_CUH_
