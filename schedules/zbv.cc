// The ZB-V compute order (torch.distributed.pipelining's ScheduleZBVZeroBubble; Qi et al.,
// "Zero Bubble Pipeline Parallelism", section 6). Pure function of the spec; no comm, no offload.
//
// V placement with v = 2: chunk 0 of stage d is virtual stage d, chunk 1 is 2p - 1 - d, so a
// microbatch runs down the stages on chunk 0 and back up on chunk 1. Stage d's order, in torch's
// phases, with F = forward, B = input-gradient backward (torch's I), W = weight gradient, each
// of chunk 0 or 1 taking its microbatches in increasing order from its own counter:
//   warm-up 1: 2(p - d) - 1 times F0;
//   warm-up 2: d times F1, F0;
//   warm-up 3: p - d times F1, B1, W1;
//   steady:    while chunk 1 has run fewer F than chunk 0, or chunk 0 has F left:
//              F0 (when it has one left), B0, W0, F1, B1, W1;
//   cool-down: d times B0, B1; then p - d times B0, W0; then the W1 left; then the W0 left.
// Torch runs the phases for max(m, 2p - 1) microbatches, so that the warm-up fills the pipeline,
// and drops every op of a microbatch >= m afterwards; so does this builder.
#include <algorithm>
#include <vector>

#include "schedules/families.h"

namespace pipeoffload::internal {
namespace {

// Appends the ops of one chunk with per-chunk counters, dropping microbatches >= m.
class ZbvStage {
 public:
  ZbvStage(StageProgram& program, int m) : program_(program), m_(m) {}

  void Forward(int chunk) { Append(OpKind::kForward, chunk, forward_[chunk]++); }
  void Backward(int chunk) { Append(OpKind::kBackward, chunk, backward_[chunk]++); }
  void Weight(int chunk) { Append(OpKind::kBackwardWeight, chunk, weight_[chunk]++); }
  int forwards(int chunk) const { return forward_[chunk]; }
  int backwards(int chunk) const { return backward_[chunk]; }
  int weights(int chunk) const { return weight_[chunk]; }

 private:
  void Append(OpKind kind, int chunk, int mb) {
    if (mb < m_) program_.ops.push_back(Op{kind, mb, chunk, -1});
  }

  StageProgram& program_;
  const int m_;
  int forward_[2] = {0, 0};
  int backward_[2] = {0, 0};
  int weight_[2] = {0, 0};
};

}  // namespace

std::vector<StageProgram> BuildZbvOrder(const PipelineSpec& spec) {
  const int p = spec.num_stages;
  const int m = spec.num_microbatches;
  const int padded = std::max(m, 2 * p - 1);
  std::vector<StageProgram> stages(p);
  for (int d = 0; d < p; ++d) {
    stages[d].stage = d;
    stages[d].ops.reserve(static_cast<std::size_t>(m) * 6);
    ZbvStage stage(stages[d], m);
    for (int i = 0; i < 2 * (p - d) - 1; ++i) stage.Forward(0);
    for (int i = 0; i < d; ++i) {
      stage.Forward(1);
      stage.Forward(0);
    }
    for (int i = 0; i < p - d; ++i) {
      stage.Forward(1);
      stage.Backward(1);
      stage.Weight(1);
    }
    while (stage.forwards(1) < stage.forwards(0) || stage.forwards(0) < padded) {
      if (stage.forwards(0) < padded) stage.Forward(0);
      stage.Backward(0);
      stage.Weight(0);
      stage.Forward(1);
      stage.Backward(1);
      stage.Weight(1);
    }
    for (int i = 0; i < d; ++i) {
      stage.Backward(0);
      stage.Backward(1);
    }
    for (int i = 0; i < p - d; ++i) {
      stage.Backward(0);
      stage.Weight(0);
    }
    while (stage.weights(1) < stage.backwards(1)) stage.Weight(1);
    while (stage.weights(0) < stage.backwards(0)) stage.Weight(0);
  }
  return stages;
}

}  // namespace pipeoffload::internal
