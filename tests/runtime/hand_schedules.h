// Hand-written schedules for the runtime tests, independent of the compiler: 1F1B (v = 1) with
// comm ops, optional split backward and chosen offloaded entries, and small edits of them.
#ifndef PIPEOFFLOAD_TESTS_RUNTIME_HAND_SCHEDULES_H_
#define PIPEOFFLOAD_TESTS_RUNTIME_HAND_SCHEDULES_H_

#include <set>
#include <vector>

#include "pipeoffload/schedule.h"

namespace pipeoffload::testing {

// 1F1B on p stages, m microbatches: stage d runs min(p - d - 1, m) warm-up forwards, then
// alternates F and B, then drains the remaining B. RECV before each F / B that needs one, SEND
// right after the op that produces it. When `split`, W follows each B at once. For every mb in
// offload[d], stage d runs OFFLOAD and RELEASE right after F (and its SEND_F), and RELOAD right
// before the B's RECV_B (or the B itself on the last stage).
Schedule Hand1F1B(int p, int m, bool split, const std::vector<std::set<int>>& offload = {});

// Position of the first op equal to `op` in `program`, or -1.
int FindOp(const StageProgram& program, const Op& op);

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_RUNTIME_HAND_SCHEDULES_H_
