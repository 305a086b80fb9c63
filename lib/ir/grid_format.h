// The "step x stage grid" that Validate and Simulate print under an error: rows are op indices
// (steps), columns are stages, cells are OpToString, the ops at fault marked with '*'.
// Pure formatting of a schedule's programs; it checks nothing. Header-only so that lib/ir and
// lib/sim share one formatter without another translation unit in the build.
#ifndef PIPEOFFLOAD_LIB_IR_GRID_FORMAT_H_
#define PIPEOFFLOAD_LIB_IR_GRID_FORMAT_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// One cell to mark: op `index` of `stage`'s program. index == ops.size() names "the end of the
// program" (a stage that has finished while others hang).
struct GridMark {
  int stage = 0;
  int index = 0;
};

// Wide pipelines print only the marked stages and their neighbours: a 64-column grid is
// unreadable in a terminal, and the columns next to the fault are the ones that explain it.
inline constexpr int kGridMaxColumns = 12;

// OpToString, except that a kind outside the enumeration (a cast gone wrong; CheckShape reports
// it) prints as "?<number>" instead of indexing past the name table.
inline std::string GridOpString(const Op& op) {
  if (static_cast<int>(op.kind) >= kNumOpKinds) {
    return "?" + std::to_string(static_cast<int>(op.kind));
  }
  return OpToString(op);
}

// "F3.1" for an op of the program, "(end)" one past its last op, "" elsewhere.
inline std::string GridCell(const StageProgram& program, long long index) {
  if (index < 0) return "";
  const auto size = static_cast<long long>(program.ops.size());
  if (index < size) return GridOpString(program.ops[static_cast<std::size_t>(index)]);
  if (index == size) return "(end)";
  return "";
}

// "stage 1, op 3 (F0.0)", or "stage 1" when the violation names no op.
inline std::string DescribeOp(const std::vector<StageProgram>& programs, int stage, int index) {
  std::string out = "stage " + std::to_string(stage);
  if (stage < 0 || static_cast<std::size_t>(stage) >= programs.size() || index < 0) return out;
  out += ", op " + std::to_string(index);
  const StageProgram& program = programs[static_cast<std::size_t>(stage)];
  if (static_cast<std::size_t>(index) < program.ops.size()) {
    out += " (" + GridOpString(program.ops[static_cast<std::size_t>(index)]) + ")";
  }
  return out;
}

// Renders the grid around `marks`, `radius` steps either side.
//  - When the first mark of every marked stage sits at the same step i (one violation, or a pair
//    of ops at one step), rows are the absolute steps i-radius .. i+radius and every shown stage
//    is aligned on them; further marks (a duplicate's first occurrence) are marked where visible.
//  - Otherwise (the stages of a deadlock hang at unrelated steps) each marked stage's column is
//    centred on its first mark: rows are offsets from it and the header says "stage d @i".
// Shows every stage when there are at most kGridMaxColumns; else the marked stages and their
// neighbours, and says how many are hidden.
// `legend` says what the marks are ("the op at fault", "blocked op").
inline std::string FormatStepGrid(const std::vector<StageProgram>& programs,
                                  const std::vector<GridMark>& marks,
                                  const std::string& legend = "the op at fault", int radius = 4) {
  const int num_stages = static_cast<int>(programs.size());
  if (num_stages == 0) return "  (no stages)\n";
  const long long center = marks.empty() ? 0 : marks.front().index;

  // Which stages become columns, and where each column is centred: on the stage's first mark.
  std::vector<int> columns;
  std::vector<long long> centers(static_cast<std::size_t>(num_stages), center);
  std::vector<char> marked_stage(static_cast<std::size_t>(num_stages), 0);
  bool aligned = true;
  for (const GridMark& mark : marks) {
    if (mark.stage < 0 || mark.stage >= num_stages) continue;
    if (marked_stage[static_cast<std::size_t>(mark.stage)] != 0) continue;
    marked_stage[static_cast<std::size_t>(mark.stage)] = 1;
    centers[static_cast<std::size_t>(mark.stage)] = mark.index;
    aligned = aligned && mark.index == center;
  }
  for (int s = 0; s < num_stages; ++s) {
    const bool near_mark =
        (marked_stage[static_cast<std::size_t>(s)] != 0) ||
        (s > 0 && marked_stage[static_cast<std::size_t>(s - 1)] != 0) ||
        (s + 1 < num_stages && marked_stage[static_cast<std::size_t>(s + 1)] != 0);
    // Unaligned columns only make sense for stages that have their own centre.
    const bool wanted = aligned ? (num_stages <= kGridMaxColumns || near_mark || marks.empty())
                                : marked_stage[static_cast<std::size_t>(s)] != 0;
    if (wanted && static_cast<int>(columns.size()) < kGridMaxColumns) columns.push_back(s);
  }

  // Cells: header row, then one row per offset.
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {aligned ? "step" : "offset"};
  for (int s : columns) {
    std::string title = "stage " + std::to_string(s);
    if (!aligned) title += " @" + std::to_string(centers[static_cast<std::size_t>(s)]);
    header.push_back(title);
  }
  rows.push_back(header);
  for (long long offset = -radius; offset <= radius; ++offset) {
    if (aligned && center + offset < 0) continue;
    std::vector<std::string> row;
    row.push_back(aligned ? std::to_string(center + offset)
                          : (offset >= 0 ? "+" : "") + std::to_string(offset));
    bool any = false;
    for (int s : columns) {
      const long long index = centers[static_cast<std::size_t>(s)] + offset;
      std::string cell = GridCell(programs[static_cast<std::size_t>(s)], index);
      for (const GridMark& mark : marks) {
        if (mark.stage == s && mark.index == index) cell += " *";
      }
      any = any || !cell.empty();
      row.push_back(std::move(cell));
    }
    if (any) rows.push_back(std::move(row));
  }

  std::vector<std::size_t> widths(header.size(), 0);
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    out += "  ";
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (c > 0) out += " | ";
      out += row[c];
      if (c + 1 < row.size()) out.append(widths[c] - row[c].size(), ' ');
    }
    while (out.back() == ' ') out.pop_back();  // an empty last cell leaves only padding
    out += "\n";
  }
  if (!marks.empty()) out += "  (* = " + legend + ")\n";
  if (static_cast<int>(columns.size()) < num_stages) {
    out += "  (" + std::to_string(num_stages - static_cast<int>(columns.size())) + " of " +
           std::to_string(num_stages) + " stages not shown)\n";
  }
  return out;
}

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_IR_GRID_FORMAT_H_
