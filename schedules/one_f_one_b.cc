// The 1F1B compute order (pipeoffload.md section 1.2; Megatron's non-interleaved schedule,
// ecosystem.md section 2.1). Pure function of the spec; no comm, no offload.
#include <algorithm>
#include <vector>

#include "schedules/families.h"

namespace pipeoffload::internal {

// Stage d: warm-up of w_d = min(p-d-1, m) forwards, a steady phase of (F(i + w_d), B(i)) pairs,
// then a cool-down of the last w_d backwards. Stage d therefore holds at most min(p-d, m)
// activations at once (unit-cost peak, pipeoffload.md section 1.2), for any m >= 1.
std::vector<StageProgram> BuildOneFOneBOrder(const PipelineSpec& spec) {
  const int p = spec.num_stages;
  const int m = spec.num_microbatches;
  const bool split = spec.split_backward;
  std::vector<StageProgram> stages(p);
  for (int d = 0; d < p; ++d) {
    StageProgram& program = stages[d];
    program.stage = d;
    program.ops.reserve(static_cast<std::size_t>(m) * (split ? 3 : 2));
    const int warmup = std::min(p - d - 1, m);
    for (int i = 0; i < warmup; ++i) AppendForward(program, i, 0);
    for (int i = 0; i + warmup < m; ++i) {
      AppendForward(program, i + warmup, 0);
      AppendBackward(program, i, 0, split);
    }
    for (int i = std::max(m - warmup, 0); i < m; ++i) AppendBackward(program, i, 0, split);
  }
  return stages;
}

}  // namespace pipeoffload::internal
