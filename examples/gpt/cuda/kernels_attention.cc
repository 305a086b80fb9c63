// Causal self-attention from cuBLAS strided-batched GEMMs (bf16 in, fp32 compute) and the row
// softmax kernels of kernels_attention_softmax.cu, one group of heads of one sequence at a time.
//
// Workspace layout, per group of G heads (AttentionHeadsPerGroup):
//   [0, 4GT^2)        S:  G fp32 (T,T) score matrices, scaled by 1/sqrt(hs). The softmax turns
//                     row i of head g in place into bf16 probabilities in the row's first bytes,
//                     so P of head g is a bf16 matrix at bf16 offset 2gT^2 with row pitch 2T.
//   [4GT^2, 8GT^2)    dP: G fp32 (T,T) (backward only), turned in place into bf16 dS likewise.
//
// Causality: the rows are cut into blocks of R = AttentionRowBlock(shape) rows; rows [r0, r1) only
// see columns [0, r1), so every product is launched per row block over the columns (or, for
// the transposed products dV and dK, the rows) that can be nonzero. With 4 blocks this computes
// 5/8 of the full T x T products and touches 5/8 of the workspace. The softmax writes P and dS
// (zeros above the diagonal) up to the end of the row's block, exactly what the products read.
//
// cuBLAS is column-major: a row-major (rows, cols) matrix with leading dimension ld is the
// column-major (cols, rows) matrix with the same ld, so each product below is written for the
// transposes. With qkv row-major (T, 3C) per sequence, head h's q is the column-major (hs, T)
// matrix at qkv + h*hs with ld 3C (k at + C, v at + 2C); heads of a group are hs apart. For the
// row block [r0, r1), with X_c the column-major view of the row-major X and X[a:b] its rows:
//   S[r0:r1, :r1]^T = K[:r1] Q[r0:r1]^T   op(A) = K_c^T, op(B) = Q_c  (m = r1, n = r1-r0, k = hs)
//   O[r0:r1]^T = V[:r1]^T P[r0:r1, :r1]^T op(A) = V_c, op(B) = P_c    (m = hs, n = r1-r0, k = r1)
//   dP[r0:r1, :r1]^T = V[:r1] dO[r0:r1]^T  as S, with V for K and dO for Q
//   dV[r0:r1]^T = dO[r0:]^T P[r0:, r0:r1]  op(A) = dO_c, op(B) = P_c^T (m = hs, n = r1-r0,
//                                          k = T-r0: rows i < r0 are zero in these columns)
//   dQ[r0:r1]^T = K[:r1]^T dS[r0:r1, :r1]^T  as O, with K for V and dS for P, times 1/sqrt(hs)
//   dK[r0:r1]^T = Q[r0:]^T dS[r0:, r0:r1]    as dV, with Q for dO and dS for P, times 1/sqrt(hs)
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/kernels_args.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/gpt/cuda/kernels_launch.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt::cuda {
namespace {

using internal::ArgCheck;
using internal::Launched;

constexpr std::int64_t kMaxHeads = 65535;  // heads of a group index grid.y of the softmax
constexpr std::int64_t kMaxHeadSize = 1024;

// One strided-batched GEMM, bf16 A and B, fp32 compute, C of type c_type.
struct Gemm {
  cublasOperation_t op_a;
  cublasOperation_t op_b;
  int m;
  int n;
  int k;
  float alpha;
  const void* a;
  int lda;
  long long stride_a;
  const void* b;
  int ldb;
  long long stride_b;
  void* c;
  cudaDataType_t c_type;
  int ldc;
  long long stride_c;
};

absl::Status Run(const char* function, const char* product, cublasHandle_t cublas, const Gemm& g,
                 int batch) {
  const float beta = 0.0f;  // overwrite: C is never read, so poisoned outputs do not leak in
  const cublasStatus_t status = cublasGemmStridedBatchedEx(
      cublas, g.op_a, g.op_b, g.m, g.n, g.k, &g.alpha, g.a, CUDA_R_16BF, g.lda, g.stride_a, g.b,
      CUDA_R_16BF, g.ldb, g.stride_b, &beta, g.c, g.c_type, g.ldc, g.stride_c, batch,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(function, ": cublasGemmStridedBatchedEx (", product,
                                          ") failed: ", cublasGetStatusName(status), ": ",
                                          cublasGetStatusString(status)));
}

// Sets the handle's pointer mode to host (alpha and beta live on the stack here) for the
// guard's lifetime and restores the caller's mode after.
class HostPointerMode {
 public:
  explicit HostPointerMode(cublasHandle_t cublas) : cublas_(cublas) {}
  HostPointerMode(const HostPointerMode&) = delete;
  HostPointerMode& operator=(const HostPointerMode&) = delete;
  ~HostPointerMode() {
    if (changed_) cublasSetPointerMode(cublas_, previous_);
  }
  absl::Status Enter(const char* function) {
    cublasStatus_t status = cublasGetPointerMode(cublas_, &previous_);
    if (status == CUBLAS_STATUS_SUCCESS && previous_ != CUBLAS_POINTER_MODE_HOST) {
      status = cublasSetPointerMode(cublas_, CUBLAS_POINTER_MODE_HOST);
      changed_ = status == CUBLAS_STATUS_SUCCESS;
    }
    if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(
        function, ": setting the cuBLAS pointer mode failed: ", cublasGetStatusName(status)));
  }

 private:
  cublasHandle_t cublas_;
  cublasPointerMode_t previous_ = CUBLAS_POINTER_MODE_HOST;
  bool changed_ = false;
};

void CheckShape(ArgCheck& check, const AttentionShape& shape) {
  check.Positive("B", shape.B).Range("T", shape.T, 1, kMaxAttentionT);
  check.Range("NH", shape.NH, 1, kMaxHeads).Range("hs", shape.hs, 1, kMaxHeadSize);
  check.Range("heads_per_group", shape.heads_per_group, 0, kMaxHeads);
  check.Range("row_blocks", shape.row_blocks, 0, kMaxAttentionT);
  // With these limits 3C, a leading dimension of the GEMMs, stays far below INT_MAX.
  check.Range("B * T", std::int64_t{shape.B} * shape.T, 1, internal::kMaxRows);
}

// The checks both directions share: shape, workspace, handle bound to `stream`.
absl::Status CheckCommon(ArgCheck& check, const AttentionShape& shape, const void* workspace,
                         cublasHandle_t cublas, cudaStream_t stream) {
  CheckShape(check, shape);
  check.NotNull("workspace", workspace).NotNull("cublas", cublas);
  check.Require(internal::IsAligned16(workspace), "workspace must be 16-byte aligned");
  PO_RETURN_IF_ERROR(check.status());
  cudaStream_t bound = nullptr;
  const cublasStatus_t status = cublasGetStream(cublas, &bound);
  check.Require(status == CUBLAS_STATUS_SUCCESS && bound == stream,
                "the cuBLAS handle must be bound to `stream` (cublasSetStream)");
  return check.status();
}

// Rows per causal block: T split in shape.row_blocks blocks, or by default in at most
// kMaxRowBlocks blocks of at least kMinRowBlock rows, rounded up to a multiple of 64 (so every
// block's GEMM operands stay 128-byte aligned). On the H200 at T = 2048 and 4096 with the
// default head groups, 4 blocks ran 3-4% faster than 2 and 12-16% faster than 1 (one block
// computes all of T x T; more blocks launch more, smaller GEMMs).
constexpr int kMaxRowBlocks = 4;
constexpr int kMinRowBlock = 512;
int AttentionRowBlock(const AttentionShape& shape) {
  const int T = shape.T;
  int blocks = shape.row_blocks;
  if (blocks <= 0) {
    blocks = (T + kMinRowBlock - 1) / kMinRowBlock;
    if (blocks > kMaxRowBlocks) blocks = kMaxRowBlocks;
  }
  const int rows = (T + blocks - 1) / blocks;
  return (rows + 63) / 64 * 64;
}

}  // namespace

int AttentionHeadsPerGroup(const AttentionShape& shape) {
  if (shape.T <= 0 || shape.NH <= 0) return 0;
  if (shape.heads_per_group > 0)
    return shape.heads_per_group < shape.NH ? shape.heads_per_group : shape.NH;
  const std::int64_t per_head = 8 * std::int64_t{shape.T} * shape.T;
  std::int64_t heads = kAttentionWorkspaceBudgetBytes / per_head;
  if (heads < 1) heads = 1;
  if (heads > shape.NH) heads = shape.NH;
  return static_cast<int>(heads);
}

std::int64_t AttentionWorkspaceBytes(const AttentionShape& shape) {
  ArgCheck check("AttentionWorkspaceBytes");
  CheckShape(check, shape);
  if (!check.status().ok()) return 0;
  return 8 * std::int64_t{shape.T} * shape.T * AttentionHeadsPerGroup(shape);
}

absl::Status AttentionForward(bf16* out, float* lse, const bf16* qkv, void* workspace,
                              const AttentionShape& shape, cublasHandle_t cublas,
                              cudaStream_t stream) {
  constexpr const char* kName = "AttentionForward";
  ArgCheck check(kName);
  check.NotNull("out", out).NotNull("lse", lse).NotNull("qkv", qkv);
  PO_RETURN_IF_ERROR(CheckCommon(check, shape, workspace, cublas, stream));
  HostPointerMode pointer_mode(cublas);
  PO_RETURN_IF_ERROR(pointer_mode.Enter(kName));

  const int T = shape.T;
  const int hs = shape.hs;
  const int C = shape.NH * hs;
  const int row3 = 3 * C;
  const long long square = static_cast<long long>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int group = AttentionHeadsPerGroup(shape);
  const int rows = AttentionRowBlock(shape);
  float* scores = static_cast<float*>(workspace);
  const bf16* probs = reinterpret_cast<const bf16*>(scores);  // pitch 2T, see the layout

  for (int b = 0; b < shape.B; ++b) {
    for (int h0 = 0; h0 < shape.NH; h0 += group) {
      const int heads = group < shape.NH - h0 ? group : shape.NH - h0;
      const bf16* q = qkv + std::int64_t{b} * T * row3 + std::int64_t{h0} * hs;
      const bf16* k = q + C;
      const bf16* v = q + 2 * C;
      for (int r0 = 0; r0 < T; r0 += rows) {
        const int r1 = r0 + rows < T ? r0 + rows : T;
        PO_RETURN_IF_ERROR(Run(kName, "Q K^T", cublas,
                               {CUBLAS_OP_T, CUBLAS_OP_N, r1, r1 - r0, hs, scale, k, row3, hs,
                                q + std::int64_t{r0} * row3, row3, hs,
                                scores + std::int64_t{r0} * T, CUDA_R_32F, T, square},
                               heads));
      }
      PO_RETURN_IF_ERROR(Launched(
          "AttentionForward softmax",
          internal::LaunchAttentionSoftmaxForward(
              scores, lse + (std::int64_t{b} * shape.NH + h0) * T, T, heads, T, rows, stream)));
      bf16* o = out + std::int64_t{b} * T * C + std::int64_t{h0} * hs;
      for (int r0 = 0; r0 < T; r0 += rows) {
        const int r1 = r0 + rows < T ? r0 + rows : T;
        PO_RETURN_IF_ERROR(Run(kName, "P V", cublas,
                               {CUBLAS_OP_N, CUBLAS_OP_N, hs, r1 - r0, r1, 1.0f, v, row3, hs,
                                probs + 2 * std::int64_t{r0} * T, 2 * T, 2 * square,
                                o + std::int64_t{r0} * C, CUDA_R_16BF, C, hs},
                               heads));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AttentionBackward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                               const float* lse, void* workspace, const AttentionShape& shape,
                               cublasHandle_t cublas, cudaStream_t stream) {
  constexpr const char* kName = "AttentionBackward";
  static_cast<void>(out);  // see kernels_cuda.h: D = sum_j P dP comes from the recomputed P
  ArgCheck check(kName);
  check.NotNull("dqkv", dqkv).NotNull("dout", dout).NotNull("qkv", qkv).NotNull("lse", lse);
  PO_RETURN_IF_ERROR(CheckCommon(check, shape, workspace, cublas, stream));
  HostPointerMode pointer_mode(cublas);
  PO_RETURN_IF_ERROR(pointer_mode.Enter(kName));

  const int T = shape.T;
  const int hs = shape.hs;
  const int C = shape.NH * hs;
  const int row3 = 3 * C;
  const long long square = static_cast<long long>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int group = AttentionHeadsPerGroup(shape);
  const int rows = AttentionRowBlock(shape);
  float* scores = static_cast<float*>(workspace);
  float* dprobs = scores + group * square;
  const bf16* probs = reinterpret_cast<const bf16*>(scores);    // pitch 2T after the softmax
  const bf16* dscores = reinterpret_cast<const bf16*>(dprobs);  // likewise

  for (int b = 0; b < shape.B; ++b) {
    for (int h0 = 0; h0 < shape.NH; h0 += group) {
      const int heads = group < shape.NH - h0 ? group : shape.NH - h0;
      const std::int64_t head_offset = std::int64_t{h0} * hs;
      const bf16* q = qkv + std::int64_t{b} * T * row3 + head_offset;
      const bf16* k = q + C;
      const bf16* v = q + 2 * C;
      const bf16* dy = dout + std::int64_t{b} * T * C + head_offset;
      bf16* dq = dqkv + std::int64_t{b} * T * row3 + head_offset;
      bf16* dk = dq + C;
      bf16* dv = dq + 2 * C;
      for (int r0 = 0; r0 < T; r0 += rows) {
        const int r1 = r0 + rows < T ? r0 + rows : T;
        PO_RETURN_IF_ERROR(Run(kName, "Q K^T", cublas,
                               {CUBLAS_OP_T, CUBLAS_OP_N, r1, r1 - r0, hs, scale, k, row3, hs,
                                q + std::int64_t{r0} * row3, row3, hs,
                                scores + std::int64_t{r0} * T, CUDA_R_32F, T, square},
                               heads));
        PO_RETURN_IF_ERROR(Run(kName, "dO V^T", cublas,
                               {CUBLAS_OP_T, CUBLAS_OP_N, r1, r1 - r0, hs, 1.0f, v, row3, hs,
                                dy + std::int64_t{r0} * C, C, hs, dprobs + std::int64_t{r0} * T,
                                CUDA_R_32F, T, square},
                               heads));
      }
      PO_RETURN_IF_ERROR(Launched("AttentionBackward softmax",
                                  internal::LaunchAttentionSoftmaxBackward(
                                      scores, dprobs, lse + (std::int64_t{b} * shape.NH + h0) * T,
                                      T, heads, T, rows, stream)));
      for (int r0 = 0; r0 < T; r0 += rows) {
        const int r1 = r0 + rows < T ? r0 + rows : T;
        // Row r0, column r0 of P and dS: the top left of the nonzero part of columns [r0, r1).
        const std::int64_t corner = 2 * std::int64_t{r0} * T + r0;
        PO_RETURN_IF_ERROR(Run(kName, "P^T dO", cublas,
                               {CUBLAS_OP_N, CUBLAS_OP_T, hs, r1 - r0, T - r0, 1.0f,
                                dy + std::int64_t{r0} * C, C, hs, probs + corner, 2 * T, 2 * square,
                                dv + std::int64_t{r0} * row3, CUDA_R_16BF, row3, hs},
                               heads));
        PO_RETURN_IF_ERROR(Run(kName, "dS K", cublas,
                               {CUBLAS_OP_N, CUBLAS_OP_N, hs, r1 - r0, r1, scale, k, row3, hs,
                                dscores + 2 * std::int64_t{r0} * T, 2 * T, 2 * square,
                                dq + std::int64_t{r0} * row3, CUDA_R_16BF, row3, hs},
                               heads));
        PO_RETURN_IF_ERROR(Run(kName, "dS^T Q", cublas,
                               {CUBLAS_OP_N, CUBLAS_OP_T, hs, r1 - r0, T - r0, scale,
                                q + std::int64_t{r0} * row3, row3, hs, dscores + corner, 2 * T,
                                2 * square, dk + std::int64_t{r0} * row3, CUDA_R_16BF, row3, hs},
                               heads));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::gpt::cuda
