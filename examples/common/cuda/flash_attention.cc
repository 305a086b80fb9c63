// The checked entry points of flash_attention.h: every argument is checked on the host first
// (InvalidArgument naming the field, with the GPT kernels' ArgCheck), then the launchers of
// flash_attention_launch.h enqueue the kernels; a failed launch becomes Internal naming the
// kernel.
#include "examples/common/cuda/flash_attention.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/kernels_args.h"
#include "examples/common/cuda/flash_attention_launch.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::examples::cuda {
namespace {

using gpt::cuda::internal::ArgCheck;
using gpt::cuda::internal::IsAligned16;
using gpt::cuda::internal::Launched;

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
static_assert(kFlashAttentionMaxT == internal::kFlashMaxT, "flash_attention.h's limit is the grid's");

bool IsAligned4(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 3u) == 0; }

// A row stride: 0 means `heads * hd`; else at least that and a multiple of 8 elements (16-byte
// row starts, given a 16-byte aligned base).
std::int64_t ResolveStride(ArgCheck& check, const char* name, std::int64_t stride, int heads,
                           int hd) {
  const std::int64_t dense = std::int64_t{heads} * hd;
  if (stride == 0) return dense;
  check.Range(name, stride, dense, std::numeric_limits<std::int64_t>::max() / 2);
  check.Require(stride % 8 == 0, absl::StrCat(name, " = ", stride, " is not a multiple of 8"));
  return stride;
}

// The dims part of the kernels' arguments, or the first failed check in `check`.
internal::FlashArgs CheckDims(ArgCheck& check, const AttentionDims& dims) {
  internal::FlashArgs args;
  check.Range("B", dims.B, 1, kIntMax).Range("T", dims.T, 1, internal::kFlashMaxT);
  check.Range("NH", dims.NH, 1, kIntMax).Range("NKV", dims.NKV, 1, kIntMax);
  check.Require(dims.hd == 64 || dims.hd == 128,
                absl::StrCat("hd = ", dims.hd, " is not 64 or 128"));
  if (!check.status().ok()) return args;
  check.Require(dims.NH % dims.NKV == 0, absl::StrCat("NH = ", dims.NH,
                                                      " is not a multiple of NKV = ", dims.NKV));
  // grid.x counts (sequence, head) pairs.
  check.Range("B * NH", std::int64_t{dims.B} * dims.NH, 1, kIntMax);
  args.q_stride = ResolveStride(check, "q_row_stride", dims.q_row_stride, dims.NH, dims.hd);
  args.kv_stride = ResolveStride(check, "kv_row_stride", dims.kv_row_stride, dims.NKV, dims.hd);
  args.out_stride = ResolveStride(check, "out_row_stride", dims.out_row_stride, dims.NH, dims.hd);
  args.B = dims.B;
  args.T = dims.T;
  args.NH = dims.NH;
  args.NKV = dims.NKV;
  args.group = dims.NH / dims.NKV;
  args.hd = dims.hd;
  return args;
}

// A bf16 tensor the kernels move in 16-byte vectors.
void CheckTensor(ArgCheck& check, const char* name, const void* p) {
  check.NotNull(name, p);
  check.Require(p == nullptr || IsAligned16(p), absl::StrCat(name, " is not 16-byte aligned"));
}

// An fp32 vector the kernels read and write in single floats.
void CheckFloats(ArgCheck& check, const char* name, const void* p) {
  check.NotNull(name, p);
  check.Require(p == nullptr || IsAligned4(p), absl::StrCat(name, " is not 4-byte aligned"));
}

}  // namespace

absl::Status FlashAttentionForward(bf16* out, float* lse, const bf16* q, const bf16* k,
                                   const bf16* v, const AttentionDims& dims,
                                   cudaStream_t stream) {
  ArgCheck check("FlashAttentionForward");
  internal::FlashArgs args = CheckDims(check, dims);
  CheckTensor(check, "out", out);
  CheckFloats(check, "lse", lse);
  CheckTensor(check, "q", q);
  CheckTensor(check, "k", k);
  CheckTensor(check, "v", v);
  PO_RETURN_IF_ERROR(check.status());
  args.out = out;
  args.lse = lse;
  args.q = q;
  args.k = k;
  args.v = v;
  return Launched("FlashForwardKernel", internal::LaunchFlashForward(args, stream));
}

std::int64_t FlashAttentionBackwardWorkspaceBytes(const AttentionDims& dims) {
  if (dims.B <= 0 || dims.T <= 0 || dims.NH <= 0) return 0;
  return std::int64_t{dims.B} * dims.NH * dims.T * static_cast<std::int64_t>(sizeof(float));
}

absl::Status FlashAttentionBackward(bf16* dq, bf16* dk, bf16* dv, void* workspace,
                                    const bf16* dout, const bf16* out, const float* lse,
                                    const bf16* q, const bf16* k, const bf16* v,
                                    const AttentionDims& dims, cudaStream_t stream) {
  ArgCheck check("FlashAttentionBackward");
  internal::FlashArgs args = CheckDims(check, dims);
  CheckTensor(check, "dq", dq);
  CheckTensor(check, "dk", dk);
  CheckTensor(check, "dv", dv);
  CheckFloats(check, "workspace", workspace);
  CheckTensor(check, "dout", dout);
  CheckTensor(check, "out", out);
  CheckFloats(check, "lse", lse);
  CheckTensor(check, "q", q);
  CheckTensor(check, "k", k);
  CheckTensor(check, "v", v);
  PO_RETURN_IF_ERROR(check.status());
  args.dq = dq;
  args.dk = dk;
  args.dv = dv;
  args.dsum = static_cast<float*>(workspace);
  args.dout = dout;
  args.out_in = out;
  args.lse_in = lse;
  args.q = q;
  args.k = k;
  args.v = v;
  PO_RETURN_IF_ERROR(
      Launched("FlashBackwardDotKernel", internal::LaunchFlashBackwardDot(args, stream)));
  PO_RETURN_IF_ERROR(
      Launched("FlashBackwardKVKernel", internal::LaunchFlashBackwardKV(args, stream)));
  return Launched("FlashBackwardQKernel", internal::LaunchFlashBackwardQ(args, stream));
}

}  // namespace pipeoffload::examples::cuda
