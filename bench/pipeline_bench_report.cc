// pipeline_bench's tables and JSON lines (see the header; the checklist is in
// pipeline_bench_checklist.cc).
#include "bench/pipeline_bench_report.h"

#include <algorithm>
#include <cmath>
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

std::string Gb(double bytes) { return absl::StrFormat("%.2f", bytes / 1e9); }

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

// A field that JSON lines of older runs lack: left as it is when absent, an error when mistyped.
template <typename T>
absl::Status ReadOptional(const json& object, const char* key, T* out, int line) {
  if (object.find(key) == object.end()) return absl::OkStatus();
  return Read(object, key, out, line);
}

#define PO_READ(object, key, field, line)                                  \
  do {                                                                     \
    if (absl::Status s_ = Read(object, key, field, line); !s_.ok()) return s_; \
  } while (false)
#define PO_READ_OPTIONAL(object, key, field, line)                                 \
  do {                                                                             \
    if (absl::Status s_ = ReadOptional(object, key, field, line); !s_.ok()) return s_; \
  } while (false)

absl::StatusOr<json> ParseLine(const std::string& text, int line) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded() || !value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": not a JSON object"));
  }
  return value;
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

std::int64_t PolicyRun::PhysicalPeak(std::size_t stage) const {
  if (stage < stash_physical_peak.size()) return stash_physical_peak[stage];
  return stage < stash_peak.size() ? stash_peak[stage] : 0;
}

std::int64_t PolicyRun::StashTotal() const {
  std::int64_t total = 0;
  for (std::size_t d = 0; d < std::max(stash_peak.size(), stash_physical_peak.size()); ++d) {
    total += PhysicalPeak(d);
  }
  return total;
}

double Overhead(const PolicyRun& run, const PolicyRun& base) {
  return run.MedianStep() / base.MedianStep() - 1.0;
}

double StageZeroCut(const PolicyRun& run, const PolicyRun& base) {
  const std::int64_t mine = run.PhysicalPeak(0), theirs = base.PhysicalPeak(0);
  if (run.stash_peak.empty() || theirs <= 0) return 0.0;
  return 1.0 - static_cast<double>(mine) / static_cast<double>(theirs);
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

namespace {

// "1.234 (+5.6%)" against the measured `step`; "-" when there is no prediction.
std::string PredictionCell(double predicted, double step) {
  if (predicted <= 0) return "-";
  return absl::StrFormat("%.4f (%+.1f%%)", predicted,
                         step > 0 ? (predicted / step - 1) * 100 : 0.0);
}

// One policy's row (12 cells).
std::string PolicyRow(const BenchRun& run, const PolicyRun& r, const PolicyRun* base) {
  if (!r.error.empty()) {
    return absl::StrCat("| ", r.name, " | ", r.order, " | failed: ", r.error,
                        " | | | | | | | | | |\n");
  }
  const double step = r.MedianStep();
  std::string peaks;
  for (std::size_t d = 0; d < r.stash_peak.size(); ++d) {
    absl::StrAppend(&peaks, d == 0 ? "" : ", ", Gb(static_cast<double>(r.stash_peak[d])), "/",
                    d < r.predicted_peak.size() ? Gb(static_cast<double>(r.predicted_peak[d]))
                                                : std::string("?"),
                    "/", Gb(static_cast<double>(r.PhysicalPeak(d))));
  }
  const bool against_base = base != nullptr && base != &r;
  const std::string versus =
      against_base ? absl::StrFormat("%+.1f%%", Overhead(r, *base) * 100) : std::string("-");
  const std::string stage0 =
      r.stash_peak.empty()
          ? std::string("-")
          : absl::StrCat(Gb(static_cast<double>(r.PhysicalPeak(0))),
                         against_base ? absl::StrFormat(" (%.0f%%)", StageZeroCut(r, *base) * 100)
                                      : std::string());
  const std::string offload =
      r.offload_gbs > 0 ? absl::StrFormat("%.1f / %.1f (%.0f%%)", r.offload_gbs, r.reload_gbs,
                                          r.link_efficiency * 100)
                        : std::string("-");
  return absl::StrFormat("| %s | %s | %.4f | %s | %.1f | %s | %s | %s | %s | %s | %s | %.4f |\n",
                         r.name, r.order, step, versus,
                         step > 0 ? run.model_flops_per_step / step / 1e12 : 0.0, stage0, peaks,
                         Gb(static_cast<double>(r.offloaded_bytes)), offload,
                         PredictionCell(r.predicted_step, step),
                         PredictionCell(r.calibrated_step, step), r.planner_step);
}

// Whether every measured logical peak equals its prediction (the compiler's contract), and
// where not.
std::string LogicalPeakCheck(const BenchRun& run) {
  std::string misses;
  for (const PolicyRun& r : run.policies) {
    if (!r.error.empty()) continue;
    for (std::size_t d = 0; d < r.stash_peak.size(); ++d) {
      const bool has = d < r.predicted_peak.size();
      if (has && r.stash_peak[d] == r.predicted_peak[d]) continue;
      absl::StrAppendFormat(&misses, " %s stage %d: %d measured vs %s predicted;", r.name,
                            static_cast<int>(d), r.stash_peak[d],
                            has ? absl::StrCat(r.predicted_peak[d]) : std::string("no"));
    }
  }
  if (misses.empty()) return "Logical stash peak == predicted, to the byte, at every stage.";
  return absl::StrCat("Logical stash peak != predicted at:", misses);
}

}  // namespace

std::string RunToMarkdown(const BenchRun& run) {
  std::string out = absl::StrFormat(
      "### pipeline_bench --model=%s h=%d heads=%d s=%d p=%d m=%d, %s v=%d, %d layer(s)/chunk "
      "(one GPU)\n\n"
      "chunk alone: F %.2f ms, B %.2f ms; entry %s GB; bf16 GEMM %.0f TFLOP/s; pinned PCIe D2H "
      "%.1f / H2D %.1f GB/s alone, %.1f GB/s each way together. Model FLOP per step %.3g "
      "(72h^2s + 12s^2h per layer and microbatch). RELEASE: %s.\n\n",
      run.model, run.hidden, run.heads, run.sequence, run.stages, run.microbatches, run.family,
      run.chunks, run.layers_per_chunk, run.forward_s * 1e3, run.backward_s * 1e3,
      Gb(static_cast<double>(run.entry_bytes)), run.gemm_flops / 1e12, run.d2h_gbs, run.h2d_gbs,
      run.duplex_gbs, run.model_flops_per_step, run.release_mode);
  if (run.calibration_scale > 0) {
    absl::StrAppendFormat(&out,
                          "Calibrated simulation: compute costs x %.4f (1f1b's measured step / "
                          "its simulation from the solo costs), copies as measured.\n\n",
                          run.calibration_scale);
  } else {
    absl::StrAppend(&out, "Calibrated simulation: unavailable (1f1b did not run).\n\n");
  }
  absl::StrAppend(
      &out,
      "| policy | order | step s (median) | vs base | model TFLOP/s | stage-0 act. GB, physical "
      "(cut) | stash peak GB per stage: logical measured/predicted/physical | offloaded GB/step "
      "| D2H / H2D GB/s (of pinned) | one-GPU sim s, solo costs (error) | one-GPU sim s, "
      "calibrated (error) | planner s (p x compute) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  const PolicyRun* base = run.Baseline();
  for (const PolicyRun& r : run.policies) absl::StrAppend(&out, PolicyRow(run, r, base));
  for (const PolicyRun& r : run.policies) {
    if (!r.auto_choice.empty()) absl::StrAppend(&out, "\n", r.name, ": ", r.auto_choice, "\n");
  }
  absl::StrAppend(&out, "\n", LogicalPeakCheck(run), "\n");
  absl::StrAppend(&out, "\nDevice memory per stage (model's own + arena), GB:");
  for (const PolicyRun& r : run.policies) {
    absl::StrAppend(&out, " ", r.name, ":");
    for (std::size_t d = 0; d < r.model_bytes.size() && d < r.arena_bytes.size(); ++d) {
      absl::StrAppend(&out, d == 0 ? " " : " / ", Gb(static_cast<double>(r.model_bytes[d])), "+",
                      Gb(static_cast<double>(r.arena_bytes[d])));
    }
    absl::StrAppend(&out, " (GPU used ", Gb(static_cast<double>(r.device_used_bytes)), ");");
  }
  // What the stages needed, as opposed to what the arenas reserved: the reserve for P2P is a
  // worst-case bound that grows with the number of messages (v), not with what offload saves.
  absl::StrAppend(&out, "\n\nNeeded per stage, GB (model's own + physical stash peak + measured "
                        "P2P peak):");
  for (const PolicyRun& r : run.policies) {
    if (r.p2p_peak.size() != r.model_bytes.size()) continue;  // an older JSON line
    absl::StrAppend(&out, " ", r.name, ":");
    std::int64_t total = 0;
    for (std::size_t d = 0; d < r.p2p_peak.size(); ++d) {
      const std::int64_t stash = r.PhysicalPeak(d);
      total += r.model_bytes[d] + stash + r.p2p_peak[d];
      absl::StrAppend(&out, d == 0 ? " " : " / ", Gb(static_cast<double>(r.model_bytes[d])), "+",
                      Gb(static_cast<double>(stash)), "+",
                      Gb(static_cast<double>(r.p2p_peak[d])));
    }
    absl::StrAppend(&out, " (all stages ", Gb(static_cast<double>(total)), ");");
  }
  absl::StrAppend(&out, "\n\nLast step: GPU busy (some stage's model work in flight, CUDA "
                        "events) of the step, and executor waits per stage in s (all: receives, "
                        "reloads, releases, barriers; r = for released blocks' D2H copies, b = in "
                        "BARRIER):");
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
                            {"stash_physical_peak", r.stash_physical_peak},
                            {"arena_bytes", r.arena_bytes},
                            {"p2p_peak", r.p2p_peak},
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
                            {"calibrated_step", r.calibrated_step},
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
                  {"release_mode", run.release_mode},
                  {"calibration_scale", run.calibration_scale},
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
  // Added with the deferred RELEASE: older lines come from the blocking one, uncalibrated.
  run.release_mode = "wait";
  PO_READ_OPTIONAL(object, "release_mode", &run.release_mode, line);
  PO_READ_OPTIONAL(object, "calibration_scale", &run.calibration_scale, line);
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
    PO_READ_OPTIONAL(p, "stash_physical_peak", &r.stash_physical_peak, line);
    PO_READ(p, "arena_bytes", &r.arena_bytes, line);
    PO_READ_OPTIONAL(p, "p2p_peak", &r.p2p_peak, line);
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
    PO_READ_OPTIONAL(p, "calibrated_step", &r.calibrated_step, line);
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

}  // namespace pipeoffload::bench
