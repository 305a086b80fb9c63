// The Llama units on the GPU (llama_cuda_layer.h): workspace layouts, creation, and each unit's
// fixed sequence of GEMMs and kernels, in LlamaCpuUnits' order (llama_layer_cpu.cc) so the two
// read side by side. Every launch goes to stream_; nothing here synchronizes or allocates after
// Create.
#include "examples/llama/cuda/llama_cuda_layer.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/gpt/cuda/gpt_cuda_util.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/llama/cuda/fused_cross_entropy.h"
#include "examples/llama/cuda/llama_cuda_kernels.h"
#include "lib/backend/cuda/cuda_check.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::llama::cuda {
namespace {

using gpt::cuda::LinearDims;

constexpr std::int64_t kBf16 = 2;
constexpr std::int64_t kF32 = 4;

// Hands out 256-byte aligned offsets from a cursor (the GPT layer's SlotCursor).
class SlotCursor {
 public:
  std::int64_t Take(std::int64_t bytes) {
    const std::int64_t at = cursor_;
    cursor_ += gpt::cuda::AlignSlot(bytes);
    return at;
  }
  std::int64_t TakeIf(bool present, std::int64_t bytes) { return present ? Take(bytes) : -1; }
  std::int64_t size() const { return cursor_; }

 private:
  std::int64_t cursor_ = 0;
};

absl::Status Bad(const char* field, std::int64_t value, const char* why) {
  return absl::InvalidArgumentError(
      absl::StrCat("llama cuda units: ", field, " = ", value, ": ", why));
}

absl::Status CheckShapes(const LlamaConfig& c, int B, int T, int ce_chunk_rows) {
  PO_RETURN_IF_ERROR(ValidateLlamaConfig(c));
  if (c.head_dim != 64 && c.head_dim != 128) {
    return Bad("head_dim", c.head_dim, "must be 64 or 128 (the flash attention's head dims)");
  }
  for (const auto& [field, value] : {std::pair<const char*, int>{"hidden_size", c.hidden_size},
                                     {"intermediate_size", c.intermediate_size},
                                     {"vocab_size", c.vocab_size}}) {
    if (value % 8 != 0) {
      return Bad(field, value, "must be a multiple of 8 (cuBLASLt's 16-byte bf16 rows)");
    }
  }
  if (B < 1) return Bad("B", B, "must be >= 1");
  if (T < 1) return Bad("T", T, "must be >= 1");
  const std::int64_t N = std::int64_t{B} * T;
  const std::int64_t widest =
      std::max<std::int64_t>({2 * std::int64_t{c.intermediate_size}, c.hidden_size,
                              (std::int64_t{c.num_heads} + 2 * c.num_kv_heads) * c.head_dim});
  if (N * widest > std::numeric_limits<std::int32_t>::max() ||
      N * c.num_heads > std::numeric_limits<std::int32_t>::max()) {
    return Bad("B * T", N, "too many rows for the kernels' int indexing");
  }
  if (ce_chunk_rows < 0 || ce_chunk_rows > N) {
    return Bad("ce_chunk_rows", ce_chunk_rows, "must be in [0, B * T] (0: automatic)");
  }
  return absl::OkStatus();
}

}  // namespace

LlamaCudaUnits::LlamaCudaUnits(const LlamaConfig& config, int B, int T, int device,
                               cudaStream_t stream)
    : config_(config),
      B_(B),
      T_(T),
      N_(B * T),
      Q_(config.num_heads * config.head_dim),
      KV_(config.num_kv_heads * config.head_dim),
      QKV_(Q_ + 2 * KV_),
      device_(device),
      stream_(stream),
      layout_(MakeDecoderLayout(config)) {}

AttentionDims AttentionFor(const LlamaConfig& c, int B, int T) {
  AttentionDims d;
  d.B = B;
  d.T = T;
  d.NH = c.num_heads;
  d.NKV = c.num_kv_heads;
  d.hd = c.head_dim;
  const std::int64_t q = std::int64_t{c.num_heads} * c.head_dim;
  d.q_row_stride = q + 2 * std::int64_t{c.num_kv_heads} * c.head_dim;
  d.kv_row_stride = d.q_row_stride;
  d.out_row_stride = q;
  return d;
}

AttentionDims LlamaCudaUnits::Attention() const { return AttentionFor(config_, B_, T_); }

absl::StatusOr<LlamaCudaWorkspaces> LlamaCudaUnits::PlanWorkspaces(const LlamaConfig& config,
                                                                    int B, int T,
                                                                    int ce_chunk_rows) {
  PO_RETURN_IF_ERROR(CheckShapes(config, B, T, ce_chunk_rows));
  const LlamaConfig& c = config;
  const std::int64_t N = std::int64_t{B} * T;
  const std::int64_t H = c.hidden_size;
  const std::int64_t F = c.intermediate_size;
  const std::int64_t NH = c.num_heads;
  const std::int64_t NKV = c.num_kv_heads;
  const std::int64_t Q = NH * c.head_dim;
  const std::int64_t QKV = Q + 2 * NKV * c.head_dim;
  LlamaCudaWorkspaces plan;

  // The decoder: forward activations, then the backward's.
  SlotCursor ws;
  DecoderCudaSlots& s = plan.decoder;
  s.rstd1 = ws.Take(N * kF32);
  s.xn1 = ws.Take(N * H * kBf16);
  s.qkv = ws.Take(N * QKV * kBf16);
  s.qkv_rot = ws.TakeIf(c.qk_norm, N * QKV * kBf16);
  s.rstd_q = ws.TakeIf(c.qk_norm, N * NH * kF32);
  s.rstd_k = ws.TakeIf(c.qk_norm, N * NKV * kF32);
  s.att = ws.Take(N * Q * kBf16);
  s.lse = ws.Take(std::int64_t{B} * NH * T * kF32);
  s.h = ws.Take(N * H * kBf16);
  s.rstd2 = ws.Take(N * kF32);
  s.xn2 = ws.Take(N * H * kBf16);
  s.gate_up = ws.Take(N * 2 * F * kBf16);
  s.act = ws.Take(N * F * kBf16);
  s.forward_bytes = ws.size();
  s.dh = ws.Take(N * H * kBf16);
  s.dtmp = ws.Take(N * H * kBf16);
  s.datt = ws.Take(N * Q * kBf16);
  s.dqkv = ws.Take(N * QKV * kBf16);
  const std::int64_t flash = FlashAttentionBackwardWorkspaceBytes(AttentionFor(c, B, T));
  if (flash < 0) return Bad("flash attention workspace", flash, "must be >= 0");
  s.flash = ws.Take(std::max<std::int64_t>(flash, 1));
  const int rows = static_cast<int>(N);
  std::int64_t norm_floats = RmsNormWeightScratchFloats({rows, 1, c.hidden_size, 0});
  if (c.qk_norm) {
    norm_floats =
        std::max({norm_floats, RmsNormWeightScratchFloats({rows, c.num_heads, c.head_dim, 0}),
                  RmsNormWeightScratchFloats({rows, c.num_kv_heads, c.head_dim, 0})});
  }
  s.norm_scratch = ws.Take(norm_floats * kF32);
  s.bias_scratch =
      ws.TakeIf(c.attention_bias, gpt::cuda::BiasScratchFloats(rows, static_cast<int>(QKV)) * kF32);
  s.bytes = ws.size();

  // The head: the fused cross-entropy's chunk as large as the decoder's workspace allows.
  SlotCursor hs;
  HeadCudaSlots& h = plan.head;
  h.rstd = hs.Take(N * kF32);
  h.xn = hs.Take(N * H * kBf16);
  h.dxn = hs.Take(N * H * kBf16);
  h.losses = hs.Take(N * kF32);
  h.norm_scratch = hs.Take(RmsNormWeightScratchFloats({rows, 1, c.hidden_size, 0}) * kF32);
  if (ce_chunk_rows == 0) {
    const int liger = LigerChunkRows(rows, c.hidden_size, c.vocab_size);
    const std::int64_t budget =
        std::max(s.bytes - hs.size(), std::int64_t{liger} * c.vocab_size * kBf16);
    ce_chunk_rows = EvenChunkRows(rows, c.vocab_size, budget);
  }
  plan.ce_chunk_rows = ce_chunk_rows;
  h.chunk = hs.Take(
      FusedCrossEntropyWorkspaceBytes({rows, c.hidden_size, c.vocab_size, ce_chunk_rows}));
  h.bytes = hs.size();
  plan.device_bytes = static_cast<std::int64_t>(T) * (c.head_dim / 2) * 2 * 4 +
                      gpt::cuda::Linear::kWorkspaceBytes;
  return plan;
}

absl::StatusOr<std::unique_ptr<LlamaCudaUnits>> LlamaCudaUnits::Create(
    const LlamaConfig& config, int B, int T, int ce_chunk_rows, int device, cudaStream_t stream) {
  PO_ASSIGN_OR_RETURN(const LlamaCudaWorkspaces plan, PlanWorkspaces(config, B, T, ce_chunk_rows));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device));
  std::unique_ptr<LlamaCudaUnits> units(new LlamaCudaUnits(config, B, T, device, stream));
  const LlamaConfig& c = config;
  units->decoder_ = plan.decoder;
  units->head_ = plan.head;
  units->ce_chunk_rows_ = plan.ce_chunk_rows;
  PO_ASSIGN_OR_RETURN(units->linear_, gpt::cuda::Linear::Create(stream));
  const std::vector<float> inv_freq = RopeInvFreq(c);
  const std::vector<float> table = RopeCosSinTable(inv_freq.data(), T, c.head_dim);
  units->rope_table_bytes_ = static_cast<std::int64_t>(table.size() * sizeof(float));
  void* rope = nullptr;
  PO_CUDA_RETURN_IF_ERROR(cudaMalloc(&rope, static_cast<std::size_t>(units->rope_table_bytes_)));
  units->rope_table_ = static_cast<float*>(rope);
  // Once, at creation: a synchronous copy (the table must be there before any launch).
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpy(rope, table.data(),
                                     static_cast<std::size_t>(units->rope_table_bytes_),
                                     cudaMemcpyHostToDevice));
  return units;
}

LlamaCudaUnits::~LlamaCudaUnits() {
  internal::ScopedDevice guard;
  if (!guard.Enter(device_).ok()) return;
  static_cast<void>(gpt::cuda::WaitForStream(stream_, 120.0, "~LlamaCudaUnits"));
  linear_.reset();
  if (rope_table_ != nullptr) PO_CUDA_LOG_IF_ERROR(cudaFree(rope_table_));
}

std::int64_t LlamaCudaUnits::device_bytes() const {
  return rope_table_bytes_ + gpt::cuda::Linear::kWorkspaceBytes;
}

absl::Status LlamaCudaUnits::EmbeddingForward(const bf16* params, const std::int32_t* tokens,
                                              bf16* out) {
  return cuda::EmbeddingForward(out, tokens, params, N_, config_.hidden_size, stream_);
}

absl::Status LlamaCudaUnits::EmbeddingBackward(const std::int32_t* index, int segments,
                                               const bf16* dout, float* dparams) {
  return cuda::EmbeddingBackward(dparams, dout, index, segments, N_, config_.hidden_size, stream_);
}

absl::Status LlamaCudaUnits::DecoderForward(const bf16* params, const bf16* x, bf16* out,
                                            void* workspace) {
  if (params == nullptr || x == nullptr || out == nullptr || workspace == nullptr) {
    return absl::InvalidArgumentError("DecoderForward: null params, x, out or workspace");
  }
  return DecoderForwardInto(params, x, out, static_cast<std::byte*>(workspace));
}

absl::Status LlamaCudaUnits::DecoderForwardInto(const bf16* params, const bf16* x, bf16* out,
                                                std::byte* ws) {
  const LlamaConfig& c = config_;
  const DecoderCudaSlots& s = decoder_;
  const DecoderLayout& p = layout_;
  const int N = N_, H = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int NH = c.num_heads, NKV = c.num_kv_heads;
  const float eps = c.rms_norm_eps;
  auto bf = [ws](std::int64_t offset) { return reinterpret_cast<bf16*>(ws + offset); };
  auto f32 = [ws](std::int64_t offset) { return reinterpret_cast<float*>(ws + offset); };
  gpt::cuda::Linear& linear = *linear_;
  bf16* xn1 = bf(s.xn1);          // (N, H)
  bf16* qkv = bf(s.qkv);          // (N, Q + 2 KV): the projection's output
  bf16* h = bf(s.h);              // (N, H) the residual stream after attention
  bf16* gate_up = bf(s.gate_up);  // (N, 2F)

  PO_RETURN_IF_ERROR(
      RmsNormForward(xn1, f32(s.rstd1), x, params + p.input_norm, {N, 1, H, 0}, eps, stream_));
  PO_RETURN_IF_ERROR(linear.Forward(qkv, xn1, params + p.qkv,
                                    p.qkv_bias >= 0 ? params + p.qkv_bias : nullptr, nullptr,
                                    nullptr, LinearDims{.N = N, .IC = H, .OC = QKV_}));
  // q | k as the attention reads them: normalized into qkv_rot (qk_norm; the raw projection
  // stays for the norm's backward), else qkv itself; then rotated in place, in one call.
  bf16* qk = qkv;
  if (c.qk_norm) {
    qk = bf(s.qkv_rot);
    PO_RETURN_IF_ERROR(
        RmsNormForward(qk, f32(s.rstd_q), qkv, params + p.q_norm, {N, NH, hd, QKV_}, eps, stream_));
    PO_RETURN_IF_ERROR(RmsNormForward(qk + Q_, f32(s.rstd_k), qkv + Q_, params + p.k_norm,
                                      {N, NKV, hd, QKV_}, eps, stream_));
  }
  PO_RETURN_IF_ERROR(RopeForward(qk, rope_table_, N, T_, NH + NKV, hd, QKV_, stream_));
  PO_RETURN_IF_ERROR(FlashAttentionForward(bf(s.att), f32(s.lse), qk, qk + Q_, qkv + Q_ + KV_,
                                           Attention(), stream_));
  PO_RETURN_IF_ERROR(linear.Forward(h, bf(s.att), params + p.o_proj, nullptr, /*residual=*/x,
                                    nullptr, LinearDims{.N = N, .IC = Q_, .OC = H}));
  PO_RETURN_IF_ERROR(
      RmsNormForward(bf(s.xn2), f32(s.rstd2), h, params + p.post_norm, {N, 1, H, 0}, eps, stream_));
  PO_RETURN_IF_ERROR(linear.Forward(gate_up, bf(s.xn2), params + p.gate_up, nullptr, nullptr,
                                    nullptr, LinearDims{.N = N, .IC = H, .OC = 2 * F}));
  PO_RETURN_IF_ERROR(SwiGluForward(bf(s.act), gate_up, N, F, stream_));
  if (out == nullptr) return absl::OkStatus();
  return linear.Forward(out, bf(s.act), params + p.down, nullptr, /*residual=*/h, nullptr,
                        LinearDims{.N = N, .IC = F, .OC = H});
}

absl::Status LlamaCudaUnits::DecoderBackward(const bf16* params, const bf16* x, const bf16* dout,
                                             bf16* dx, float* dparams, void* workspace) {
  if (params == nullptr || x == nullptr || dout == nullptr || dx == nullptr || dparams == nullptr ||
      workspace == nullptr) {
    return absl::InvalidArgumentError(
        "DecoderBackward: null params, x, dout, dx, dparams or workspace");
  }
  auto* ws = static_cast<std::byte*>(workspace);
  PO_RETURN_IF_ERROR(DecoderForwardInto(params, x, nullptr, ws));
  const LlamaConfig& c = config_;
  const DecoderCudaSlots& s = decoder_;
  const DecoderLayout& p = layout_;
  const int N = N_, H = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int NH = c.num_heads, NKV = c.num_kv_heads;
  auto bf = [ws](std::int64_t offset) { return reinterpret_cast<bf16*>(ws + offset); };
  auto f32 = [ws](std::int64_t offset) { return reinterpret_cast<float*>(ws + offset); };
  gpt::cuda::Linear& linear = *linear_;
  bf16* dh = bf(s.dh);            // (N, H) gradient of h
  bf16* dtmp = bf(s.dtmp);        // (N, H) gradient of xn2, then of xn1
  bf16* act = bf(s.act);          // (N, F) act, then its gradient
  bf16* gate_up = bf(s.gate_up);  // (N, 2F) gate_up, then its gradient
  bf16* dqkv = bf(s.dqkv);        // (N, Q + 2 KV) dq | dk | dv
  float* norm_scratch = f32(s.norm_scratch);
  const bf16* qkv = bf(s.qkv);
  const bf16* qk = c.qk_norm ? bf(s.qkv_rot) : qkv;

  // MLP: out = h + act down^T. The weight gradient first: act is overwritten by its gradient.
  const LinearDims down{.N = N, .IC = F, .OC = H};
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dparams + p.down, dout, act, down));
  PO_RETURN_IF_ERROR(linear.BackwardInput(act, dout, params + p.down, nullptr, down));
  PO_RETURN_IF_ERROR(SwiGluBackward(gate_up, act, gate_up, N, F, stream_));
  const LinearDims up{.N = N, .IC = H, .OC = 2 * F};
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dparams + p.gate_up, gate_up, bf(s.xn2), up));
  PO_RETURN_IF_ERROR(linear.BackwardInput(dtmp, gate_up, params + p.gate_up, nullptr, up));
  PO_RETURN_IF_ERROR(RmsNormBackwardWeight(dparams + p.post_norm, norm_scratch, dtmp, bf(s.h),
                                           f32(s.rstd2), {N, 1, H, 0}, stream_));
  // dh = the norm's input gradient + dout (the residual); dout is not read after this.
  PO_RETURN_IF_ERROR(RmsNormBackwardInput(dh, dtmp, /*residual=*/dout, bf(s.h),
                                          params + p.post_norm, f32(s.rstd2), {N, 1, H, 0},
                                          stream_));
  // Attention: h = x + att o_proj^T.
  const LinearDims o{.N = N, .IC = Q_, .OC = H};
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dparams + p.o_proj, dh, bf(s.att), o));
  PO_RETURN_IF_ERROR(linear.BackwardInput(bf(s.datt), dh, params + p.o_proj, nullptr, o));
  PO_RETURN_IF_ERROR(FlashAttentionBackward(dqkv, dqkv + Q_, dqkv + Q_ + KV_, ws + s.flash,
                                            bf(s.datt), bf(s.att), f32(s.lse), qk, qk + Q_,
                                            qkv + Q_ + KV_, Attention(), stream_));
  PO_RETURN_IF_ERROR(RopeBackward(dqkv, rope_table_, N, T_, NH + NKV, hd, QKV_, stream_));
  if (c.qk_norm) {
    // Weight gradients before the in-place input gradients overwrite dq, dk.
    const RmsNormShape qn{N, NH, hd, QKV_};
    const RmsNormShape kn{N, NKV, hd, QKV_};
    PO_RETURN_IF_ERROR(RmsNormBackwardWeight(dparams + p.q_norm, norm_scratch, dqkv, qkv,
                                             f32(s.rstd_q), qn, stream_));
    PO_RETURN_IF_ERROR(RmsNormBackwardInput(dqkv, dqkv, nullptr, qkv, params + p.q_norm,
                                            f32(s.rstd_q), qn, stream_));
    PO_RETURN_IF_ERROR(RmsNormBackwardWeight(dparams + p.k_norm, norm_scratch, dqkv + Q_, qkv + Q_,
                                             f32(s.rstd_k), kn, stream_));
    PO_RETURN_IF_ERROR(RmsNormBackwardInput(dqkv + Q_, dqkv + Q_, nullptr, qkv + Q_,
                                            params + p.k_norm, f32(s.rstd_k), kn, stream_));
  }
  const LinearDims proj{.N = N, .IC = H, .OC = QKV_};
  PO_RETURN_IF_ERROR(linear.BackwardWeight(dparams + p.qkv, dqkv, bf(s.xn1), proj));
  if (p.qkv_bias >= 0) {
    PO_RETURN_IF_ERROR(
        gpt::cuda::BiasBackward(dparams + p.qkv_bias, f32(s.bias_scratch), dqkv, N, QKV_, stream_));
  }
  PO_RETURN_IF_ERROR(linear.BackwardInput(dtmp, dqkv, params + p.qkv, nullptr, proj));
  PO_RETURN_IF_ERROR(RmsNormBackwardWeight(dparams + p.input_norm, norm_scratch, dtmp, x,
                                           f32(s.rstd1), {N, 1, H, 0}, stream_));
  return RmsNormBackwardInput(dx, dtmp, /*residual=*/dh, x, params + p.input_norm, f32(s.rstd1),
                              {N, 1, H, 0}, stream_);
}

absl::Status LlamaCudaUnits::HeadLossBackward(const bf16* params, const bf16* x,
                                              const std::int32_t* targets, float grad_scale,
                                              bf16* dx, float* dparams, double* loss_sum,
                                              void* workspace) {
  if (params == nullptr || x == nullptr || targets == nullptr || dx == nullptr ||
      dparams == nullptr || loss_sum == nullptr || workspace == nullptr) {
    return absl::InvalidArgumentError(
        "HeadLossBackward: null params, x, targets, dx, dparams, loss_sum or workspace");
  }
  auto* ws = static_cast<std::byte*>(workspace);
  const HeadCudaSlots& s = head_;
  const int N = N_, H = config_.hidden_size, V = config_.vocab_size;
  auto bf = [ws](std::int64_t offset) { return reinterpret_cast<bf16*>(ws + offset); };
  auto f32 = [ws](std::int64_t offset) { return reinterpret_cast<float*>(ws + offset); };
  bf16* xn = bf(s.xn);    // (N, H)
  bf16* dxn = bf(s.dxn);  // (N, H)
  float* rstd = f32(s.rstd);
  float* losses = f32(s.losses);  // (N)
  const RmsNormShape norm{N, 1, H, 0};
  PO_RETURN_IF_ERROR(RmsNormForward(xn, rstd, x, params, norm, config_.rms_norm_eps, stream_));
  PO_RETURN_IF_ERROR(FusedLinearCrossEntropy(*linear_, dxn, dparams + H, losses, ws + s.chunk, xn,
                                             params + H, targets, {N, H, V, ce_chunk_rows_},
                                             grad_scale, stream_));
  PO_RETURN_IF_ERROR(
      RmsNormBackwardWeight(dparams, f32(s.norm_scratch), dxn, x, rstd, norm, stream_));
  PO_RETURN_IF_ERROR(RmsNormBackwardInput(dx, dxn, nullptr, x, params, rstd, norm, stream_));
  return SumToDouble(loss_sum, losses, N, stream_);
}

}  // namespace pipeoffload::llama::cuda
