// PipelineStageImpl's iteration and teardown (pipeline_stage_impl.h; Open is in stage_open.cc).
#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "lib/runtime/pipeline_stage_impl.h"

namespace pipeoffload::internal {

PipelineStageImpl::~PipelineStageImpl() {
  if (backend_ == nullptr) return;  // Open failed before there was anything to drain
  // Teardown: errors are ignored; each wait is bounded.
  static_cast<void>(backend_->Synchronize(timeout()));
  executor_.reset();
  static_cast<void>(backend_->Synchronize(timeout()));  // the poison fills of its last frees
  arena_.reset();
}

absl::StatusOr<IterationStats> PipelineStageImpl::Run() {
  absl::StatusOr<IterationStats> stats = executor_->Run();
  // A CUDA executor returns once the iteration's last work is enqueued; the contract is that
  // Run returns once it has finished, on success and on error alike.
  const absl::Status drained = backend_->Synchronize(timeout());
  if (!stats.ok()) return stats.status();
  if (!drained.ok()) {
    return Annotate(drained, absl::StrCat("stage ", stage_, ": draining the ",
                                          backend_->Name(), " backend after the iteration"));
  }
  // The executor empties the stash, host pool and P2P buffers; the arena must agree.
  if (arena_->reserved_bytes() != 0) {
    return absl::InternalError(absl::StrCat(
        "stage ", stage_, ": the arena still holds ", arena_->reserved_bytes(),
        " bytes after the iteration (stash ", arena_->Usage(MemoryCategory::kStash).in_use_bytes,
        ", p2p ", arena_->Usage(MemoryCategory::kP2P).in_use_bytes, ")"));
  }
  return stats;
}

}  // namespace pipeoffload::internal
