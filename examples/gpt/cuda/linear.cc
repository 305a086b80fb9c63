// Linear layers through cuBLASLt (see linear.h). Invariants:
//  - A Plan (descriptors, layouts, algorithm) is built once per GEMM signature and reused; its
//    algorithm never changes, so one signature always runs the same kernel sequence.
//  - A fused epilogue (bias + GELU forward, GELU-gradient backward) is used when the heuristic
//    offers an algorithm for it; otherwise the signature is planned without it and the GELU
//    runs as its own kernel (kernels_cuda.h). Either way the choice is pinned with the plan.
//  - Every launch goes to `stream_`, with this object's own workspace.
#include "examples/gpt/cuda/linear.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::gpt::cuda {

struct Linear::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fused = true;  // false: the requested GELU epilogue is not available for this signature

  ~Plan() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// Preferences and descriptors are set through untyped attribute calls; these keep the types
// right at each call site.
template <typename T>
absl::Status SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                     const T& value, const char* what) {
  return CublasStatus(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), what);
}
template <typename T>
absl::Status SetPreference(cublasLtMatmulPreference_t preference,
                           cublasLtMatmulPreferenceAttributes_t attribute, const T& value,
                           const char* what) {
  return CublasStatus(
      cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)), what);
}

cublasLtEpilogue_t ToCublas(int epilogue) {
  switch (epilogue) {
    case 1:
      return CUBLASLT_EPILOGUE_BIAS;
    case 2:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case 3:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case 4:
      return CUBLASLT_EPILOGUE_DGELU;
    default:
      return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

absl::Status CheckDims(const LinearDims& dims, const char* op) {
  if (dims.N <= 0 || dims.IC <= 0 || dims.OC <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Linear::", op, ": dimensions N=", dims.N,
                                                   " IC=", dims.IC, " OC=", dims.OC,
                                                   " must be positive"));
  }
  return absl::OkStatus();
}

absl::Status CheckMultipleOf8(int value, const char* name, const char* op) {
  if (value % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Linear::", op, ": ", name, "=", value,
                     " must be a multiple of 8 (bf16 rows must be 16-byte aligned for cuBLASLt)"));
  }
  return absl::OkStatus();
}

}  // namespace

int PointerAlignment(const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  int alignment = 256;
  while (alignment > 1 && address % static_cast<std::uintptr_t>(alignment) != 0) alignment /= 2;
  return alignment;
}

absl::StatusOr<std::unique_ptr<Linear>> Linear::Create(cudaStream_t stream) {
  std::unique_ptr<Linear> linear(new Linear(stream));
  PO_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&linear->handle_));
  PO_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&linear->workspace_, static_cast<std::size_t>(kWorkspaceBytes)));
  return linear;
}

Linear::Linear(cudaStream_t stream) : stream_(stream) {}

Linear::~Linear() {
  plans_.clear();  // descriptors before the handle
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

absl::StatusOr<Linear::Plan*> Linear::GetPlan(const Gemm& gemm) {
  auto found = plans_.find(gemm.Key());
  if (found != plans_.end()) return found->second.get();
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t out_type = gemm.fp32_out ? CUDA_R_32F : CUDA_R_16BF;
  // Stored shapes (before op): A is (k, m) when transposed, else (m, k); B (n, k) or (k, n).
  PO_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, gemm.trans_a ? gemm.k : gemm.m,
                                 gemm.trans_a ? gemm.m : gemm.k, gemm.trans_a ? gemm.k : gemm.m));
  PO_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, gemm.trans_b ? gemm.n : gemm.k,
                                 gemm.trans_b ? gemm.k : gemm.n, gemm.trans_b ? gemm.n : gemm.k));
  PO_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, out_type, gemm.m, gemm.n, gemm.m));
  PO_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->d, out_type, gemm.m, gemm.n, gemm.m));

  cublasLtMatmulPreference_t preference = nullptr;
  PO_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
  struct PreferenceGuard {
    cublasLtMatmulPreference_t p;
    ~PreferenceGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } preference_guard{preference};
  const std::uint64_t workspace = kWorkspaceBytes;
  PO_RETURN_IF_ERROR(SetPreference(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace,
                                   "workspace preference"));
  // Split-K only with a separate, fixed-order reduction of fp32 partials (see linear.h).
  const std::uint32_t reductions =
      CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  PO_RETURN_IF_ERROR(SetPreference(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                   reductions, "reduction scheme preference"));
  const std::uint32_t align_a = static_cast<std::uint32_t>(gemm.align_a);
  const std::uint32_t align_b = static_cast<std::uint32_t>(gemm.align_b);
  const std::uint32_t align_c = static_cast<std::uint32_t>(gemm.align_c);
  const std::uint32_t align_d = static_cast<std::uint32_t>(gemm.align_d);
  PO_RETURN_IF_ERROR(SetPreference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a,
                                   "alignment preference"));
  PO_RETURN_IF_ERROR(SetPreference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b,
                                   "alignment preference"));
  PO_RETURN_IF_ERROR(SetPreference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c,
                                   "alignment preference"));
  PO_RETURN_IF_ERROR(SetPreference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d,
                                   "alignment preference"));

  // Try the requested epilogue; when no algorithm offers a GELU epilogue here, plan without it
  // (the caller then runs the GELU as a kernel).
  for (const bool fused : {true, false}) {
    Epilogue epilogue = gemm.epilogue;
    if (!fused) {
      if (epilogue == Epilogue::kGeluAuxBias) {
        epilogue = Epilogue::kBias;
      } else if (epilogue == Epilogue::kGeluAux || epilogue == Epilogue::kDGelu) {
        epilogue = Epilogue::kDefault;
      } else {
        break;  // nothing to drop: the signature itself has no algorithm
      }
    }
    if (plan->desc != nullptr) {
      cublasLtMatmulDescDestroy(plan->desc);
      plan->desc = nullptr;
    }
    PO_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const std::int32_t trans_a = gemm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const std::int32_t trans_b = gemm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    PO_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, trans_a, "transa"));
    PO_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, trans_b, "transb"));
    const std::uint32_t cublas_epilogue = ToCublas(static_cast<int>(epilogue));
    PO_RETURN_IF_ERROR(
        SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, cublas_epilogue, "epilogue"));
    const bool has_bias = epilogue == Epilogue::kBias || epilogue == Epilogue::kGeluAuxBias;
    const bool has_aux = epilogue == Epilogue::kGeluAuxBias || epilogue == Epilogue::kGeluAux ||
                         epilogue == Epilogue::kDGelu;
    if (has_bias) {
      const std::int32_t bias_type = CUDA_R_16BF;
      PO_RETURN_IF_ERROR(
          SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "bias type"));
      // The heuristic reads the pointer's value for its alignment only.
      const void* bias =
          reinterpret_cast<const void*>(static_cast<std::uintptr_t>(gemm.align_bias));
      PO_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "bias"));
    }
    if (has_aux) {
      // The aux matrix (the GELU's pre-activation) has D's shape and, by default, D's type.
      const std::int64_t aux_ld = gemm.m;
      const void* aux = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(gemm.align_aux));
      PO_RETURN_IF_ERROR(
          SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld, "aux ld"));
      PO_RETURN_IF_ERROR(
          SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, "aux pointer"));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle_, plan->desc, plan->a, plan->b, plan->c, plan->d, preference, 1, &result, &returned);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
      plan->algo = result.algo;
      plan->fused = fused;
      ++stats_.plans;
      Plan* raw = plan.get();
      plans_.emplace(gemm.Key(), std::move(plan));
      return raw;
    }
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
      PO_RETURN_IF_ERROR(CublasStatus(status, "cublasLtMatmulAlgoGetHeuristic"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "cuBLASLt has no algorithm for the GEMM m=", gemm.m, " n=", gemm.n, " k=", gemm.k,
      gemm.trans_a ? " A^T" : "", gemm.trans_b ? " B^T" : "", gemm.fp32_out ? " fp32 out" : "",
      " (pointer alignments ", gemm.align_a, "/", gemm.align_b, "/", gemm.align_d, " bytes)"));
}

absl::Status Linear::Run(const Gemm& gemm, const void* a, const void* b, const void* c, void* d,
                         const void* bias, void* aux) {
  PO_ASSIGN_OR_RETURN(Plan * plan, GetPlan(gemm));
  if (bias != nullptr) {
    PO_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "bias"));
  }
  if (aux != nullptr && plan->fused) {
    PO_RETURN_IF_ERROR(
        SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, "aux pointer"));
  }
  const float alpha = 1.0f;
  const float beta = gemm.accumulate ? 1.0f : 0.0f;
  PO_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      handle_, plan->desc, &alpha, a, plan->a, b, plan->b, &beta, c != nullptr ? c : d, plan->c, d,
      plan->d, &plan->algo, workspace_, static_cast<std::size_t>(kWorkspaceBytes), stream_));
  ++stats_.launches;
  if (plan->fused || aux == nullptr || gemm.epilogue != Epilogue::kDGelu) {
    return absl::OkStatus();
  }
  // The GELU gradient without the epilogue: d = gelu'(aux) * (A B), in place.
  return GeluBackward(static_cast<bf16*>(d), static_cast<const bf16*>(aux),
                      static_cast<const bf16*>(d), std::int64_t{gemm.m} * gemm.n, stream_);
}

absl::Status Linear::Forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                             const bf16* residual, bf16* pre_gelu, const LinearDims& dims) {
  PO_RETURN_IF_ERROR(CheckDims(dims, "Forward"));
  PO_RETURN_IF_ERROR(CheckMultipleOf8(dims.IC, "IC", "Forward"));
  PO_RETURN_IF_ERROR(CheckMultipleOf8(dims.OC, "OC", "Forward"));
  if (out == nullptr || inp == nullptr || weight == nullptr) {
    return absl::InvalidArgumentError("Linear::Forward: out, inp and weight must not be null");
  }
  if (residual != nullptr && pre_gelu != nullptr) {
    return absl::InvalidArgumentError("Linear::Forward: a residual and a GELU do not combine");
  }
  Gemm gemm;
  gemm.m = dims.OC;
  gemm.n = dims.N;
  gemm.k = dims.IC;
  gemm.trans_a = true;
  gemm.accumulate = residual != nullptr;
  gemm.epilogue = pre_gelu != nullptr
                      ? (bias != nullptr ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux)
                      : (bias != nullptr ? Epilogue::kBias : Epilogue::kDefault);
  gemm.align_a = PointerAlignment(weight);
  gemm.align_b = PointerAlignment(inp);
  gemm.align_c = PointerAlignment(residual != nullptr ? residual : out);
  // Unfused, the GEMM writes pre_gelu instead of out: plan for the weaker of the two.
  gemm.align_d = std::min(PointerAlignment(out), PointerAlignment(pre_gelu));
  gemm.align_bias = PointerAlignment(bias);
  gemm.align_aux = PointerAlignment(pre_gelu);
  if (pre_gelu == nullptr) {
    return Run(gemm, weight, inp, residual, out, bias, nullptr);
  }
  PO_ASSIGN_OR_RETURN(Plan * plan, GetPlan(gemm));
  if (plan->fused) return Run(gemm, weight, inp, nullptr, out, bias, pre_gelu);
  // Unfused: the GEMM (with bias) writes the pre-activation, then GELU into out.
  PO_RETURN_IF_ERROR(Run(gemm, weight, inp, nullptr, pre_gelu, bias, nullptr));
  return GeluForward(out, pre_gelu, std::int64_t{dims.N} * dims.OC, stream_);
}

absl::Status Linear::BackwardInput(bf16* dinp, const bf16* dout, const bf16* weight,
                                   const bf16* pre_gelu, const LinearDims& dims) {
  PO_RETURN_IF_ERROR(CheckDims(dims, "BackwardInput"));
  PO_RETURN_IF_ERROR(CheckMultipleOf8(dims.IC, "IC", "BackwardInput"));
  PO_RETURN_IF_ERROR(CheckMultipleOf8(dims.OC, "OC", "BackwardInput"));
  if (dinp == nullptr || dout == nullptr || weight == nullptr) {
    return absl::InvalidArgumentError(
        "Linear::BackwardInput: dinp, dout and weight must not be null");
  }
  Gemm gemm;
  gemm.m = dims.IC;
  gemm.n = dims.N;
  gemm.k = dims.OC;
  gemm.epilogue = pre_gelu != nullptr ? Epilogue::kDGelu : Epilogue::kDefault;
  gemm.align_a = PointerAlignment(weight);
  gemm.align_b = PointerAlignment(dout);
  gemm.align_c = PointerAlignment(dinp);
  gemm.align_d = gemm.align_c;
  gemm.align_aux = PointerAlignment(pre_gelu);
  gemm.align_bias = 256;
  // With the GELU unfused, Run applies GeluBackward in place after the GEMM.
  return Run(gemm, weight, dout, nullptr, dinp, nullptr, const_cast<bf16*>(pre_gelu));
}

absl::Status Linear::BackwardWeight(float* dweight, const bf16* dout, const bf16* inp,
                                    const LinearDims& dims) {
  PO_RETURN_IF_ERROR(CheckDims(dims, "BackwardWeight"));
  PO_RETURN_IF_ERROR(CheckMultipleOf8(dims.IC, "IC", "BackwardWeight"));
  PO_RETURN_IF_ERROR(CheckMultipleOf8(dims.OC, "OC", "BackwardWeight"));
  if (dweight == nullptr || dout == nullptr || inp == nullptr) {
    return absl::InvalidArgumentError(
        "Linear::BackwardWeight: dweight, dout and inp must not be null");
  }
  Gemm gemm;
  gemm.m = dims.IC;
  gemm.n = dims.OC;
  gemm.k = dims.N;
  gemm.trans_b = true;
  gemm.fp32_out = true;
  gemm.accumulate = true;
  gemm.align_a = PointerAlignment(inp);
  gemm.align_b = PointerAlignment(dout);
  gemm.align_c = PointerAlignment(dweight);
  gemm.align_d = gemm.align_c;
  gemm.align_aux = 256;
  gemm.align_bias = 256;
  return Run(gemm, inp, dout, dweight, dweight, nullptr, nullptr);
}

}  // namespace pipeoffload::gpt::cuda
