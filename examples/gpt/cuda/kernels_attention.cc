// The GPT's causal self-attention (kernels_cuda.h): its shape checked, then the shared flash
// kernel (examples/common/cuda/flash_attention.h) on the fused QKV layout. The flash kernel
// checks pointers, alignment and strides itself; what is checked here is what the mapping needs
// before it may form qkv + C and qkv + 2C.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "examples/common/cuda/flash_attention.h"
#include "examples/gpt/cuda/kernels_args.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt::cuda {
namespace {

using internal::ArgCheck;

// NH * hs = C stays an int and every row offset (rows of 3C) an int64_t.
constexpr std::int64_t kMaxHeads = 65535;

void CheckShape(ArgCheck& check, const AttentionShape& shape) {
  check.Positive("B", shape.B).Range("T", shape.T, 1, kMaxAttentionT);
  check.Range("NH", shape.NH, 1, kMaxHeads);
  check.Require(shape.hs == 64 || shape.hs == 128,
                absl::StrCat("hs = ", shape.hs,
                             " is not a head size of the flash attention (64 or 128)"));
  check.Range("B * T", std::int64_t{shape.B} * shape.T, 1, internal::kMaxRows);
}

}  // namespace

examples::cuda::AttentionDims FlashDims(const AttentionShape& shape) {
  const std::int64_t C = std::int64_t{shape.NH} * shape.hs;
  examples::cuda::AttentionDims dims;
  dims.B = shape.B;
  dims.T = shape.T;
  dims.NH = shape.NH;
  dims.NKV = shape.NH;
  dims.hd = shape.hs;
  dims.q_row_stride = 3 * C;
  dims.kv_row_stride = 3 * C;
  dims.out_row_stride = C;
  return dims;
}

std::int64_t AttentionBackwardWorkspaceBytes(const AttentionShape& shape) {
  ArgCheck check("AttentionBackwardWorkspaceBytes");
  CheckShape(check, shape);
  if (!check.status().ok()) return 0;
  return examples::cuda::FlashAttentionBackwardWorkspaceBytes(FlashDims(shape));
}

absl::Status AttentionForward(bf16* out, float* lse, const bf16* qkv, const AttentionShape& shape,
                              cudaStream_t stream) {
  ArgCheck check("AttentionForward");
  CheckShape(check, shape);
  check.NotNull("qkv", qkv);
  PO_RETURN_IF_ERROR(check.status());
  const std::int64_t C = std::int64_t{shape.NH} * shape.hs;
  return examples::cuda::FlashAttentionForward(out, lse, qkv, qkv + C, qkv + 2 * C,
                                               FlashDims(shape), stream);
}

absl::Status AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                               const float* lse, void* workspace, const AttentionShape& shape,
                               cudaStream_t stream) {
  ArgCheck check("AttentionBackward");
  CheckShape(check, shape);
  check.NotNull("dqkv", dqkv).NotNull("qkv", qkv);
  PO_RETURN_IF_ERROR(check.status());
  const std::int64_t C = std::int64_t{shape.NH} * shape.hs;
  // The heads' columns of dq, dk, dv cover each row of dqkv: every element is written.
  return examples::cuda::FlashAttentionBackward(dqkv, dqkv + C, dqkv + 2 * C, workspace, dout,
                                                out, lse, qkv, qkv + C, qkv + 2 * C,
                                                FlashDims(shape), stream);
}

}  // namespace pipeoffload::gpt::cuda
