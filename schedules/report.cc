// Formatting of po-schedule's tables. Column widths adapt to the content; numbers use the same
// units throughout a table (see ReportUnits).
#include "schedules/report.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pipeoffload::cli {
namespace {

using Row = std::vector<std::string>;

// Left-aligns the first column, right-aligns the rest, separates columns by two spaces and
// rules the header.
std::string RenderTable(const Row& header, const std::vector<Row>& rows) {
  std::vector<std::size_t> widths(header.size(), 0);
  auto widen = [&](const Row& row) {
    for (std::size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  };
  widen(header);
  for (const Row& row : rows) widen(row);
  auto render = [&](const Row& row) {
    std::string line;
    for (std::size_t i = 0; i < widths.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      const std::string pad(widths[i] - cell.size(), ' ');
      absl::StrAppend(&line, i == 0 ? "" : "  ", i == 0 ? cell + pad : pad + cell);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + "\n";
  };
  std::string out = render(header);
  std::size_t total = 0;
  for (std::size_t w : widths) total += w + 2;
  absl::StrAppend(&out, std::string(total > 2 ? total - 2 : 0, '-'), "\n");
  for (const Row& row : rows) absl::StrAppend(&out, render(row));
  return out;
}

std::string Time(double t, ReportUnits units) {
  return units.unit_costs ? absl::StrFormat("%.2f", t) : absl::StrFormat("%.1f ms", t * 1e3);
}

std::string Bytes(std::int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
}

// Memory in the table's unit: chunk units for unit costs, GiB otherwise.
std::string Memory(std::int64_t bytes, ReportUnits units) {
  if (!units.unit_costs) return Bytes(bytes);
  const auto unit = static_cast<double>(std::max<std::int64_t>(1, units.unit_bytes));
  return absl::StrFormat("%.3g", static_cast<double>(bytes) / unit);
}

std::string Percent(double ratio) { return absl::StrFormat("%.1f%%", ratio * 100); }

std::string SpecLine(const PipelineSpec& spec) {
  std::string line = absl::StrFormat("%s p=%d m=%d v=%d", std::string(FamilyName(spec.family)),
                                     spec.num_stages, spec.num_microbatches,
                                     spec.chunks_per_stage);
  if (spec.family == Family::kGroupInterleaved) absl::StrAppend(&line, " g=", spec.group_size);
  if (spec.split_backward) absl::StrAppend(&line, " split-backward");
  if (spec.offload != OffloadPolicy::kNone) {
    absl::StrAppend(&line, " offload=", std::string(OffloadPolicyName(spec.offload)));
  }
  return line;
}

// Whether a row ran with W apart from B: the compiled spec where there is one (zbv and
// dualpipev split whatever the base asks), else the requested one.
bool SplitBackward(const ComparisonRow& row) {
  return row.result.ok() ? row.result->spec.split_backward : row.spec.split_backward;
}

// Which backward the rows use, and why compare splits by default: "vs 1f1b" means little to a
// reader who does not know both sides' backward, and unsplit group-interleaved looks slower
// than 1f1b for a reason the table alone does not show.
std::string BackwardNote(const std::vector<ComparisonRow>& rows) {
  std::vector<std::string> split_families;
  bool all_split = true;
  for (const ComparisonRow& row : rows) {
    if (!SplitBackward(row)) {
      all_split = false;
      continue;
    }
    const Family family = row.result.ok() ? row.result->spec.family : row.spec.family;
    const std::string name(FamilyName(family));
    if (std::find(split_families.begin(), split_families.end(), name) == split_families.end()) {
      split_families.push_back(name);
    }
  }
  constexpr char kWhy[] =
      "group-interleaved's building blocks assume split passes; unsplit, at g < p, they wait in "
      "bubbles W would fill.\n";
  if (all_split) {
    return absl::StrCat(
        "backward split (B, then W) in every row: compare's default; --unsplit-backward puts W "
        "inside B.\nwhy: ",
        kWhy);
  }
  const std::string except =
      split_families.empty()
          ? ""
          : absl::StrCat(" except ", absl::StrJoin(split_families, ", "),
                         " (split by definition, weighed against an unsplit 1f1b)");
  return absl::StrCat("backward unsplit (W inside B, --unsplit-backward)", except,
                      ".\ncompare's default is split: ", kWhy);
}

}  // namespace

std::string FormatScheduleTable(const Schedule& schedule, ReportUnits units) {
  const Predictions& pred = *schedule.predictions;
  std::string out = absl::StrCat(SpecLine(schedule.spec), "\n");
  // The overhead the offload plan costs this order, the number a user weighs against the
  // memory it saves.
  const double overhead = pred.step_time_without_offload > 0
                              ? pred.step_time / pred.step_time_without_offload - 1.0
                              : 0.0;
  absl::StrAppend(&out, "step ", Time(pred.step_time, units), " (without offload ",
                  Time(pred.step_time_without_offload, units), ", overhead ",
                  absl::StrFormat("%+.2f%%", 100.0 * overhead), "), bubble ",
                  Percent(pred.bubble_ratio), ", collisions ", pred.collisions, "\n\n");
  std::vector<Row> rows;
  for (std::size_t d = 0; d < pred.stages.size(); ++d) {
    const StagePrediction& s = pred.stages[d];
    const std::size_t ops = d < schedule.stages.size() ? schedule.stages[d].ops.size() : 0;
    rows.push_back({absl::StrCat(d), absl::StrCat(ops), Time(s.busy_time, units),
                    Memory(s.peak_bytes, units),
                    Memory(s.peak_bytes_without_offload, units),
                    Memory(s.host_bytes, units), Memory(s.offloaded_bytes, units)});
  }
  absl::StrAppend(&out, RenderTable({"stage", "ops", "busy", "peak", "peak w/o offload",
                                     "host", "offloaded"},
                                    rows));
  for (const std::string& warning : pred.warnings) {
    absl::StrAppend(&out, "warning: ", warning, "\n");
  }
  return out;
}

std::vector<ComparisonRow> ComparisonRows(const PipelineSpec& base,
                                          std::int64_t auto_budget_bytes) {
  const int v = std::max(2, base.chunks_per_stage);
  auto make = [&](std::string label, Family family, OffloadPolicy offload) {
    PipelineSpec spec = base;
    spec.family = family;
    spec.offload = offload;
    spec.chunks_per_stage = family == Family::k1F1B ? 1 : v;
    spec.group_size = family == Family::kGroupInterleaved ? base.group_size : 0;
    // Only the recompute rows below (and auto, which takes it as a bound) keep the base's
    // --recompute: the other rows are the offload policies as they are.
    if (offload != OffloadPolicy::kAuto) spec.recompute = Recompute::kNone;
    return ComparisonRow{std::move(label), spec, absl::UnknownError("not compiled")};
  };
  std::vector<ComparisonRow> rows;
  rows.push_back(make("1f1b", Family::k1F1B, OffloadPolicy::kNone));
  rows.push_back(make("interleaved", Family::kInterleaved, OffloadPolicy::kNone));
  rows.push_back(make("group-interleaved", Family::kGroupInterleaved, OffloadPolicy::kNone));
  rows.push_back(make("po-h (group-interleaved)", Family::kGroupInterleaved, OffloadPolicy::kHalf));
  rows.push_back(make("po-f (group-interleaved)", Family::kGroupInterleaved, OffloadPolicy::kFull));
  rows.push_back(make("po-f (1f1b)", Family::k1F1B, OffloadPolicy::kFull));
  // Recompute instead of offload (issue 15), on 1f1b beside po-f (1f1b): the base's
  // --recompute-fraction / --recompute-chunks, every entry by default.
  for (const Recompute mode : {Recompute::kFull, Recompute::kLean}) {
    ComparisonRow row = make("", Family::k1F1B, OffloadPolicy::kNone);
    row.spec.recompute = mode;
    row.spec.recompute_fraction = base.recompute_fraction;
    row.spec.recompute_chunks = std::min(base.recompute_chunks, 1);
    row.label = absl::StrCat("recompute ", RecomputeName(mode), " (1f1b)");
    rows.push_back(std::move(row));
  }
  // And lean beside po-f: what the link cannot carry whole, it carries as lean blocks.
  ComparisonRow lean_offload = rows.back();
  lean_offload.spec.offload = OffloadPolicy::kFull;
  lean_offload.label = "recompute lean + po-f (1f1b)";
  rows.push_back(std::move(lean_offload));
  // torch's V schedules (v placement, two chunks per stage, split backward); DualPipeV only
  // where it is defined (m >= 2p).
  for (Family family : {Family::kZbv, Family::kDualPipeV}) {
    if (family == Family::kDualPipeV && base.num_microbatches < 2 * base.num_stages) continue;
    for (OffloadPolicy offload : {OffloadPolicy::kNone, OffloadPolicy::kHalf}) {
      const std::string name(FamilyName(family));
      ComparisonRow row = make(offload == OffloadPolicy::kNone ? name : "po-h (" + name + ")",
                               family, offload);
      row.spec.chunks_per_stage = 2;
      rows.push_back(std::move(row));
    }
  }
  ComparisonRow selective =
      make("", Family::kGroupInterleaved, OffloadPolicy::kSelective);
  if (selective.spec.offload_chunks == 0 && selective.spec.offload_fraction == 0) {
    selective.spec.offload_fraction = 0.25;
  }
  selective.label = selective.spec.offload_chunks > 0
                        ? absl::StrCat("selective ", selective.spec.offload_chunks, " chunk(s)")
                        : absl::StrFormat("selective %.0f%%",
                                          selective.spec.offload_fraction * 100);
  rows.push_back(std::move(selective));
  ComparisonRow automatic = make("", base.family, OffloadPolicy::kAuto);
  automatic.spec.chunks_per_stage = base.chunks_per_stage;
  if (automatic.spec.memory_budget_bytes <= 0) {
    automatic.spec.memory_budget_bytes = auto_budget_bytes;
  }
  automatic.label = absl::StrCat("auto (budget ", Bytes(automatic.spec.memory_budget_bytes), ")");
  if (base.memory_budget_bytes <= 0) automatic.label = "auto (budget: half the 1f1b peak)";
  rows.push_back(std::move(automatic));
  return rows;
}

std::string FormatComparison(const std::vector<ComparisonRow>& rows, ReportUnits units) {
  double baseline = 0;
  for (const ComparisonRow& row : rows) {
    if (row.spec.family == Family::k1F1B && row.spec.offload == OffloadPolicy::kNone &&
        row.spec.recompute == Recompute::kNone && row.result.ok()) {
      baseline = row.result->predictions->step_time;
    }
  }
  std::string out;
  if (!rows.empty()) {
    const PipelineSpec& s = rows.front().spec;
    absl::StrAppend(&out, "pipeline: p=", s.num_stages, " m=", s.num_microbatches,
                    SplitBackward(rows.front()) ? " split-backward" : "", "\n",
                    BackwardNote(rows), "\n");
  }
  std::vector<Row> table;
  std::vector<Row> per_stage;
  std::string notes;
  std::size_t num_stages = 0;
  for (const ComparisonRow& row : rows) {
    if (!row.result.ok()) {
      table.push_back({row.label, "-", "-", "-", "-", "-", "-", "-", "-", "-", "error"});
      absl::StrAppend(&notes, row.label, ": ", std::string(row.result.status().message()), "\n");
      continue;
    }
    const Schedule& schedule = *row.result;
    const Predictions& pred = *schedule.predictions;
    std::int64_t max_bytes = 0, max_host = 0, offloaded = 0;
    Row stage_row = {row.label};
    for (const StagePrediction& s : pred.stages) {
      max_bytes = std::max(max_bytes, s.peak_bytes);
      max_host = std::max(max_host, s.host_bytes);
      offloaded += s.offloaded_bytes;
      stage_row.push_back(Memory(s.peak_bytes, units));
    }
    num_stages = std::max(num_stages, pred.stages.size());
    per_stage.push_back(std::move(stage_row));
    const StagePrediction& first = pred.stages.front();
    table.push_back(
        {row.label, absl::StrCat(schedule.spec.chunks_per_stage),
         schedule.spec.family == Family::kGroupInterleaved ? absl::StrCat(schedule.spec.group_size)
                                                           : "-",
         Time(pred.step_time, units),
         baseline > 0 ? absl::StrFormat("%+.1f%%", (pred.step_time / baseline - 1) * 100) : "-",
         Percent(pred.bubble_ratio), Memory(first.peak_bytes, units),
         Memory(max_bytes, units), Memory(max_host, units), Memory(offloaded, units),
         absl::StrCat(pred.collisions)});
    for (const std::string& warning : pred.warnings) {
      absl::StrAppend(&notes, row.label, ": warning: ", warning, "\n");
    }
  }
  absl::StrAppend(&out, RenderTable({"policy", "v", "g", "step", "vs 1f1b", "bubble",
                                     "peak stage 0", "max peak", "host/stage",
                                     "offloaded/iter", "collisions"},
                                    table));
  Row header = {"peak per stage"};
  for (std::size_t d = 0; d < num_stages; ++d) header.push_back(absl::StrCat("s", d));
  absl::StrAppend(&out, "\n", RenderTable(header, per_stage));
  if (!notes.empty()) absl::StrAppend(&out, "\n", notes);
  return out;
}

}  // namespace pipeoffload::cli
