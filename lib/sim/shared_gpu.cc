// SimulateSharedGpu (shared_gpu.h): a fluid event loop over the stages' programs.
//
// Invariants of the loop:
//  - time only moves to the next instant at which something running finishes (a compute op,
//    a copy, a P2P transfer); rates are constant in between, so each step is exact;
//  - at each instant every stage's head is tried until none moves ("settle"): a head starts
//    exactly at the instant its last dependency finished, as in Simulate;
//  - end_[s][i] is +infinity until op i of stage s has finished, then its end time; a P2P op's
//    end is its transfer's end (on both stages).
#include "pipeoffload/shared_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/ir/grid_index.h"

namespace pipeoffload {
namespace {

using internal::ScheduleIndex;

constexpr double kNever = std::numeric_limits<double>::infinity();
// Work left below these counts as done (rounding of the fluid steps).
constexpr double kSecondsEpsilon = 1e-12;
constexpr double kBytesEpsilon = 0.5;

// Seconds of compute op `kind` on stage s alone on its GPU.
double ComputeSeconds(const CostModel& cost, int s, OpKind kind, bool split) {
  switch (kind) {
    case OpKind::kForward: return cost.ForwardTime(s);
    case OpKind::kBackward: return cost.BackwardTime(s, split);
    case OpKind::kRecompute: return cost.RecomputeTime(s, Recompute::kFull);
    case OpKind::kRecomputeLean: return cost.RecomputeTime(s, Recompute::kLean);
    default: return cost.WeightTime(s);
  }
}

struct Running {
  int stage;
  int index;
  double remaining;  // compute: solo seconds; copies: bytes
};

class SharedGpu {
 public:
  SharedGpu(const Schedule& schedule, const CostModel& cost)
      : schedule_(schedule),
        cost_(cost),
        index_(schedule),
        p_(schedule.spec.num_stages),
        map_(schedule.spec.stage_map()),
        split_(schedule.spec.split_backward),
        head_(static_cast<std::size_t>(p_), 0),
        parked_(static_cast<std::size_t>(p_), 0),
        compute_busy_(static_cast<std::size_t>(p_), 0),
        d2h_busy_(static_cast<std::size_t>(p_), 0),
        h2d_busy_(static_cast<std::size_t>(p_), 0),
        pending_sends_(static_cast<std::size_t>(p_)) {
    for (const StageProgram& program : schedule.stages) {
      end_.emplace_back(program.ops.size(), kNever);
      post_.emplace_back(program.ops.size(), -1.0);
    }
  }

  absl::StatusOr<SharedGpuPrediction> Run() {
    SharedGpuPrediction out;
    while (true) {
      Settle();
      if (AllDone()) break;
      const double dt = NextStep();
      if (!(dt < kNever)) return HangError();
      if (compute_.empty()) {
        out.gpu_idle += dt;
        if (WaitingForCopy()) out.copy_stall += dt;
      }
      Advance(dt);
    }
    out.step_time = now_;
    for (int s = 0; s < p_; ++s) {
      double end = 0.0;
      for (const double e : end_[static_cast<std::size_t>(s)]) end = std::max(end, e);
      out.stage_end.push_back(end);
    }
    return out;
  }

 private:
  const std::vector<Op>& Ops(int s) const {
    return schedule_.stages[static_cast<std::size_t>(s)].ops;
  }
  int& Head(int s) { return head_[static_cast<std::size_t>(s)]; }
  double& End(int s, int i) {
    return end_[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)];
  }
  double& Post(int s, int i) {
    return post_[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)];
  }

  // (kind, mb, chunk) is before the head of s and has finished by now.
  bool Finished(int s, OpKind kind, int mb, int chunk) {
    const int j = index_.Position(s, kind, mb, chunk);
    return j >= 0 && j < Head(s) && End(s, j) <= now_ + kSecondsEpsilon;
  }
  bool Offloaded(int s, int mb, int chunk) const {
    return index_.Position(s, OpKind::kReload, mb, chunk) >= 0;
  }


  // Whether the head of s may start now (its own dependencies; engines checked by the caller).
  bool Ready(int s, const Op& op) {
    // The neighbour's data: a RECV, or the neighbour's own op when it is on this stage.
    const std::optional<internal::NeighbourInput> input =
        internal::InputOf(map_, s, op.kind, op.chunk);
    switch (op.kind) {
      case OpKind::kForward:
        return !input || Finished(s, input->kind, op.mb, input->chunk);
      case OpKind::kBackward:
        if (!Finished(s, OpKind::kForward, op.mb, op.chunk)) return false;
        if (input && !Finished(s, input->kind, op.mb, input->chunk)) return false;
        return !Offloaded(s, op.mb, op.chunk) || Finished(s, OpKind::kReload, op.mb, op.chunk);
      case OpKind::kBackwardWeight:
        return Finished(s, OpKind::kBackward, op.mb, op.chunk) &&
               (!Offloaded(s, op.mb, op.chunk) || Finished(s, OpKind::kReload, op.mb, op.chunk));
      case OpKind::kOffload:
        return Finished(s, OpKind::kForward, op.mb, op.chunk);
      case OpKind::kRecompute:
      case OpKind::kRecomputeLean:
        // An offloaded retained block is read back first.
        return Finished(s, OpKind::kForward, op.mb, op.chunk) &&
               (!Offloaded(s, op.mb, op.chunk) || Finished(s, OpKind::kReload, op.mb, op.chunk));
      case OpKind::kRelease:
      case OpKind::kReload:
        return Finished(s, OpKind::kOffload, op.mb, op.chunk);
      default:
        return true;
    }
  }

  // Starts (or posts) the head of s if it can start now; true when the head moved.
  bool TryAdvance(int s) {
    int& head = Head(s);
    if (static_cast<std::size_t>(head) >= Ops(s).size()) return false;
    const Op& op = Ops(s)[static_cast<std::size_t>(head)];
    const std::size_t su = static_cast<std::size_t>(s);
    if (IsP2P(op.kind)) {
      Post(s, head) = now_;
      if (IsSend(op.kind)) pending_sends_[su].push_back(head);
      ++head;
      return true;
    }
    if (op.kind == OpKind::kBarrier) {
      const int partner = index_.Partner(s, head);
      if (partner < 0) return false;  // never: reported as a hang
      const std::size_t peer = static_cast<std::size_t>(op.peer);
      if (parked_[peer] && head_[peer] == partner) {
        End(s, head) = now_;
        End(op.peer, partner) = now_;
        ++head;
        ++head_[peer];
        parked_[su] = parked_[peer] = 0;
        return true;
      }
      parked_[su] = 1;
      return false;
    }
    if (!Ready(s, op)) return false;
    if (IsCompute(op.kind)) {
      if (compute_busy_[su]) return false;
      compute_busy_[su] = 1;
      compute_.push_back({s, head, ComputeSeconds(cost_, s, op.kind, split_)});
    } else if (op.kind == OpKind::kOffload || op.kind == OpKind::kReload) {
      const bool d2h = op.kind == OpKind::kOffload;
      std::vector<char>& busy = d2h ? d2h_busy_ : h2d_busy_;
      if (busy[su]) return false;
      busy[su] = 1;
      (d2h ? d2h_ : h2d_)
          .push_back({s, head,
                      static_cast<double>(cost_.RetainedBytes(
                          s, op.chunk, map_, index_.RecomputeMode(s, op.mb, op.chunk)))});
    } else {  // RELEASE: done once its OFFLOAD is
      End(s, head) = now_;
    }
    ++head;
    return true;
  }

  // Starts the transfers whose ends are both posted and whose data is produced.
  bool ResolveP2P() {
    bool any = false;
    const double duration =
        cost_.p2p_latency + static_cast<double>(cost_.boundary_bytes) / cost_.p2p_bandwidth;
    for (int s = 0; s < p_; ++s) {
      std::vector<int>& pending = pending_sends_[static_cast<std::size_t>(s)];
      for (std::size_t k = 0; k < pending.size();) {
        const int i = pending[k];
        const Op& op = Ops(s)[static_cast<std::size_t>(i)];
        const int j = index_.Partner(s, i);
        const OpKind producer =
            op.kind == OpKind::kSendActivation ? OpKind::kForward : OpKind::kBackward;
        if (j < 0 || Post(op.peer, j) < 0 || !Finished(s, producer, op.mb, op.chunk)) {
          ++k;
          continue;
        }
        End(s, i) = End(op.peer, j) = now_ + duration;
        p2p_ends_.push_back(now_ + duration);
        pending[k] = pending.back();
        pending.pop_back();
        any = true;
      }
    }
    return any;
  }

  void Settle() {
    bool moved = true;
    while (moved) {
      moved = ResolveP2P();
      for (int s = 0; s < p_; ++s) {
        while (TryAdvance(s)) moved = true;
      }
    }
  }

  bool AllDone() const {
    for (int s = 0; s < p_; ++s) {
      if (static_cast<std::size_t>(head_[static_cast<std::size_t>(s)]) < Ops(s).size()) {
        return false;
      }
    }
    return compute_.empty() && d2h_.empty() && h2d_.empty() &&
           std::none_of(p2p_ends_.begin(), p2p_ends_.end(),
                        [&](double end) { return end > now_ + kSecondsEpsilon; });
  }

  // Bandwidth of each running copy of one direction.
  double CopyRate(bool d2h) const {
    const std::vector<Running>& mine = d2h ? d2h_ : h2d_;
    const bool duplex = !(d2h ? h2d_ : d2h_).empty();
    const double link =
        duplex ? cost_.duplex_bandwidth : (d2h ? cost_.d2h_bandwidth : cost_.h2d_bandwidth);
    return mine.empty() ? 0.0 : link / static_cast<double>(mine.size());
  }

  double NextStep() const {
    double dt = kNever;
    const double n = static_cast<double>(compute_.size());
    for (const Running& r : compute_) dt = std::min(dt, r.remaining * n);
    for (const bool d2h : {true, false}) {
      const double rate = CopyRate(d2h);
      for (const Running& r : d2h ? d2h_ : h2d_) dt = std::min(dt, r.remaining / rate);
    }
    for (const double end : p2p_ends_) {
      if (end > now_ + kSecondsEpsilon) dt = std::min(dt, end - now_);
    }
    return dt;
  }

  void Advance(double dt) {
    const double n = static_cast<double>(compute_.size());
    const double d2h_rate = CopyRate(true);
    const double h2d_rate = CopyRate(false);
    now_ += dt;
    for (Running& r : compute_) r.remaining -= dt / n;
    for (Running& r : d2h_) r.remaining -= d2h_rate * dt;
    for (Running& r : h2d_) r.remaining -= h2d_rate * dt;
    const auto finish = [&](std::vector<Running>& running, std::vector<char>& busy, double eps) {
      for (std::size_t k = 0; k < running.size();) {
        if (running[k].remaining > eps) {
          ++k;
          continue;
        }
        End(running[k].stage, running[k].index) = now_;
        busy[static_cast<std::size_t>(running[k].stage)] = 0;
        running[k] = running.back();
        running.pop_back();
      }
    };
    finish(compute_, compute_busy_, kSecondsEpsilon);
    finish(d2h_, d2h_busy_, kBytesEpsilon);
    finish(h2d_, h2d_busy_, kBytesEpsilon);
    std::erase_if(p2p_ends_, [&](double end) { return end <= now_ + kSecondsEpsilon; });
  }

  // Some stage's head waits for a copy: a B/W/RECOMPUTE* for its reload, or a RELEASE for its
  // offload.
  bool WaitingForCopy() {
    for (int s = 0; s < p_; ++s) {
      if (static_cast<std::size_t>(Head(s)) >= Ops(s).size()) continue;
      const Op& op = Ops(s)[static_cast<std::size_t>(Head(s))];
      if (op.kind == OpKind::kRelease && !Finished(s, OpKind::kOffload, op.mb, op.chunk)) {
        return true;
      }
      if ((op.kind == OpKind::kBackward || op.kind == OpKind::kBackwardWeight ||
           IsRecompute(op.kind)) &&
          Offloaded(s, op.mb, op.chunk) && !Finished(s, OpKind::kReload, op.mb, op.chunk)) {
        return true;
      }
    }
    return false;
  }

  absl::Status HangError() const {
    std::string detail;
    for (int s = 0; s < p_; ++s) {
      const int head = head_[static_cast<std::size_t>(s)];
      if (static_cast<std::size_t>(head) >= Ops(s).size()) continue;
      absl::StrAppend(&detail, " stage ", s, " at op ", head, " (",
                      OpToString(Ops(s)[static_cast<std::size_t>(head)]), ");");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("SimulateSharedGpu: the programs hang at t=", now_, " s:", detail));
  }

  const Schedule& schedule_;
  const CostModel& cost_;
  const ScheduleIndex index_;
  const int p_;
  const VirtualStageMap map_;
  const bool split_;
  double now_ = 0.0;
  std::vector<int> head_;
  std::vector<char> parked_, compute_busy_, d2h_busy_, h2d_busy_;
  std::vector<std::vector<double>> end_, post_;
  std::vector<std::vector<int>> pending_sends_;  // [stage]: posted SENDs not yet started
  std::vector<Running> compute_, d2h_, h2d_;
  std::vector<double> p2p_ends_;  // transfers in flight
};

absl::Status CheckCosts(const Schedule& schedule, const CostModel& cost) {
  const int p = schedule.spec.num_stages;
  if (p < 1 || schedule.stages.size() != static_cast<std::size_t>(p) ||
      schedule.spec.num_microbatches < 1 || schedule.spec.chunks_per_stage < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimulateSharedGpu: malformed schedule (p=", p, ", ",
                     schedule.stages.size(), " programs)"));
  }
  for (int s = 0; s < p; ++s) {
    for (const double t : {cost.ForwardTime(s), cost.BackwardTime(s, schedule.spec.split_backward),
                           schedule.spec.split_backward ? cost.WeightTime(s) : 1.0}) {
      if (!(t > 0.0) || !std::isfinite(t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SimulateSharedGpu: stage ", s, " has a compute time of ", t, " (must be > 0)"));
      }
    }
  }
  for (const double bw : {cost.d2h_bandwidth, cost.h2d_bandwidth, cost.duplex_bandwidth,
                          cost.p2p_bandwidth}) {
    if (!(bw > 0.0) || !std::isfinite(bw)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SimulateSharedGpu: bandwidths must be finite and > 0 (got ", bw, ")"));
    }
  }
  if (!(cost.p2p_latency >= 0.0)) {
    return absl::InvalidArgumentError("SimulateSharedGpu: p2p_latency must be >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SharedGpuPrediction> SimulateSharedGpu(const Schedule& schedule,
                                                      const CostModel& cost) {
  if (absl::Status status = CheckCosts(schedule, cost); !status.ok()) return status;
  if (const auto violation = internal::CheckShape(schedule); violation.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("SimulateSharedGpu: ", violation->detail));
  }
  SharedGpu gpu(schedule, cost);
  absl::StatusOr<SharedGpuPrediction> out = gpu.Run();
  if (!out.ok()) return out;
  for (const StageProgram& program : schedule.stages) {
    for (const Op& op : program.ops) {
      if (IsCompute(op.kind)) {
        out->compute_work +=
            ComputeSeconds(cost, program.stage, op.kind, schedule.spec.split_backward);
      }
    }
  }
  return out;
}

}  // namespace pipeoffload
