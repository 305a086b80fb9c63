// PyTorch pipelining schedule CSV (torch.distributed.pipelining, current dialect; ecosystem.md
// sections 1.2-1.4): export of a Schedule and import of a torch-written file.
//
// Cell grammar: <virtual stage><TYPE>[<microbatch>], e.g. "5F3", "2SEND_F0", "0UNSHARD"; one
// row per rank, no header, empty cell = idle slot. Virtual stage l lives on rank l % p ("loop"
// placement), and our (stage d, chunk c) is virtual stage c * p + d. Our B is torch's B (full
// backward) when the spec does not split W and torch's I (input gradient) when it does. Offload
// ops and BARRIERs have no torch equivalent and are stripped on export. Torch's UNSHARD, RESHARD
// and REDUCE_GRAD are no-ops for us and are skipped on import.
//
// Error positions: "row r, column c" are 0-based (row r is rank r), followed by the cell text.
#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/echo.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/schedule_io.h"

namespace pipeoffload {
namespace {

enum class ActionType {
  kForward,         // F
  kBackwardInput,   // I
  kFullBackward,    // B
  kBackwardWeight,  // W
  kSendF,
  kRecvF,
  kSendB,
  kRecvB,
  kUnshard,     // FSDP; a no-op for us
  kReshard,     // FSDP; a no-op for us
  kReduceGrad,  // DP gradient reduction; a no-op for us
};

struct ActionTypeName {
  ActionType type;
  std::string_view name;
};

constexpr std::array<ActionTypeName, 11> kActionTypes = {{
    {ActionType::kForward, "F"},
    {ActionType::kBackwardInput, "I"},
    {ActionType::kFullBackward, "B"},
    {ActionType::kBackwardWeight, "W"},
    {ActionType::kSendF, "SEND_F"},
    {ActionType::kRecvF, "RECV_F"},
    {ActionType::kSendB, "SEND_B"},
    {ActionType::kRecvB, "RECV_B"},
    {ActionType::kUnshard, "UNSHARD"},
    {ActionType::kReshard, "RESHARD"},
    {ActionType::kReduceGrad, "REDUCE_GRAD"},
}};

// Stage and microbatch numbers above this are rejected, so that m, v and p * v fit in an int.
constexpr std::int64_t kMaxIndex = 1 << 24;

bool IsSkipped(ActionType type) {
  return type == ActionType::kUnshard || type == ActionType::kReshard ||
         type == ActionType::kReduceGrad;
}

bool IsSplitBackward(ActionType type) {
  return type == ActionType::kBackwardInput || type == ActionType::kBackwardWeight;
}

// ---------------------------------------------------------------------------------------------
// Export.

// The torch type of `op`, or "" when the op is not exported in `flavor`.
std::string_view TorchType(const Op& op, bool split_backward, CsvFlavor flavor) {
  switch (op.kind) {
    case OpKind::kForward: return "F";
    case OpKind::kBackward: return split_backward ? "I" : "B";
    case OpKind::kBackwardWeight: return "W";
    default: break;
  }
  if (flavor == CsvFlavor::kComputeOnly || !IsP2P(op.kind)) return "";
  return OpKindName(op.kind);  // SEND_F, RECV_F, SEND_B, RECV_B: the same names as torch's
}

// ---------------------------------------------------------------------------------------------
// Import.

struct Position {
  int row = 0;
  int column = 0;
  std::string cell;
};

std::string Where(const Position& at) {
  return absl::StrCat("row ", at.row, ", column ", at.column, ", cell \"", Echo(at.cell), "\"");
}

absl::Status CellError(const Position& at, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Where(at), ": ", std::string(what)));
}

struct Action {
  ActionType type = ActionType::kForward;
  int virtual_stage = 0;
  int mb = 0;
  Position at;
};

std::string_view Trim(std::string_view text) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> pieces;
  while (true) {
    const std::size_t at = text.find(separator);
    pieces.push_back(text.substr(0, at));
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return pieces;
}

// Rows split on "\n" with any "\r" before it dropped; a final line end does not open a row.
std::vector<std::string_view> SplitRows(std::string_view csv) {
  if (csv.empty()) return {};
  std::vector<std::string_view> rows = Split(csv, '\n');
  if (rows.back().empty()) rows.pop_back();
  for (std::string_view& row : rows) {
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
  }
  return rows;
}

// Reads decimal digits at `*pos`; nullopt when there are none. Errors above kMaxIndex.
absl::StatusOr<std::optional<int>> ReadNumber(std::string_view cell, std::size_t* pos,
                                              std::string_view what) {
  std::int64_t value = 0;
  const std::size_t begin = *pos;
  while (*pos < cell.size() && std::isdigit(static_cast<unsigned char>(cell[*pos]))) {
    value = value * 10 + (cell[*pos] - '0');
    if (value > kMaxIndex) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(what), " is out of range (at most ", kMaxIndex, ")"));
    }
    ++*pos;
  }
  if (*pos == begin) return std::optional<int>();
  return std::optional<int>(static_cast<int>(value));
}

std::string ActionTypeList() {
  std::string out;
  for (const ActionTypeName& entry : kActionTypes) {
    if (!out.empty()) out.append(", ");
    out.append(entry.name);
  }
  return out;
}

// Parses one non-empty, trimmed cell. Errors say what is wrong, without the position.
absl::StatusOr<Action> ParseCell(std::string_view cell) {
  if (cell.find("OVERLAP_F_B") != std::string_view::npos) {
    return absl::InvalidArgumentError(
        "OVERLAP_F_B (DualPipeV's overlapped forward and backward) is not supported");
  }
  std::size_t pos = 0;
  PO_ASSIGN_OR_RETURN(const std::optional<int> stage, ReadNumber(cell, &pos, "virtual stage"));
  if (!stage.has_value()) {
    return absl::InvalidArgumentError(
        "expected <virtual stage><TYPE>[<microbatch>], e.g. \"0F3\"; the cell does not start "
        "with a stage number");
  }
  const std::size_t type_begin = pos;
  while (pos < cell.size() &&
         (std::isalpha(static_cast<unsigned char>(cell[pos])) || cell[pos] == '_')) {
    ++pos;
  }
  const std::string_view type_name = cell.substr(type_begin, pos - type_begin);
  if (type_name.empty()) {
    return absl::InvalidArgumentError("missing the action type after the stage number");
  }
  const auto entry = std::find_if(kActionTypes.begin(), kActionTypes.end(),
                                  [&](const ActionTypeName& e) { return e.name == type_name; });
  if (entry == kActionTypes.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown action type \"", Echo(type_name), "\"; expected one of ",
        ActionTypeList(),
        type_name == "BW" ? " (\"BW\" is the pre-2.6 dialect's full backward; this reader "
                            "reads the current one, where it is \"B\")"
                          : ""));
  }
  PO_ASSIGN_OR_RETURN(const std::optional<int> mb, ReadNumber(cell, &pos, "microbatch"));
  if (pos != cell.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected \"", Echo(cell.substr(pos)), "\" after the action"));
  }
  Action action;
  action.type = entry->type;
  action.virtual_stage = *stage;
  if (!IsSkipped(action.type)) {
    if (!mb.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a ", std::string(type_name), " action needs a microbatch number"));
    }
    action.mb = *mb;
  }
  return action;
}

OpKind OpKindOf(ActionType type) {
  switch (type) {
    case ActionType::kForward: return OpKind::kForward;
    case ActionType::kBackwardInput: return OpKind::kBackward;
    case ActionType::kFullBackward: return OpKind::kBackward;
    case ActionType::kBackwardWeight: return OpKind::kBackwardWeight;
    case ActionType::kSendF: return OpKind::kSendActivation;
    case ActionType::kRecvF: return OpKind::kRecvActivation;
    case ActionType::kSendB: return OpKind::kSendGrad;
    case ActionType::kRecvB: return OpKind::kRecvGrad;
    default: break;
  }
  return OpKind::kBarrier;  // unreachable: skipped types never become ops
}

// The virtual stage at the other end of a P2P action of virtual stage `l`: SEND_F and RECV_B
// talk to l + 1, RECV_F and SEND_B to l - 1.
int PeerVirtualStage(ActionType type, int l) {
  return type == ActionType::kSendF || type == ActionType::kRecvB ? l + 1 : l - 1;
}

// Turns the actions of all rows into a Schedule; checks what needs m and v (known only now).
absl::StatusOr<Schedule> BuildSchedule(const std::vector<std::vector<Action>>& rows,
                                       int num_stages, Family family_hint, bool split) {
  const int p = num_stages;
  int max_mb = -1;
  int max_virtual_stage = 0;
  for (const std::vector<Action>& row : rows) {
    for (const Action& action : row) {
      if (action.type == ActionType::kForward || action.type == ActionType::kBackwardInput ||
          action.type == ActionType::kFullBackward ||
          action.type == ActionType::kBackwardWeight) {
        max_mb = std::max(max_mb, action.mb);
      }
      max_virtual_stage = std::max(max_virtual_stage, action.virtual_stage);
    }
  }
  if (max_mb < 0) {
    return absl::InvalidArgumentError(
        "the CSV holds no F, I, B or W action, so the number of microbatches is unknown");
  }
  Schedule schedule;
  schedule.spec.family = family_hint;
  schedule.spec.num_stages = p;
  schedule.spec.num_microbatches = max_mb + 1;
  schedule.spec.chunks_per_stage = max_virtual_stage / p + 1;
  schedule.spec.split_backward = split;
  const int num_virtual_stages = schedule.spec.num_virtual_stages();

  schedule.stages.resize(p);
  for (int d = 0; d < p; ++d) {
    StageProgram& program = schedule.stages[d];
    program.stage = d;
    program.ops.reserve(rows[d].size());
    for (const Action& action : rows[d]) {
      Op op;
      op.kind = OpKindOf(action.type);
      op.mb = action.mb;
      op.chunk = action.virtual_stage / p;
      if (IsP2P(op.kind)) {
        if (action.mb > max_mb) {
          return CellError(action.at, absl::StrCat("microbatch ", action.mb,
                                                   " has no compute action anywhere (m = ",
                                                   max_mb + 1, ")"));
        }
        const int other = PeerVirtualStage(action.type, action.virtual_stage);
        if (other < 0 || other >= num_virtual_stages) {
          return CellError(action.at,
                           absl::StrCat("virtual stage ", action.virtual_stage,
                                        " has no neighbour ", other, " to talk to (there are ",
                                        num_virtual_stages, " virtual stages)"));
        }
        op.peer = other % p;
        if (op.peer == d) {
          return CellError(action.at,
                           absl::StrCat("virtual stages ", action.virtual_stage, " and ", other,
                                        " are both on rank ", d,
                                        ", which hands data over locally without SEND/RECV"));
        }
      }
      program.ops.push_back(op);
    }
  }
  return schedule;
}

}  // namespace

std::string ScheduleToPyTorchCsv(const Schedule& schedule, CsvFlavor flavor) {
  const int p = schedule.spec.num_stages;
  std::string out;
  for (const StageProgram& program : schedule.stages) {
    bool first = true;
    for (const Op& op : program.ops) {
      const std::string_view type = TorchType(op, schedule.spec.split_backward, flavor);
      if (type.empty()) continue;
      if (!first) out.push_back(',');
      first = false;
      absl::StrAppend(&out, op.chunk * p + program.stage, std::string(type), op.mb);
    }
    out.push_back('\n');
  }
  return out;
}

absl::StatusOr<Schedule> ParsePyTorchCsv(std::string_view csv, int num_stages,
                                         Family family_hint) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_stages must be >= 1 to read a PyTorch CSV, got ", num_stages));
  }
  const std::vector<std::string_view> rows = SplitRows(csv);
  // Sized by the rows the text holds, never by num_stages alone: a huge --stages must cost
  // nothing before the row count refutes it (below).
  std::vector<std::vector<Action>> actions(
      std::min(rows.size(), static_cast<std::size_t>(num_stages)));
  std::optional<Position> first_full_backward;
  std::optional<Position> first_split_backward;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::vector<std::string_view> cells = Split(rows[r], ',');
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const std::string_view cell = Trim(cells[c]);
      if (cell.empty()) continue;  // an idle slot
      Position at{static_cast<int>(r), static_cast<int>(c), std::string(cell)};
      if (r >= static_cast<std::size_t>(num_stages)) {
        return CellError(at, absl::StrCat("the CSV has more rows (", rows.size(),
                                          ") than the pipeline has ranks (num_stages = ",
                                          num_stages, ")"));
      }
      absl::StatusOr<Action> action = ParseCell(cell);
      if (!action.ok()) return Annotate(action.status(), Where(at));
      if (IsSkipped(action->type)) continue;
      if (action->virtual_stage % num_stages != static_cast<int>(r)) {
        return CellError(at, absl::StrCat("virtual stage ", action->virtual_stage,
                                          " runs on rank ", action->virtual_stage % num_stages,
                                          " under loop placement (stage % ", num_stages,
                                          "), not on rank ", r));
      }
      if (action->type == ActionType::kFullBackward && !first_full_backward) {
        first_full_backward = at;
      }
      if (IsSplitBackward(action->type) && !first_split_backward) first_split_backward = at;
      if (first_full_backward && first_split_backward) {
        const Position& other =
            action->type == ActionType::kFullBackward ? *first_split_backward
                                                      : *first_full_backward;
        return CellError(at, absl::StrCat("mixes full backward (B) with split backward (I/W), "
                                          "first seen at ",
                                          Where(other)));
      }
      action->at = std::move(at);
      actions[r].push_back(*std::move(action));
    }
  }
  if (rows.size() < static_cast<std::size_t>(num_stages)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CSV has ", rows.size(), " rows but the pipeline has num_stages = ",
                     num_stages, " ranks (one row per rank, in rank order)"));
  }
  // Rows past the last rank hold no action (one that did was reported above). Blank lines there
  // are an editor's; but a row of idle cells (",,") is a rank that idles throughout, so the file
  // was written for a longer pipeline: a wrong --stages, not something to ignore.
  for (std::size_t r = static_cast<std::size_t>(num_stages); r < rows.size(); ++r) {
    if (rows[r].find(',') == std::string_view::npos) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "row ", r, " holds only idle cells, a rank the pipeline does not have (num_stages = ",
        num_stages, ", so rows 0..", num_stages - 1,
        "); pass the file's rank count, or drop the row"));
  }
  return BuildSchedule(actions, num_stages, family_hint, first_split_backward.has_value());
}

}  // namespace pipeoffload
