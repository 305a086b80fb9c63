// The GPT layer stack on the GPU, for benchmarks: a pipeoffload::StageModel whose chunks are
// `layers_per_chunk` GPT layers each (pre-LN: LN, QKV linear, causal attention, projection,
// residual, LN, 4h linear + GELU, projection, residual), in bf16 with fp32 accumulation, run by
// the same layer code as the full CUDA GPT (gpt_cuda_chunk.h). No embedding, head or loss:
//  - virtual stage 0's Forward reads a fixed random bf16 input [batch, seq, hidden] (filled once
//    at creation) instead of tokens;
//  - the last virtual stage's Backward starts from a fixed random bf16 output gradient, and its
//    Forward output (the StageModel contract lets it be null there) goes to scratch.
// Parameters are bf16 working copies (random normal, std 0.02; LayerNorm weights 1, biases 0;
// deterministic in `seed`) with fp32 gradient accumulators; there is no optimizer state, since
// a benchmark of the pipeline step has no use for one.
//
// Target: po_gpt_cuda. Launches go to the backend's compute stream (CudaComputeStream), so the
// executor's events order them with the offload copies.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_LAYER_STACK_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_LAYER_STACK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::gpt::cuda {

struct LayerStackShape {
  std::int64_t hidden = 4096;  // h = C
  int heads = 32;              // NH; head size h / NH must be 64 or 128
  std::int64_t seq = 2048;     // T
  int batch = 1;               // B, sequences per microbatch
  int layers_per_chunk = 1;
  int chunks_per_stage = 1;
  std::uint64_t seed = 1;
  // Lean saved activations (LayerDims::lean_saved, gpt_cuda_layer.h): each layer saves 20 h
  // instead of 32 h bytes per token; the weight backward recomputes the two LayerNorm outputs
  // and the GELU output it needs. Forward outputs and input gradients are bitwise the same.
  bool lean_saved = false;
  // Offer recompute (StageModel::RetainedBytes >= 0): kFull keeps a chunk's input (2 h bytes
  // per token) and reruns its forward before B; kLean (not with lean_saved) keeps the lean
  // layout and rebuilds ln1, ln2 and g: with a split backward into a full entry
  // (RecomputeSaved), with an unsplit one inside B, which reads the lean block as it is
  // (BackwardReadsRetained: no copy, no full entry; bitwise the same gradients). Costs the full-recompute forward's workspace (one
  // layer's entry, ~32 h s bytes) and the lean scratch (12 h s bytes), allocated at creation.
  // false: RetainedBytes is -1 and the runtime refuses a program that recomputes.
  bool recompute = false;

  // One chunk's stash entry: layers_per_chunk times the saved bytes of one layer (bf16
  // activations, fp32 LayerNorm statistics and attention log-sum-exp, each slot 256-byte
  // aligned; gpt_cuda_chunk.h lists them): 32 h + 16 + 4 NH bytes per token plus alignment,
  // i.e. ~32 h s bytes per layer for microbatch size 1 (DESIGN.md section 6 estimates 34 h s);
  // 20 h + 16 + 4 NH with lean_saved.
  // The same with or without a split backward: W's inputs are kept in the stash only when the
  // schedule splits W, which the layer stack's SavedBytes(chunk, true) accounts for separately.
  std::int64_t SavedBytes() const;
  // What the model's RetainedBytes(chunk, mode, ...) says, without a GPU: kFull the chunk's
  // input (BoundaryBytes, slot-aligned), kLean layers_per_chunk lean layer regions; -1 without
  // `recompute`, for kNone, and for kLean with lean_saved.
  std::int64_t RetainedBytes(Recompute mode) const;
  // The activation between virtual stages: [batch, seq, hidden] bf16.
  std::int64_t BoundaryBytes() const;
  // FLOP of one chunk's forward, counted as the earlier tables did: per layer, the four linear
  // layers 24 h^2 (B T) and the attention's two products over full T x T score matrices
  // 4 T^2 h B. (The flash kernel computes only the causal half of those, ~2 T^2 h B, so
  // TFLOP/s from this count stay comparable across attention implementations, not a measure
  // of the work launched.) A full backward counts twice that.
  double ForwardFlops() const;
};

// InvalidArgument naming the field: non-positive sizes, hidden not a multiple of 64, a head
// size other than 64 or 128, seq above the attention kernels' limit or not a multiple of 8,
// layers_per_chunk outside [1, 256], chunks_per_stage < 1, or sizes whose GEMM dimensions
// overflow cuBLAS's 32-bit arguments.
[[nodiscard]] absl::Status CheckLayerStackShape(const LayerStackShape& shape);

// Creates the stage model of one pipeline stage on `backend` (a CUDA backend: InvalidArgument
// otherwise): `chunks_per_stage` chunks, parameters, gradients, scratch and the fixed
// input/gradient allocated with cudaMalloc at creation (outside the runtime's arena: about
// 6 B per parameter, 12 h^2 parameters per layer, plus ~30 h s bytes of scratch (12 h s more
// with lean_saved) and the attention backward's B * NH * T floats), a cuBLASLt handle bound to
// the compute stream.
// The stage model reports SavedBytes(chunk, false) = shape.SavedBytes() for every chunk and
// every stage (virtual stage 0 and the last one save what the others do), and
// SavedBytes(chunk, true) adds the output gradients W needs (22 h s bytes per layer).
// Errors: CheckLayerStackShape's; ResourceExhausted / Internal naming the CUDA or cuBLAS call.
[[nodiscard]] absl::StatusOr<std::unique_ptr<StageModel>> CreateCudaGptLayerStack(
    Backend& backend, const LayerStackShape& shape);

// For tests: one FNV-1a hash per parameter of `model` (made by CreateCudaGptLayerStack) over the
// bits of its fp32 gradient accumulator, chunk by chunk in tensor order, after waiting for the
// compute stream. Offloading moves bytes and must never change one of these. Errors:
// InvalidArgument for a model CreateCudaGptLayerStack did not make; CUDA errors.
[[nodiscard]] absl::StatusOr<std::vector<std::uint64_t>> LayerStackGradHashes(StageModel& model);

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_GPT_LAYER_STACK_H_
