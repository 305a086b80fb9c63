// Megatron-LM's interleaved 1F1B compute order with loop placement (ecosystem.md section 2.1;
// pipeoffload.md section 2 for its warm-up). Pure function of the spec; no comm, no offload.
#include <algorithm>
#include <vector>

#include "schedules/families.h"

namespace pipeoffload::internal {
namespace {

// Megatron walks m * v "virtual microbatches" k. They come in rounds of p microbatches: round
// (k / p) runs chunk (k / p) % v of microbatches (k / (p v)) * p + k % p, so each group of p
// microbatches visits chunks 0..v-1 in the forward and v-1..0 in the backward.
int VirtualMicrobatch(int k, int p, int v) { return (k / (p * v)) * p + k % p; }
int ForwardChunk(int k, int p, int v) { return (k / p) % v; }
int BackwardChunk(int k, int p, int v) { return v - 1 - (k / p) % v; }

}  // namespace

// Rank d warms up with min(2(p-d-1) + (v-1)p, m v) forwards, then alternates F(k + warm-up),
// B(k), then drains the remaining backwards. REQUIRES: m % p == 0 and v >= 2 (ResolveSpec).
std::vector<StageProgram> BuildInterleavedOrder(const PipelineSpec& spec) {
  const int p = spec.num_stages;
  const int v = spec.chunks_per_stage;
  const int total = spec.num_microbatches * v;
  const bool split = spec.split_backward;
  std::vector<StageProgram> stages(p);
  for (int d = 0; d < p; ++d) {
    StageProgram& program = stages[d];
    program.stage = d;
    program.ops.reserve(static_cast<std::size_t>(total) * (split ? 3 : 2));
    const int warmup = std::min(2 * (p - d - 1) + (v - 1) * p, total);
    auto forward = [&](int k) {
      AppendForward(program, VirtualMicrobatch(k, p, v), ForwardChunk(k, p, v));
    };
    auto backward = [&](int k) {
      AppendBackward(program, VirtualMicrobatch(k, p, v), BackwardChunk(k, p, v), split);
    };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k + warmup < total; ++k) {
      forward(k + warmup);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return stages;
}

}  // namespace pipeoffload::internal
