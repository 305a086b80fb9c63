// The DualPipeV compute order (torch.distributed.pipelining's ScheduleDualPipeV, after DeepSeek's
// DualPipe, arXiv 2412.19437). Pure function of the spec; no comm, no offload.
//
// V placement with v = 2 (chunk 0 of stage d is virtual stage d, chunk 1 is 2p - 1 - d). Torch
// writes three kinds of backward: I (input gradient; its W is queued and issued later, oldest
// first), B (full backward) and OVERLAP_F_B (a forward of one chunk overlapped with a full
// backward of the other). Our runtime has one compute stream per stage, so a full backward is
// our B followed at once by its W, and OVERLAP_F_B(F x, B y) is F x, then B y, then W y, in that
// order: the same dependencies and the same memory order, without the overlap. Every chunk's
// F, B and W take its microbatches in increasing order; B and I share one counter.
// Stage d, with m microbatches, in torch's eight steps:
//   1: 2(p - d - 1) times F0;          2: d + 1 times F0, F1;
//   3: p - d - 1 times I1, W(queued), F1;
//   4: m - 2p + d + 1 times OVERLAP(F0, B1), OVERLAP(F1, B0), except that the last stage's
//      first round is F0, B1 (not overlapped, to shorten the bubble);
//   5: p - d - 1 times B1, OVERLAP(F1, B0);
//   6: d + 1 times a backward of chunk 1 then of chunk 0: full B until the middle round
//      (i = (d + 1) / 2), I from there on; an odd stage switches before the chunk-1 backward of
//      that round, an even one between the two;
//   7: p - d - 1 times W(queued), I0;   8: d + 1 times W(queued).
// Torch requires m >= 2p (ResolveSpec says so).
#include <deque>
#include <utility>
#include <vector>

#include "schedules/families.h"

namespace pipeoffload::internal {
namespace {

class DualPipeVStage {
 public:
  explicit DualPipeVStage(StageProgram& program) : program_(program) {}

  void Forward(int chunk) { Append(OpKind::kForward, chunk, forward_[chunk]++); }
  // Torch's B: our B and its W, back to back.
  void FullBackward(int chunk) {
    const int mb = backward_[chunk]++;
    Append(OpKind::kBackward, chunk, mb);
    Append(OpKind::kBackwardWeight, chunk, mb);
  }
  // Torch's I: our B; its W waits in the queue.
  void InputBackward(int chunk) {
    const int mb = backward_[chunk]++;
    Append(OpKind::kBackward, chunk, mb);
    pending_weights_.push_back({chunk, mb});
  }
  void Backward(int chunk, bool zero_bubble) {
    if (zero_bubble) {
      InputBackward(chunk);
    } else {
      FullBackward(chunk);
    }
  }
  // Torch's OVERLAP_F_B as its parts, forward first.
  void Overlap(int forward_chunk, int backward_chunk) {
    Forward(forward_chunk);
    FullBackward(backward_chunk);
  }
  void PendingWeight() {
    if (pending_weights_.empty()) return;
    const auto [chunk, mb] = pending_weights_.front();
    pending_weights_.pop_front();
    Append(OpKind::kBackwardWeight, chunk, mb);
  }

 private:
  void Append(OpKind kind, int chunk, int mb) { program_.ops.push_back(Op{kind, mb, chunk, -1}); }

  StageProgram& program_;
  int forward_[2] = {0, 0};
  int backward_[2] = {0, 0};
  std::deque<std::pair<int, int>> pending_weights_;  // (chunk, mb) of I's not yet followed by W
};

}  // namespace

std::vector<StageProgram> BuildDualPipeVOrder(const PipelineSpec& spec) {
  const int p = spec.num_stages;
  const int m = spec.num_microbatches;
  std::vector<StageProgram> stages(p);
  for (int d = 0; d < p; ++d) {
    stages[d].stage = d;
    stages[d].ops.reserve(static_cast<std::size_t>(m) * 6);
    DualPipeVStage stage(stages[d]);
    for (int i = 0; i < 2 * (p - d - 1); ++i) stage.Forward(0);
    for (int i = 0; i < d + 1; ++i) {
      stage.Forward(0);
      stage.Forward(1);
    }
    for (int i = 0; i < p - d - 1; ++i) {
      stage.InputBackward(1);
      stage.PendingWeight();
      stage.Forward(1);
    }
    for (int i = 0; i < m - 2 * p + d + 1; ++i) {
      if (i == 0 && d == p - 1) {
        stage.Forward(0);
        stage.FullBackward(1);
      } else {
        stage.Overlap(0, 1);
      }
      stage.Overlap(1, 0);
    }
    for (int i = 0; i < p - d - 1; ++i) {
      stage.FullBackward(1);
      stage.Overlap(1, 0);
    }
    const int rounds = d + 1;
    bool zero_bubble = false;
    for (int i = 0; i < rounds; ++i) {
      if (i == rounds / 2 && d % 2 == 1) zero_bubble = true;
      stage.Backward(1, zero_bubble);
      if (i == rounds / 2 && d % 2 == 0) zero_bubble = true;
      stage.Backward(0, zero_bubble);
    }
    for (int i = 0; i < p - d - 1; ++i) {
      stage.PendingWeight();
      stage.Backward(0, zero_bubble);
    }
    for (int i = 0; i < d + 1; ++i) stage.PendingWeight();
  }
  return stages;
}

}  // namespace pipeoffload::internal
