// The cost model the compiler plans with and the simulator times with (DESIGN.md section 4).
//
// Times are in any unit the user likes (seconds for measured costs, "units" for --unit-costs);
// bandwidths are bytes per that unit. Plain values, and their JSON form.
#ifndef PIPEOFFLOAD_COST_MODEL_H_
#define PIPEOFFLOAD_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/stage_model.h"

namespace pipeoffload {

// What an entry holds for its B from its RECOMPUTE* on: the block the rebuild allocates, or,
// where the rebuild allocates nothing (B reads the retained block in place), the retained block
// itself. The one statement of the rule for the simulator, the planner and the runtime's walk.
constexpr std::int64_t HeldForBackward(std::int64_t rebuild_bytes, std::int64_t retained_bytes) {
  return rebuild_bytes > 0 ? rebuild_bytes : retained_bytes;
}

struct CostModel {
  // Per-chunk compute durations. When the spec does not split W, one B op takes
  // backward_time + weight_time.
  double forward_time = 1.0;
  double backward_time = 1.0;  // input-gradient part
  double weight_time = 1.0;    // weight-gradient part
  // Optional per-stage multipliers of the three durations (size p), for unbalanced pipelines
  // and measured costs; empty = 1 everywhere.
  std::vector<double> stage_time_scale;

  // Saved-activation bytes of one (mb, chunk) stash entry. activation_bytes_per_virtual_stage,
  // when not empty, has p * v entries indexed by virtual stage (the spec's VirtualStageMap:
  // c * p + d under loop placement, d or 2p - 1 - d under v) and overrides the
  // uniform value (the runtime measures it exactly; the last stage may save more).
  std::int64_t activation_bytes = 1 << 20;
  std::vector<std::int64_t> activation_bytes_per_virtual_stage;
  // Bytes of one P2P message (activation forward, gradient backward).
  std::int64_t boundary_bytes = 1 << 16;

  // Host link (PCIe) bandwidth per direction, bytes per time unit, for a copy running alone and
  // for each direction while both run (reference/hardware.md: 55.2 alone, ~44.6 duplex GB/s).
  // The simulator times a transfer with the duplex figure whenever the opposite direction of the
  // same link is busy when it starts, else with the solo figure.
  double d2h_bandwidth = 55.2e9;
  double h2d_bandwidth = 55.2e9;
  double duplex_bandwidth = 44.6e9;
  // One copy engine serves both directions (transfers serialise).
  bool shared_copy_engine = false;

  // P2P link between neighbouring stages.
  double p2p_bandwidth = 100e9;
  double p2p_latency = 0.0;
  // P2P crosses the same PCIe host link as offload (inter-node, or no NVLink): sends are charged
  // to the sender's link in the D2H direction and to the receiver's in the H2D direction.
  bool p2p_shares_host_link = false;
  // Stages [k * host_link_group_size, (k + 1) * host_link_group_size) share one host link and
  // are paired for staggering. 1 = every stage has its own link.
  int host_link_group_size = 2;

  // Transfer safety margin: a reload must end this long before its B starts, in units of B's
  // duration (reference planner: one B duration).
  double reload_margin_in_backward_times = 1.0;

  // Recomputation (issue 15), per chunk. A recomputed entry holds only a retained block from its
  // F to its RECOMPUTE op, which rebuilds the full entry on the compute stream right before B.
  // Durations of RECOMPUTE (full: the chunk's forward once more) and RECOMPUTE_LEAN (the cheap
  // parts, e.g. LayerNorm and GELU); any negative value (the default) derives them:
  // forward_time, and kLeanRecomputeShare * forward_time. Both scale with stage_time_scale.
  double recompute_full_time = -1.0;
  double recompute_lean_time = -1.0;
  // Retained bytes of one entry; 0 means the mode is not offered (the planner never picks it,
  // as the runtime refuses it). Full: negative (the default) = boundary_bytes (F keeps the
  // chunk's input). Lean: 0 by default. The *_per_virtual_stage vectors, when not empty,
  // override per virtual stage as activation_bytes_per_virtual_stage does (a negative element
  // of the full one derives too).
  std::int64_t retained_full_bytes = -1;
  std::int64_t retained_lean_bytes = 0;
  std::vector<std::int64_t> retained_full_bytes_per_virtual_stage;
  std::vector<std::int64_t> retained_lean_bytes_per_virtual_stage;
  // Bytes a RECOMPUTE_LEAN allocates for the entry it rebuilds, which replaces the lean block
  // when the op ends. Negative (the default): the whole entry (ActivationBytes). 0: nothing, B
  // reads the lean block itself (StageModel::BackwardReadsRetained) and the entry keeps it
  // until B frees it. The vector, when not empty, overrides per virtual stage as the others do.
  std::int64_t lean_rebuild_bytes = -1;
  std::vector<std::int64_t> lean_rebuild_bytes_per_virtual_stage;

  // Bytes of entry (mb, chunk) on `stage`: activation_bytes_per_virtual_stage is indexed by the
  // virtual stage `map` places that chunk at.
  std::int64_t ActivationBytes(int stage, int chunk, const VirtualStageMap& map) const;
  // The same under loop placement for a pipeline of `num_stages` stages.
  std::int64_t ActivationBytes(int stage, int chunk, int num_stages) const;
  // Durations on `stage` (applies stage_time_scale).
  double ForwardTime(int stage) const;
  double BackwardTime(int stage, bool split_backward) const;  // includes W when not split
  double WeightTime(int stage) const;
  // Duration of a RECOMPUTE (kFull) or RECOMPUTE_LEAN (kLean) op on `stage`; 0 for kNone.
  double RecomputeTime(int stage, Recompute mode) const;
  // Bytes F keeps of entry (stage, chunk) recomputed with `mode`: ActivationBytes for kNone;
  // 0 when `mode` is not offered there.
  std::int64_t RetainedBytes(int stage, int chunk, const VirtualStageMap& map,
                             Recompute mode) const;
  // Bytes the RECOMPUTE* of entry (stage, chunk) recomputed with `mode` allocates: the whole
  // entry, except a lean one whose lean_rebuild_bytes says otherwise (0: read in place).
  std::int64_t RebuildBytes(int stage, int chunk, const VirtualStageMap& map,
                            Recompute mode) const;
  // Bytes the entry holds from its RECOMPUTE* (when kept: from its F) to the op that frees it:
  // RebuildBytes, or the retained block when the rebuild allocates nothing.
  std::int64_t BackwardHeldBytes(int stage, int chunk, const VirtualStageMap& map,
                                 Recompute mode) const;
  // Whether the planner may choose `mode` for (stage, chunk): kNone always, the others when
  // their retained bytes are > 0.
  bool RecomputeOffered(int stage, int chunk, const VirtualStageMap& map, Recompute mode) const;
};

// A lean recompute's share of forward_time when recompute_lean_time is not given.
inline constexpr double kLeanRecomputeShare = 0.25;

// F = B = W = 1, transfers free of charge except offload, which takes k * 3 per entry one way
// (the reference planner's k: transfer time of one chunk's activation over its F + B + W time).
// Recompute: full takes 1 (one F) and keeps 1/16 of the entry (the chunk's input); lean takes
// 0.25 and keeps 1/2 of it.
CostModel UnitCostModel(double offload_ratio_k);

// The shape of a GPT layer stack, for estimating a cost model when no measured one exists.
struct GptShape {
  int hidden = 8192;           // h
  int sequence = 4096;         // s, tokens per microbatch (microbatch size 1)
  int layers_per_chunk = 2;    // layers in one (stage, chunk)
  double flops_per_second = 600e12;  // achieved bf16 rate (about 75% of the H200's 790 TFLOP/s)
  double pcie_bandwidth = 55.2e9;    // one direction alone (reference/hardware.md)
  double pcie_duplex_bandwidth = 44.6e9;  // each direction while both run
  double p2p_bandwidth = 300e9;      // NVLink between neighbouring GPUs
  double p2p_latency = 10e-6;
  double memory_bandwidth = 4.0e12;  // achieved HBM bytes/s (H200: 4.8 TB/s peak)
};

// Seconds and bytes for one chunk of `shape`: F = 24h^2 s + 4 s^2 h FLOP per layer (B and W the
// same each, so F+B+W = 72 h^2 s + 12 s^2 h as in reference/hardware.md section 4), 34 h s bytes
// of saved activations per layer (bf16, no recompute; DESIGN.md section 6), 2 h s bytes per P2P
// message. Recompute: full = one forward, keeping the chunk's input (2 h s bytes); lean =
// the two LayerNorm outputs (2 x 2 h s) and the GELU output (8 h s) recomputed, so it keeps
// 22 h s bytes per layer and takes the time those memory-bound kernels move 24 h s bytes per
// layer (read and write) at memory_bandwidth.

CostModel EstimateGptCostModel(const GptShape& shape);

// Cost model JSON: an object with any subset of CostModel's field names (unknown keys and wrong
// types are InvalidArgument naming the key); missing fields keep `defaults`' values.
[[nodiscard]] absl::StatusOr<CostModel> ParseCostModelJson(std::string_view json,
                                                           const CostModel& defaults);
std::string CostModelToJson(const CostModel& cost);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_COST_MODEL_H_
