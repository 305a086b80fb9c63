// gpt_train's command line: every flag, its parsing and its help text, and the PipelineSpec the
// flags ask for. Pure functions of the arguments; no I/O (the schedule file is read elsewhere).
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_OPTIONS_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/gpt/gpt_config.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::gpt {

// How the ranks are laid out (--transport).
enum class TrainTransport : std::uint8_t {
  kAuto,       // "auto": MPI when started by mpirun, else the single-process reference
  kMpi,        // "mpi": one rank per stage, ranks of an mpirun job
  kLocal,      // "local": every stage a thread of this process
  kReference,  // "reference": no pipeline, ReferenceTrainer (F then B per microbatch)
};

// What each stage computes on (--backend).
enum class TrainBackend : std::uint8_t {
  kCpu,   // "cpu": the fp32 GPT (GptStageModel) on the CPU backend
  kCuda,  // "cuda": the bf16 GPT (GptCudaStageModel) on a CUDA backend
};

// Where the CUDA GPT keeps its optimizer state (--optimizer-offload).
enum class TrainOptimizerOffload : std::uint8_t {
  kNone,         // "none": fp32 master, m and v on the GPU, GPU AdamW
  kCpu,          // "cpu": all state in pinned host memory, CPU Adam (ZeRO-Offload style)
  kInterleaved,  // "interleaved": host state; a share of subgroups updated on the GPU each step
  kStatic,       // "static": a share of subgroups keeps its state on the GPU for good
};

// gpt_train's default global gradient-norm clip (GPT-2/3 and llm.c practice).
inline constexpr float kDefaultClipNorm = 1.0f;
// The default --warmup-steps. A fixed length, not a share of the run and not cut to a short
// run: what the warm-up must keep small is the first updates' coherent jump (--help), and that
// depends on the rate of update 1 (lr / N), not on how many steps follow. On one H200 the
// issue-16 command (--embd 2048 --lr 3e-4, 12 steps) jumped from loss 6.10 to 10.37 at update 1
// with N = 12 (rate 2.5e-5) and fell to 4.71 with N = 100 (rate 3e-6); at --embd 4096 a rate of
// 1e-5 at update 1 jumped to 14.4.
inline constexpr std::int64_t kDefaultWarmupSteps = 100;

struct TrainOptions {
  GptConfig config;          // model shape, m (--microbatches), seed, tied head, AdamW
  std::int64_t steps = 500;  // about a minute on 2 cores with 4 ranks
  std::string data_path;     // empty: the embedded synthetic corpus
  TrainTransport transport = TrainTransport::kAuto;

  // The pipeline. `schedule` is --schedule as given ("" when absent); `family` is --family.
  std::string schedule;
  std::string family;
  int stages = 0;      // 0: the MPI world size (mpi), 4 (local), the file's (with --schedule-file)
  int chunks = 0;      // 0: 1 for 1f1b, else 2
  int group_size = 0;  // 0: the family's default
  bool split_backward = false;
  double offload_fraction = 0.0;
  int offload_chunks = 0;
  // --recompute: recompute entries before their B instead of keeping them (the schedule's
  // RECOMPUTE / RECOMPUTE_LEAN ops; PipelineSpec::recompute). With --schedule auto, the most the
  // planner may use per entry. --recompute-chunks N: every entry of chunks 0..N-1, else
  // --recompute-fraction of each stage's entries, longest-lived first.
  Recompute recompute = Recompute::kNone;
  double recompute_fraction = 1.0;
  int recompute_chunks = 0;
  std::string schedule_file;  // run this schedule (JSON) instead of compiling one
  // --schedule auto: the per-stage activation budget, in bytes, or (memory_budget_share > 0)
  // as a share of the largest stage's stash peak without offload ("50%").
  std::int64_t memory_budget_bytes = 0;
  double memory_budget_share = 0.0;

  // The runtime.
  std::int64_t arena_bytes = 0;    // per-stage device arena budget; 0 = fitted to the plan
  double watchdog_seconds = 60.0;  // bound on every wait (runtime, side channel)
  bool poison = false;             // fill released arena memory with NaN (catches misuse)
  bool p2p_reserve_worst = false;  // --p2p-reserve worst: no P2P plan, room for every buffer
  std::string trace_path;          // measured Perfetto trace of the last step
  // --costs: plan with each stage's measured chunk times and host link (MeasureStageCosts)
  // instead of nominal units. Default: measured with --backend cuda, nominal on the CPU.
  bool measured_costs = false;

  // The device (--backend) and, with cuda, the optimizer state's home.
  TrainBackend backend = TrainBackend::kCpu;
  TrainOptimizerOffload optimizer_offload = TrainOptimizerOffload::kNone;
  double gpu_share = 0.5;                                   // interleaved / static: GPU share
  std::int64_t optimizer_subgroup = std::int64_t{1} << 24;  // parameters per subgroup
  bool lean_saved = false;  // --saved lean (cuda): layers recompute LN outputs and GELU in W

  // Flags given explicitly, to tell a default from a request that conflicts with a file.
  bool stages_given = false;
  bool chunks_given = false;
  bool microbatches_given = false;
  bool split_given = false;
  bool heads_given = false;
  bool gpu_share_given = false;
  bool subgroup_given = false;
  bool costs_given = false;
  bool warmup_given = false;
  bool lr_min_given = false;

  // The learning-rate schedule: --warmup-steps (config.optimizer.warmup_steps; default
  // kDefaultWarmupSteps), --lr-decay cosine (true, default: to --lr-min at the last
  // step) or none, --lr-min (default lr / 10). ParseTrainOptions resolves them into
  // config.optimizer; --clip-norm sets config.optimizer.clip_norm (default kDefaultClipNorm).
  bool lr_decay = true;
  bool lr_decay_given = false;

  bool help = false;  // --help: print TrainHelpText() and exit 0
};

// Parses argv[1..]. Errors: InvalidArgument naming the flag, what it expects and what it got
// (unknown flag, missing value, bad number, bad choice, conflicting flags).
[[nodiscard]] absl::StatusOr<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args);

// The --help text: every flag with its meaning and default, and examples.
std::string TrainHelpText();

// "auto", "mpi", "local", "reference".
std::string TrainTransportName(TrainTransport transport);
// "cpu", "cuda".
std::string TrainBackendName(TrainBackend backend);
// "none", "cpu", "interleaved", "static".
std::string TrainOptimizerOffloadName(TrainOptimizerOffload offload);

// The spec the flags ask for on `num_stages` stages (family, v, g, split, offload policy;
// m from config.num_microbatches). Checked by ResolveSpec (the compiler's own messages, e.g.
// "interleaved needs num_microbatches % num_stages == 0"), prefixed with the flags' names.
[[nodiscard]] absl::StatusOr<PipelineSpec> TrainSpec(const TrainOptions& options, int num_stages);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_OPTIONS_H_
