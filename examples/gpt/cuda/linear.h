// The GPT's linear layers on the GPU: bf16 GEMMs through cuBLASLt with fp32 accumulation, in
// llm.c's layout (weight (OC, IC), out = inp @ W^T + b), forward with fused epilogues, backward
// for the input and for the weight.
//
//   Forward        out (N,OC) = act(inp (N,IC) @ W^T + bias + residual)
//                  act = identity, or GELU (tanh) with the pre-activation kept in `pre_gelu`
//   BackwardInput  dinp (N,IC) = dout (N,OC) @ W,  or  gelu'(pre_gelu) * (dout @ W)
//   BackwardWeight dW (OC,IC) += dout^T @ inp  (fp32 accumulator, beta = 1)
//
// Determinism (the pipeline's offload-on/off bitwise equality rests on it): every GEMM
// signature (dimensions, transposes, epilogue, accumulate flag, pointer alignments) is planned
// once, on first use, and its algorithm pinned for the object's lifetime; the heuristic is asked
// only for algorithms whose split-K reduction, if any, runs as a separate fixed-order pass over
// fp32 partials in the workspace (CUBLASLT_REDUCTION_SCHEME_NONE | COMPUTE_TYPE: never
// in-place accumulation into the output). With a workspace of its own per object (one object
// per stage, one stream each), concurrent stages on one GPU cannot perturb each other's choice.
//
// Row-major to cuBLASLt's column-major: a row-major (R, C) matrix is a column-major (C, R) one,
// so out^T = W inp^T is computed as D (OC, N) = op_T(W) (OC, IC) * inp^T (IC, N).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_LINEAR_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_LINEAR_H_

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipeoffload::gpt::cuda {

using bf16 = __nv_bfloat16;

// Rows and widths of one linear layer: inp (N, IC), W (OC, IC), out (N, OC).
struct LinearDims {
  int N = 0;
  int IC = 0;
  int OC = 0;
};

// Counters for tests and benchmarks.
struct LinearStats {
  std::int64_t plans = 0;     // distinct GEMM signatures planned (heuristic queries)
  std::int64_t launches = 0;  // cublasLtMatmul calls
};

class Linear {
 public:
  // The workspace every algorithm may use: 32 MiB, as NVIDIA advises for Hopper.
  static constexpr std::int64_t kWorkspaceBytes = std::int64_t{32} << 20;

  // A cuBLASLt handle and `kWorkspaceBytes` of device memory (cudaMalloc, on the current
  // device), for launches on `stream`. Errors: the cuBLAS / CUDA call's, named.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Linear>> Create(cudaStream_t stream);
  // REQUIRES: no launch of this object is still queued (the caller synchronizes its stream).
  ~Linear();
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  // out = inp @ W^T (+ bias when not null) (+ residual when not null); with `pre_gelu` not
  // null, out = gelu(that) and pre_gelu (N,OC) receives the pre-activation. residual and
  // pre_gelu are exclusive. out may not alias the inputs (residual may not alias out either).
  // Errors: InvalidArgument for non-positive dimensions, an OC not a multiple of 8 (cuBLASLt's
  // 16-byte row alignment for bf16), null inputs, or both residual and pre_gelu; cuBLASLt's
  // status otherwise.
  [[nodiscard]] absl::Status Forward(bf16* out, const bf16* inp, const bf16* weight,
                                     const bf16* bias, const bf16* residual, bf16* pre_gelu,
                                     const LinearDims& dims);
  // dinp = dout @ W, or with `pre_gelu` (N,IC) not null, gelu'(pre_gelu) * (dout @ W).
  // Errors: as Forward (IC must be a multiple of 8).
  [[nodiscard]] absl::Status BackwardInput(bf16* dinp, const bf16* dout, const bf16* weight,
                                           const bf16* pre_gelu, const LinearDims& dims);
  // dweight (OC,IC) fp32 += dout^T @ inp, in the order of one GEMM (deterministic).
  [[nodiscard]] absl::Status BackwardWeight(float* dweight, const bf16* dout, const bf16* inp,
                                            const LinearDims& dims);

  LinearStats stats() const { return stats_; }

 private:
  enum class Epilogue : std::uint8_t { kDefault, kBias, kGeluAuxBias, kGeluAux, kDGelu };
  // One column-major GEMM D (m,n) = op(A) op(B) (+ beta C), with its epilogue; C has D's type
  // and layout. Everything that selects the algorithm is in the key.
  struct Gemm {
    int m = 0, n = 0, k = 0;
    bool trans_a = false, trans_b = false;
    bool fp32_out = false;   // C and D fp32 (weight gradients), else bf16
    bool accumulate = false; // beta = 1
    Epilogue epilogue = Epilogue::kDefault;
    int align_a = 0, align_b = 0, align_c = 0, align_d = 0, align_aux = 0, align_bias = 0;
    std::array<int, 14> Key() const {
      return {m, n, k, trans_a, trans_b, fp32_out, accumulate, static_cast<int>(epilogue),
              align_a, align_b, align_c, align_d, align_aux, align_bias};
    }
  };
  struct Plan;

  explicit Linear(cudaStream_t stream);  // out of line: Plan is complete only in linear.cc
  absl::StatusOr<Plan*> GetPlan(const Gemm& gemm);
  // Launches D = epilogue(op(A) op(B) + beta C) with the signature's plan (C null: C = D).
  absl::Status Run(const Gemm& gemm, const void* a, const void* b, const void* c, void* d,
                   const void* bias, void* aux);

  const cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<std::array<int, 14>, std::unique_ptr<Plan>> plans_;
  LinearStats stats_;
};

// Largest power of two <= 256 that divides the address (256 for null).
int PointerAlignment(const void* ptr);

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_LINEAR_H_
