// GemmStageModel (see the header). Invariants:
//  - Every launch goes to the backend's compute stream, with the backend's device current
//    (ScopedDevice), so the executor's events on that stream order it with offload copies.
//  - Buffers the executor passes in are only used within the call (StageModel contract); the
//    model's own buffers are cudaMalloc'd once, at Create, and freed in the destructor after a
//    stream synchronize (the executor's queued work may still use them).
//  - Row-major GEMMs are issued as column-major ones with swapped operands (Gemm below).
#include "bench/gemm_stage_model.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/backend/cuda/cuda_status.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/cuda_stream.h"

namespace pipeoffload::bench {
namespace {

constexpr std::int64_t kBf16 = 2;  // bytes per element
// Magnitudes of the pseudo-random fills: inputs and gradients O(1); weights small enough that
// a layer's outputs stay O(1) over h-long sums, so nothing overflows bf16 across many layers.
constexpr float kActivationScale = 1.0f;
constexpr float kWeightScale = 0.01f;
constexpr std::int64_t kRandomBlockBytes = std::int64_t{8} << 20;

// bf16 bits of x (round to nearest even).
std::uint16_t ToBf16(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof(bits));
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>(bits >> 16);
}

absl::Status FillRandom(void* device, std::int64_t bytes, float scale, std::uint64_t seed,
                        cudaStream_t stream) {
  const std::int64_t block = std::min(bytes, kRandomBlockBytes) / kBf16 * kBf16;
  if (block <= 0) return absl::OkStatus();
  std::vector<std::uint16_t> host(static_cast<std::size_t>(block / kBf16));
  std::uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::uint16_t& value : host) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG; top bits used
    const float unit = static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
    value = ToBf16((2.0f * unit - 1.0f) * scale);
  }
  char* base = static_cast<char*>(device);
  PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base, host.data(), static_cast<std::size_t>(block),
                                          cudaMemcpyHostToDevice, stream));
  for (std::int64_t offset = block; offset < bytes; offset += block) {
    const std::int64_t n = std::min(block, bytes - offset);
    PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + offset, base, static_cast<std::size_t>(n),
                                            cudaMemcpyDeviceToDevice, stream));
  }
  PO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // set-up only; `host` dies here
  return absl::OkStatus();
}

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const auto code = status == CUBLAS_STATUS_ALLOC_FAILED ? absl::StatusCode::kResourceExhausted
                                                         : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat("gemm stage model: ", what, " failed with cuBLAS status ",
                                         static_cast<int>(status)));
}

#define PO_CUBLAS_RETURN_IF_ERROR(call) PO_RETURN_IF_ERROR(CublasStatus((call), #call))

class GemmStageModel final : public StageModel {
 public:
  GemmStageModel(const GemmShape& shape, int device, cudaStream_t stream)
      : shape_(shape), device_(device), stream_(stream) {}

  ~GemmStageModel() override {
    internal::ScopedDevice guard;
    if (!guard.Enter(device_).ok()) return;
    cudaStreamSynchronize(stream_);  // teardown only: queued GEMMs may use our buffers
    if (handle_ != nullptr) cublasDestroy(handle_);
    for (void* buffer : allocations_) cudaFree(buffer);
  }

  absl::Status Init();

  std::int64_t SavedBytes(int, bool) const override { return shape_.SavedBytes(); }
  std::int64_t BoundaryBytes() const override { return shape_.BoundaryBytes(); }

  absl::Status Forward(int mb, int chunk, const void* input, void* output, void* saved) override;
  absl::Status Backward(int mb, int chunk, const void* grad_output, void* grad_input,
                        void* saved, bool with_weight_grad) override;
  absl::Status BackwardWeight(int mb, int chunk, void* saved) override;

 private:
  // Weight matrices, row-major: qkv [h,3h], proj [h,h], fc1 [h,4h], fc2 [4h,h].
  enum Matrix { kQkv, kProj, kFc1, kFc2, kNumMatrices };
  // Pointers into one layer's stash entry (elements of [s, *]): the layer input x [s,h], the
  // QKV output [s,3h], the projection output a [s,h] and the MLP hidden [s,4h].
  struct Saved {
    void* x;
    void* qkv;
    void* a;
    void* hidden;
  };

  Saved LayerSaved(void* saved, int layer) const;
  // Row-major C[m,n] = op(A)[m,k] * op(B)[k,n] (+ C when accumulate), bf16 in and out, fp32
  // accumulation. A is stored [m,k] (or [k,m] when trans_a); B [k,n] (or [n,k] when trans_b).
  absl::Status Gemm(std::int64_t m, std::int64_t n, std::int64_t k, const void* a, bool trans_a,
                    const void* b, bool trans_b, void* c, bool accumulate);
  absl::Status InputGrads(const Saved& layer, const void* dy, void* dx);
  absl::Status WeightGrads(const Saved& layer);
  absl::StatusOr<void*> Allocate(std::int64_t bytes, float scale);

  const GemmShape shape_;
  const int device_;
  const cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  std::vector<void*> allocations_;
  std::array<void*, kNumMatrices> weights_{};
  std::array<void*, kNumMatrices> weight_grads_{};
  // Scratch [s, *] activations and gradients, reused by every call.
  void* tokens_ = nullptr;   // [s,h] input of virtual stage 0
  void* y_ = nullptr;        // [s,h] layer output ping
  void* y2_ = nullptr;       // [s,h] layer output pong
  void* dy_ = nullptr;       // [s,h] gradient ping (also the loss gradient of the last stage)
  void* dy2_ = nullptr;      // [s,h] gradient pong
  void* dhidden_ = nullptr;  // [s,4h]
  void* dqkv_ = nullptr;     // [s,3h]
  void* da_ = nullptr;       // [s,h]
};

absl::StatusOr<void*> GemmStageModel::Allocate(std::int64_t bytes, float scale) {
  void* buffer = nullptr;
  PO_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer, static_cast<std::size_t>(bytes)));
  allocations_.push_back(buffer);
  PO_RETURN_IF_ERROR(FillRandom(buffer, bytes, scale, allocations_.size(), stream_));
  return buffer;
}

absl::Status GemmStageModel::Init() {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const std::int64_t h = shape_.hidden;
  const std::int64_t s = shape_.sequence;
  const std::array<std::int64_t, kNumMatrices> weight_elements = {h * 3 * h, h * h, h * 4 * h,
                                                                  4 * h * h};
  for (int i = 0; i < kNumMatrices; ++i) {
    PO_ASSIGN_OR_RETURN(weights_[static_cast<std::size_t>(i)],
                        Allocate(weight_elements[static_cast<std::size_t>(i)] * kBf16,
                                 kWeightScale));
    PO_ASSIGN_OR_RETURN(weight_grads_[static_cast<std::size_t>(i)],
                        Allocate(weight_elements[static_cast<std::size_t>(i)] * kBf16,
                                 kWeightScale));
  }
  for (void** buffer : {&tokens_, &y_, &y2_, &dy_, &dy2_, &da_}) {
    PO_ASSIGN_OR_RETURN(*buffer, Allocate(s * h * kBf16, kActivationScale));
  }
  PO_ASSIGN_OR_RETURN(dhidden_, Allocate(s * 4 * h * kBf16, kActivationScale));
  PO_ASSIGN_OR_RETURN(dqkv_, Allocate(s * 3 * h * kBf16, kActivationScale));
  PO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle_));
  PO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, stream_));
  // Default math mode: bf16 inputs with CUBLAS_COMPUTE_32F use tensor cores.
  return absl::OkStatus();
}

GemmStageModel::Saved GemmStageModel::LayerSaved(void* saved, int layer) const {
  const std::int64_t sh = shape_.sequence * shape_.hidden * kBf16;  // bytes of one [s,h]
  char* base = static_cast<char*>(saved) + static_cast<std::int64_t>(layer) * 34 * sh / kBf16;
  return Saved{base, base + sh, base + 4 * sh, base + 5 * sh};
}

absl::Status GemmStageModel::Gemm(std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
                                  bool trans_a, const void* b, bool trans_b, void* c,
                                  bool accumulate) {
  // Row-major C = A B is column-major C^T = B^T A^T: pass B first, dimensions (n, m, k).
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  PO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, CUDA_R_16BF,
      static_cast<int>(trans_b ? k : n), a, CUDA_R_16BF, static_cast<int>(trans_a ? m : k), &beta,
      c, CUDA_R_16BF, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status GemmStageModel::Forward(int, int, const void* input, void* output, void* saved) {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const std::int64_t h = shape_.hidden;
  const std::int64_t s = shape_.sequence;
  const void* x = input != nullptr ? input : tokens_;
  for (int layer = 0; layer < shape_.layers_per_chunk; ++layer) {
    const Saved entry = LayerSaved(saved, layer);
    PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(entry.x, x, static_cast<std::size_t>(s * h * kBf16),
                                            cudaMemcpyDeviceToDevice, stream_));
    PO_RETURN_IF_ERROR(Gemm(s, 3 * h, h, entry.x, false, weights_[kQkv], false, entry.qkv, false));
    PO_RETURN_IF_ERROR(Gemm(s, h, h, entry.x, false, weights_[kProj], false, entry.a, false));
    PO_RETURN_IF_ERROR(Gemm(s, 4 * h, h, entry.a, false, weights_[kFc1], false, entry.hidden,
                            false));
    const bool last = layer == shape_.layers_per_chunk - 1;
    void* y = last && output != nullptr ? output : (layer % 2 == 0 ? y_ : y2_);
    PO_RETURN_IF_ERROR(Gemm(s, h, 4 * h, entry.hidden, false, weights_[kFc2], false, y, false));
    // The rest of the layer's 34 h s bytes (norm inputs, dropout masks, attention scores in a
    // real layer): written, so the entry is produced in full like a real one.
    char* rest = static_cast<char*>(entry.hidden) + s * 4 * h * kBf16;
    PO_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(rest, 0, static_cast<std::size_t>(16 * s * h), stream_));
    x = y;
  }
  return absl::OkStatus();
}

absl::Status GemmStageModel::InputGrads(const Saved& layer, const void* dy, void* dx) {
  const std::int64_t h = shape_.hidden;
  const std::int64_t s = shape_.sequence;
  // d hidden = dy fc2^T; d a = d hidden fc1^T; dx = d a proj^T + d qkv qkv^T (accumulated).
  PO_RETURN_IF_ERROR(Gemm(s, 4 * h, h, dy, false, weights_[kFc2], true, dhidden_, false));
  PO_RETURN_IF_ERROR(Gemm(s, h, 4 * h, dhidden_, false, weights_[kFc1], true, da_, false));
  PO_RETURN_IF_ERROR(Gemm(s, h, h, da_, false, weights_[kProj], true, dx, false));
  // The attention core is not modelled, so d qkv is scratch of the right shape.
  PO_RETURN_IF_ERROR(Gemm(s, h, 3 * h, dqkv_, false, weights_[kQkv], true, dx, true));
  static_cast<void>(layer);
  return absl::OkStatus();
}

absl::Status GemmStageModel::WeightGrads(const Saved& layer) {
  const std::int64_t h = shape_.hidden;
  const std::int64_t s = shape_.sequence;
  // dW = X^T dY for each GEMM, X read from the stash entry, accumulated over microbatches.
  PO_RETURN_IF_ERROR(Gemm(4 * h, h, s, layer.hidden, true, dy_, false, weight_grads_[kFc2], true));
  PO_RETURN_IF_ERROR(Gemm(h, 4 * h, s, layer.a, true, dhidden_, false, weight_grads_[kFc1], true));
  PO_RETURN_IF_ERROR(Gemm(h, h, s, layer.x, true, da_, false, weight_grads_[kProj], true));
  PO_RETURN_IF_ERROR(Gemm(h, 3 * h, s, layer.x, true, dqkv_, false, weight_grads_[kQkv], true));
  return absl::OkStatus();
}

absl::Status GemmStageModel::Backward(int, int, const void* grad_output, void* grad_input,
                                      void* saved, bool with_weight_grad) {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  const std::int64_t bytes = shape_.sequence * shape_.hidden * kBf16;
  if (grad_output != nullptr) {
    PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dy_, grad_output, static_cast<std::size_t>(bytes),
                                            cudaMemcpyDeviceToDevice, stream_));
  }
  for (int layer = shape_.layers_per_chunk - 1; layer >= 0; --layer) {
    const Saved entry = LayerSaved(saved, layer);
    const bool first = layer == 0;
    void* dx = first && grad_input != nullptr ? grad_input : dy2_;
    PO_RETURN_IF_ERROR(InputGrads(entry, dy_, dx));
    if (with_weight_grad) PO_RETURN_IF_ERROR(WeightGrads(entry));
    if (dx == dy2_) {
      PO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dy_, dy2_, static_cast<std::size_t>(bytes),
                                              cudaMemcpyDeviceToDevice, stream_));
    }
  }
  return absl::OkStatus();
}

absl::Status GemmStageModel::BackwardWeight(int, int, void* saved) {
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device_));
  for (int layer = shape_.layers_per_chunk - 1; layer >= 0; --layer) {
    PO_RETURN_IF_ERROR(WeightGrads(LayerSaved(saved, layer)));
  }
  return absl::OkStatus();
}

}  // namespace

std::int64_t GemmShape::SavedBytes() const { return 34 * hidden * sequence * layers_per_chunk; }
std::int64_t GemmShape::BoundaryBytes() const { return hidden * sequence * kBf16; }
double GemmShape::ForwardFlops() const {
  return 24.0 * static_cast<double>(hidden) * static_cast<double>(hidden) *
         static_cast<double>(sequence) * layers_per_chunk;
}

absl::Status CheckGemmShape(const GemmShape& shape) {
  if (shape.hidden <= 0 || shape.hidden % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden must be a positive multiple of 64, got ", shape.hidden));
  }
  if (shape.sequence <= 0 || shape.sequence % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq must be a positive multiple of 8, got ", shape.sequence));
  }
  if (shape.layers_per_chunk < 1 || shape.layers_per_chunk > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layers-per-chunk must be in [1, 64], got ", shape.layers_per_chunk));
  }
  if (shape.chunks_per_stage < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunks must be at least 1, got ", shape.chunks_per_stage));
  }
  constexpr std::int64_t kMaxDim = std::numeric_limits<int>::max();
  if (4 * shape.hidden > kMaxDim || shape.sequence > kMaxDim ||
      shape.SavedBytes() / shape.layers_per_chunk > (std::int64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat("--hidden ", shape.hidden, " / --seq ",
                                                   shape.sequence, " are too large"));
  }
  return absl::OkStatus();
}

namespace {

// cudaMalloc'd buffers and events of one measurement, released on every path.
struct Scratch {
  std::vector<void*> buffers;
  std::vector<cudaEvent_t> events;
  ~Scratch() {
    for (void* buffer : buffers) cudaFree(buffer);
    for (cudaEvent_t event : events) cudaEventDestroy(event);
  }
};

// Runs `call` between two events on `stream` and returns its milliseconds (waits for it).
template <typename Call>
absl::StatusOr<double> TimeOnStream(cudaStream_t stream, Scratch& scratch, Call&& call) {
  std::array<cudaEvent_t, 2> events{};
  for (cudaEvent_t& event : events) {
    PO_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
    scratch.events.push_back(event);
  }
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(events[0], stream));
  PO_RETURN_IF_ERROR(call());
  PO_CUDA_RETURN_IF_ERROR(cudaEventRecord(events[1], stream));
  // Bounded like the backend's waits: a hung GEMM must surface, not block forever.
  absl::StatusOr<bool> done = internal::PollUntil(
      [&]() -> absl::StatusOr<bool> {
        const cudaError_t error = cudaEventQuery(events[1]);
        if (error == cudaErrorNotReady) return false;
        PO_CUDA_RETURN_IF_ERROR(error);
        return true;
      },
      /*timeout_seconds=*/120.0);
  if (!done.ok()) return done.status();
  if (!*done) return absl::DeadlineExceededError("MeasureChunkTimes: a chunk took over 120 s");
  float ms = 0.0f;
  PO_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events[0], events[1]));
  return static_cast<double>(ms);
}

double MedianOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

absl::Status FillRandomBf16(Backend& backend, void* device, std::int64_t bytes, float scale,
                            std::uint64_t seed) {
  PO_ASSIGN_OR_RETURN(const int ordinal, CudaBackendDevice(backend));
  PO_ASSIGN_OR_RETURN(cudaStream_t stream, CudaComputeStream(backend));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(ordinal));
  return FillRandom(device, bytes, scale, seed, stream);
}

absl::StatusOr<double> MeasureGemmRate(Backend& backend, int n, int reps) {
  if (n < 64 || n > 32768 || reps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MeasureGemmRate: n must be in [64, 32768] and reps >= 1 (got n=", n,
                     ", reps=", reps, ")"));
  }
  PO_ASSIGN_OR_RETURN(const int device, CudaBackendDevice(backend));
  PO_ASSIGN_OR_RETURN(cudaStream_t stream, CudaComputeStream(backend));
  internal::ScopedDevice guard;
  PO_RETURN_IF_ERROR(guard.Enter(device));
  Scratch scratch;
  const std::int64_t bytes = std::int64_t{n} * n * kBf16;
  std::array<void*, 3> matrices{};  // A, B, C
  for (std::size_t i = 0; i < matrices.size(); ++i) {
    PO_CUDA_RETURN_IF_ERROR(cudaMalloc(&matrices[i], static_cast<std::size_t>(bytes)));
    scratch.buffers.push_back(matrices[i]);
    PO_RETURN_IF_ERROR(FillRandom(matrices[i], bytes, kActivationScale, 100 + i, stream));
  }
  cublasHandle_t handle = nullptr;
  PO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
  struct HandleGuard {
    cublasHandle_t handle;
    ~HandleGuard() { cublasDestroy(handle); }
  } handle_guard{handle};
  PO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  const float alpha = 1.0f;
  const float beta = 0.0f;
  auto gemm = [&]() -> absl::Status {
    PO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                                           matrices[0], CUDA_R_16BF, n, matrices[1], CUDA_R_16BF,
                                           n, &beta, matrices[2], CUDA_R_16BF, n,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  };
  std::vector<double> seconds;
  constexpr int kWarmup = 3;
  for (int rep = 0; rep < kWarmup + reps; ++rep) {
    PO_ASSIGN_OR_RETURN(const double ms, TimeOnStream(stream, scratch, gemm));
    if (rep >= kWarmup) seconds.push_back(ms / 1e3);
  }
  return 2.0 * n * static_cast<double>(n) * n / MedianOf(seconds);
}

absl::StatusOr<std::unique_ptr<StageModel>> CreateGemmStageModel(Backend& backend,
                                                                 const GemmShape& shape) {
  PO_RETURN_IF_ERROR(CheckGemmShape(shape));
  PO_ASSIGN_OR_RETURN(const int device, CudaBackendDevice(backend));
  PO_ASSIGN_OR_RETURN(cudaStream_t stream, CudaComputeStream(backend));
  auto model = std::make_unique<GemmStageModel>(shape, device, stream);
  PO_RETURN_IF_ERROR(model->Init());
  return std::unique_ptr<StageModel>(std::move(model));
}

}  // namespace pipeoffload::bench
