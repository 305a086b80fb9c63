// pipeline_bench --summarize: issue 5's targets over saved runs (Checklist, declared in
// pipeline_bench_report.h). Memory targets use the PHYSICAL stash peaks (the memory the GPU
// really held); the simulator target uses the calibrated prediction (see CalibrationScale in
// pipeline_bench_plan.h for why the solo one cannot be held to 10%).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/pipeline_bench_report.h"

namespace pipeoffload::bench {
namespace {

// Issue 5's bars.
constexpr double kBaselineShareOfGemm = 0.60;
constexpr double kOverheadBar = 0.03;
constexpr double kPoFullCut = 0.70;
constexpr double kPoHalfCut = 0.45;
constexpr double kLinkShare = 0.85;
constexpr double kSimulatorError = 0.10;
constexpr double kPeerSlowdown = 1.25;

std::string Gb(double bytes) { return absl::StrFormat("%.2f", bytes / 1e9); }

std::string Verdict(std::optional<bool> pass) {
  return !pass.has_value() ? "n/a " : *pass ? "PASS" : "MISS";
}

const BenchRun* RunAt(const std::vector<BenchRun>& runs, int hidden) {
  for (const BenchRun& run : runs) {
    if (run.hidden == hidden) return &run;
  }
  return nullptr;
}

bool Ran(const PolicyRun* run) { return run != nullptr && !run->step_seconds.empty(); }

// Whether `name` is an offload policy ("1f1b", "none" are not; any suffix counts as the base).
bool Offloads(const std::string& name) {
  const std::string base = name.substr(0, name.find_first_of("@:"));
  return base != "1f1b" && base != "none";
}

// Whether `name` is `policy` or a variant of it ("po-f@3", "po-f:shared").
bool VariantOf(const std::string& name, const std::string& policy) {
  return name == policy || name.rfind(policy + "@", 0) == 0 || name.rfind(policy + ":", 0) == 0;
}

// "policy at h costs <= 3% and cuts stage 0's activation peak by >= cut", judged on the policy
// as named (the default split link); its link variants, when run, beside it: :shared, and
// :split (a no-op alias now, but lines from before the split default use it for the split plan,
// where the plain name was the shared one).
std::string OverheadAndCut(const std::vector<BenchRun>& runs, const std::string& policy, int hidden,
                           double cut_bar) {
  const BenchRun* run = RunAt(runs, hidden);
  const PolicyRun* mine = run ? run->Find(policy) : nullptr;
  const PolicyRun* base = run ? run->Baseline() : nullptr;
  const std::string what = absl::StrFormat(
      "%s at h=%d: step <= +%.0f%% vs %s and stage 0's activation peak (physical) cut >= %.0f%%",
      policy, hidden, kOverheadBar * 100, base ? base->name : "1f1b", cut_bar * 100);
  if (!Ran(mine) || !Ran(base)) return absl::StrCat("- n/a  ", what, ": not run\n");
  const double overhead = Overhead(*mine, *base);
  const double cut = StageZeroCut(*mine, *base);
  std::string beside;
  for (const char* suffix : {":shared", ":split"}) {
    const std::string name = policy + suffix;
    if (const PolicyRun* variant = run->Find(name); Ran(variant)) {
      absl::StrAppendFormat(&beside, "; %s: %+.1f%%, cut %.0f%%", name,
                            Overhead(*variant, *base) * 100, StageZeroCut(*variant, *base) * 100);
    }
  }
  return absl::StrFormat("- %s %s: %+.1f%%, cut %.0f%% (%s -> %s GB)%s\n",
                         Verdict(overhead <= kOverheadBar && cut >= cut_bar), what, overhead * 100,
                         cut * 100, Gb(static_cast<double>(base->PhysicalPeak(0))),
                         Gb(static_cast<double>(mine->PhysicalPeak(0))), beside);
}

const PeerRun* PeerAt(const std::vector<PeerRun>& peers, int hidden, const std::string& mode) {
  for (const PeerRun& peer : peers) {
    if (peer.hidden == hidden && peer.mode == mode) return &peer;
  }
  return nullptr;
}

// The largest |predicted / measured - 1| over `runs`' offload policies, with where it was.
struct WorstError {
  double error = -1.0;  // < 0: none
  std::string where;
  void Add(double predicted, double step, const std::string& name, int hidden) {
    if (predicted <= 0 || step <= 0) return;
    const double e = std::fabs(predicted / step - 1.0);
    if (e <= error) return;
    error = e;
    where = absl::StrFormat("%s at h=%d: %.4f predicted vs %.4f s", name, hidden, predicted, step);
  }
};

std::string SimulatorError(const std::vector<BenchRun>& runs) {
  // Over the offload policies: for 1f1b the calibrated prediction is the measurement itself.
  WorstError calibrated, solo;
  for (const BenchRun& run : runs) {
    for (const PolicyRun& r : run.policies) {
      if (!Offloads(r.name)) continue;
      const double step = r.MedianStep();
      solo.Add(r.predicted_step, step, r.name, run.hidden);
      if (run.calibration_scale > 0) calibrated.Add(r.calibrated_step, step, r.name, run.hidden);
    }
  }
  const std::string what = absl::StrFormat(
      "one-GPU simulation, compute calibrated on the measured 1f1b step, within %.0f%% of the "
      "measured step (worst offload policy)",
      kSimulatorError * 100);
  const std::string solo_text = solo.error < 0
                                    ? std::string("none")
                                    : absl::StrFormat("%.1f%% (%s)", solo.error * 100, solo.where);
  if (calibrated.error < 0) {
    return absl::StrCat("- n/a  ", what,
                        ": calibrated prediction unavailable (needs 1f1b and an offload policy "
                        "in the same run); from the solo costs: ",
                        solo_text, "\n");
  }
  return absl::StrFormat("- %s %s: %.1f%% (%s); from the solo costs: %s\n",
                         Verdict(calibrated.error <= kSimulatorError), what, calibrated.error * 100,
                         calibrated.where, solo_text);
}

// The transfer-bound case: auto against every po-f variant run (po-f, po-f@C, po-f:shared).
std::string TransferBound(const std::vector<BenchRun>& runs) {
  const BenchRun* run = RunAt(runs, 2048);
  const PolicyRun* base = run ? run->Baseline() : nullptr;
  const PolicyRun* chosen = run ? run->Find("auto") : nullptr;
  std::vector<const PolicyRun*> full;
  if (run != nullptr) {
    for (const PolicyRun& r : run->policies) {
      if (VariantOf(r.name, "po-f") && Ran(&r)) full.push_back(&r);
    }
  }
  const std::string what = absl::StrFormat(
      "h=2048 (transfer-bound): auto within %.0f%% of the baseline and saving memory, po-f "
      "costing more",
      kOverheadBar * 100);
  if (!Ran(base) || !Ran(chosen)) {
    return absl::StrCat("- n/a  ", what, ": needs 1f1b, auto and po-f at h=2048\n");
  }
  const double auto_cost = Overhead(*chosen, *base);
  const bool saves = chosen->StashTotal() < base->StashTotal();
  const std::string auto_text = absl::StrFormat(
      "auto %+.1f%% (activations %s -> %s GB, all stages, physical)", auto_cost * 100,
      Gb(static_cast<double>(base->StashTotal())), Gb(static_cast<double>(chosen->StashTotal())));
  if (full.empty()) return absl::StrCat("- n/a  ", what, ": po-f not run; ", auto_text, "\n");
  double most = -1e9;
  std::string costs;
  for (const PolicyRun* r : full) {
    most = std::max(most, Overhead(*r, *base));
    absl::StrAppendFormat(&costs, ", %s %+.1f%%", r->name, Overhead(*r, *base) * 100);
  }
  return absl::StrFormat("- %s %s: %s%s\n",
                         Verdict(auto_cost <= kOverheadBar && saves && most > auto_cost), what,
                         auto_text, costs);
}

// PyTorch peer, at every h where both ran. Memory per GPU: the p stages emulate p GPUs, so a
// GPU holds one stage's peak (the largest, physical); the peer holds its whole stack on one GPU
// (both hold the same layer-microbatch entries without offload: 1F1B's stage 0 keeps p
// microbatches of L/p layers, the peer one microbatch of L layers).
std::string Peer(const std::vector<BenchRun>& runs, const std::vector<PeerRun>& peers) {
  std::string out;
  for (const BenchRun& run : runs) {
    const PolicyRun* full = run.Find("po-f");
    const PeerRun* plain = PeerAt(peers, run.hidden, "none");
    const PeerRun* saved = PeerAt(peers, run.hidden, "save_on_cpu");
    if (full == nullptr || plain == nullptr || saved == nullptr || full->MedianStep() <= 0) {
      continue;
    }
    const double ratio = full->MedianStep() / plain->step_s;
    std::int64_t per_gpu = 0;
    for (std::size_t d = 0; d < full->stash_peak.size(); ++d) {
      per_gpu = std::max(per_gpu, full->PhysicalPeak(d));
    }
    const bool less = per_gpu < saved->activation_bytes;
    absl::StrAppendFormat(
        &out,
        "- %s h=%d: our po-f step within %.2fx of PyTorch without offload, with less activation "
        "memory per GPU than save_on_cpu: %.3f vs %.3f s = %.2fx; activations %s GB (largest "
        "stage, physical; all %d stages %s GB) vs %s GB (PyTorch none: %s GB, save_on_cpu "
        "%.3f s)\n",
        Verdict(ratio <= kPeerSlowdown && less), run.hidden, kPeerSlowdown, full->MedianStep(),
        plain->step_s, ratio, Gb(static_cast<double>(per_gpu)), run.stages,
        Gb(static_cast<double>(full->StashTotal())),
        Gb(static_cast<double>(saved->activation_bytes)),
        Gb(static_cast<double>(plain->activation_bytes)), saved->step_s);
  }
  if (out.empty()) {
    return "- n/a  PyTorch peer: needs po-f runs and torch_peer.py rows (none and save_on_cpu) "
           "at the same h\n";
  }
  return out;
}

}  // namespace

std::string Checklist(const std::vector<BenchRun>& runs, const std::vector<PeerRun>& peers) {
  std::string out = "### Issue 5 targets\n\n";
  // 1. Baseline vs the GEMM ceiling at h = 8192.
  {
    const BenchRun* run = RunAt(runs, 8192);
    const PolicyRun* base = run ? run->Baseline() : nullptr;
    const std::string what = absl::StrFormat(
        "baseline (1f1b, no offload) at h=8192 >= %.0f%% of the measured bf16 GEMM rate",
        kBaselineShareOfGemm * 100);
    if (base == nullptr || run->gemm_flops <= 0 || base->MedianStep() <= 0) {
      absl::StrAppend(&out, "- n/a  ", what, ": not run\n");
    } else {
      const double rate = run->model_flops_per_step / base->MedianStep();
      absl::StrAppendFormat(&out, "- %s %s: %.0f of %.0f TFLOP/s = %.0f%% (model %s)\n",
                            Verdict(rate >= kBaselineShareOfGemm * run->gemm_flops), what,
                            rate / 1e12, run->gemm_flops / 1e12, rate / run->gemm_flops * 100,
                            run->model);
    }
  }
  // 2, 3. po-f at 8192, po-h at 4096 (the split-link plans; :shared beside).
  absl::StrAppend(&out, OverheadAndCut(runs, "po-f", 8192, kPoFullCut));
  absl::StrAppend(&out, OverheadAndCut(runs, "po-h", 4096, kPoHalfCut));
  // 4. Offload bandwidth vs pinned, over every policy that moved data.
  {
    double worst = -1.0;
    std::string where;
    for (const BenchRun& run : runs) {
      for (const PolicyRun& r : run.policies) {
        if (r.link_efficiency <= 0) continue;
        if (worst < 0 || r.link_efficiency < worst) {
          worst = r.link_efficiency;
          where = absl::StrFormat(
              "%s at h=%d: D2H %.1f, H2D %.1f GB/s; pinned %.1f / %.1f "
              "alone, %.1f each way together",
              r.name, run.hidden, r.offload_gbs, r.reload_gbs, run.d2h_gbs, run.h2d_gbs,
              run.duplex_gbs);
        }
      }
    }
    const std::string what = absl::StrFormat(
        "offload copies >= %.0f%% of the measured pinned PCIe bandwidth (worst policy)",
        kLinkShare * 100);
    if (worst < 0) {
      absl::StrAppend(&out, "- n/a  ", what, ": nothing was offloaded\n");
    } else {
      absl::StrAppendFormat(&out, "- %s %s: %.0f%% (%s)\n", Verdict(worst >= kLinkShare), what,
                            worst * 100, where);
    }
  }
  // 5. Simulator error (calibrated), 6. the transfer-bound case, 7. the PyTorch peer.
  absl::StrAppend(&out, SimulatorError(runs));
  absl::StrAppend(&out, TransferBound(runs));
  absl::StrAppend(&out, Peer(runs, peers));
  return out;
}

}  // namespace pipeoffload::bench
