// PlanAuto: the `auto` offload policy (issue 3). Compiles candidate plans (family, v, g, share
// of the activation volume to offload) for the spec's p and m and keeps the fastest whose
// predicted per-stage peak fits the memory budget. Pure function of its inputs; no I/O.
//
// The cost model describes a chunk of the spec's own v (spec.chunks_per_stage). A candidate
// with v' chunks per stage cuts the same layers into v' chunks, so its per-chunk compute times
// and activation bytes are the spec's scaled by v / v'; P2P message sizes stay. With
// activation_bytes_per_virtual_stage (one entry per virtual stage of the spec's v) only v' = v
// can be priced, so only that v is tried. The returned schedule's predictions use the scaled
// model of the plan it holds.
//
// Within one (family, v, g), offloading never makes a plan faster (the planner keeps a step as
// fast, or lets it grow within its overhead budget to gate a warm-up), so an order whose plain
// step is slower than the incumbent is skipped, and otherwise its pick is the smallest share
// of the volume that fits: it moves the fewest bytes over PCIe, and where a smaller share fits
// a larger one buys no speed.
//
// Recompute (issue 15): when spec.recompute is lean or full, an order that does not fit without
// offload is also tried with recompute instead of offload: for each mode allowed (lean, and
// full when spec.recompute is full) the smallest of kRecomputeFractions of each stage's
// entries, longest-lived first, that fits. And where full offload alone does not fit, with
// both per entry (kept, offloaded, recomputed, or recomputed with what F keeps offloaded): po-f
// carries what the link can, and rounds of RecomputeAtPeaks (recompute_mix.h) recompute entries
// at each stage's peak that the plan kept, re-planning the offload around them each round (its
// candidate for a recomputed entry is the retained block), until the plan fits: once
// recomputing lean (then, when full is allowed, upgrading to full where lean is not enough) and
// once recomputing full, each with rounds that cover a stage's peak and with rounds that cover
// every instant above the budget (MixCover). And once with every entry recomputed lean and
// po-f on top (TryLeanOffload: where the link cannot carry whole entries it may carry their
// lean blocks), then, when full is allowed, rounds that recompute in full at the peaks. All
// compete on step time (recompute costs compute time; offload is free while the link keeps up).
//
// "Faster" is the candidate's predicted step_time, or with a judge (CompileOptions::auto_step)
// the judge's step: stages sharing one GPU are judged by SimulateSharedGpu, where recompute in a
// bubble is not free. Only the ranking changes; which candidates are compiled does not.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/checked_math.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "schedules/offload_planner.h"
#include "schedules/recompute_mix.h"

namespace pipeoffload::internal {
namespace {

// Largest v tried: beyond it the per-chunk P2P and bookkeeping overheads dominate, and the
// reference configurations use v <= 4 (pipeoffload.md section 1.3).
constexpr int kMaxAutoChunks = 4;

struct Share {
  OffloadPolicy policy;
  double fraction;  // for kSelective
  const char* name;
};
// In increasing order of offloaded volume (the planner's choices nest: pipeoffload.md 7.7).
constexpr Share kShares[] = {{OffloadPolicy::kNone, 0.0, "none"},
                             {OffloadPolicy::kSelective, 0.25, "selective 0.25"},
                             {OffloadPolicy::kHalf, 0.5, "po-h"},
                             {OffloadPolicy::kSelective, 0.75, "selective 0.75"},
                             {OffloadPolicy::kFull, 1.0, "po-f"}};

// Shares of each stage's entries a recompute candidate recomputes, in increasing order.
constexpr double kRecomputeFractions[] = {0.25, 0.5, 0.75, 1.0};

// The most rounds of one mixed search (each compiles one plan). Each round covers every stage's
// excess at its peak, so a few usually suffice; the bound keeps auto's time bounded when the
// peak keeps moving.
constexpr int kMaxMixRounds = 16;
// Rounds without a lower peak after which a lean search goes on in full.
constexpr int kMixRoundsWithoutGain = 3;
constexpr int kFullOffload = 4;  // kShares' po-f

struct Order {
  Family family;
  int v;
  int g;  // 0: the family's default
};

std::string OrderName(const Order& order, int resolved_g) {
  std::string name = std::string(FamilyName(order.family));
  if (order.family != Family::k1F1B) absl::StrAppend(&name, " v=", order.v, " g=", resolved_g);
  return name;
}

std::vector<Order> Orders(const PipelineSpec& spec, const CostModel& cost) {
  const int p = spec.num_stages;
  std::vector<int> chunk_counts;
  if (!cost.activation_bytes_per_virtual_stage.empty()) {
    chunk_counts.push_back(spec.chunks_per_stage);
  } else {
    for (int v = 1; v <= kMaxAutoChunks; ++v) chunk_counts.push_back(v);
  }
  std::vector<Order> orders;
  for (const int v : chunk_counts) {
    if (v == 1) {
      orders.push_back({Family::k1F1B, 1, 0});
      continue;
    }
    orders.push_back({Family::kInterleaved, v, 0});
    const int g_min = (p + 1) / 2;
    orders.push_back({Family::kGroupInterleaved, v, g_min});
    if (g_min != p) orders.push_back({Family::kGroupInterleaved, v, p});
  }
  return orders;
}

std::int64_t MaxPeak(const Predictions& predictions) {
  std::int64_t peak = 0;
  for (const StagePrediction& stage : predictions.stages) peak = std::max(peak, stage.peak_bytes);
  return peak;
}

std::int64_t Offloaded(const Predictions& predictions) {
  std::int64_t bytes = 0;
  for (const StagePrediction& stage : predictions.stages) bytes += stage.offloaded_bytes;
  return bytes;
}

// "recompute lean 12, full 3 of 256 entries": what a per-entry choice recomputes.
std::string ChoiceName(const RecomputeChoice& choice, const PipelineSpec& spec) {
  int lean = 0, full = 0;
  for (const auto& [key, mode] : choice) {
    lean += mode == Recompute::kLean;
    full += mode == Recompute::kFull;
  }
  std::string name = "recompute";
  if (lean > 0) absl::StrAppend(&name, " lean ", lean);
  if (full > 0) absl::StrAppend(&name, lean > 0 ? "," : "", " full ", full);
  const std::int64_t entries = static_cast<std::int64_t>(spec.num_stages) *
                               spec.num_microbatches * spec.chunks_per_stage;
  return absl::StrCat(name, " of ", entries, " entries");
}

// The search state of PlanAuto: the incumbent, the smallest peak seen, and the log.
struct Search {
  const PipelineSpec& spec;
  std::vector<std::string>* alternatives;
  const StepJudge& judge;
  std::optional<Schedule> best;
  double best_step = 0.0;  // Step(*best)
  std::string best_name;
  std::optional<std::int64_t> smallest_peak;
  std::string smallest_name;
  std::string last_error;
  int weighed = 0;

  // Compiles `order` with share kShares[index], recompute as spec.recompute = `recompute` and
  // `recompute_fraction` would choose, or per entry as `choice` says when it is not null;
  // nullopt when it does not compile.
  std::optional<Schedule> Try(const Order& order, const CostModel& cost, int index,
                              std::string* name, Recompute recompute = Recompute::kNone,
                              double recompute_fraction = 1.0,
                              const RecomputeChoice* choice = nullptr) {
    const Share& share = kShares[index];
    PipelineSpec candidate = spec;
    candidate.recompute = recompute;
    candidate.recompute_fraction = recompute_fraction;
    candidate.recompute_chunks = 0;
    candidate.family = order.family;
    candidate.chunks_per_stage = order.v;
    candidate.group_size = order.g;
    candidate.offload = share.policy;
    candidate.offload_fraction = share.policy == OffloadPolicy::kSelective ? share.fraction : 0.0;
    candidate.offload_chunks = 0;
    candidate.strict = false;
    absl::StatusOr<Schedule> compiled = choice != nullptr
                                            ? CompileWithRecompute(candidate, cost, *choice)
                                            : Compile(candidate, cost);
    ++weighed;
    *name = absl::StrCat(OrderName(order, compiled.ok() ? compiled->spec.group_size : order.g),
                         ", offload ", share.name);
    if (recompute != Recompute::kNone) {
      absl::StrAppend(name, absl::StrFormat(", recompute %s %g", RecomputeName(recompute),
                                            recompute_fraction));
    }
    if (choice != nullptr) absl::StrAppend(name, ", ", ChoiceName(*choice, candidate));
    if (!compiled.ok()) {
      last_error = std::string(compiled.status().message());
      Log(absl::StrCat(*name, ": not applicable: ", last_error));
      return std::nullopt;
    }
    const std::int64_t peak = MaxPeak(*compiled->predictions);
    if (!smallest_peak || peak < *smallest_peak) {
      smallest_peak = peak;
      smallest_name = *name;
    }
    return *std::move(compiled);
  }

  // The step `schedule` is ranked by (the file comment); nullopt when the judge rules it out.
  std::optional<double> Step(const Schedule& schedule, const std::string& name) {
    if (!judge) return schedule.predictions->step_time;
    absl::StatusOr<double> step = judge(schedule);
    if (!step.ok()) {
      Log(absl::StrCat(name, ": ruled out by the step judge: ", step.status().message()));
      return std::nullopt;
    }
    Log(absl::StrFormat("%s: judged step time %.6g", name, *step));
    return *step;
  }

  bool Fits(const Schedule& schedule) const {
    return MaxPeak(*schedule.predictions) <= spec.memory_budget_bytes;
  }

  void Log(std::string line) {
    if (alternatives != nullptr) alternatives->push_back(std::move(line));
  }
  void LogPlan(const std::string& name, const Schedule& schedule) {
    const Predictions& p = *schedule.predictions;
    Log(absl::StrFormat("%s: step time %.6g, peak %d bytes per stage, %d bytes offloaded: %s",
                        name, p.step_time, MaxPeak(p), Offloaded(p),
                        Fits(schedule) ? "fits" : "exceeds the budget"));
  }

  // The order's smallest share that fits, if it can beat the incumbent. Offload never makes an
  // order faster, so its step time without offload decides whether it can; peaks fall as the
  // share grows (the planner's choices nest), so after no offload and full offload a bisection
  // over the shares between finds the smallest that fits.
  void TryOrder(const Order& order, const CostModel& cost) {
    std::string name;
    std::optional<Schedule> plain = Try(order, cost, 0, &name);
    if (!plain) return;
    const std::optional<double> plain_step = Step(*plain, name);
    if (!plain_step) return;
    if (best && *plain_step > best_step * (1 + 1e-9)) {
      Log(absl::StrFormat("%s: step time %.6g, slower than %s: skipped with its larger shares",
                          name, *plain_step, best_name));
      return;
    }
    LogPlan(name, *plain);
    if (Fits(*plain)) return Consider(std::move(*plain), name);
    std::optional<Schedule> full_offload = TryOffloadShares(order, cost);
    TryRecompute(order, cost);
    if (full_offload && spec.recompute != Recompute::kNone) {
      for (const MixCover cover : {MixCover::kPeak, MixCover::kPlateau}) {
        TryMixed(order, cost, *full_offload, {}, Recompute::kLean, cover);
        if (spec.recompute == Recompute::kFull) {
          TryMixed(order, cost, *full_offload, {}, Recompute::kFull, cover);
        }
      }
      TryLeanOffload(order, cost, *full_offload);
    }
  }

  // Every entry recomputed lean with po-f on top, which offloads what F keeps wherever the link
  // carries it (issue 16: where the link cannot carry whole entries, a lean block is the share
  // of an entry it can), and, when that does not fit and spec.recompute allows full, rounds
  // from it that recompute in full at the peaks. `full_offload` is the order's po-f plan.
  void TryLeanOffload(const Order& order, const CostModel& cost, const Schedule& full_offload) {
    RecomputeChoice all_lean;
    const VirtualStageMap map = full_offload.spec.stage_map();
    for (const StageProgram& program : full_offload.stages) {
      for (const Op& op : program.ops) {
        if (op.kind != OpKind::kForward ||
            !cost.RecomputeOffered(program.stage, op.chunk, map, Recompute::kLean)) {
          continue;
        }
        all_lean[{program.stage, op.mb, op.chunk}] = Recompute::kLean;
      }
    }
    if (all_lean.empty()) return;
    std::string name;
    std::optional<Schedule> lean =
        Try(order, cost, kFullOffload, &name, Recompute::kNone, 1.0, &all_lean);
    if (!lean) return;
    LogPlan(name, *lean);
    if (Fits(*lean)) return Consider(*std::move(lean), name);
    if (spec.recompute != Recompute::kFull) return;
    for (const MixCover cover : {MixCover::kPeak, MixCover::kPlateau}) {
      TryMixed(order, cost, *lean, all_lean, Recompute::kFull, cover);
    }
  }

  // Full offload plus recompute per entry (the file comment), starting from `start` (a po-f
  // plan with the recompute `choice`, which does not fit) and recomputing in `mode` first, each
  // round covering what `cover` says; a lean search goes on in full once lean lowers no stage
  // further, when spec.recompute allows it.
  void TryMixed(const Order& order, const CostModel& cost, const Schedule& start,
                RecomputeChoice choice, Recompute mode, MixCover cover) {
    const Schedule* current = &start;
    std::optional<Schedule> candidate;
    std::int64_t lowest = MaxPeak(*start.predictions);
    int stalled = 0;  // rounds since the worst stage's peak last came down
    for (int round = 0; round < kMaxMixRounds; ++round) {
      // Lean is not enough when it finds nothing more at the peaks or stops lowering them:
      // go on in full, which keeps less, where spec.recompute allows it.
      if (stalled >= kMixRoundsWithoutGain ||
          RecomputeAtPeaks(*current, cost, spec.memory_budget_bytes, mode, cover, &choice) == 0) {
        // Nothing recomputed lean yet: that is the full search, made on its own.
        if (mode == Recompute::kFull || spec.recompute != Recompute::kFull || round == 0) return;
        mode = Recompute::kFull;
        stalled = 0;
        if (RecomputeAtPeaks(*current, cost, spec.memory_budget_bytes, mode, cover, &choice) == 0) {
          return;
        }
      }
      std::string name;
      candidate = Try(order, cost, kFullOffload, &name, Recompute::kNone, 1.0, &choice);
      if (!candidate) return;
      LogPlan(name, *candidate);
      if (Fits(*candidate)) return Consider(*std::move(candidate), name);
      const std::int64_t peak = MaxPeak(*candidate->predictions);
      stalled = peak < lowest ? 0 : stalled + 1;
      lowest = std::min(lowest, peak);
      current = &*candidate;
    }
  }

  // For each recompute mode spec.recompute allows, the smallest fraction that fits.
  void TryRecompute(const Order& order, const CostModel& cost) {
    std::vector<Recompute> modes;
    if (spec.recompute != Recompute::kNone) modes.push_back(Recompute::kLean);
    if (spec.recompute == Recompute::kFull) modes.push_back(Recompute::kFull);
    for (const Recompute mode : modes) {
      for (const double fraction : kRecomputeFractions) {
        std::string name;
        std::optional<Schedule> candidate = Try(order, cost, 0, &name, mode, fraction);
        if (!candidate) break;
        LogPlan(name, *candidate);
        if (Fits(*candidate)) {
          Consider(*std::move(candidate), name);
          break;
        }
      }
    }
  }

  // The offload share bisection of TryOrder, for an order whose plain plan does not fit.
  // Returns the full offload plan when it does not fit either (the mixed search starts there).
  std::optional<Schedule> TryOffloadShares(const Order& order, const CostModel& cost) {
    std::string name;
    int low = 1, high = static_cast<int>(std::size(kShares)) - 1;  // high: the fitting candidate
    std::optional<Schedule> fitting = Try(order, cost, high, &name);
    if (!fitting) return std::nullopt;
    LogPlan(name, *fitting);
    if (!Fits(*fitting)) return fitting;
    std::string fitting_name = name;
    while (low < high) {
      const int mid = (low + high) / 2;
      std::optional<Schedule> candidate = Try(order, cost, mid, &name);
      if (!candidate) return std::nullopt;
      LogPlan(name, *candidate);
      if (Fits(*candidate)) {
        high = mid;
        fitting = std::move(candidate);
        fitting_name = name;
      } else {
        low = mid + 1;
      }
    }
    Consider(*std::move(fitting), fitting_name);
    return std::nullopt;
  }

  // Keeps `schedule` (which fits) when it is faster than the incumbent, or as fast and moves
  // fewer bytes.
  void Consider(Schedule schedule, const std::string& name) {
    const std::optional<double> step = Step(schedule, name);
    if (!step) return;
    const Predictions& p = *schedule.predictions;
    const Predictions* incumbent = best ? &*best->predictions : nullptr;
    const bool better =
        incumbent == nullptr || *step < best_step * (1 - 1e-9) ||
        (*step <= best_step * (1 + 1e-9) &&
         std::make_pair(Offloaded(p), MaxPeak(p)) <
             std::make_pair(Offloaded(*incumbent), MaxPeak(*incumbent)));
    if (!better) return;
    best = std::move(schedule);
    best_step = *step;
    best_name = name;
  }
};

}  // namespace

CostModel RechunkedCost(const CostModel& cost, int from_v, int to_v) {
  if (from_v == to_v || from_v < 1 || to_v < 1 || !cost.activation_bytes_per_virtual_stage.empty()) {
    return cost;
  }
  CostModel scaled = cost;
  const double factor = static_cast<double>(from_v) / to_v;
  scaled.forward_time *= factor;
  scaled.backward_time *= factor;
  scaled.weight_time *= factor;
  // Saturated: llround of a value past the int64 range is undefined; the byte-total check then
  // refuses the model.
  scaled.activation_bytes =
      SaturatedInt64(std::round(static_cast<double>(cost.activation_bytes) * factor));
  // Recompute times given explicitly scale with the chunk; derived ones follow forward_time.
  // The lean layout scales with the layers; the full one is the chunk's input, which stays.
  if (scaled.recompute_full_time >= 0) scaled.recompute_full_time *= factor;
  if (scaled.recompute_lean_time >= 0) scaled.recompute_lean_time *= factor;
  scaled.retained_lean_bytes =
      SaturatedInt64(std::round(static_cast<double>(cost.retained_lean_bytes) * factor));
  // A rebuild's own block scales with the layers too; 0 (read in place) and the derived -1 stay.
  if (scaled.lean_rebuild_bytes > 0) {
    scaled.lean_rebuild_bytes =
        SaturatedInt64(std::round(static_cast<double>(cost.lean_rebuild_bytes) * factor));
  }
  return scaled;
}

absl::StatusOr<Schedule> PlanAuto(const PipelineSpec& spec, const CostModel& cost,
                                  std::vector<std::string>* alternatives,
                                  const StepJudge& judge) {
  if (spec.memory_budget_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "auto offload needs memory_budget_bytes > 0, the per-stage activation budget in bytes "
        "(got ",
        spec.memory_budget_bytes, ")"));
  }
  if (spec.chunks_per_stage < 1 || spec.num_stages < 1 || spec.num_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "auto offload needs num_stages, num_microbatches and chunks_per_stage >= 1 (got p=",
        spec.num_stages, ", m=", spec.num_microbatches, ", v=", spec.chunks_per_stage, ")"));
  }
  Search search{spec, alternatives, judge};
  for (const Order& order : Orders(spec, cost)) {
    search.TryOrder(order, RechunkedCost(cost, spec.chunks_per_stage, order.v));
  }
  if (!search.best) {
    if (!search.smallest_peak) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auto offload: no candidate plan compiles; the last error: ", search.last_error));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "auto offload: no plan fits memory_budget_bytes=", spec.memory_budget_bytes,
        " per stage; the smallest peak found is ", *search.smallest_peak, " bytes (",
        search.smallest_name, ") among ", search.weighed,
        " candidates; raise the budget or add stages"));
  }
  Schedule& best = *search.best;
  const std::string judged =
      judge ? absl::StrFormat(", judged %.6g", search.best_step) : std::string();
  best.predictions->warnings.push_back(absl::StrFormat(
      "auto: chose %s (step time %.6g%s, peak %d <= budget %d bytes per stage) among %d "
      "candidates",
      search.best_name, best.predictions->step_time, judged, MaxPeak(*best.predictions),
      spec.memory_budget_bytes, search.weighed));
  return std::move(best);
}

}  // namespace pipeoffload::internal
