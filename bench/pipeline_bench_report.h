// pipeline_bench's results: what one run measured, its markdown table, its JSON line, and the
// checklist against issue 5's targets over several runs (and the PyTorch peer's rows from
// scripts/torch_peer.py; pipeline_bench_checklist.cc). Plain C++: the checklist can be
// recomputed from saved JSON lines on any machine (pipeline_bench --summarize).
//
// Memory, two peaks per stage: the LOGICAL stash peak (entries in program order: what the
// compiler predicts, exactly) and the PHYSICAL one (the arena's kStash high water, which also
// counts released blocks whose D2H copy still runs, since RELEASE no longer blocks). The
// physical one is the memory the GPU really held, so "activations" and every cut use it.
#ifndef PIPEOFFLOAD_BENCH_PIPELINE_BENCH_REPORT_H_
#define PIPEOFFLOAD_BENCH_PIPELINE_BENCH_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipeoffload::bench {

// One policy as run (measured) beside its plan (predicted).
struct PolicyRun {
  std::string name;    // "1f1b", "po-f", ...
  std::string order;   // e.g. "group-interleaved v=2, 1 layer(s)/chunk"
  std::string auto_choice;  // auto: the compiler's choice line
  std::vector<double> step_seconds;  // measured steps after warm-up
  std::vector<std::int64_t> stash_peak;       // [stage] measured LOGICAL high water, bytes
  std::vector<std::int64_t> predicted_peak;   // [stage] the compiler's (== stash_peak)
  // [stage] measured PHYSICAL high water (>= stash_peak). JSON lines from before it existed
  // read it as stash_peak (the RELEASE of that runtime blocked, so the two were equal).
  std::vector<std::int64_t> stash_physical_peak;
  std::vector<std::int64_t> arena_bytes;      // [stage] the arena's size
  // [stage] measured P2P high water (IterationStats::p2p_high_water_bytes, max over steps): what
  // the arena's P2P reserve (a worst-case bound: every SEND/RECV buffer of the step at once)
  // was actually used for. Empty in JSON lines from before it was recorded.
  std::vector<std::int64_t> p2p_peak;
  std::vector<std::int64_t> model_bytes;      // [stage] the model's own device memory
  std::vector<double> wait_seconds;  // [stage] executor blocked (receives, copies, barriers)
  // [stage] of which waiting for released blocks' D2H copies (IterationStats::
  // release_wait_seconds: in RELEASE with --release=wait, else when an allocation or the end
  // of the step needs the block)
  std::vector<double> release_wait;
  std::vector<double> barrier_wait;  // [stage] of which in BARRIER (the partner stage)
  double gpu_busy = 0.0;  // seconds some stage had model work in flight (CUDA events), last step
  std::int64_t device_used_bytes = 0;  // cudaMemGetInfo total - free with everything alive
  std::int64_t offloaded_bytes = 0;    // per step, all stages
  double offload_gbs = 0.0;            // OFFLOAD bytes over the time any offload ran (GB/s)
  double reload_gbs = 0.0;             // RELOAD likewise
  double link_efficiency = 0.0;        // LinkUse::efficiency (0: nothing moved)
  double predicted_step = 0.0;         // SimulateSharedGpu with the solo costs
  // SimulateSharedGpu with compute x BenchRun::calibration_scale (CalibrationScale in
  // pipeline_bench_plan.h); 0 when unavailable (1f1b not run, or this policy did not run)
  double calibrated_step = 0.0;
  double predicted_serial = 0.0;       // sum of solo compute
  double planner_step = 0.0;           // the compiler's prediction (p x compute)
  int warnings = 0;                    // planner warnings (e.g. shortfall)
  std::string error;                   // why it did not plan or run ("" when it did)

  double MedianStep() const;
  // The physical peak of `stage` (the logical one when no physical was recorded); 0 if none.
  std::int64_t PhysicalPeak(std::size_t stage) const;
  std::int64_t StashTotal() const;  // sum over stages of the physical peaks (one GPU)
};

// run's median step / base's - 1.
double Overhead(const PolicyRun& run, const PolicyRun& base);
// 1 - run's stage-0 physical stash peak / base's (0 when either is missing).
double StageZeroCut(const PolicyRun& run, const PolicyRun& base);

// One offload or reload copy as measured (seconds on one clock for all stages).
struct CopyInterval {
  bool d2h = true;
  double start = 0.0;
  double end = 0.0;
  std::int64_t bytes = 0;
};

// What the copies got out of the link, per direction: bytes over the union of the times that
// direction was busy (so two stages' copies at once count once), and how close that is to the
// measured ceiling: efficiency = (time the bytes would take at the ceiling) / (busy time),
// over both directions, where the ceiling is the solo bandwidth while the other direction is
// idle and the duplex one while it is busy.
struct LinkUse {
  double d2h_gbs = 0.0;
  double h2d_gbs = 0.0;
  double efficiency = 0.0;  // 0 when nothing moved
};
LinkUse SummarizeCopies(const std::vector<CopyInterval>& copies, double solo_d2h,
                        double solo_h2d, double duplex);

// One pipeline_bench invocation (one hidden size).
struct BenchRun {
  std::string model;  // "gemm" | "gpt"
  int hidden = 0, heads = 0, sequence = 0, stages = 0, microbatches = 0, chunks = 0;
  int layers_per_chunk = 0;
  std::string family;
  double forward_s = 0.0, backward_s = 0.0;  // one chunk alone
  std::int64_t entry_bytes = 0;
  double gemm_flops = 0.0;            // measured bf16 GEMM rate, FLOP/s (0: not measured)
  double d2h_gbs = 0.0, h2d_gbs = 0.0, duplex_gbs = 0.0;  // measured pinned link
  double model_flops_per_step = 0.0;  // ModelFlopsPerStep
  std::string release_mode = "defer";  // --release (JSON lines without it: "wait", as then)
  // measured 1f1b step / its SimulateSharedGpu step with the solo costs; 0 = 1f1b not run, so
  // no policy has a calibrated prediction
  double calibration_scale = 0.0;
  std::vector<PolicyRun> policies;

  const PolicyRun* Find(const std::string& name) const;
  // "1f1b" when run, else "none", else null.
  const PolicyRun* Baseline() const;
};

// One row of scripts/torch_peer.py.
struct PeerRun {
  int hidden = 0, sequence = 0, layers = 0, microbatches = 0;
  std::string mode;  // "none" | "save_on_cpu"
  double step_s = 0.0, tflops = 0.0;
  std::int64_t peak_bytes = 0, static_bytes = 0, activation_bytes = 0;
};

// The run's markdown: a header line with the measured ceilings and one row per policy.
std::string RunToMarkdown(const BenchRun& run);
std::string RunToJsonLine(const BenchRun& run);

// JSON lines (one BenchRun / PeerRun per line; blank lines skipped).
// Errors: InvalidArgument naming the line and the missing or mistyped field.
[[nodiscard]] absl::StatusOr<std::vector<BenchRun>> ParseRuns(const std::string& jsonl);
[[nodiscard]] absl::StatusOr<std::vector<PeerRun>> ParsePeers(const std::string& jsonl);

// Issue 5's targets, each PASS / MISS / n/a (what was not run) with its numbers
// (pipeline_bench_checklist.cc). The targets name the policies as run: po-f / po-h are the
// default split-link plans; their :shared variants, when run, are printed beside them. The
// simulator target judges the calibrated prediction over the offload policies (the solo one
// beside it).
std::string Checklist(const std::vector<BenchRun>& runs, const std::vector<PeerRun>& peers);

}  // namespace pipeoffload::bench

#endif  // PIPEOFFLOAD_BENCH_PIPELINE_BENCH_REPORT_H_
