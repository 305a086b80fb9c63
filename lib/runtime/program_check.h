// The executor's boundary check of one StageProgram, and what the program needs (stash peak,
// host slots). Pure: no backend, no transport; the executor turns its results into Status.
#ifndef PIPEOFFLOAD_LIB_RUNTIME_PROGRAM_CHECK_H_
#define PIPEOFFLOAD_LIB_RUNTIME_PROGRAM_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload::internal {

// Loop placement (schedule.h): chunk c of stage d is virtual stage c * p + d.
struct Placement {
  int num_stages = 1;  // p
  int chunks = 1;      // v
  int virtual_stage(int stage, int chunk) const { return chunk * num_stages + stage; }
  int num_virtual_stages() const { return num_stages * chunks; }
  int stage_of(int virtual_stage) const { return virtual_stage % num_stages; }
  int chunk_of(int virtual_stage) const { return virtual_stage / num_stages; }
};

struct ProgramNeeds {
  std::int64_t stash_peak_bytes = 0;          // requested bytes, program order
  std::int64_t stash_peak_aligned_bytes = 0;  // the same with each entry rounded as the arena
  int stash_peak_op = -1;                     // index of the op that reaches the aligned peak
  std::vector<HostSlotClass> host_slots;      // per entry size, the most entries on host at once
};

// Checks the spec, the program's stage and every op's ranges and peers against the placement,
// and the model's sizes; then walks the program in order to find its needs: +entry at F and
// RELOAD, -entry at RELEASE and at B (unsplit) or W (split), exactly the compiler's model; host
// slots +1 at OFFLOAD, -1 at the entry's B. Errors: InvalidArgument / FailedPrecondition
// naming the stage, op index and op.
[[nodiscard]] absl::StatusOr<ProgramNeeds> CheckStageProgram(const PipelineSpec& spec,
                                                             const StageProgram& program,
                                                             const StageModel& model,
                                                             std::int64_t arena_alignment);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_RUNTIME_PROGRAM_CHECK_H_
