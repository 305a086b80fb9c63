// GemmStageModel: a StageModel that costs what a GPT stage costs on a GPU, without being one.
// Used by pipeline_bench to measure what activation offload costs a real pipeline's step.
//
// A chunk is `layers_per_chunk` layers; a layer's forward is the four bf16 GEMMs of a GPT
// layer's shapes (fp32 accumulation, cuBLAS on the backend's compute stream):
//   [s,h]x[h,3h] (QKV), [s,h]x[h,h] (attention projection), [s,h]x[h,4h] and [s,4h]x[4h,h] (MLP),
// i.e. 24 h^2 s FLOP. The attention core (4 s^2 h FLOP) is not run: the FLOP counts below are
// of the GEMMs actually launched. Backward runs, per GEMM, its input-gradient and its
// weight-gradient GEMM (2x the forward work); with a split backward, Backward runs the
// input-gradient half and BackwardWeight the weight-gradient half.
//
// Memory: SavedBytes = 34 h s bytes per layer (bf16 activations, DESIGN.md section 6). Forward
// writes the layer input and the three GEMM outputs it needs again (18 h s bytes) straight
// into the stash entry and zero-fills the rest; backward's weight-gradient GEMMs read them
// from the entry, so a stash entry that came back wrong would at least be read at full size.
// Numerical values are meaningless, but not constant: weights and inputs are pseudo-random bf16
// (METHOD.md: never time on zeros or constants; one weight set per stage is shared by its
// layers, which changes no GEMM shape).
#ifndef PIPEOFFLOAD_BENCH_GEMM_STAGE_MODEL_H_
#define PIPEOFFLOAD_BENCH_GEMM_STAGE_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/pipeline_bench_plan.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::bench {

struct GemmShape {
  std::int64_t hidden = 4096;    // h
  std::int64_t sequence = 2048;  // s (microbatch size 1)
  int layers_per_chunk = 1;
  int chunks_per_stage = 1;

  // 34 h s bytes per layer.
  std::int64_t SavedBytes() const;
  // The activation between stages: [s, h] bf16.
  std::int64_t BoundaryBytes() const;
  // FLOP of one chunk's forward as launched: 24 h^2 s per layer. Backward is twice that.
  double ForwardFlops() const;
};

// Checks a shape: positive sizes, h a multiple of 64 (tensor-core friendly), and sizes whose
// GEMM dimensions fit cuBLAS's int arguments. Errors: InvalidArgument naming the field.
[[nodiscard]] absl::Status CheckGemmShape(const GemmShape& shape);

// Fills `bytes` of `backend`'s device memory with pseudo-random bf16 uniform in [-scale, scale]
// (a host block of up to 8 MiB from `seed`, repeated) on its compute stream, and waits for it
// (set-up only). Errors: the CUDA calls'.
[[nodiscard]] absl::Status FillRandomBf16(Backend& backend, void* device, std::int64_t bytes,
                                          float scale, std::uint64_t seed);

// The bf16 GEMM rate of this GPU in FLOP/s: C[n,n] = A[n,n] B[n,n] with fp32 accumulation
// (cuBLAS, random operands), the median of `reps` event-timed calls after three warm-ups.
// Errors: the CUDA / cuBLAS calls' (naming them).
[[nodiscard]] absl::StatusOr<double> MeasureGemmRate(Backend& backend, int n, int reps);

// Creates the model on `backend` (a CUDA backend: InvalidArgument otherwise), allocating its
// weights, weight gradients and scratch with cudaMalloc (about 3.2 * 12 h^2 + 20 h s bytes;
// outside the runtime's arena) and a cuBLAS handle bound to the backend's compute stream.
// Errors: ResourceExhausted / Internal naming the CUDA or cuBLAS call.
[[nodiscard]] absl::StatusOr<std::unique_ptr<StageModel>> CreateGemmStageModel(
    Backend& backend, const GemmShape& shape);

}  // namespace pipeoffload::bench

#endif  // PIPEOFFLOAD_BENCH_GEMM_STAGE_MODEL_H_
