// pipeline_bench's tables, JSON lines and checklist (see the header).
#include "bench/pipeline_bench_report.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "nlohmann/json.hpp"

namespace pipeoffload::bench {
namespace {

using nlohmann::json;

// Issue 5's bars.
constexpr double kBaselineShareOfGemm = 0.60;
constexpr double kOverheadBar = 0.03;
constexpr double kPoFullCut = 0.70;
constexpr double kPoHalfCut = 0.45;
constexpr double kLinkShare = 0.85;
constexpr double kSimulatorError = 0.10;
constexpr double kPeerSlowdown = 1.25;

std::string Gb(double bytes) { return absl::StrFormat("%.2f", bytes / 1e9); }

double Overhead(const PolicyRun& run, const PolicyRun& base) {
  return run.MedianStep() / base.MedianStep() - 1.0;
}

// 1 - run's stage-0 stash peak / base's.
double StageZeroCut(const PolicyRun& run, const PolicyRun& base) {
  if (run.stash_peak.empty() || base.stash_peak.empty() || base.stash_peak[0] <= 0) return 0.0;
  return 1.0 - static_cast<double>(run.stash_peak[0]) / static_cast<double>(base.stash_peak[0]);
}

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

// Whether `value` can be read as a T without nlohmann throwing (we use no exceptions).
template <typename T>
bool HasType(const json& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value.is_string();
  } else if constexpr (std::is_arithmetic_v<T>) {
    return value.is_number();
  } else if constexpr (IsVector<T>::value) {
    return value.is_array() && std::all_of(value.begin(), value.end(), [](const json& item) {
             return HasType<typename T::value_type>(item);
           });
  } else {
    return true;  // json itself
  }
}

template <typename T>
absl::Status Read(const json& object, const char* key, T* out, int line) {
  const auto it = object.find(key);
  if (it == object.end()) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": missing \"", key, "\""));
  }
  if (!HasType<T>(*it)) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ": \"", key, "\" has the wrong type"));
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

#define PO_READ(object, key, field, line)                                  \
  do {                                                                     \
    if (absl::Status s_ = Read(object, key, field, line); !s_.ok()) return s_; \
  } while (false)

absl::StatusOr<json> ParseLine(const std::string& text, int line) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded() || !value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": not a JSON object"));
  }
  return value;
}

std::string Verdict(std::optional<bool> pass) {
  return !pass.has_value() ? "n/a " : *pass ? "PASS" : "MISS";
}

const BenchRun* RunAt(const std::vector<BenchRun>& runs, int hidden) {
  for (const BenchRun& run : runs) {
    if (run.hidden == hidden) return &run;
  }
  return nullptr;
}

// "po-x costs <= 3% at h and cuts stage 0's activation peak by >= cut".
std::string OverheadAndCut(const std::vector<BenchRun>& runs, const std::string& policy,
                           int hidden, double cut_bar) {
  const BenchRun* run = RunAt(runs, hidden);
  const PolicyRun* mine = run ? run->Find(policy) : nullptr;
  const PolicyRun* base = run ? run->Baseline() : nullptr;
  const std::string what = absl::StrFormat(
      "%s at h=%d: step <= +%.0f%% vs %s and stage 0's activation peak cut >= %.0f%%", policy,
      hidden, kOverheadBar * 100, base ? base->name : "1f1b", cut_bar * 100);
  if (mine == nullptr || base == nullptr || mine->step_seconds.empty() ||
      base->step_seconds.empty()) {
    return absl::StrCat("- n/a  ", what, ": not run\n");
  }
  const double overhead = Overhead(*mine, *base);
  const double cut = StageZeroCut(*mine, *base);
  return absl::StrFormat("- %s %s: %+.1f%%, cut %.0f%% (%s -> %s GB)\n",
                         Verdict(overhead <= kOverheadBar && cut >= cut_bar), what,
                         overhead * 100, cut * 100, Gb(static_cast<double>(base->stash_peak[0])),
                         Gb(static_cast<double>(mine->stash_peak[0])));
}

const PeerRun* PeerAt(const std::vector<PeerRun>& peers, int hidden, const std::string& mode) {
  for (const PeerRun& peer : peers) {
    if (peer.hidden == hidden && peer.mode == mode) return &peer;
  }
  return nullptr;
}

using Span = std::pair<double, double>;

// The union of the copies of one direction, as sorted disjoint spans.
std::vector<Span> Union(const std::vector<CopyInterval>& copies, bool d2h) {
  std::vector<Span> spans;
  for (const CopyInterval& copy : copies) {
    if (copy.d2h == d2h && copy.end > copy.start) spans.emplace_back(copy.start, copy.end);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<Span> merged;
  for (const Span& span : spans) {
    if (!merged.empty() && span.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, span.second);
    } else {
      merged.push_back(span);
    }
  }
  return merged;
}

double Length(const std::vector<Span>& spans) {
  double total = 0.0;
  for (const Span& span : spans) total += span.second - span.first;
  return total;
}

// Length of the intersection of two sorted disjoint span lists.
double Overlap(const std::vector<Span>& a, const std::vector<Span>& b) {
  double total = 0.0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    total += std::max(0.0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

}  // namespace

LinkUse SummarizeCopies(const std::vector<CopyInterval>& copies, double solo_d2h,
                        double solo_h2d, double duplex) {
  const std::vector<Span> d2h = Union(copies, true);
  const std::vector<Span> h2d = Union(copies, false);
  double bytes[2] = {0.0, 0.0};
  for (const CopyInterval& copy : copies) {
    if (copy.end > copy.start) bytes[copy.d2h ? 0 : 1] += static_cast<double>(copy.bytes);
  }
  const double busy_d2h = Length(d2h), busy_h2d = Length(h2d);
  const double both = Overlap(d2h, h2d);
  LinkUse use;
  use.d2h_gbs = busy_d2h > 0 ? bytes[0] / busy_d2h / 1e9 : 0.0;
  use.h2d_gbs = busy_h2d > 0 ? bytes[1] / busy_h2d / 1e9 : 0.0;
  // Capacity of each direction over its busy time: solo where alone, duplex where both ran.
  const double capacity = solo_d2h * (busy_d2h - both) + solo_h2d * (busy_h2d - both) +
                          2.0 * duplex * both;
  use.efficiency = capacity > 0 ? (bytes[0] + bytes[1]) / capacity : 0.0;
  return use;
}

double PolicyRun::MedianStep() const {
  if (step_seconds.empty()) return 0.0;
  std::vector<double> sorted = step_seconds;
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

std::int64_t PolicyRun::StashTotal() const {
  std::int64_t total = 0;
  for (const std::int64_t bytes : stash_peak) total += bytes;
  return total;
}

const PolicyRun* BenchRun::Find(const std::string& name) const {
  for (const PolicyRun& policy : policies) {
    if (policy.name == name) return &policy;
  }
  return nullptr;
}

const PolicyRun* BenchRun::Baseline() const {
  const PolicyRun* base = Find("1f1b");
  return base != nullptr ? base : Find("none");
}

std::string RunToMarkdown(const BenchRun& run) {
  std::string out = absl::StrFormat(
      "### pipeline_bench --model=%s h=%d heads=%d s=%d p=%d m=%d, %s v=%d, %d layer(s)/chunk "
      "(one GPU)\n\n"
      "chunk alone: F %.2f ms, B %.2f ms; entry %s GB; bf16 GEMM %.0f TFLOP/s; pinned PCIe D2H "
      "%.1f / H2D %.1f GB/s alone, %.1f GB/s each way together. Model FLOP per step %.3g "
      "(72h^2s + 12s^2h per layer and microbatch).\n\n",
      run.model, run.hidden, run.heads, run.sequence, run.stages, run.microbatches, run.family,
      run.chunks, run.layers_per_chunk, run.forward_s * 1e3, run.backward_s * 1e3,
      Gb(static_cast<double>(run.entry_bytes)), run.gemm_flops / 1e12, run.d2h_gbs, run.h2d_gbs,
      run.duplex_gbs, run.model_flops_per_step);
  absl::StrAppend(
      &out,
      "| policy | order | step s (median) | vs base | model TFLOP/s | stage-0 act. GB (cut) | "
      "stash peak GB per stage, measured/predicted | offloaded GB/step | D2H / H2D GB/s "
      "(of pinned) | predicted s (one-GPU sim) | sim error | planner s (p x compute) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const PolicyRun* base = run.Baseline();
  for (const PolicyRun& r : run.policies) {
    if (!r.error.empty()) {
      absl::StrAppend(&out, "| ", r.name, " | ", r.order, " | failed: ", r.error,
                      " | | | | | | | | | |\n");
      continue;
    }
    const double step = r.MedianStep();
    std::string peaks;
    for (std::size_t d = 0; d < r.stash_peak.size(); ++d) {
      absl::StrAppend(&peaks, d == 0 ? "" : ", ", Gb(static_cast<double>(r.stash_peak[d])), "/",
                      d < r.predicted_peak.size()
                          ? Gb(static_cast<double>(r.predicted_peak[d]))
                          : std::string("?"));
    }
    const std::string versus =
        base != nullptr && base != &r ? absl::StrFormat("%+.1f%%", Overhead(r, *base) * 100)
                                      : std::string("-");
    const std::string stage0 =
        r.stash_peak.empty()
            ? std::string("-")
            : absl::StrCat(Gb(static_cast<double>(r.stash_peak[0])),
                           base != nullptr && base != &r
                               ? absl::StrFormat(" (%.0f%%)", StageZeroCut(r, *base) * 100)
                               : std::string());
    const std::string offload =
        r.offload_gbs > 0 ? absl::StrFormat("%.1f / %.1f (%.0f%%)", r.offload_gbs, r.reload_gbs,
                                            r.link_efficiency * 100)
                          : std::string("-");
    absl::StrAppendFormat(
        &out, "| %s | %s | %.4f | %s | %.1f | %s | %s | %s | %s | %.4f | %+.1f%% | %.4f |\n",
        r.name, r.order, step, versus, step > 0 ? run.model_flops_per_step / step / 1e12 : 0.0,
        stage0, peaks, Gb(static_cast<double>(r.offloaded_bytes)), offload, r.predicted_step,
        step > 0 ? (r.predicted_step / step - 1.0) * 100 : 0.0, r.planner_step);
  }
  for (const PolicyRun& r : run.policies) {
    if (!r.auto_choice.empty()) absl::StrAppend(&out, "\n", r.name, ": ", r.auto_choice, "\n");
  }
  absl::StrAppend(&out, "\nDevice memory per stage (model's own + arena), GB:");
  for (const PolicyRun& r : run.policies) {
    absl::StrAppend(&out, " ", r.name, ":");
    for (std::size_t d = 0; d < r.model_bytes.size() && d < r.arena_bytes.size(); ++d) {
      absl::StrAppend(&out, d == 0 ? " " : " / ", Gb(static_cast<double>(r.model_bytes[d])), "+",
                      Gb(static_cast<double>(r.arena_bytes[d])));
    }
    absl::StrAppend(&out, " (GPU used ", Gb(static_cast<double>(r.device_used_bytes)), ");");
  }
  absl::StrAppend(&out, "\n\nLast step: GPU busy (some stage's model work in flight, CUDA "
                        "events) of the step, and executor waits per stage in s (all: receives, "
                        "reloads, releases, barriers; r = in RELEASE, b = in BARRIER):");
  for (const PolicyRun& r : run.policies) {
    absl::StrAppendFormat(&out, " %s: busy %.3f of %.3f s, waits", r.name, r.gpu_busy,
                          r.step_seconds.empty() ? 0.0 : r.step_seconds.back());
    for (std::size_t d = 0; d < r.wait_seconds.size(); ++d) {
      absl::StrAppendFormat(&out, "%s%.3f", d == 0 ? " " : " / ", r.wait_seconds[d]);
      if (d < r.release_wait.size() && d < r.barrier_wait.size()) {
        absl::StrAppendFormat(&out, " (r %.3f b %.3f)", r.release_wait[d], r.barrier_wait[d]);
      }
    }
    absl::StrAppend(&out, ";");
  }
  absl::StrAppend(&out, "\n");
  return out;
}

std::string RunToJsonLine(const BenchRun& run) {
  json policies = json::array();
  for (const PolicyRun& r : run.policies) {
    policies.push_back(json{{"name", r.name},
                            {"order", r.order},
                            {"auto_choice", r.auto_choice},
                            {"step_seconds", r.step_seconds},
                            {"stash_peak", r.stash_peak},
                            {"predicted_peak", r.predicted_peak},
                            {"arena_bytes", r.arena_bytes},
                            {"model_bytes", r.model_bytes},
                            {"wait_seconds", r.wait_seconds},
                            {"release_wait", r.release_wait},
                            {"barrier_wait", r.barrier_wait},
                            {"gpu_busy", r.gpu_busy},
                            {"device_used_bytes", r.device_used_bytes},
                            {"offloaded_bytes", r.offloaded_bytes},
                            {"offload_gbs", r.offload_gbs},
                            {"reload_gbs", r.reload_gbs},
                            {"link_efficiency", r.link_efficiency},
                            {"predicted_step", r.predicted_step},
                            {"predicted_serial", r.predicted_serial},
                            {"planner_step", r.planner_step},
                            {"warnings", r.warnings},
                            {"error", r.error}});
  }
  const json line{{"model", run.model},
                  {"hidden", run.hidden},
                  {"heads", run.heads},
                  {"sequence", run.sequence},
                  {"stages", run.stages},
                  {"microbatches", run.microbatches},
                  {"chunks", run.chunks},
                  {"layers_per_chunk", run.layers_per_chunk},
                  {"family", run.family},
                  {"forward_s", run.forward_s},
                  {"backward_s", run.backward_s},
                  {"entry_bytes", run.entry_bytes},
                  {"gemm_flops", run.gemm_flops},
                  {"d2h_gbs", run.d2h_gbs},
                  {"h2d_gbs", run.h2d_gbs},
                  {"duplex_gbs", run.duplex_gbs},
                  {"model_flops_per_step", run.model_flops_per_step},
                  {"policies", policies}};
  return line.dump() + "\n";
}

namespace {

// The records of a JSON-lines file, one per non-blank line, each read by `read` (which gets the
// line's object and its 1-based number); the first bad line's error names it.
template <typename Record>
absl::StatusOr<std::vector<Record>> ParseJsonLines(
    const std::string& jsonl, absl::Status (*read)(const json&, int, Record&)) {
  std::vector<Record> records;
  int line = 0;
  for (const absl::string_view text : absl::StrSplit(jsonl, '\n')) {
    ++line;
    if (absl::StripAsciiWhitespace(text).empty()) continue;
    absl::StatusOr<json> value = ParseLine(std::string(text), line);
    if (!value.ok()) return value.status();
    Record record;
    if (absl::Status status = read(*value, line, record); !status.ok()) return status;
    records.push_back(std::move(record));
  }
  return records;
}

absl::Status ReadRun(const json& object, int line, BenchRun& run) {
  PO_READ(object, "model", &run.model, line);
  PO_READ(object, "hidden", &run.hidden, line);
  PO_READ(object, "heads", &run.heads, line);
  PO_READ(object, "sequence", &run.sequence, line);
  PO_READ(object, "stages", &run.stages, line);
  PO_READ(object, "microbatches", &run.microbatches, line);
  PO_READ(object, "chunks", &run.chunks, line);
  PO_READ(object, "layers_per_chunk", &run.layers_per_chunk, line);
  PO_READ(object, "family", &run.family, line);
  PO_READ(object, "forward_s", &run.forward_s, line);
  PO_READ(object, "backward_s", &run.backward_s, line);
  PO_READ(object, "entry_bytes", &run.entry_bytes, line);
  PO_READ(object, "gemm_flops", &run.gemm_flops, line);
  PO_READ(object, "d2h_gbs", &run.d2h_gbs, line);
  PO_READ(object, "h2d_gbs", &run.h2d_gbs, line);
  PO_READ(object, "duplex_gbs", &run.duplex_gbs, line);
  PO_READ(object, "model_flops_per_step", &run.model_flops_per_step, line);
  json policies;
  PO_READ(object, "policies", &policies, line);
  if (!policies.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ": \"policies\" is not a list"));
  }
  for (const json& p : policies) {
    PolicyRun r;
    PO_READ(p, "name", &r.name, line);
    PO_READ(p, "order", &r.order, line);
    PO_READ(p, "auto_choice", &r.auto_choice, line);
    PO_READ(p, "step_seconds", &r.step_seconds, line);
    PO_READ(p, "stash_peak", &r.stash_peak, line);
    PO_READ(p, "predicted_peak", &r.predicted_peak, line);
    PO_READ(p, "arena_bytes", &r.arena_bytes, line);
    PO_READ(p, "model_bytes", &r.model_bytes, line);
    PO_READ(p, "wait_seconds", &r.wait_seconds, line);
    PO_READ(p, "release_wait", &r.release_wait, line);
    PO_READ(p, "barrier_wait", &r.barrier_wait, line);
    PO_READ(p, "gpu_busy", &r.gpu_busy, line);
    PO_READ(p, "device_used_bytes", &r.device_used_bytes, line);
    PO_READ(p, "offloaded_bytes", &r.offloaded_bytes, line);
    PO_READ(p, "offload_gbs", &r.offload_gbs, line);
    PO_READ(p, "reload_gbs", &r.reload_gbs, line);
    PO_READ(p, "link_efficiency", &r.link_efficiency, line);
    PO_READ(p, "predicted_step", &r.predicted_step, line);
    PO_READ(p, "predicted_serial", &r.predicted_serial, line);
    PO_READ(p, "planner_step", &r.planner_step, line);
    PO_READ(p, "warnings", &r.warnings, line);
    PO_READ(p, "error", &r.error, line);
    run.policies.push_back(std::move(r));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<BenchRun>> ParseRuns(const std::string& jsonl) {
  return ParseJsonLines<BenchRun>(jsonl, &ReadRun);
}

namespace {

absl::Status ReadPeer(const json& object, int line, PeerRun& peer) {
  PO_READ(object, "hidden", &peer.hidden, line);
  PO_READ(object, "seq", &peer.sequence, line);
  PO_READ(object, "layers", &peer.layers, line);
  PO_READ(object, "microbatches", &peer.microbatches, line);
  PO_READ(object, "mode", &peer.mode, line);
  PO_READ(object, "step_s", &peer.step_s, line);
  PO_READ(object, "tflops", &peer.tflops, line);
  PO_READ(object, "peak_bytes", &peer.peak_bytes, line);
  PO_READ(object, "static_bytes", &peer.static_bytes, line);
  PO_READ(object, "activation_bytes", &peer.activation_bytes, line);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PeerRun>> ParsePeers(const std::string& jsonl) {
  return ParseJsonLines<PeerRun>(jsonl, &ReadPeer);
}

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
  // 2, 3. po-f at 8192, po-h at 4096.
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
          where = absl::StrFormat("%s at h=%d: D2H %.1f, H2D %.1f GB/s; pinned %.1f / %.1f "
                                  "alone, %.1f each way together",
                                  r.name, run.hidden, r.offload_gbs, r.reload_gbs, run.d2h_gbs,
                                  run.h2d_gbs, run.duplex_gbs);
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
  // 5. Simulator error over every policy run.
  {
    double worst = -1.0;
    std::string where;
    for (const BenchRun& run : runs) {
      for (const PolicyRun& r : run.policies) {
        const double step = r.MedianStep();
        if (step <= 0 || r.predicted_step <= 0) continue;
        const double error = std::fabs(r.predicted_step / step - 1.0);
        if (error > worst) {
          worst = error;
          where = absl::StrFormat("%s at h=%d: %.4f predicted vs %.4f s", r.name, run.hidden,
                                  r.predicted_step, step);
        }
      }
    }
    const std::string what = absl::StrFormat(
        "one-GPU simulation from measured op costs within %.0f%% of the measured step (worst)",
        kSimulatorError * 100);
    if (worst < 0) {
      absl::StrAppend(&out, "- n/a  ", what, ": not run\n");
    } else {
      absl::StrAppendFormat(&out, "- %s %s: %.1f%% (%s)\n", Verdict(worst <= kSimulatorError),
                            what, worst * 100, where);
    }
  }
  // 6. The transfer-bound case: auto against every po-f variant run (po-f, po-f@C).
  {
    const BenchRun* run = RunAt(runs, 2048);
    const PolicyRun* base = run ? run->Baseline() : nullptr;
    const PolicyRun* chosen = run ? run->Find("auto") : nullptr;
    std::vector<const PolicyRun*> full;
    if (run != nullptr) {
      for (const PolicyRun& r : run->policies) {
        if ((r.name == "po-f" || r.name.rfind("po-f@", 0) == 0) && !r.step_seconds.empty()) {
          full.push_back(&r);
        }
      }
    }
    const std::string what = absl::StrFormat(
        "h=2048 (transfer-bound): auto within %.0f%% of the baseline and saving memory, po-f "
        "costing more",
        kOverheadBar * 100);
    if (base == nullptr || chosen == nullptr || chosen->step_seconds.empty() || full.empty()) {
      absl::StrAppend(&out, "- n/a  ", what, ": needs 1f1b, auto and po-f at h=2048\n");
    } else {
      const double auto_cost = Overhead(*chosen, *base);
      const bool saves = chosen->StashTotal() < base->StashTotal();
      double most = -1e9;
      std::string costs;
      for (const PolicyRun* r : full) {
        most = std::max(most, Overhead(*r, *base));
        absl::StrAppendFormat(&costs, ", %s %+.1f%%", r->name, Overhead(*r, *base) * 100);
      }
      absl::StrAppendFormat(
          &out, "- %s %s: auto %+.1f%% (activations %s -> %s GB, all stages)%s\n",
          Verdict(auto_cost <= kOverheadBar && saves && most > auto_cost), what, auto_cost * 100,
          Gb(static_cast<double>(base->StashTotal())),
          Gb(static_cast<double>(chosen->StashTotal())), costs);
    }
  }
  // 7. PyTorch peer, at every h where both ran. Memory per GPU: the p stages emulate p GPUs,
  // so a GPU holds one stage's peak (the largest); the peer holds its whole stack on one GPU
  // (both hold the same layer-microbatch entries without offload: 1F1B's stage 0 keeps p
  // microbatches of L/p layers, the peer one microbatch of L layers).
  bool any_peer = false;
  for (const BenchRun& run : runs) {
    const PolicyRun* full = run.Find("po-f");
    const PeerRun* plain = PeerAt(peers, run.hidden, "none");
    const PeerRun* saved = PeerAt(peers, run.hidden, "save_on_cpu");
    if (full == nullptr || plain == nullptr || saved == nullptr || full->MedianStep() <= 0) {
      continue;
    }
    any_peer = true;
    const double ratio = full->MedianStep() / plain->step_s;
    const std::int64_t per_gpu =
        full->stash_peak.empty()
            ? 0
            : *std::max_element(full->stash_peak.begin(), full->stash_peak.end());
    const bool less = per_gpu < saved->activation_bytes;
    absl::StrAppendFormat(
        &out,
        "- %s h=%d: our po-f step within %.2fx of PyTorch without offload, with less activation "
        "memory per GPU than save_on_cpu: %.3f vs %.3f s = %.2fx; activations %s GB (largest "
        "stage; all %d stages %s GB) vs %s GB (PyTorch none: %s GB, save_on_cpu %.3f s)\n",
        Verdict(ratio <= kPeerSlowdown && less), run.hidden, kPeerSlowdown, full->MedianStep(),
        plain->step_s, ratio, Gb(static_cast<double>(per_gpu)), run.stages,
        Gb(static_cast<double>(full->StashTotal())),
        Gb(static_cast<double>(saved->activation_bytes)),
        Gb(static_cast<double>(plain->activation_bytes)), saved->step_s);
  }
  if (!any_peer) {
    absl::StrAppend(&out,
                    "- n/a  PyTorch peer: needs po-f runs and torch_peer.py rows (none and "
                    "save_on_cpu) at the same h\n");
  }
  return out;
}

}  // namespace pipeoffload::bench
