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
//
// Compile time (issue 15): each candidate is a full compile (up to seconds at p=64 m=512 v=4),
// so the orders are compiled on several threads, a few at a time (kOrdersInFlight), and
// replayed into one sequential search in order. An order's own search (its shares, recompute
// fractions and mixed rounds) depends on no other order; only whether it is searched at all
// depends on the incumbent, which the replay decides. So the result, the log, the candidates
// counted and the judge's calls are the sequential search's whatever the number of threads; a
// thread only guesses which orders are wanted, to search them ahead (a wrong guess costs time,
// never the result). An order is lowered once (LowerOrder: its compute order, comm lowering and
// baseline simulation), for its plain plan and its offload shares alike (CompileLowered); the
// lowering is kept from the plain plan to the order's search by at most kOrdersInFlight orders
// at once, and freed when its search ends. An order whose long warm-up makes activations faster
// than its host links can carry them out within the step is not planned at all: where the
// link-rate bound (link_rate_bound.h) shows that no offload plan of it can fit, its search
// records po-f as tried and ruled out (counted among the candidates, logged with the bound).
// Likewise a share whose policy keeps too much on the device (share_bound.h: po-h and the
// selective shares of 1F1B at p=64 in schedule_bench's auto case) is ruled out in the
// bisection as one that does not fit; neither bound rules anything out with recompute, whose
// mixed search starts from the po-f plan.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/check.h"
#include "lib/base/checked_math.h"
#include "lib/base/parallel_for.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/compiler.h"
#include "schedules/link_rate_bound.h"
#include "schedules/offload_planner.h"
#include "schedules/offload_policy.h"
#include "schedules/recompute_mix.h"
#include "schedules/share_bound.h"

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

// Candidates compiled at once (each on a thread of its own). A compile holds its working state
// (about 0.4 GB at p=64 m=512 v=4, docs/benchmarks.md), so this bounds auto's memory at about
// that many compiles; the compiler's threads they leave idle run the loops inside their
// compiles (lib/base/parallel_for.h).
constexpr int kOrdersInFlight = 4;

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

bool FitsBudget(const Schedule& schedule, const PipelineSpec& spec) {
  return MaxPeak(*schedule.predictions) <= spec.memory_budget_bytes;
}

// The log line of a compiled candidate.
std::string PlanLine(const std::string& name, const Schedule& schedule, const PipelineSpec& spec) {
  const Predictions& p = *schedule.predictions;
  return absl::StrFormat("%s: step time %.6g, peak %d bytes per stage, %d bytes offloaded: %s",
                         name, p.step_time, MaxPeak(p), Offloaded(p),
                         FitsBudget(schedule, spec) ? "fits" : "exceeds the budget");
}

// One step of an order's search, as Search replays it: a candidate compiled (or not), a log
// line, or a fitting candidate offered to the incumbent.
struct Event {
  enum class Kind { kTried, kLog, kConsider };
  Kind kind;
  std::string text;                  // kTried, kConsider: the candidate's name; kLog: the line
  std::optional<std::int64_t> peak;  // kTried: the candidate's peak; nullopt: not compiled
  std::string error;                 // kTried that did not compile: why
  std::optional<Schedule> schedule;  // kConsider
  // kTried ruled out without compiling it: the least peak it can have (OrderSearch::LeastPeak:
  // the larger of link_rate_bound.h's and share_bound.h's).
  std::optional<std::int64_t> least_peak = std::nullopt;
};

// What one order's search does once its plain plan does not fit (TryOrder in the file comment's
// terms): compile its offload shares, recompute fractions and mixed rounds, and pick among them.
// None of it depends on the other orders (the incumbent only decides whether the order is
// searched at all) and none of it calls the judge, so it may run on any thread, ahead of the
// replay; it records what it does as Events, which Search replays in order.
struct OrderSearch {
  const PipelineSpec& spec;
  const CostModel& cost;  // re-chunked for order.v
  Order order;
  std::vector<Event> events;
  // The order lowered for its offload shares (CompileOffloadShare), while they are compiled.
  std::optional<LoweredOrder> lowered;
  bool lowering_failed = false;
  std::optional<std::int64_t> link_rate_least;  // LinkRateLeastPeak of `lowered`, once found

  // Compiles `order` with share kShares[index], recompute as spec.recompute = `recompute` and
  // `recompute_fraction` would choose, or per entry as `choice` says when it is not null;
  // nullopt when it does not compile.
  std::optional<Schedule> Try(int index, std::string* name, Recompute recompute = Recompute::kNone,
                              double recompute_fraction = 1.0,
                              const RecomputeChoice* choice = nullptr) {
    const Share& share = kShares[index];
    PipelineSpec candidate = CandidateSpec(index);
    candidate.recompute = recompute;
    candidate.recompute_fraction = recompute_fraction;
    absl::StatusOr<Schedule> compiled =
        choice != nullptr ? CompileWithRecompute(candidate, cost, *choice)
        : recompute == Recompute::kNone ? CompileOffloadShare(candidate)
            : Compile(candidate, cost);
    *name = absl::StrCat(OrderName(order, compiled.ok() ? compiled->spec.group_size : order.g),
                         ", offload ", share.name);
    if (recompute != Recompute::kNone) {
      absl::StrAppend(name, absl::StrFormat(", recompute %s %g", RecomputeName(recompute),
                                            recompute_fraction));
    }
    if (choice != nullptr) absl::StrAppend(name, ", ", ChoiceName(*choice, candidate));
    if (!compiled.ok()) {
      const std::string error(compiled.status().message());
      events.push_back({Event::Kind::kTried, *name, std::nullopt, error, std::nullopt});
      Log(absl::StrCat(*name, ": not applicable: ", error));
      return std::nullopt;
    }
    events.push_back(
        {Event::Kind::kTried, *name, MaxPeak(*compiled->predictions), "", std::nullopt});
    return *std::move(compiled);
  }

  // The spec of the order with share kShares[index] and no recompute.
  PipelineSpec CandidateSpec(int index) const {
    const Share& share = kShares[index];
    PipelineSpec candidate = spec;
    candidate.recompute = Recompute::kNone;
    candidate.recompute_fraction = 1.0;
    candidate.recompute_chunks = 0;
    candidate.family = order.family;
    candidate.chunks_per_stage = order.v;
    candidate.group_size = order.g;
    candidate.offload = share.policy;
    candidate.offload_fraction = share.policy == OffloadPolicy::kSelective ? share.fraction : 0.0;
    candidate.offload_chunks = 0;
    candidate.strict = false;
    return candidate;
  }

  // Compile(candidate, cost) for one of the order's offload shares (none included), on the
  // order lowered once for all of them (LowerOrder: its lowering and baseline simulation are
  // the same for every share), or compiled whole should the order not lower.
  absl::StatusOr<Schedule> CompileOffloadShare(const PipelineSpec& candidate) {
    Lower(candidate);
    if (!lowered) return Compile(candidate, cost);
    return CompileLowered(candidate, cost, &*lowered);
  }

  // Lowers the order (`candidate`: one of its offload shares) unless done or tried before.
  void Lower(const PipelineSpec& candidate) {
    if (lowered || lowering_failed) return;
    absl::StatusOr<LoweredOrder> made = LowerOrder(candidate, cost);
    lowering_failed = !made.ok();
    if (made.ok()) lowered = *std::move(made);
  }

  // The least peak any plan of share kShares[index] of the order can have, by the link-rate
  // bound (link_rate_bound.h: every plan the offload planner keeps is within kOverheadBudget of
  // the order's step) and the share bound (share_bound.h; kept on the lowered order, where the
  // planner finds it again as it plans the share), and which of them says so; 0 where
  // neither applies. Only for a search that offloads alone: with recompute, the po-f plan is
  // where the mixed search starts, so it is compiled anyway.
  std::pair<std::int64_t, const char*> LeastPeak(int index) {
    if (spec.recompute != Recompute::kNone) return {0, ""};
    const PipelineSpec candidate = CandidateSpec(index);
    Lower(candidate);
    if (!lowered) return {0, ""};
    if (!link_rate_least) {
      const double max_step = lowered->baseline.step_time * (1.0 + kOverheadBudget) + 1e-12;
      link_rate_least = LinkRateLeastPeak(lowered->posted, lowered->posted_times, cost, max_step);
    }
    const std::int64_t share = lowered->share_bounds.Largest(lowered->posted, candidate, cost);
    if (share > *link_rate_least) {
      return {share, "the policy's share keeps that much on the device"};
    }
    return {*link_rate_least,
            "the host link cannot carry the warm-up's activations out within the step"};
  }

  // Whether share kShares[index] cannot fit by LeastPeak; when so, records it as tried and
  // ruled out, and logs why.
  bool RuledOut(int index) {
    const auto [least, why] = LeastPeak(index);
    if (least <= spec.memory_budget_bytes) return false;
    const std::string name = absl::StrCat(OrderName(order, lowered->lowered.spec.group_size),
                                          ", offload ", kShares[index].name);
    events.push_back({Event::Kind::kTried, name, std::nullopt, "", std::nullopt, least});
    Log(absl::StrFormat("%s: peak at least %d bytes per stage (%s): exceeds the budget, not "
                        "compiled",
                        name, least, why));
    return true;
  }

  bool Fits(const Schedule& schedule) const { return FitsBudget(schedule, spec); }
  void Log(std::string line) {
    events.push_back({Event::Kind::kLog, std::move(line), std::nullopt, "", std::nullopt});
  }
  void LogPlan(const std::string& name, const Schedule& schedule) {
    Log(PlanLine(name, schedule, spec));
  }
  void Consider(Schedule schedule, const std::string& name) {
    events.push_back({Event::Kind::kConsider, name, std::nullopt, "", std::move(schedule)});
  }

  // The order's smallest offload share that fits (the plain plan did not), then recompute
  // instead of offload and both per entry where spec.recompute allows it. Offload never makes
  // an order faster; peaks fall as the share grows (the planner's choices nest), so after full
  // offload a bisection over the shares between finds the smallest that fits.
  void Run() {
    std::optional<Schedule> full_offload = TryOffloadShares();
    lowered.reset();  // the shares are done: what follows recomputes, which lowers anew
    TryRecompute();
    if (full_offload && spec.recompute != Recompute::kNone) {
      for (const MixCover cover : {MixCover::kPeak, MixCover::kPlateau}) {
        TryMixed(*full_offload, {}, Recompute::kLean, cover);
        if (spec.recompute == Recompute::kFull) {
          TryMixed(*full_offload, {}, Recompute::kFull, cover);
        }
      }
      TryLeanOffload(*full_offload);
    }
  }

  // Every entry recomputed lean with po-f on top, which offloads what F keeps wherever the link
  // carries it (issue 16: where the link cannot carry whole entries, a lean block is the share
  // of an entry it can), and, when that does not fit and spec.recompute allows full, rounds
  // from it that recompute in full at the peaks. `full_offload` is the order's po-f plan.
  void TryLeanOffload(const Schedule& full_offload) {
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
    std::optional<Schedule> lean = Try(kFullOffload, &name, Recompute::kNone, 1.0, &all_lean);
    if (!lean) return;
    LogPlan(name, *lean);
    if (Fits(*lean)) return Consider(*std::move(lean), name);
    if (spec.recompute != Recompute::kFull) return;
    for (const MixCover cover : {MixCover::kPeak, MixCover::kPlateau}) {
      TryMixed(*lean, all_lean, Recompute::kFull, cover);
    }
  }

  // Full offload plus recompute per entry (the file comment), starting from `start` (a po-f
  // plan with the recompute `choice`, which does not fit) and recomputing in `mode` first, each
  // round covering what `cover` says; a lean search goes on in full once lean lowers no stage
  // further, when spec.recompute allows it.
  void TryMixed(const Schedule& start, RecomputeChoice choice, Recompute mode, MixCover cover) {
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
      candidate = Try(kFullOffload, &name, Recompute::kNone, 1.0, &choice);
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
  void TryRecompute() {
    std::vector<Recompute> modes;
    if (spec.recompute != Recompute::kNone) modes.push_back(Recompute::kLean);
    if (spec.recompute == Recompute::kFull) modes.push_back(Recompute::kFull);
    for (const Recompute mode : modes) {
      for (const double fraction : kRecomputeFractions) {
        std::string name;
        std::optional<Schedule> candidate = Try(0, &name, mode, fraction);
        if (!candidate) break;
        LogPlan(name, *candidate);
        if (Fits(*candidate)) {
          Consider(*std::move(candidate), name);
          break;
        }
      }
    }
  }

  // The offload share bisection, for an order whose plain plan does not fit.
  // Returns the full offload plan when it does not fit either (the mixed search starts there).
  std::optional<Schedule> TryOffloadShares() {
    if (RuledOut(kFullOffload)) return std::nullopt;
    std::string name;
    int low = 1, high = static_cast<int>(std::size(kShares)) - 1;  // high: the fitting candidate
    std::optional<Schedule> fitting = Try(high, &name);
    if (!fitting) return std::nullopt;
    LogPlan(name, *fitting);
    if (!Fits(*fitting)) return fitting;
    std::string fitting_name = name;
    while (low < high) {
      const int mid = (low + high) / 2;
      if (RuledOut(mid)) {
        low = mid + 1;
        continue;
      }
      std::optional<Schedule> candidate = Try(mid, &name);
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

  std::vector<Event> TakeEvents() { return std::exchange(events, {}); }
};

// One order's plain plan and, when it was searched ahead of the replay, its OrderSearch's
// events.
struct OrderRun {
  Order order;
  const CostModel* cost = nullptr;  // re-chunked for order.v
  std::vector<Event> plain_events;
  std::optional<Schedule> plain;  // without a judge, of one that does not fit: no programs
  // The order's lowering, kept from its plain plan for its offload shares (OrderScheduler).
  std::optional<LoweredOrder> lowered;
  std::string plain_name;
  std::optional<std::vector<Event>> searched;
};

// The search state of PlanAuto: the incumbent, the smallest peak seen, and the log. It sees the
// orders one at a time, in order, as the sequential search would: whatever ran ahead of it on
// other threads, the incumbent, the log and the judge's calls are those of the sequential
// search.
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
  // The least of the peaks candidates ruled out without compiling them can have.
  std::optional<std::int64_t> least_ruled_out;
  int ruled_out = 0;
  int weighed = 0;

  // The order's plain plan decides: skipped when slower than the incumbent (offload never makes
  // an order faster, so its step time without offload decides whether it can beat it), kept
  // when it fits, else searched (OrderSearch, now unless it ran ahead).
  void ReplayOrder(OrderRun& run) {
    Replay(std::move(run.plain_events));
    if (!run.plain) return;
    const std::optional<double> plain_step = Step(*run.plain, run.plain_name);
    if (!plain_step) return;
    if (best && *plain_step > best_step * (1 + 1e-9)) {
      Log(absl::StrFormat("%s: step time %.6g, slower than %s: skipped with its larger shares",
                          run.plain_name, *plain_step, best_name));
      return;
    }
    Log(PlanLine(run.plain_name, *run.plain, spec));
    if (FitsBudget(*run.plain, spec)) return Consider(*std::move(run.plain), run.plain_name);
    run.plain.reset();
    if (!run.searched) {
      OrderSearch search{spec, *run.cost, run.order, {}, std::move(run.lowered)};
      run.lowered.reset();
      search.Run();
      run.searched = search.TakeEvents();
    }
    Replay(*std::move(run.searched));
  }

  void Replay(std::vector<Event> events) {
    for (Event& event : events) {
      switch (event.kind) {
        case Event::Kind::kTried:
          ++weighed;
          if (event.least_peak) {
            ++ruled_out;
            if (!least_ruled_out || *event.least_peak < *least_ruled_out) {
              least_ruled_out = event.least_peak;
            }
          } else if (!event.peak) {
            last_error = std::move(event.error);
          } else if (!smallest_peak || *event.peak < *smallest_peak) {
            smallest_peak = event.peak;
            smallest_name = event.text;
          }
          break;
        case Event::Kind::kLog:
          Log(std::move(event.text));
          break;
        case Event::Kind::kConsider:
          Consider(*std::move(event.schedule), event.text);
          break;
      }
    }
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

  void Log(std::string line) {
    if (alternatives != nullptr) alternatives->push_back(std::move(line));
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

// Compiles the orders' candidates on the compiler's threads and replays them into a Search in
// order (the file comment). The tasks: every order's plain plan, in order, and the searches of
// the orders likely to be wanted (Wanted), each as soon as it is known to be wanted and before
// the next plain plan, the largest first, so that the longest start first; at most
// kOrdersInFlight at once. Whichever thread ends a task replays what is ready, one
// thread at a time; the replay searches an order itself when no thread has, so on one thread
// this is the sequential search, and a guess that missed costs time, never the result.
class OrderScheduler {
 public:
  OrderScheduler(const PipelineSpec& spec, const CostModel& cost, bool judged,
                 std::vector<Order> orders, Search* search)
      : spec_(spec), judged_(judged), search_(*search), slots_(orders.size()) {
    for (std::size_t i = 0; i < orders.size(); ++i) {
      slots_[i].cost = RechunkedCost(cost, spec.chunks_per_stage, orders[i].v);
      slots_[i].run.order = orders[i];
      slots_[i].run.cost = &slots_[i].cost;
    }
  }

  void Run() {
    const int workers = std::min(kOrdersInFlight, CompileThreads());
    ParallelFor(workers, [&](int) { Work(); }, workers);
    PO_CHECK(replayed_ == static_cast<int>(slots_.size()));
  }

 private:
  enum class SearchState { kNone, kRunning, kDone };
  struct Slot {
    CostModel cost;  // the order's, re-chunked; read by every thread, written by none
    OrderRun run;
    bool plain_done = false;
    std::optional<double> plain_step;  // predicted; nullopt: the plain plan did not compile
    std::int64_t ops = 0;              // the plain plan's: how long its search will take
    SearchState search = SearchState::kNone;
    bool taken = false;  // by the replay, which searches it itself if it must
    bool held = false;   // run.lowered was kept (counted in held_) until its search ends
  };
  struct Task {
    int order;
    bool search;  // else its plain plan
  };

  void Work() {
    try {
      std::unique_lock<std::mutex> lock(mu_);
      Task task;
      while (NextTask(lock, &task)) {
        lock.unlock();
        if (task.search) {
          Slot& slot = slots_[task.order];
          OrderSearch search{spec_, slot.cost, slot.run.order, {}, std::move(slot.run.lowered)};
          slot.run.lowered.reset();
          search.Run();
          std::vector<Event> events = search.TakeEvents();
          search.lowered.reset();
          lock.lock();
          if (slot.held) --held_;
          slot.run.searched = std::move(events);
          slot.search = SearchState::kDone;
        } else {
          CompilePlain(task.order, lock);
          --plains_running_;
        }
        changed_.notify_all();
        ReplayReady(lock);
      }
    } catch (...) {
      // Threads waiting for a task must not wait for one that will not come.
      const std::lock_guard<std::mutex> lock(mu_);
      failed_ = true;
      changed_.notify_all();
      throw;
    }
  }

  // Compiles order i's plain plan; returns with `lock` held and the slot filled.
  void CompilePlain(int i, std::unique_lock<std::mutex>& lock) {
    Slot& slot = slots_[i];
    OrderSearch search{spec_, slot.cost, slot.run.order, {}};
    std::string name;
    std::optional<Schedule> plain = search.Try(0, &name);
    std::int64_t ops = 0;
    if (plain) {
      for (const StageProgram& program : plain->stages) {
        ops += static_cast<std::int64_t>(program.ops.size());
      }
      // Without a judge the replay reads only the predictions of a plan that does not fit;
      // its programs need not wait for the replay beside the other orders'.
      if (!judged_ && !FitsBudget(*plain, spec_)) std::vector<StageProgram>().swap(plain->stages);
    }
    // An order whose plain plan does not fit may be searched: its lowering is kept for its
    // offload shares, by at most kOrdersInFlight orders at once (each is a few copies of the
    // lowering), until its search ends.
    if (!plain || FitsBudget(*plain, spec_)) search.lowered.reset();
    lock.lock();
    if (search.lowered && held_ < kOrdersInFlight) {
      slot.run.lowered = std::move(search.lowered);
      slot.held = true;
      ++held_;
    }
    lock.unlock();
    search.lowered.reset();  // not kept: freed outside the lock
    lock.lock();
    if (plain) slot.plain_step = plain->predictions->step_time;
    slot.run.plain = std::move(plain);
    slot.run.plain_name = std::move(name);
    slot.run.plain_events = search.TakeEvents();
    slot.ops = ops;
    slot.plain_done = true;
  }

  // The next task, or false when none is left to start (waits while a plain plan that may
  // make one wanted is being compiled).
  bool NextTask(std::unique_lock<std::mutex>& lock, Task* task) {
    const int count = static_cast<int>(slots_.size());
    while (!failed_) {
      // A wanted search before the next plain plan: a search takes several plain plans' time
      // and the replay is likely to need it (Wanted), so it starts as soon as that is known
      // (the longest first) rather than after every plain plan has been dispatched.
      int pick = -1;
      for (int i = replayed_; i < count; ++i) {
        // Of two as large, the later: its groups are larger, which takes the planner longer.
        if (Wanted(i) && (pick < 0 || slots_[i].ops >= slots_[pick].ops)) pick = i;
      }
      if (pick >= 0) {
        slots_[pick].search = SearchState::kRunning;
        *task = {pick, true};
        return true;
      }
      if (next_plain_ < count) {
        *task = {next_plain_++, false};
        ++plains_running_;
        return true;
      }
      if (plains_running_ == 0) return false;
      changed_.wait(lock);
    }
    return false;
  }

  // Whether order i is likely to be searched by the replay: its plain plan does not fit, and
  // it is no slower than the incumbent so far, nor than an earlier order's plain plan, which
  // is as fast as any of that order's candidates. With a judge the incumbent's step is the
  // judge's, which the prediction does not bound.
  bool Wanted(int i) const {
    const Slot& slot = slots_[i];
    if (slot.taken || slot.search != SearchState::kNone || !slot.plain_done ||
        !slot.plain_step || FitsBudget(*slot.run.plain, spec_)) {
      return false;
    }
    const double step = *slot.plain_step;
    if (!judged_ && known_best_ && step > *known_best_ * (1 + 1e-9)) return false;
    for (int j = 0; j < i; ++j) {
      if (!slots_[j].plain_done) return false;  // it may rule this order out
      if (slots_[j].plain_step && step > *slots_[j].plain_step * (1 + 1e-9)) return false;
    }
    return true;
  }

  // Replays the orders that are ready, in order, unless another thread is replaying (it will).
  void ReplayReady(std::unique_lock<std::mutex>& lock) {
    if (replaying_) return;
    replaying_ = true;
    const int count = static_cast<int>(slots_.size());
    while (replayed_ < count && slots_[replayed_].plain_done &&
           slots_[replayed_].search != SearchState::kRunning) {
      Slot& slot = slots_[replayed_];
      slot.taken = true;
      {
        OrderRun run = std::move(slot.run);
        lock.unlock();
        search_.ReplayOrder(run);
      }  // what the incumbent did not take is freed outside the lock
      lock.lock();
      if (slot.held && slot.search == SearchState::kNone) --held_;
      ++replayed_;
      if (search_.best) known_best_ = search_.best_step;
      changed_.notify_all();
    }
    replaying_ = false;
  }

  const PipelineSpec& spec_;
  const bool judged_;
  Search& search_;  // touched by the replaying thread only
  std::mutex mu_;
  std::condition_variable changed_;
  // Guarded by mu_ (a slot's run also while its search runs: only that thread touches it).
  std::vector<Slot> slots_;
  int next_plain_ = 0, plains_running_ = 0, replayed_ = 0;
  int held_ = 0;  // slots whose run.lowered is kept, or whose search holds it
  bool replaying_ = false, failed_ = false;
  std::optional<double> known_best_;  // search_.best_step as of the last replayed order
};

}  // namespace

CostModel RechunkedCost(const CostModel& cost, int from_v, int to_v) {
  if (from_v == to_v || from_v < 1 || to_v < 1 ||
      !cost.activation_bytes_per_virtual_stage.empty()) {
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
  OrderScheduler(spec, cost, static_cast<bool>(judge), Orders(spec, cost), &search).Run();
  if (!search.best) {
    const std::string over = absl::StrCat("auto offload: no plan fits memory_budget_bytes=",
                                          spec.memory_budget_bytes, " per stage; ");
    const std::string ruled_out =
        search.least_ruled_out
            ? absl::StrCat(" (", search.ruled_out, " not compiled: ",
                           search.ruled_out == 1 ? "its peak" : "their peaks",
                           " would be at least ", *search.least_ruled_out, " bytes)")
            : std::string();
    const std::string advice = "; raise the budget or add stages";
    if (search.smallest_peak) {
      return absl::ResourceExhaustedError(absl::StrCat(
          over, "the smallest peak found is ", *search.smallest_peak, " bytes (",
          search.smallest_name, ") among ", search.weighed, " candidates", ruled_out, advice));
    }
    if (search.least_ruled_out) {
      return absl::ResourceExhaustedError(absl::StrCat(
          over, "among ", search.weighed, " candidates none compiled", ruled_out, advice));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "auto offload: no candidate plan compiles; the last error: ", search.last_error));
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
