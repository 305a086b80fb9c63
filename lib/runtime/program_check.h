// The executor's boundary check of one StageProgram, and what the program needs (stash peak,
// host slots). Pure: no backend, no transport; the executor turns its results into Status.
#ifndef PIPEOFFLOAD_LIB_RUNTIME_PROGRAM_CHECK_H_
#define PIPEOFFLOAD_LIB_RUNTIME_PROGRAM_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/runtime/recompute_plan.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::internal {

struct ProgramNeeds {
  std::int64_t stash_peak_bytes = 0;          // requested bytes, program order
  std::int64_t stash_peak_aligned_bytes = 0;  // the same with each entry rounded as the arena
  int stash_peak_op = -1;                     // index of the op that reaches the aligned peak
  std::vector<HostSlotClass> host_slots;      // per entry size, the most entries on host at once
  RecomputePlan recompute;                    // the recomputed entries and their retained bytes
};

// Checks the spec, the program's stage and every op's ranges and peers against the placement,
// and the model's sizes; then walks the program in order to find its needs: +entry at F and
// RELOAD, -entry at RELEASE and at B (unsplit) or W (split), exactly the compiler's model; host
// slots +1 at OFFLOAD, -1 at the entry's B. A recomputed entry (recompute_plan.h) counts its
// retained bytes from F, then at its RECOMPUTE* + the full entry and - the retained bytes.
// Errors: InvalidArgument / FailedPrecondition naming the stage, op index and op, or the
// recompute mode the model does not offer.
[[nodiscard]] absl::StatusOr<ProgramNeeds> CheckStageProgram(const PipelineSpec& spec,
                                                             const StageProgram& program,
                                                             const StageModel& model,
                                                             std::int64_t arena_alignment);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_RUNTIME_PROGRAM_CHECK_H_
