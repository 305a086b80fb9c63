// The schedule IR: the one contract between the schedule compiler and the runtime.
//
// A Schedule is a PipelineSpec, one StageProgram per pipeline rank, and (once simulated) the
// predictions. A StageProgram is an ordered list of Ops that the runtime issues strictly in order.
// This header holds plain value types only: no I/O, no CUDA, no MPI (DESIGN.md section 3).
//
// Notation (reference/pipeoffload.md section 0): p = num_stages, m = num_microbatches,
// v = chunks_per_stage, g = group_size. Chunk c on stage d holds layer group (virtual stage)
// c * p + d under "loop" placement, and d or 2p - 1 - d under "v" placement (VirtualStageMap).
#ifndef PIPEOFFLOAD_SCHEDULE_H_
#define PIPEOFFLOAD_SCHEDULE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeoffload/stage_model.h"  // Recompute

namespace pipeoffload {

// What one instruction does. Each kind prints as its IR name (OpKindName), e.g. kForward -> "F".
enum class OpKind : std::uint8_t {
  kForward,         // "F": forward of (mb, chunk); its saved activations enter the stash.
  kBackward,        // "B": backward for inputs of (mb, chunk); the full backward (input and
                    //      weight gradients) when the spec does not split W. Frees the stash
                    //      entry when not split.
  kBackwardWeight,  // "W": weight-gradient backward of (mb, chunk); frees the stash entry.
  kSendActivation,  // "SEND_F": output of F(mb, chunk) to the next virtual stage (on `peer`).
  kRecvActivation,  // "RECV_F": input of F(mb, chunk) from the previous virtual stage.
  kSendGrad,        // "SEND_B": input gradient of B(mb, chunk) to the previous virtual stage.
  kRecvGrad,        // "RECV_B": output gradient for B(mb, chunk) from the next virtual stage.
  kOffload,         // "OFFLOAD": start the D2H copy of (mb, chunk)'s stash entry (of an entry
                    //      the program recomputes: its retained block, see kRecompute).
  kRelease,         // "RELEASE": once that copy is done, free the device copy.
  kReload,          // "RELOAD": allocate device memory and start the H2D copy back.
  kBarrier,         // "BARRIER": rendezvous with `peer` (the paired stage), to stagger transfers.
  // Appended after BARRIER so the older kinds keep their numbers (file formats, fingerprints).
  kRecompute,       // "RECOMPUTE": before B(mb, chunk), rebuild the full stash entry from what
                    //      F kept (StageModel::RecomputeSaved, Recompute::kFull: the chunk's
                    //      input), then free the retained block. Runs on the compute queue.
                    //      The retained block may itself be offloaded: OFFLOAD, RELEASE and
                    //      RELOAD of a recomputed entry move it, RELOAD before the RECOMPUTE.
  kRecomputeLean,   // "RECOMPUTE_LEAN": the same from the lean layout (Recompute::kLean).
};
inline constexpr int kNumOpKinds = 13;

// "F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OFFLOAD", "RELEASE", "RELOAD", "BARRIER",
// "RECOMPUTE", "RECOMPUTE_LEAN".
std::string_view OpKindName(OpKind kind);
// Inverse of OpKindName; nullopt for any other string (exact, case-sensitive match).
std::optional<OpKind> OpKindFromName(std::string_view name);

// Inline: the simulator, the validator and the offload planner ask these of every op they
// visit, a few million times per compile at p=64 m=512 v=4 (issue 15).
// RECOMPUTE, RECOMPUTE_LEAN
inline bool IsRecompute(OpKind kind) {
  return kind == OpKind::kRecompute || kind == OpKind::kRecomputeLean;
}
// F, B, W, RECOMPUTE, RECOMPUTE_LEAN
inline bool IsCompute(OpKind kind) {
  return kind == OpKind::kForward || kind == OpKind::kBackward ||
         kind == OpKind::kBackwardWeight || IsRecompute(kind);
}
// SEND_F, RECV_F, SEND_B, RECV_B
inline bool IsP2P(OpKind kind) {
  return kind == OpKind::kSendActivation || kind == OpKind::kRecvActivation ||
         kind == OpKind::kSendGrad || kind == OpKind::kRecvGrad;
}
// SEND_F, SEND_B
inline bool IsSend(OpKind kind) {
  return kind == OpKind::kSendActivation || kind == OpKind::kSendGrad;
}
// OFFLOAD, RELEASE, RELOAD
inline bool IsOffload(OpKind kind) {
  return kind == OpKind::kOffload || kind == OpKind::kRelease || kind == OpKind::kReload;
}
// P2P kinds and BARRIER
inline bool HasPeer(OpKind kind) { return IsP2P(kind) || kind == OpKind::kBarrier; }

// One instruction. `mb` and `chunk` name the stash entry / microbatch the op concerns; `chunk` is
// always the chunk *on the op's own stage* (a RECV_F on stage 0 for chunk 1 receives the output
// of chunk 0 on stage p-1). `peer` is the other stage for P2P ops and BARRIER, -1 otherwise.
// A BARRIER's (mb, chunk) name the transfer it guards, or (-1, -1) when it guards none.
struct Op {
  OpKind kind = OpKind::kForward;
  int mb = 0;
  int chunk = 0;
  int peer = -1;

  friend bool operator==(const Op&, const Op&) = default;
};

// "F3.1" style short name used in text forms and error messages: kind, mb, '.', chunk, and
// "->peer" / "<-peer" for P2P ops.
std::string OpToString(const Op& op);

struct StageProgram {
  int stage = 0;
  std::vector<Op> ops;

  friend bool operator==(const StageProgram&, const StageProgram&) = default;
};

// The compute-order family (DESIGN.md section 4, pass 1).
enum class Family : std::uint8_t {
  k1F1B,              // "1f1b"
  kInterleaved,       // "interleaved": Megatron-style interleaved 1F1B, loop placement
  kGroupInterleaved,  // "group-interleaved": building blocks of group size g (pipeoffload.md 1.3)
  kZbv,               // "zbv": torch's ScheduleZBVZeroBubble (ZB-V), V placement, split B/W
  kDualPipeV,         // "dualpipev": torch's ScheduleDualPipeV, V placement, split B/W
};
std::string_view FamilyName(Family family);
std::optional<Family> FamilyFromName(std::string_view name);

// Which layer groups (virtual stages) a stage's chunks hold (issue 15).
enum class Placement : std::uint8_t {
  kLoop,  // "loop": chunk c of stage d is virtual stage c * p + d (Megatron, Interleaved1F1B)
  kV,     // "v": v = 2; chunk 0 of stage d is virtual stage d, chunk 1 is 2p - 1 - d (torch's
          //      ZBVZeroBubble and DualPipeV: stage s on rank s for s < p, else on 2p - 1 - s)
};
std::string_view PlacementName(Placement placement);
std::optional<Placement> PlacementFromName(std::string_view name);

// The one mapping between (stage, chunk) and virtual stages; every pass, the simulator, the
// runtime and the CSV reader use it instead of writing the formula out. Under V the first and the
// last virtual stage share stage 0 and the middle two (p - 1 and p) share stage p - 1, which
// hands data between them locally. REQUIRES: placement kV only with chunks == 2 (ResolveSpec and
// Validate say so for other v).
struct VirtualStageMap {
  Placement placement = Placement::kLoop;
  int num_stages = 1;  // p
  int chunks = 1;      // v

  int num_virtual_stages() const { return num_stages * chunks; }
  int virtual_stage(int stage, int chunk) const {
    if (placement == Placement::kV && chunk == 1) return 2 * num_stages - 1 - stage;
    return chunk * num_stages + stage;
  }
  int stage_of(int virtual_stage) const {
    if (placement == Placement::kV && virtual_stage >= num_stages) {
      return 2 * num_stages - 1 - virtual_stage;
    }
    return virtual_stage % num_stages;
  }
  int chunk_of(int virtual_stage) const { return virtual_stage / num_stages; }
};

// Which activations leave the device (issue 3). kNone plans no transfers.
enum class OffloadPolicy : std::uint8_t {
  kNone,       // "none"
  kHalf,       // "po-h": half of the activation volume, longest-lived first
  kFull,       // "po-f": every entry whose lifespan is long enough to save memory
  kSelective,  // "selective": offload_fraction of the volume, or offload_chunks chunks
  kAuto,       // "auto": the fastest plan whose predicted peak fits memory_budget_bytes
};
std::string_view OffloadPolicyName(OffloadPolicy policy);
std::optional<OffloadPolicy> OffloadPolicyFromName(std::string_view name);

// What the user asks for. group_size == 0 means "the family's default" (p for interleaved,
// ceil(p/2) for group-interleaved); it is resolved by the compiler and written back.
struct PipelineSpec {
  Family family = Family::k1F1B;
  int num_stages = 1;        // p
  int num_microbatches = 1;  // m
  int chunks_per_stage = 1;  // v
  int group_size = 0;        // g
  bool split_backward = false;  // emit separate W ops (zero-bubble style)

  // Recomputation (issue 15): kLean / kFull put RECOMPUTE_LEAN / RECOMPUTE before B of the
  // chosen entries, whose F keeps only a retained block. recompute_chunks > 0 chooses every
  // entry of chunks [0, recompute_chunks); else recompute_fraction of each stage's entries,
  // longest-lived first. With offload kAuto, `recompute` is instead the most the planner may
  // use per entry (kLean: keep, offload or lean; kFull: any of the four).
  Recompute recompute = Recompute::kNone;
  double recompute_fraction = 1.0;  // in (0, 1]
  int recompute_chunks = 0;         // in [0, v]; 0 = use the fraction

  OffloadPolicy offload = OffloadPolicy::kNone;
  double offload_fraction = 0.0;  // selective: share of the activation volume, in [0, 1]
  int offload_chunks = 0;         // selective: offload chunks [0, offload_chunks); 0 = use fraction
  std::int64_t memory_budget_bytes = 0;  // auto: per-stage activation budget
  bool strict = false;  // fail instead of planning less offload than requested

  Placement placement = Placement::kLoop;  // kV needs v = 2

  int num_virtual_stages() const { return num_stages * chunks_per_stage; }
  VirtualStageMap stage_map() const { return {placement, num_stages, chunks_per_stage}; }

  friend bool operator==(const PipelineSpec&, const PipelineSpec&) = default;
};

// What the simulator predicts for one stage.
struct StagePrediction {
  std::int64_t peak_units = 0;   // peak stash entries resident on the device (chunk units)
  std::int64_t peak_bytes = 0;   // the same peak in bytes
  std::int64_t peak_units_without_offload = 0;  // the same order with no transfers planned
  std::int64_t peak_bytes_without_offload = 0;
  std::int64_t host_bytes = 0;        // pinned host memory the stage needs (peak)
  std::int64_t offloaded_bytes = 0;   // bytes copied D2H per iteration (equal to H2D)
  double busy_time = 0.0;             // compute time on this stage
  double end_time = 0.0;              // completion time of the stage's last op

  friend bool operator==(const StagePrediction&, const StagePrediction&) = default;
};

// Traffic through one stage's host link, or across one P2P link.
struct LinkTraffic {
  std::string name;  // "host:0" (host link of link group 0), "p2p:0->1"
  std::int64_t bytes_d2h = 0;  // host links: device-to-host; P2P links: bytes sent
  std::int64_t bytes_h2d = 0;  // host links: host-to-device; P2P links: 0

  friend bool operator==(const LinkTraffic&, const LinkTraffic&) = default;
};

struct Predictions {
  double step_time = 0.0;     // makespan of one iteration
  double bubble_ratio = 0.0;  // 1 - (sum of busy compute time) / (p * step_time)
  double step_time_without_offload = 0.0;  // the same order with no transfers planned
  std::vector<StagePrediction> stages;
  std::vector<LinkTraffic> links;
  int collisions = 0;  // overlapping transfers in one direction of one link
  std::vector<std::string> warnings;  // e.g. planned less offload than requested, with numbers

  friend bool operator==(const Predictions&, const Predictions&) = default;
};

struct Schedule {
  PipelineSpec spec;
  std::vector<StageProgram> stages;  // stages[d].stage == d
  std::optional<Predictions> predictions;

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_SCHEDULE_H_
