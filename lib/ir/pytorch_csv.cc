// PyTorch pipelining schedule CSV (torch.distributed.pipelining, current dialect; ecosystem.md
// sections 1.2-1.4): export of a Schedule and import of a torch-written file.
//
// Cell grammar: <virtual stage><TYPE>[<microbatch>], e.g. "5F3", "2SEND_F0", "0UNSHARD"; one
// row per rank, no header, empty cell = idle slot. Virtual stage l lives on rank l % p under loop
// placement (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) and on rank l or 2p - 1 - l under
// V placement (ZBVZeroBubble, DualPipeV); VirtualStageMap maps our (stage d, chunk c) to it. Our
// B is torch's B (full backward) when the spec does not split W and torch's I (input gradient)
// when it does. Offload ops and BARRIERs have no torch equivalent and are stripped on export.
// Torch's UNSHARD, RESHARD and REDUCE_GRAD are no-ops for us and are skipped on import.
//
// Import infers what the file does not say: the ranks from its rows, the placement from the rank
// its virtual stages >= p run on, split backward from any I or W. In a split file a full B is our
// B followed by its W (DualPipeV writes both), and DualPipeV's "(0F3;7B2)OVERLAP_F_B" is its
// sub-actions in order: our runtime has one compute stream per stage, so they run one after the
// other, which keeps every dependency and the memory order.
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

bool IsComputeAction(ActionType type) {
  return type == ActionType::kForward || type == ActionType::kBackwardInput ||
         type == ActionType::kFullBackward || type == ActionType::kBackwardWeight;
}

// One cell's actions: one, or an OVERLAP_F_B's sub-actions "(a;b;...)OVERLAP_F_B" in order
// (torch writes a forward and a full backward there).
absl::StatusOr<std::vector<Action>> ParseCellActions(std::string_view cell) {
  if (cell.empty() || cell.front() != '(') {
    PO_ASSIGN_OR_RETURN(Action action, ParseCell(cell));
    return std::vector<Action>{action};
  }
  const std::size_t close = cell.find(')');
  if (close == std::string_view::npos || cell.substr(close + 1) != "OVERLAP_F_B") {
    return absl::InvalidArgumentError(
        "a cell that starts with \"(\" must be \"(<action>;<action>...)OVERLAP_F_B\"");
  }
  std::vector<Action> actions;
  for (std::string_view part : Split(cell.substr(1, close - 1), ';')) {
    part = Trim(part);
    if (part.empty()) continue;
    absl::StatusOr<Action> action = ParseCell(part);
    if (!action.ok()) {
      return Annotate(action.status(), absl::StrCat("OVERLAP_F_B part \"", Echo(part), "\""));
    }
    if (!IsComputeAction(action->type)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "OVERLAP_F_B part \"", Echo(part), "\" is not a compute action (F, I, B or W)"));
    }
    actions.push_back(*std::move(action));
  }
  if (actions.empty()) return absl::InvalidArgumentError("OVERLAP_F_B without sub-actions");
  return actions;
}

// The rank virtual stage `l` runs on under `placement`, -1 when it has none (V: l >= 2p).
int RankOf(Placement placement, int p, int l) {
  if (placement == Placement::kV && l >= 2 * p) return -1;
  return VirtualStageMap{placement, p, 2}.stage_of(l);
}

// The placement the rows follow: `given`, or the one every action fits (loop when both do: then
// no virtual stage >= p tells them apart, e.g. v = 1); when neither does, the one the first
// telling action (a virtual stage l >= p whose ranks differ: l % p vs 2p - 1 - l) fits, so that
// the error names a cell that breaks it. Every action is then checked against it; errors name
// the cell and the rule.
absl::StatusOr<Placement> RowPlacement(const std::vector<std::vector<Action>>& rows, int p,
                                       std::optional<Placement> given) {
  const auto fits = [&](Placement placement) {
    for (std::size_t r = 0; r < rows.size(); ++r) {
      for (const Action& action : rows[r]) {
        if (RankOf(placement, p, action.virtual_stage) != static_cast<int>(r)) return false;
      }
    }
    return true;
  };
  Placement placement = given.value_or(Placement::kLoop);
  if (!given.has_value() && !fits(Placement::kLoop)) {
    if (fits(Placement::kV)) {
      placement = Placement::kV;
    } else {
      bool told = false;
      for (std::size_t r = 0; r < rows.size() && !told; ++r) {
        for (const Action& action : rows[r]) {
          const int l = action.virtual_stage;
          const int v_rank = RankOf(Placement::kV, p, l);
          if (l < p || l % p == v_rank) continue;
          placement = v_rank == static_cast<int>(r) ? Placement::kV : Placement::kLoop;
          told = true;
          break;
        }
      }
    }
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (const Action& action : rows[r]) {
      const int l = action.virtual_stage;
      const int rank = RankOf(placement, p, l);
      if (rank == static_cast<int>(r)) continue;
      if (placement == Placement::kLoop) {
        return CellError(action.at, absl::StrCat("virtual stage ", l, " runs on rank ", rank,
                                                 " under loop placement (stage % ", p,
                                                 "), not on rank ", r));
      }
      if (rank < 0) {
        return CellError(action.at, absl::StrCat("virtual stage ", l,
                                                 " has no rank under v placement (", 2 * p,
                                                 " virtual stages for ", p, " ranks)"));
      }
      return CellError(action.at,
                       absl::StrCat("virtual stage ", l, " runs on rank ", rank,
                                    " under v placement (stage for stage < ", p, ", ", 2 * p - 1,
                                    " - stage otherwise), not on rank ", r));
    }
  }
  return placement;
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
                                       int num_stages, Placement placement, Family family_hint,
                                       bool split) {
  const int p = num_stages;
  int max_mb = -1;
  int max_virtual_stage = 0;
  for (const std::vector<Action>& row : rows) {
    for (const Action& action : row) {
      if (IsComputeAction(action.type)) max_mb = std::max(max_mb, action.mb);
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
  schedule.spec.placement = placement;
  if (placement == Placement::kV && schedule.spec.chunks_per_stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "v placement needs virtual stages up to 2p - 1 = ", 2 * p - 1,
        " (two per rank); the CSV's highest is ", max_virtual_stage));
  }
  const VirtualStageMap map = schedule.spec.stage_map();
  const int num_virtual_stages = map.num_virtual_stages();

  schedule.stages.resize(p);
  for (int d = 0; d < p; ++d) {
    StageProgram& program = schedule.stages[d];
    program.stage = d;
    program.ops.reserve(rows[d].size());
    for (const Action& action : rows[d]) {
      Op op;
      op.kind = OpKindOf(action.type);
      op.mb = action.mb;
      op.chunk = map.chunk_of(action.virtual_stage);
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
        op.peer = map.stage_of(other);
        if (op.peer == d) {
          return CellError(action.at,
                           absl::StrCat("virtual stages ", action.virtual_stage, " and ", other,
                                        " are both on rank ", d,
                                        ", which hands data over locally without SEND/RECV"));
        }
      }
      program.ops.push_back(op);
      // A full backward in a split file: its W comes with it (DualPipeV writes both kinds).
      if (split && action.type == ActionType::kFullBackward) {
        program.ops.push_back(Op{OpKind::kBackwardWeight, op.mb, op.chunk, -1});
      }
    }
  }
  return schedule;
}

}  // namespace

std::string ScheduleToPyTorchCsv(const Schedule& schedule, CsvFlavor flavor) {
  const VirtualStageMap map = schedule.spec.stage_map();
  std::string out;
  for (const StageProgram& program : schedule.stages) {
    bool first = true;
    for (const Op& op : program.ops) {
      const std::string_view type = TorchType(op, schedule.spec.split_backward, flavor);
      if (type.empty()) continue;
      if (!first) out.push_back(',');
      first = false;
      absl::StrAppend(&out, map.virtual_stage(program.stage, op.chunk), std::string(type), op.mb);
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
  return ParsePyTorchCsv(csv, CsvImportOptions{num_stages, std::nullopt, family_hint});
}

absl::StatusOr<Schedule> ParsePyTorchCsv(std::string_view csv, const CsvImportOptions& options) {
  if (options.num_stages < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_stages must be >= 1, or 0 for the CSV's row count, got ", options.num_stages));
  }
  const std::vector<std::string_view> rows = SplitRows(csv);
  // The file's ranks: its rows up to the last that is not blank (editors add blank lines).
  std::size_t file_ranks = rows.size();
  while (file_ranks > 0 && Trim(rows[file_ranks - 1]).empty()) --file_ranks;
  if (options.num_stages == 0 && file_ranks == 0) {
    return absl::InvalidArgumentError(
        "the CSV has no rows, so the number of ranks (one row each) is unknown");
  }
  const int num_stages =
      options.num_stages > 0 ? options.num_stages : static_cast<int>(file_ranks);
  // Sized by the rows the text holds, never by num_stages alone: a huge --stages must cost
  // nothing before the row count refutes it (below).
  std::vector<std::vector<Action>> actions(
      std::min(rows.size(), static_cast<std::size_t>(num_stages)));
  bool split = false;
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
      absl::StatusOr<std::vector<Action>> parsed = ParseCellActions(cell);
      if (!parsed.ok()) return Annotate(parsed.status(), Where(at));
      for (Action& action : *parsed) {
        if (IsSkipped(action.type)) continue;
        split = split || IsSplitBackward(action.type);
        action.at = at;
        actions[r].push_back(std::move(action));
      }
    }
  }
  // Before the row count: a cell on the wrong rank says more than "too few rows"; but when the
  // given count is not the file's, that is the likelier cause, so the error says it too.
  absl::StatusOr<Placement> placement = RowPlacement(actions, num_stages, options.placement);
  if (!placement.ok() && file_ranks != static_cast<std::size_t>(num_stages)) {
    return absl::InvalidArgumentError(absl::StrCat(
        placement.status().message(), " (the CSV has ", file_ranks,
        " rows but the pipeline has num_stages = ", num_stages, " ranks)"));
  }
  PO_RETURN_IF_ERROR(placement.status());
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
  return BuildSchedule(actions, num_stages, *placement, options.family_hint, split);
}

}  // namespace pipeoffload
