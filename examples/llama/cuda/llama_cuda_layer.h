// The math of the Llama model's layer-sliding units on the GPU, bf16 activations with fp32
// accumulation: the CUDA mirror of llama_layer_cpu.h's LlamaCpuUnits (same formulas, same flat
// parameter layout, same call contracts), composed from the GPT's cuBLASLt Linear,
// llama_cuda_kernels.h, flash_attention.h and fused_cross_entropy.h. It holds no parameters;
// it owns the handles its calls need (one Linear with its cuBLASLt workspace, the RoPE table).
//
// Decoder (x the unit's input, every tensor (N, width) row-major; Q = NH hd, KV = NKV hd):
//   xn1 = RMSNorm(x) * input_norm
//   qkv = xn1 [q; k; v]^T (+ bias, in the GEMM's epilogue)         one GEMM, (N, Q + 2 KV)
//   qk_norm: q, k per head RMSNorm'd into qkv_rot (the raw qkv stays for the backward)
//   RoPE on the q | k columns (of qkv_rot with qk_norm, else of qkv in place)
//   att = FlashAttention(q, k, v) read in place from the fused buffers via row strides
//   h = x + att o_proj^T                                          residual in the epilogue
//   xn2 = RMSNorm(h) * post_norm; gate_up = xn2 [gate; up]^T       one GEMM, (N, 2F)
//   out = h + SwiGLU(gate_up) down^T                              residual in the epilogue
// Forward saves nothing (the engine checkpoints the input); Backward recomputes the forward
// into the workspace, then back-propagates, accumulating weight gradients in fp32 with beta = 1
// (Linear::BackwardWeight) and norm / bias gradients with fixed-order column sums.
//
// Stream semantics: every call only enqueues work on the stream given at Create and returns;
// nothing synchronizes or allocates after Create. Calls must not overlap (one thread, in order:
// the Linear's plans and the workspaces are shared). Deterministic: the same inputs give the
// same bits (pinned GEMM algorithms, no float atomics).
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_LAYER_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_LAYER_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/common/cuda/flash_attention.h"
#include "examples/gpt/cuda/linear.h"
#include "examples/llama/llama_config.h"
#include "examples/llama/llama_layer_cpu.h"

namespace pipeoffload::llama::cuda {

using bf16 = __nv_bfloat16;
// The flash attention both example models share (examples/common/cuda/flash_attention.h).
using examples::cuda::AttentionDims;
using examples::cuda::FlashAttentionBackward;
using examples::cuda::FlashAttentionBackwardWorkspaceBytes;
using examples::cuda::FlashAttentionForward;

// Byte offsets of the decoder's activations in its workspace, each slot 256-byte aligned; -1 for
// slots the config does not need. The forward part comes first.
struct DecoderCudaSlots {
  // Forward (what the backward reads).
  std::int64_t rstd1 = 0, xn1 = 0, qkv = 0, qkv_rot = -1, rstd_q = -1, rstd_k = -1, att = 0,
               lse = 0, h = 0, rstd2 = 0, xn2 = 0, gate_up = 0, act = 0;
  // Backward only. The MLP's gradients overwrite the forward's act and gate_up in place.
  std::int64_t dh = 0, dtmp = 0, datt = 0, dqkv = 0, flash = 0, norm_scratch = 0, bias_scratch = -1;
  std::int64_t forward_bytes = 0;  // end of the forward part
  std::int64_t bytes = 0;          // the whole workspace
};

// Byte offsets of the head's workspace.
struct HeadCudaSlots {
  std::int64_t rstd = 0, xn = 0, dxn = 0, losses = 0, norm_scratch = 0, chunk = 0;
  std::int64_t bytes = 0;
};

// What LlamaCudaUnits::Create will lay out and allocate, computed without a device (for
// --dry-run plans): the two workspaces, the head's cross-entropy chunk and Create's own bytes.
struct LlamaCudaWorkspaces {
  DecoderCudaSlots decoder;
  HeadCudaSlots head;
  int ce_chunk_rows = 0;
  std::int64_t device_bytes = 0;  // the RoPE table and the Linear's cuBLASLt workspace
};

// The flash attention's dims for the fused QKV layout of `config` (q | k | v per row).
AttentionDims AttentionFor(const LlamaConfig& config, int B, int T);

class LlamaCudaUnits {
 public:
  // Create's layout, without a device. Errors: Create's argument errors.
  [[nodiscard]] static absl::StatusOr<LlamaCudaWorkspaces> PlanWorkspaces(
      const LlamaConfig& config, int B, int T, int ce_chunk_rows);
  // Units of `config` for microbatches of B sequences of T tokens, launching on `stream` of
  // `device` (made current during Create). ce_chunk_rows: rows of logits the head's fused
  // cross-entropy takes at a time; 0 picks the largest chunk that fits in the decoder's
  // workspace (which the engine allocates anyway: its workspace is the largest unit's), at
  // least Liger's (LigerChunkRows); N is the materialised-logits path.
  // Errors: InvalidArgument for a config the kernels do not take (ValidateLlamaConfig's, hd other
  // than 64 or 128, H, F or V not multiples of 8), B, T or ce_chunk_rows out of range (naming
  // the field), or sizes past the kernels' int indexing; the CUDA / cuBLAS calls'.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LlamaCudaUnits>> Create(
      const LlamaConfig& config, int B, int T, int ce_chunk_rows, int device, cudaStream_t stream);
  // Waits (bounded) for the stream, then frees the RoPE table and the Linear.
  ~LlamaCudaUnits();
  LlamaCudaUnits(const LlamaCudaUnits&) = delete;
  LlamaCudaUnits& operator=(const LlamaCudaUnits&) = delete;

  const LlamaConfig& config() const { return config_; }
  int rows() const { return N_; }  // N
  int ce_chunk_rows() const { return ce_chunk_rows_; }
  const DecoderLayout& decoder_layout() const { return layout_; }
  const DecoderCudaSlots& decoder_slots() const { return decoder_; }
  const HeadCudaSlots& head_slots() const { return head_; }
  std::int64_t DecoderWorkspaceBytes() const { return decoder_.bytes; }
  std::int64_t HeadWorkspaceBytes() const { return head_.bytes; }
  // Device bytes Create allocated: the RoPE table and the Linear's cuBLASLt workspace.
  std::int64_t device_bytes() const;
  gpt::cuda::Linear& linear() { return *linear_; }

  // ---- Embedding unit: params = embed_tokens (V, H) bf16 ------------------------------------
  // out (N, H) = params[tokens[n], :]. tokens: N device ints in [0, V).
  [[nodiscard]] absl::Status EmbeddingForward(const bf16* params, const std::int32_t* tokens,
                                              bf16* out);
  // dparams (V, H) fp32 += dout (N, H) scattered by token, rows ascending per token. index:
  // the device copy of BuildTokenRowIndex(tokens, N).ints, `segments` its distinct tokens.
  [[nodiscard]] absl::Status EmbeddingBackward(const std::int32_t* index, int segments,
                                               const bf16* dout, float* dparams);

  // ---- Decoder unit: params (bf16) in DecoderLayout -----------------------------------------
  // out (N, H) from x (N, H); workspace DecoderWorkspaceBytes(). out must not alias x.
  [[nodiscard]] absl::Status DecoderForward(const bf16* params, const bf16* x, bf16* out,
                                            void* workspace);
  // Recomputes the forward from x, then back-propagates dout (N, H): OVERWRITES dx (N, H) and
  // ADDS the parameter gradients into dparams (fp32, DecoderLayout). dx may alias dout (dout is
  // consumed before dx is written); neither may alias x, params or the workspace.
  [[nodiscard]] absl::Status DecoderBackward(const bf16* params, const bf16* x, const bf16* dout,
                                             bf16* dx, float* dparams, void* workspace);

  // ---- Head unit: params = norm (H) | lm_head (V, H), own or borrowed (llama_layer_cpu.h) ---
  // xn = RMSNorm(x) * norm, the fused cross-entropy of xn lm_head^T against targets (N device
  // ints in [0, V)), ce_chunk_rows() rows at a time: OVERWRITES dx (N, H) with the gradient of
  // grad_scale * sum_n loss_n, ADDS the parameter gradients into dparams (H + V * H floats) and
  // OVERWRITES *loss_sum (one device double) with sum_n loss_n (a fixed-order double sum).
  // workspace HeadWorkspaceBytes(); dx must not alias x.
  [[nodiscard]] absl::Status HeadLossBackward(const bf16* params, const bf16* x,
                                              const std::int32_t* targets, float grad_scale,
                                              bf16* dx, float* dparams, double* loss_sum,
                                              void* workspace);

 private:
  LlamaCudaUnits(const LlamaConfig& config, int B, int T, int device, cudaStream_t stream);
  // The forward into the workspace, then out (N, H) unless out is null (the recompute).
  [[nodiscard]] absl::Status DecoderForwardInto(const bf16* params, const bf16* x, bf16* out,
                                                std::byte* ws);
  AttentionDims Attention() const;

  const LlamaConfig config_;
  const int B_, T_, N_, Q_, KV_, QKV_;
  const int device_;
  const cudaStream_t stream_;
  int ce_chunk_rows_ = 0;
  DecoderLayout layout_;
  DecoderCudaSlots decoder_;
  HeadCudaSlots head_;
  std::unique_ptr<gpt::cuda::Linear> linear_;
  float* rope_table_ = nullptr;  // (T, hd/2, 2) device, RopeCosSinTable
  std::int64_t rope_table_bytes_ = 0;
};

}  // namespace pipeoffload::llama::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_CUDA_LLAMA_CUDA_LAYER_H_
