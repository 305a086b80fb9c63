// pipeline_bench's GPU-free half: its flags, the cost model it builds from measured chunk
// times, the compiled schedule of each policy, and the arena each stage needs. Kept apart from
// the CUDA code so --dry-run (and a reader) can check the plans on a machine without a GPU.
#ifndef PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_
#define PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/gemm_stage_model.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::bench {

extern const char kBenchUsage[];

struct BenchOptions {
  int hidden = 4096;
  int sequence = 2048;
  int layers_per_chunk = 1;
  int microbatches = 0;  // 0 = 4 * stages
  int stages = 4;
  int chunks = 1;
  std::string family = "1f1b";
  std::vector<std::string> policies = {"1f1b"};  // each: 1f1b|po-h|po-f|selective|auto
  double offload_fraction = 0.5;
  double budget_gb = 0.0;  // auto: per-stage activation budget; 0 = half the 1f1b peak
  int steps = 5;
  int warmup = 2;
  int reps = 5;
  double pcie_gbs = 55.0;
  double duplex_gbs = 46.0;
  std::string out;
  bool dry_run = false;

  int Microbatches() const { return microbatches > 0 ? microbatches : 4 * stages; }
  GemmShape Shape() const;
};

// Parses argv[1..). Errors: InvalidArgument naming the flag and what it accepts.
[[nodiscard]] absl::StatusOr<BenchOptions> ParseBenchOptions(int argc, char** argv);

// Chunk times from FLOPs at an assumed 600 TFLOP/s (for --dry-run).
ChunkTimes EstimatedChunkTimes(const BenchOptions& options);

// The cost model of the measured chunk: F, B split evenly into B and W (the spec does not
// split W, so one B op costs both), the GEMM model's bytes, the PCIe figures, and a fast P2P
// link (device-to-device copies on one GPU).
CostModel BenchCostModel(const BenchOptions& options, const ChunkTimes& times);

struct PlannedPolicy {
  std::string name;  // as given: "1f1b", "po-h", ...
  Schedule schedule;  // compiled, with predictions
};

// Compiles every policy of `options`. Errors: Compile's, annotated with the policy.
[[nodiscard]] absl::StatusOr<std::vector<PlannedPolicy>> PlanPolicies(const BenchOptions& options,
                                                                      const ChunkTimes& times);

// Device arena budget for `stage` of `schedule`: its predicted stash peak with the arena's
// 256-byte alignment per entry, plus room for the P2P buffers that can be live at once.
std::int64_t ArenaBudget(const Schedule& schedule, int stage, std::int64_t boundary_bytes);

// The --dry-run report: per policy, predicted step, peaks, offloaded bytes and warnings.
std::string PlansToText(const BenchOptions& options, const ChunkTimes& times,
                        const std::vector<PlannedPolicy>& plans);

}  // namespace pipeoffload::bench

#endif  // PIPEOFFLOAD_BENCH_PIPELINE_BENCH_PLAN_H_
