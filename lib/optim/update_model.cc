// The update-phase model (update_model.h): a task graph of the engine's pipeline run by a fluid
// simulation. Tasks hold remaining work (params or bytes); between two events every running
// task progresses at a constant rate given by what else is running; the next event is the
// earliest completion. Ready tasks start the instant their dependencies finish.
#include "lib/optim/update_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status_macros.h"

namespace pipeoffload {
namespace {

enum class Lane : std::uint8_t { kCpu, kH2D, kD2H, kGpu };

struct Task {
  Lane lane = Lane::kCpu;
  double remaining = 0.0;  // params (kCpu, kGpu) or bytes (kH2D, kD2H)
  int deps_left = 0;
  std::vector<int> dependents;
  bool done = false;
};

class Simulation {
 public:
  int Add(Lane lane, double work, std::initializer_list<int> deps) {
    const int id = static_cast<int>(tasks_.size());
    tasks_.push_back(Task{lane, work, 0, {}, false});
    for (int dep : deps) {
      if (dep < 0) continue;  // -1: no such predecessor
      tasks_[static_cast<std::size_t>(dep)].dependents.push_back(id);
      ++tasks_[static_cast<std::size_t>(id)].deps_left;
    }
    return id;
  }

  // Runs every task to completion; fills the time fields of `out`.
  void Run(const UpdateRates& rates, UpdatePrediction& out) {
    std::vector<int> running;
    for (int id = 0; id < static_cast<int>(tasks_.size()); ++id) {
      if (tasks_[static_cast<std::size_t>(id)].deps_left == 0) running.push_back(id);
    }
    double now = 0.0;
    std::vector<double> rate(tasks_.size(), 0.0);
    while (!running.empty()) {
      int cpu = 0, h2d = 0, d2h = 0, gpu = 0;
      for (int id : running) {
        switch (tasks_[static_cast<std::size_t>(id)].lane) {
          case Lane::kCpu:
            ++cpu;
            break;
          case Lane::kH2D:
            ++h2d;
            break;
          case Lane::kD2H:
            ++d2h;
            break;
          case Lane::kGpu:
            ++gpu;
            break;
        }
      }
      const double pcie_scale = cpu > 0 ? rates.pcie_factor_with_cpu : 1.0;
      const double h2d_link = (d2h > 0 ? rates.h2d_duplex : rates.h2d) * pcie_scale;
      const double d2h_link = (h2d > 0 ? rates.d2h_duplex : rates.d2h) * pcie_scale;
      const double cpu_rate = h2d + d2h > 0 ? rates.cpu_adam_with_pcie : rates.cpu_adam;
      double step = std::numeric_limits<double>::infinity();
      for (int id : running) {
        const Task& task = tasks_[static_cast<std::size_t>(id)];
        double r = 0.0;
        switch (task.lane) {
          case Lane::kCpu:
            r = cpu_rate;
            break;
          case Lane::kH2D:
            r = h2d_link / h2d;
            break;
          case Lane::kD2H:
            r = d2h_link / d2h;
            break;
          case Lane::kGpu:
            r = rates.gpu_adam;
            break;
        }
        rate[static_cast<std::size_t>(id)] = r;
        step = std::min(step, task.remaining / r);  // work 0 or rate inf: 0
      }
      if (cpu > 0) out.cpu_busy_seconds += step;
      if (gpu > 0) out.gpu_busy_seconds += step;
      if (h2d > 0) out.h2d_busy_seconds += step;
      if (d2h > 0) out.d2h_busy_seconds += step;
      now += step;
      std::vector<int> next;
      std::vector<int> finished;
      for (int id : running) {
        Task& task = tasks_[static_cast<std::size_t>(id)];
        const double left = task.remaining - rate[static_cast<std::size_t>(id)] * step;
        // The task that defined `step` ends exactly; others within rounding of it end too.
        if (task.remaining / rate[static_cast<std::size_t>(id)] <= step ||
            left <= 1e-12 * std::max(1.0, task.remaining)) {
          task.remaining = 0.0;
          task.done = true;
          finished.push_back(id);
        } else {
          task.remaining = left;
          next.push_back(id);
        }
      }
      for (int id : finished) {
        for (int dependent : tasks_[static_cast<std::size_t>(id)].dependents) {
          if (--tasks_[static_cast<std::size_t>(dependent)].deps_left == 0) {
            next.push_back(dependent);
          }
        }
      }
      running = std::move(next);
    }
    out.seconds = now;
  }

 private:
  std::vector<Task> tasks_;
};

bool PositiveFinite(double x) { return std::isfinite(x) && x > 0.0; }
bool PositiveOrInfinite(double x) { return x > 0.0; }  // NaN fails

}  // namespace

absl::Status CheckUpdateRates(const UpdateRates& rates) {
  const struct {
    const char* name;
    double value;
    bool may_be_infinite;
  } fields[] = {{"cpu_adam", rates.cpu_adam, false},
                {"cpu_adam_with_pcie", rates.cpu_adam_with_pcie, false},
                {"gpu_adam", rates.gpu_adam, true},
                {"h2d", rates.h2d, false},
                {"d2h", rates.d2h, false},
                {"h2d_duplex", rates.h2d_duplex, false},
                {"d2h_duplex", rates.d2h_duplex, false},
                {"upcast", rates.upcast, true}};
  for (const auto& field : fields) {
    const bool ok =
        field.may_be_infinite ? PositiveOrInfinite(field.value) : PositiveFinite(field.value);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("update rates: ", field.name, " = ",
                                                     field.value, " must be > 0",
                                                     field.may_be_infinite ? "" : " and finite"));
    }
  }
  if (!(rates.pcie_factor_with_cpu > 0.0 && rates.pcie_factor_with_cpu <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update rates: pcie_factor_with_cpu = ", rates.pcie_factor_with_cpu, " must be in (0, 1]"));
  }
  return absl::OkStatus();
}

std::string FormatUpdateRates(const UpdateRates& r) {
  return absl::StrFormat(
      "cpu_adam %.3g/s (%.3g/s with PCIe), gpu_adam %.3g/s, H2D %.1f GB/s, D2H %.1f GB/s, "
      "duplex %.1f + %.1f GB/s, PCIe x%.2f under CPU Adam, upcast %.3g/s",
      r.cpu_adam, r.cpu_adam_with_pcie, r.gpu_adam, r.h2d / 1e9, r.d2h / 1e9, r.h2d_duplex / 1e9,
      r.d2h_duplex / 1e9, r.pcie_factor_with_cpu, r.upcast);
}

std::int64_t SubgroupLayout::num_subgroups() const {
  return (num_params + subgroup_size - 1) / subgroup_size;
}

std::int64_t SubgroupLayout::size(std::int64_t subgroup) const {
  return std::min(subgroup_size, num_params - offset(subgroup));
}

absl::Status CheckSubgroupLayout(const SubgroupLayout& layout) {
  if (layout.num_params <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_params = ", layout.num_params, " must be > 0"));
  }
  if (layout.subgroup_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("subgroup_size = ", layout.subgroup_size, " must be > 0"));
  }
  return absl::OkStatus();
}

std::int64_t SubgroupsForShare(std::int64_t num_subgroups, double share) {
  const auto k =
      static_cast<std::int64_t>(std::llround(share * static_cast<double>(num_subgroups)));
  return std::clamp<std::int64_t>(k, 0, num_subgroups);
}

std::vector<bool> SpreadEvenly(std::int64_t n, std::int64_t k) {
  std::vector<bool> marked(static_cast<std::size_t>(n), false);
  for (std::int64_t i = 0; i < n; ++i) {
    // (i + 1) * k fits in int64 for any n, k below 2^31, far beyond any subgroup count.
    marked[static_cast<std::size_t>(i)] = (i + 1) * k / n > i * k / n;
  }
  return marked;
}

std::vector<SubgroupPlace> PlaceSubgroups(OffloadMode mode, std::int64_t num_subgroups,
                                          double share) {
  std::vector<SubgroupPlace> places(static_cast<std::size_t>(num_subgroups), SubgroupPlace::kCpu);
  switch (mode) {
    case OffloadMode::kCpu:
      break;
    case OffloadMode::kInterleaved: {
      const std::vector<bool> gpu =
          SpreadEvenly(num_subgroups, SubgroupsForShare(num_subgroups, share));
      for (std::size_t i = 0; i < places.size(); ++i) {
        if (gpu[i]) places[i] = SubgroupPlace::kGpuStaged;
      }
      break;
    }
    case OffloadMode::kStatic: {
      const std::int64_t resident = SubgroupsForShare(num_subgroups, share);
      for (std::int64_t i = num_subgroups - resident; i < num_subgroups; ++i) {
        places[static_cast<std::size_t>(i)] = SubgroupPlace::kGpuResident;
      }
      break;
    }
    case OffloadMode::kGpu:
      std::fill(places.begin(), places.end(), SubgroupPlace::kGpuResident);
      break;
  }
  return places;
}

absl::StatusOr<UpdatePrediction> PredictUpdate(const UpdateRates& rates,
                                               const SubgroupLayout& layout, OffloadMode mode,
                                               double share) {
  PO_RETURN_IF_ERROR(CheckUpdateRates(rates));
  PO_RETURN_IF_ERROR(CheckSubgroupLayout(layout));
  if (!(share >= 0.0 && share <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("GPU share = ", share, " must be in [0, 1]"));
  }
  const std::int64_t n = layout.num_subgroups();
  const std::vector<SubgroupPlace> places = PlaceSubgroups(mode, n, share);

  UpdatePrediction out;
  out.mode = mode;
  Simulation sim;
  int cpu_prev = -1, upload_prev = -1, gpu_prev = -1, prefetch_prev = -1;
  std::vector<int> writebacks;  // W_j of staged subgroups in order
  double host_params = 0.0;
  double staged_max = 0.0;
  int staged = 0;
  // The engine enqueues the GPU lanes first and then runs the CPU lane; the simulation is
  // order-free (dependencies only), so one pass over the subgroups builds both.
  for (std::int64_t i = 0; i < n; ++i) {
    const double size = static_cast<double>(layout.size(i));
    switch (places[static_cast<std::size_t>(i)]) {
      case SubgroupPlace::kCpu: {
        cpu_prev = sim.Add(Lane::kCpu, size, {cpu_prev});
        upload_prev = sim.Add(Lane::kH2D, kBf16BytesPerParam * size, {cpu_prev, upload_prev});
        out.h2d_bytes += kBf16BytesPerParam * size;
        host_params += size;
        break;
      }
      case SubgroupPlace::kGpuStaged: {
        const int free_set = writebacks.size() >= 2 ? writebacks[writebacks.size() - 2] : -1;
        prefetch_prev = sim.Add(Lane::kH2D, kStateBytesPerParam * size, {prefetch_prev, free_set});
        gpu_prev = sim.Add(Lane::kGpu, size, {prefetch_prev, gpu_prev});
        const int last_writeback = writebacks.empty() ? -1 : writebacks.back();
        writebacks.push_back(
            sim.Add(Lane::kD2H, kStateBytesPerParam * size, {gpu_prev, last_writeback}));
        out.h2d_bytes += kStateBytesPerParam * size;
        out.d2h_bytes += kStateBytesPerParam * size;
        out.gpu_grad_bytes += 4.0 * size;
        staged_max = std::max(staged_max, size);
        ++staged;
        ++out.gpu_subgroups;
        break;
      }
      case SubgroupPlace::kGpuResident: {
        gpu_prev = sim.Add(Lane::kGpu, size, {gpu_prev});
        out.gpu_state_bytes += kStateBytesPerParam * size;
        out.gpu_grad_bytes += 4.0 * size;
        ++out.gpu_subgroups;
        break;
      }
    }
  }
  out.gpu_state_bytes +=
      static_cast<double>(std::min(staged, 2)) * kStateBytesPerParam * staged_max;
  out.share = static_cast<double>(out.gpu_subgroups) / static_cast<double>(n);
  sim.Run(rates, out);
  // The gradient path (during backward): the GPU upcasts every gradient and the D2H engine
  // moves host subgroups' fp32 gradients, pipelined through the two upcast chunks.
  out.grad_path_seconds = std::max(static_cast<double>(layout.num_params) / rates.upcast,
                                   kGradBytesPerParam * host_params / rates.d2h);
  return out;
}

absl::StatusOr<UpdatePrediction> BestInterleavedShare(const UpdateRates& rates,
                                                      const SubgroupLayout& layout) {
  PO_RETURN_IF_ERROR(CheckSubgroupLayout(layout));
  const std::int64_t n = layout.num_subgroups();
  UpdatePrediction best;
  bool have = false;
  for (std::int64_t k = 0; k <= n; ++k) {
    PO_ASSIGN_OR_RETURN(UpdatePrediction p,
                        PredictUpdate(rates, layout, OffloadMode::kInterleaved,
                                      static_cast<double>(k) / static_cast<double>(n)));
    if (!have || p.seconds < best.seconds) {
      best = p;
      have = true;
    }
  }
  return best;
}

namespace {

// The factor f in [1/64, 64] with time(f) == target, for a time that falls as f grows
// (bisection on log f).
template <typename TimeOf>
absl::StatusOr<double> SolveScale(TimeOf time_of, double target, const char* what) {
  double lo = 1.0 / 64.0, hi = 64.0;
  PO_ASSIGN_OR_RETURN(const double slowest, time_of(lo));
  PO_ASSIGN_OR_RETURN(const double fastest, time_of(hi));
  if (!(target <= slowest && target >= fastest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FitRatesToSteps: the measured ", what, " time ", target,
        " s is not within a factor 64 of the model's (", fastest, " .. ", slowest, " s)"));
  }
  for (int i = 0; i < 200 && hi / lo > 1.0 + 1e-12; ++i) {
    const double mid = std::sqrt(lo * hi);
    PO_ASSIGN_OR_RETURN(const double t, time_of(mid));
    (t > target ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

// Steps 1 and 2 of FitRatesToSteps for a fixed contention factor.
absl::StatusOr<UpdateRates> FitLevels(const UpdateRates& rates, const SubgroupLayout& layout,
                                      double cpu_only_seconds, double all_staged_seconds) {
  UpdateRates fitted = rates;
  auto with_pcie = [&](double f) {
    UpdateRates r = fitted;
    for (double* x : {&r.h2d, &r.d2h, &r.h2d_duplex, &r.d2h_duplex}) *x *= f;
    return r;
  };
  PO_ASSIGN_OR_RETURN(const double pcie, SolveScale(
                                             [&](double f) -> absl::StatusOr<double> {
                                               PO_ASSIGN_OR_RETURN(
                                                   const UpdatePrediction p,
                                                   PredictUpdate(with_pcie(f), layout,
                                                                 OffloadMode::kInterleaved, 1.0));
                                               return p.seconds;
                                             },
                                             all_staged_seconds, "all-staged"));
  fitted = with_pcie(pcie);
  auto with_cpu = [&](double f) {
    UpdateRates r = fitted;
    r.cpu_adam *= f;
    r.cpu_adam_with_pcie *= f;
    return r;
  };
  PO_ASSIGN_OR_RETURN(const double cpu,
                      SolveScale(
                          [&](double f) -> absl::StatusOr<double> {
                            PO_ASSIGN_OR_RETURN(
                                const UpdatePrediction p,
                                PredictUpdate(with_cpu(f), layout, OffloadMode::kCpu, 0.0));
                            return p.seconds;
                          },
                          cpu_only_seconds, "cpu-only"));
  return with_cpu(cpu);
}

}  // namespace

absl::StatusOr<UpdateRates> FitRatesToSteps(const UpdateRates& rates, const SubgroupLayout& layout,
                                            double cpu_only_seconds, double all_staged_seconds,
                                            const MeasuredStep* mixed) {
  PO_RETURN_IF_ERROR(CheckUpdateRates(rates));
  PO_RETURN_IF_ERROR(CheckSubgroupLayout(layout));
  if (!PositiveFinite(cpu_only_seconds) || !PositiveFinite(all_staged_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("FitRatesToSteps: measured times must be finite and > 0, got cpu only ",
                     cpu_only_seconds, " s and all staged ", all_staged_seconds, " s"));
  }
  if (mixed == nullptr) return FitLevels(rates, layout, cpu_only_seconds, all_staged_seconds);
  if (!(mixed->share > 0.0 && mixed->share < 1.0) || !PositiveFinite(mixed->seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FitRatesToSteps: the mixed step needs a share in (0, 1) and a time > 0, got share ",
        mixed->share, " and ", mixed->seconds, " s"));
  }
  // The mixed time falls as the factor grows (PCIe keeps more of its rate under CpuAdam).
  auto fit_with = [&](double factor) {
    UpdateRates r = rates;
    r.pcie_factor_with_cpu = factor;
    return FitLevels(r, layout, cpu_only_seconds, all_staged_seconds);
  };
  auto mixed_time = [&](const UpdateRates& r) -> absl::StatusOr<double> {
    PO_ASSIGN_OR_RETURN(const UpdatePrediction p,
                        PredictUpdate(r, layout, OffloadMode::kInterleaved, mixed->share));
    return p.seconds;
  };
  double lo = 0.05, hi = 1.0;
  PO_ASSIGN_OR_RETURN(UpdateRates at_lo, fit_with(lo));
  PO_ASSIGN_OR_RETURN(UpdateRates at_hi, fit_with(hi));
  PO_ASSIGN_OR_RETURN(const double slowest, mixed_time(at_lo));
  PO_ASSIGN_OR_RETURN(const double fastest, mixed_time(at_hi));
  if (mixed->seconds >= slowest) return at_lo;
  if (mixed->seconds <= fastest) return at_hi;
  for (int i = 0; i < 60 && hi - lo > 1e-6; ++i) {
    const double mid = 0.5 * (lo + hi);
    PO_ASSIGN_OR_RETURN(UpdateRates at_mid, fit_with(mid));
    PO_ASSIGN_OR_RETURN(const double t, mixed_time(at_mid));
    if (t > mixed->seconds) {
      lo = mid;
    } else {
      hi = mid;
      at_hi = at_mid;
    }
  }
  return at_hi;
}

}  // namespace pipeoffload
