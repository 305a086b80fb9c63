// Hand-written 1F1B schedules (hand_schedules.h).
#include "tests/runtime/hand_schedules.h"

#include <algorithm>

namespace pipeoffload::testing {

Schedule Hand1F1B(int p, int m, bool split, const std::vector<std::set<int>>& offload) {
  Schedule schedule;
  schedule.spec.num_stages = p;
  schedule.spec.num_microbatches = m;
  schedule.spec.chunks_per_stage = 1;
  schedule.spec.split_backward = split;
  for (int d = 0; d < p; ++d) {
    StageProgram program;
    program.stage = d;
    std::vector<Op>& ops = program.ops;
    const bool offloads = static_cast<int>(offload.size()) > d;
    auto offloaded = [&](int mb) {
      return offloads && offload[static_cast<std::size_t>(d)].count(mb) > 0;
    };
    auto forward = [&](int mb) {
      if (d > 0) ops.push_back(Op{OpKind::kRecvActivation, mb, 0, d - 1});
      ops.push_back(Op{OpKind::kForward, mb, 0, -1});
      if (d < p - 1) ops.push_back(Op{OpKind::kSendActivation, mb, 0, d + 1});
      if (offloaded(mb)) {
        ops.push_back(Op{OpKind::kOffload, mb, 0, -1});
        ops.push_back(Op{OpKind::kRelease, mb, 0, -1});
      }
    };
    auto backward = [&](int mb) {
      if (offloaded(mb)) ops.push_back(Op{OpKind::kReload, mb, 0, -1});
      if (d < p - 1) ops.push_back(Op{OpKind::kRecvGrad, mb, 0, d + 1});
      ops.push_back(Op{OpKind::kBackward, mb, 0, -1});
      if (d > 0) ops.push_back(Op{OpKind::kSendGrad, mb, 0, d - 1});
      if (split) ops.push_back(Op{OpKind::kBackwardWeight, mb, 0, -1});
    };
    const int warmup = std::min(p - d - 1, m);
    for (int mb = 0; mb < warmup; ++mb) forward(mb);
    for (int i = 0; i + warmup < m; ++i) {
      forward(warmup + i);
      backward(i);
    }
    for (int mb = m - warmup; mb < m; ++mb) backward(mb);
    schedule.stages.push_back(program);
  }
  return schedule;
}

int FindOp(const StageProgram& program, const Op& op) {
  for (std::size_t i = 0; i < program.ops.size(); ++i) {
    if (program.ops[i] == op) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace pipeoffload::testing
