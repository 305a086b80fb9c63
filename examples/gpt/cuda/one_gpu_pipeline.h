// A p-stage pipeline on ONE GPU: stages as threads of this process, each with its own CUDA
// backend (its own streams), device arena and executor, exchanging device buffers through the
// local transport with CudaDeviceCopier (DESIGN.md section 5, "local" transport). The rig the
// CUDA GPT's tests use; bench/pipeline_bench.cc builds the same one by hand and could use this.
//
// The caller owns the backends and stage models (model d runs on backends[d]); the rig owns
// the transports, arenas and executors, and drives one step at a time.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_CUDA_ONE_GPU_PIPELINE_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_CUDA_ONE_GPU_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/memory.h"
#include "pipeoffload/runtime.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/stage_model.h"
#include "pipeoffload/transport.h"

namespace pipeoffload::gpt::cuda {

struct OneGpuPipelineOptions {
  double wait_timeout_seconds = 120.0;  // the executors' watchdog and every drain
  // Fill released arena blocks with kPoisonWord, so a stash entry read after its release (a
  // missing wait on an offload or reload) shows up as NaN instead of passing silently.
  bool poison_on_free = true;
};

// The arena budget that surely holds `program`: its predicted stash peak with every entry
// rounded up to the arena's 256-byte alignment, one aligned boundary buffer per op that can
// hold one (F, B, RECV_F, RECV_B), and a quarter more for fragmentation.
std::int64_t OneGpuArenaBytes(const StageProgram& program, const StagePrediction& prediction,
                              std::int64_t boundary_bytes);

class OneGpuPipeline {
 public:
  // `schedule` (compiled, with predictions), backends[d] and models[d] for each of its stages;
  // all must outlive the rig. Errors: InvalidArgument for mismatched sizes or a schedule
  // without predictions; the transports', arenas' and executors' (e.g. ResourceExhausted).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<OneGpuPipeline>> Create(
      const Schedule& schedule, const std::vector<Backend*>& backends,
      const std::vector<StageModel*>& models, const OneGpuPipelineOptions& options = {});
  // Drains every backend (executors, arenas and transports go in that order).
  ~OneGpuPipeline();

  // One iteration: every stage's Executor::Run on its own thread, then every backend drained
  // (a stage's Run returns once its last work is enqueued, not done). Returns stats[d] of stage
  // d. Errors: the first failing stage's, annotated with the stage.
  [[nodiscard]] absl::StatusOr<std::vector<IterationStats>> RunStep();

  const Schedule& schedule() const { return schedule_; }
  std::int64_t arena_bytes(int stage) const;

 private:
  OneGpuPipeline(const Schedule& schedule, const std::vector<Backend*>& backends,
                 const OneGpuPipelineOptions& options)
      : schedule_(schedule), backends_(backends), options_(options) {}

  const Schedule schedule_;
  const std::vector<Backend*> backends_;
  const OneGpuPipelineOptions options_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<DeviceArena>> arenas_;
  std::vector<std::unique_ptr<Executor>> executors_;
};

}  // namespace pipeoffload::gpt::cuda

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_CUDA_ONE_GPU_PIPELINE_H_
