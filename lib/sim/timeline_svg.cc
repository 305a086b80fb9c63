// SVG picture of a Timeline (timeline_svg.h). Top to bottom: title, legend, one band of rows
// per stage (compute, then D2H / H2D, then send / recv), the time axis, then one memory plot per
// stage on the same time scale. Every coordinate goes through Num (one fixed decimal) so output
// is byte-stable, and every text through XmlEscape, so any input gives well-formed XML.
// Formatting only: no I/O, and nothing here may depend on the simulator's internals.
#include "pipeoffload/timeline_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipeoffload {
namespace {

// Tableau 10 (2016 revision): ten hues that stay apart for most colour-blind readers. More
// microbatches than hues repeat the hues; the block labels and tooltips disambiguate.
constexpr std::uint32_t kPalette[] = {0x4e79a7, 0xf28e2b, 0xe15759, 0x76b7b2, 0x59a14f,
                                      0xedc948, 0xb07aa1, 0xff9da7, 0x9c755f, 0xbab0ac};
constexpr int kPaletteSize = static_cast<int>(std::size(kPalette));
constexpr std::uint32_t kNeutral = 0x7f7f7f;   // legend swatches of the kinds
constexpr std::uint32_t kP2PColor = 0x9e9e9e;  // P2P blocks: many and small, so not per mb

constexpr double kMedianBlockPx = 28;  // room for a two-digit label in a typical block
constexpr double kMinPlotPx = 560, kMaxPlotPx = 1800;
constexpr int kCompactAbove = 16;  // stages; above this, rows get thinner and lose labels

constexpr char kStyle[] =
    "text{font-family:sans-serif;font-size:11px;fill:#222}"
    ".title{font-size:14px;font-weight:bold}.small{font-size:9px;fill:#555}"
    ".in{text-anchor:middle;font-size:10px}.inw{text-anchor:middle;font-size:10px;fill:#fff}"
    ".lane{font-size:8px;fill:#666}.tick{text-anchor:middle;font-size:10px;fill:#444}"
    ".grid{stroke:#e4e4e4}"
    ".axis{stroke:#444}.band{fill:#f4f4f4}.mem{fill:#dbe6f1;stroke:#2f5d8a}"
    ".noofl{stroke:#888;stroke-dasharray:4 3}.peak{fill:#c0392b}";

// One decimal, finite, never "-0.0": the same doubles always print the same bytes.
std::string Num(double value) {
  if (!std::isfinite(value)) value = 0.0;
  return absl::StrFormat("%.1f", std::round(value * 10.0) / 10.0 + 0.0);
}

// A value shown as text, with `decimals` fixed decimals; "?" for one that is not finite.
std::string Fixed(double value, int decimals) {
  return std::isfinite(value) ? absl::StrFormat("%.*f", decimals, value + 0.0) : "?";
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 forbids most control characters even when escaped.
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') ? '?' : c;
    }
  }
  return out;
}

// `rgb` moved `percent` of the way to white (percent > 0) or to black (percent < 0).
std::string Mix(std::uint32_t rgb, int percent) {
  const int target = percent > 0 ? 255 : 0;
  const int amount = std::min(100, std::abs(percent));
  std::string out = "#";
  for (const int shift : {16, 8, 0}) {
    const int c = static_cast<int>((rgb >> shift) & 0xffu);
    absl::StrAppendFormat(&out, "%02x", (c * (100 - amount) + target * amount + 50) / 100);
  }
  return out;
}

// The hue names the microbatch, the shade the kind: F light, B the hue, W dark.
int KindShade(OpKind kind) {
  switch (kind) {
    case OpKind::kForward: return 45;
    case OpKind::kBackward: return 0;
    case OpKind::kBackwardWeight: return -40;
    default: return 20;
  }
}

std::uint32_t MicrobatchHue(int mb) {
  return kPalette[((mb % kPaletteSize) + kPaletteSize) % kPaletteSize];
}

std::string_view KindLabel(OpKind kind, bool split) {
  switch (kind) {
    case OpKind::kForward: return "forward";
    case OpKind::kBackward: return split ? "backward (input)" : "backward";
    case OpKind::kBackwardWeight: return "backward (weight)";
    default: return OpKindName(kind);
  }
}

// Where everything goes. Heights in px.
struct Layout {
  bool compact = false;
  bool transfers = false;  // some OFFLOAD / RELOAD: D2H and H2D lanes
  bool p2p = false;        // some P2P transfer takes time, and rows are not compact
  double compute_h = 18, lane_h = 9, p2p_h = 6, stage_gap = 8, memory_h = 36;
  double left = 104, right = 24, plot_w = kMinPlotPx;
  double t_end = 1;    // time at the right edge (timeline units)
  double display = 1;  // display units per timeline unit (1e3: seconds shown as ms)
  std::string unit;    // "units" or "ms"

  double Width() const { return left + plot_w + right; }
  double X(double t) const { return left + std::clamp(t / t_end, 0.0, 1.0) * plot_w; }
  double StageHeight() const {
    return compute_h + (transfers ? 2 * lane_h + 2 : 0) + (p2p ? 2 * p2p_h + 2 : 0) + stage_gap;
  }
};

Layout Measure(const Timeline& timeline, const SvgOptions& options, int num_stages) {
  Layout l;
  l.display = options.unit_costs ? 1.0 : 1e3;
  l.unit = options.unit_costs ? "units" : "ms";
  l.compact = num_stages > kCompactAbove;
  if (l.compact) {
    l.compute_h = 10;
    l.lane_h = 4;
    l.p2p_h = 3;
    l.stage_gap = 3;
    l.memory_h = 18;
  }
  double end = timeline.predictions.step_time;
  std::vector<double> compute;
  for (const auto& stage : timeline.stages) {
    for (const TimedOp& t : stage) {
      end = std::max(end, t.end);
      if (t.engine == Engine::kCompute && t.end > t.start) compute.push_back(t.end - t.start);
      if (t.engine == Engine::kD2H || t.engine == Engine::kH2D) l.transfers = true;
      // Compact rows leave P2P out: 3 px slivers, yet most of the bytes of a p = 64 picture.
      if ((t.engine == Engine::kSend || t.engine == Engine::kRecv) && t.end > t.start) {
        l.p2p = !l.compact;
      }
    }
  }
  for (const auto& samples : timeline.memory) {
    for (const MemorySample& s : samples) end = std::max(end, s.time);
  }
  l.t_end = (std::isfinite(end) && end > 0) ? end : 1.0;
  if (!compute.empty()) {
    std::nth_element(compute.begin(), compute.begin() + compute.size() / 2, compute.end());
    const double median = compute[compute.size() / 2];
    l.plot_w = std::clamp(std::round(l.t_end / median * kMedianBlockPx), kMinPlotPx, kMaxPlotPx);
  }
  return l;
}

// Opens a <rect>; the caller ends it with "/>" or with a <title> child and "</rect>".
void Rect(std::string* out, const std::string& cls, double x, double y, double w, double h,
          const std::string& fill) {
  absl::StrAppend(out, "<rect class=\"", cls, "\" x=\"", Num(x), "\" y=\"", Num(y),
                  "\" width=\"", Num(w), "\" height=\"", Num(h), "\"");
  if (!fill.empty()) absl::StrAppend(out, " fill=\"", fill, "\"");
}

void Text(std::string* out, const std::string& cls, double x, double y, std::string_view text) {
  absl::StrAppend(out, "<text", cls.empty() ? "" : absl::StrCat(" class=\"", cls, "\""),
                  " x=\"", Num(x), "\" y=\"", Num(y), "\">", XmlEscape(text), "</text>\n");
}

void Line(std::string* out, const std::string& cls, double x1, double y1, double x2, double y2) {
  absl::StrAppend(out, "<line class=\"", cls, "\" x1=\"", Num(x1), "\" y1=\"", Num(y1),
                  "\" x2=\"", Num(x2), "\" y2=\"", Num(y2), "\"/>\n");
}

// One op's block, with a tooltip naming it and its span; labelled with the microbatch when the
// label fits inside.
void OpBlock(std::string* out, const Layout& l, const TimedOp& t, double y, double h,
             bool label) {
  const OpKind kind = t.op.kind;
  std::string fill;
  if (t.engine == Engine::kCompute) {
    fill = Mix(MicrobatchHue(t.op.mb), KindShade(kind));
  } else {
    fill = Mix(t.engine == Engine::kSend || t.engine == Engine::kRecv ? kP2PColor
                                                                      : MicrobatchHue(t.op.mb),
               0);
  }
  const double x = l.X(t.start);
  const double w = std::max(l.X(t.end) - x, 0.6);  // zero-length ops stay visible and countable
  Rect(out, std::string(OpKindName(kind)), x, y, w, h, fill);
  std::string tip = absl::StrCat(OpToString(t.op), " ", Fixed(t.start * l.display, 3), "-",
                                 Fixed(t.end * l.display, 3), " ", l.unit);
  if (t.bytes > 0) absl::StrAppend(&tip, ", ", t.bytes, " B");
  absl::StrAppend(out, "><title>", XmlEscape(tip), "</title></rect>\n");
  const std::string mb = absl::StrCat(t.op.mb);
  if (label && w >= 6.5 * static_cast<double>(mb.size()) + 3) {
    Text(out, kind == OpKind::kBackwardWeight ? "inw" : "in", x + w / 2, y + h / 2 + 3.5, mb);
  }
}

void StageRows(std::string* out, const Layout& l, const std::vector<TimedOp>& ops, int d,
               double top) {
  absl::StrAppend(out, "<g id=\"stage-", d, "\">\n");
  Text(out, l.compact ? "small" : "", 8, top + l.compute_h / 2 + 4, absl::StrCat("stage ", d));
  Rect(out, "band", l.left, top, l.plot_w, l.compute_h, "");
  absl::StrAppend(out, "/>\n");
  // Lane tops: D2H, H2D, send, recv (absent lanes are never drawn into).
  const double d2h = top + l.compute_h + 2, h2d = d2h + l.lane_h;
  const double send = (l.transfers ? h2d + l.lane_h : d2h) + 2, recv = send + l.p2p_h;
  if (!l.compact) {
    if (l.transfers) {
      Text(out, "lane", 76, d2h + l.lane_h - 1.5, "D2H");
      Text(out, "lane", 76, h2d + l.lane_h - 1.5, "H2D");
    }
    if (l.p2p) {
      Text(out, "lane", 76, send + l.p2p_h - 0.5, "send");
      Text(out, "lane", 76, recv + l.p2p_h - 0.5, "recv");
    }
  }
  for (const TimedOp& t : ops) {
    switch (t.engine) {
      case Engine::kCompute: OpBlock(out, l, t, top, l.compute_h, !l.compact); break;
      case Engine::kD2H: OpBlock(out, l, t, d2h, l.lane_h, false); break;
      case Engine::kH2D: OpBlock(out, l, t, h2d, l.lane_h, false); break;
      case Engine::kSend:
        if (l.p2p) OpBlock(out, l, t, send, l.p2p_h, false);
        break;
      case Engine::kRecv:
        if (l.p2p) OpBlock(out, l, t, recv, l.p2p_h, false);
        break;
      case Engine::kNone: break;  // RELEASE and BARRIER take no time; the memory plot shows them
    }
  }
  absl::StrAppend(out, "</g>\n");
}

// A 1-2-5 step that gives about 10 ticks over `span` (display units); `span` itself when the
// span is too large or too small for that arithmetic.
double TickStep(double span) {
  const double raw = span / 10;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * magnitude;
  for (const double f : {5.0, 2.0, 1.0}) {
    if (f * magnitude >= raw) step = f * magnitude;
  }
  return (std::isfinite(step) && step > 0) ? step : span;
}

// Grid lines from `top` to `bottom`, and the axis with its labels at `axis_y`.
void TimeAxis(std::string* out, const Layout& l, double top, double axis_y, double bottom) {
  const double span = l.t_end * l.display;
  const double step = TickStep(span);
  // Enough decimals to tell ticks apart; clamped before the cast, which overflows otherwise.
  const int decimals =
      static_cast<int>(std::clamp(-std::floor(std::log10(step) + 1e-9), 0.0, 9.0));
  absl::StrAppend(out, "<g id=\"axis\">\n");
  for (int i = 0; i * step <= span * (1 + 1e-9) && i <= 20; ++i) {
    const double x = l.X(i * step / l.display);
    Line(out, "grid", x, top, x, bottom);
    Line(out, "axis", x, axis_y, x, axis_y + 4);
    Text(out, "tick", x, axis_y + 15, Fixed(i * step, decimals));
  }
  Line(out, "axis", l.left, axis_y, l.left + l.plot_w, axis_y);
  Text(out, "tick", l.left + l.plot_w / 2, axis_y + 29, absl::StrCat("time (", l.unit, ")"));
  absl::StrAppend(out, "</g>\n");
}

struct LegendItem {
  std::string fill;
  std::string mark;  // text inside the swatch
  std::string label;
};

// Legend rows from `top`, wrapped to the picture's width; returns the y below them.
double Legend(std::string* out, const Layout& l, const std::vector<LegendItem>& items,
              double top) {
  absl::StrAppend(out, "<g id=\"legend\">\n");
  double x = 8, y = top;
  for (const LegendItem& item : items) {
    const double indent = item.fill.empty() ? 0 : 22;  // text-only items have no swatch
    const double w = indent + 6.2 * static_cast<double>(item.label.size()) + 14;
    if (x > 8 && x + w > l.Width() - 8) {
      x = 8;
      y += 18;
    }
    if (!item.fill.empty()) {
      Rect(out, "swatch", x, y, 18, 12, item.fill);
      absl::StrAppend(out, "/>\n");
    }
    if (!item.mark.empty()) Text(out, "in", x + 9, y + 10, item.mark);
    Text(out, "", x + indent, y + 10, item.label);
    x += w;
  }
  absl::StrAppend(out, "</g>\n");
  return y + 18;
}

std::vector<LegendItem> LegendItems(const Schedule& schedule, const Timeline& timeline,
                                    const Layout& l) {
  bool kinds[kNumOpKinds] = {};
  std::int64_t microbatches = 0;
  for (const auto& stage : timeline.stages) {
    for (const TimedOp& t : stage) {
      if (t.engine != Engine::kCompute || static_cast<int>(t.op.kind) >= kNumOpKinds) continue;
      kinds[static_cast<int>(t.op.kind)] = true;
      microbatches = std::max<std::int64_t>(microbatches, std::int64_t{t.op.mb} + 1);
    }
  }
  std::vector<LegendItem> items;
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    if (!kinds[k]) continue;
    items.push_back({Mix(kNeutral, KindShade(kind)), std::string(OpKindName(kind)),
                     std::string(KindLabel(kind, schedule.spec.split_backward))});
  }
  if (l.transfers) {
    items.push_back({"", "", "thin lanes: D2H offload, H2D reload (colour = mb)"});
  }
  if (l.p2p) items.push_back({Mix(kP2PColor, 0), "", "P2P send / recv"});
  for (int mb = 0; mb < std::min<std::int64_t>(microbatches, kPaletteSize); ++mb) {
    items.push_back({Mix(MicrobatchHue(mb), 0), "", absl::StrCat("mb ", mb)});
  }
  if (microbatches > kPaletteSize) {
    items.push_back({"#ffffff", "", absl::StrCat("colour = mb mod ", kPaletteSize)});
  }
  return items;
}

std::string Title(const Schedule& schedule, const Timeline& timeline, const Layout& l) {
  const PipelineSpec& spec = schedule.spec;
  std::string title = absl::StrFormat("%s p=%d m=%d v=%d", std::string(FamilyName(spec.family)),
                                      spec.num_stages, spec.num_microbatches,
                                      spec.chunks_per_stage);
  if (spec.family == Family::kGroupInterleaved) absl::StrAppend(&title, " g=", spec.group_size);
  if (spec.split_backward) absl::StrAppend(&title, " split");
  absl::StrAppend(&title, ", offload ", std::string(OffloadPolicyName(spec.offload)));
  absl::StrAppend(&title, ": step ", Fixed(timeline.predictions.step_time * l.display, 2), " ",
                  l.unit, ", bubble ", Fixed(timeline.predictions.bubble_ratio * 100, 1), "%");
  return title;
}

// Memory in the picture's unit: slots for unit costs, bytes otherwise.
std::int64_t MemoryValue(const MemorySample& s, const SvgOptions& options) {
  return options.unit_costs ? s.units : s.bytes;
}

std::string MemoryLabel(std::int64_t value, const SvgOptions& options) {
  if (options.unit_costs) return absl::StrCat(value, value == 1 ? " slot" : " slots");
  return absl::StrFormat("%.2f GiB", static_cast<double>(value) / (1024.0 * 1024 * 1024));
}

// Stage d's memory plot: the step curve filled down to zero, the peak as a red dot, the peak
// without offload as a dashed line when it is higher. `scale` is the largest value of any
// stage, so the plots compare across stages.
void MemoryPlot(std::string* out, const Layout& l, const Timeline& timeline,
                const SvgOptions& options, int d, double top, double scale) {
  const std::vector<MemorySample>& samples = timeline.memory[static_cast<std::size_t>(d)];
  const double base = top + l.memory_h;
  auto y_of = [&](std::int64_t v) {
    return base - static_cast<double>(v) / scale * (l.memory_h - 2);
  };
  std::int64_t peak = 0;
  const MemorySample* peak_at = nullptr;
  std::string path = absl::StrCat("M", Num(l.X(0)), " ", Num(base));
  // Samples at one instant (a RELEASE and the F after it) draw as one step to the last of them:
  // their order within the instant is the simulator's tie-break, not a state memory is in.
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (i + 1 < samples.size() && samples[i + 1].time == samples[i].time) continue;
    const std::int64_t value = MemoryValue(samples[i], options);
    absl::StrAppend(&path, "H", Num(l.X(samples[i].time)), "V", Num(y_of(value)));
    if (value > peak) {
      peak = value;
      peak_at = &samples[i];
    }
  }
  absl::StrAppend(&path, "H", Num(l.X(l.t_end)), "V", Num(base), "Z");

  absl::StrAppend(out, "<g id=\"memory-", d, "\">\n");
  Text(out, l.compact ? "small" : "", 8, top + (l.compact ? 12 : 14), absl::StrCat("stage ", d));
  if (!l.compact) Text(out, "small", 8, top + 26, "peak " + MemoryLabel(peak, options));
  Line(out, "axis", l.left, base, l.left + l.plot_w, base);
  absl::StrAppend(out, "<path class=\"mem\" d=\"", path, "\"/>\n");
  const auto& predicted = timeline.predictions.stages;
  if (static_cast<std::size_t>(d) < predicted.size()) {
    const StagePrediction& s = predicted[static_cast<std::size_t>(d)];
    const std::int64_t plain =
        options.unit_costs ? s.peak_units_without_offload : s.peak_bytes_without_offload;
    if (plain > peak) Line(out, "noofl", l.left, y_of(plain), l.left + l.plot_w, y_of(plain));
    // The table's peak counts allocations in program order; the curve in time, where a RELOAD
    // issued beside a B allocates before that B frees. Show both rather than hide the gap.
    const std::int64_t table = options.unit_costs ? s.peak_units : s.peak_bytes;
    if (table != peak && !l.compact) {
      Text(out, "small", 8, top + 37, "table: " + MemoryLabel(table, options));
    }
  }
  if (peak_at != nullptr) {
    absl::StrAppend(out, "<circle class=\"peak\" cx=\"", Num(l.X(peak_at->time)), "\" cy=\"",
                    Num(y_of(peak)), "\" r=\"2.5\"><title>",
                    XmlEscape("peak " + MemoryLabel(peak, options)), "</title></circle>\n");
  }
  absl::StrAppend(out, "</g>\n");
}

// The largest memory value any plot shows, at least 1.
double MemoryScale(const Timeline& timeline, const SvgOptions& options) {
  std::int64_t top = 1;
  for (const auto& samples : timeline.memory) {
    for (const MemorySample& s : samples) top = std::max(top, MemoryValue(s, options));
  }
  for (const StagePrediction& s : timeline.predictions.stages) {
    top = std::max(top, options.unit_costs ? s.peak_units_without_offload
                                           : s.peak_bytes_without_offload);
  }
  return static_cast<double>(top);
}

}  // namespace

std::string TimelineToSvg(const Schedule& schedule, const Timeline& timeline,
                          const SvgOptions& options) {
  const int p = static_cast<int>(timeline.stages.size());
  const int memory_plots = static_cast<int>(timeline.memory.size());
  const Layout l = Measure(timeline, options, std::max(p, memory_plots));

  std::string body;
  Text(&body, "title", 8, 20, Title(schedule, timeline, l));
  const double panel_top = Legend(&body, l, LegendItems(schedule, timeline, l), 32) + 8;
  const double axis_y = panel_top + p * l.StageHeight() + 2;
  const double memory_top = axis_y + 58;
  const double memory_step = l.memory_h + l.stage_gap;
  const double bottom = memory_top + memory_plots * memory_step;
  TimeAxis(&body, l, panel_top, axis_y, memory_plots > 0 ? bottom - l.stage_gap : axis_y);
  for (int d = 0; d < p; ++d) {
    StageRows(&body, l, timeline.stages[static_cast<std::size_t>(d)], d,
              panel_top + d * l.StageHeight());
  }
  if (memory_plots > 0) {
    Text(&body, "", 8, memory_top - 12,
         absl::StrCat("device activation memory per stage (",
                      options.unit_costs ? "stash slots" : "GiB",
                      "; red dot = peak, dashed = peak without offload)"));
    const double scale = MemoryScale(timeline, options);
    for (int d = 0; d < memory_plots; ++d) {
      MemoryPlot(&body, l, timeline, options, d, memory_top + d * memory_step, scale);
    }
  }

  const std::string width = Num(l.Width()), height = Num(bottom + 8);
  std::string out = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" ",
      "width=\"", width, "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ", height,
      "\">\n<style>", kStyle, "</style>\n");
  // An opaque background: dark-mode viewers would otherwise draw dark text on black.
  absl::StrAppend(&out, "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n", body,
                  "</svg>\n");
  return out;
}

}  // namespace pipeoffload
