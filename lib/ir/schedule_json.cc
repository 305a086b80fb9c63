// The canonical schedule file, "pipeoffload.schedule/1" (schedule_io.h): writer and reader.
//
// The writer puts one op per line so files diff well; doubles use nlohmann's shortest
// round-trip form (non-finite ones as strings, json_fields.h), so reading a written file gives
// back an equal Schedule, bit for bit. The reader checks the shape of the document (keys, types,
// signs, stage numbering), not the schedule's invariants: that is Validate's job, and a file that
// breaks them must still load so that Validate can say where.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/echo.h"
#include "lib/base/status_macros.h"
#include "lib/ir/json_fields.h"
#include "lib/ir/json_spec.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/schedule_io.h"

namespace pipeoffload {
namespace internal {

OrderedJson SpecToJson(const PipelineSpec& spec) {
  OrderedJson out = OrderedJson::object();
  out["family"] = std::string(FamilyName(spec.family));
  out["stages"] = spec.num_stages;
  out["microbatches"] = spec.num_microbatches;
  out["chunks"] = spec.chunks_per_stage;
  out["group_size"] = spec.group_size;
  out["split_backward"] = spec.split_backward;
  // Written only when not the default, so that every loop-placed file stays byte-identical.
  if (spec.placement != Placement::kLoop) {
    out["placement"] = std::string(PlacementName(spec.placement));
  }
  out["offload"] = std::string(OffloadPolicyName(spec.offload));
  out["offload_fraction"] = DoubleToJson(spec.offload_fraction);
  out["offload_chunks"] = spec.offload_chunks;
  out["memory_budget_bytes"] = spec.memory_budget_bytes;
  out["strict"] = spec.strict;
  // Also only when asked for: files without recompute stay byte-identical.
  if (spec.recompute != Recompute::kNone) {
    out["recompute"] = std::string(RecomputeName(spec.recompute));
    out["recompute_fraction"] = DoubleToJson(spec.recompute_fraction);
    out["recompute_chunks"] = spec.recompute_chunks;
  }
  return out;
}

}  // namespace internal

namespace {

using internal::CheckObjectKeys;
using internal::DoubleToJson;
using internal::DumpInline;
using internal::FieldError;
using internal::FindMember;
using internal::IndexPath;
using internal::Json;
using internal::JoinPath;
using internal::OrderedJson;
using internal::ReadMember;
using internal::ReadValue;
using internal::RequireArray;

// Names of every value of an enum whose name function returns "?" past its last value (the
// enums are contiguous from 0), for "expected one of ..." messages that stay complete when a
// value is added.
template <typename Enum, typename NameFn>
std::string AllNames(NameFn name_of) {
  std::vector<std::string_view> names;
  for (int i = 0; i < 256; ++i) {
    const std::string_view name = name_of(static_cast<Enum>(i));
    if (name == "?") break;
    names.push_back(name);
  }
  return internal::JoinNames(names);
}

std::string AllOpKindNames() {
  std::vector<std::string_view> names;
  for (int i = 0; i < kNumOpKinds; ++i) names.push_back(OpKindName(static_cast<OpKind>(i)));
  return internal::JoinNames(names);
}

// ---------------------------------------------------------------------------------------------
// Writer.

void AppendOp(const Op& op, std::string* out) {
  absl::StrAppend(out, "{\"op\": \"", std::string(OpKindName(op.kind)), "\", \"mb\": ", op.mb,
                  ", \"chunk\": ", op.chunk);
  if (HasPeer(op.kind)) absl::StrAppend(out, ", \"peer\": ", op.peer);
  out->push_back('}');
}

// `"key": [` then one element per line at `indent` + 2, then `]` at `indent`.
void AppendLines(std::string_view key, const std::vector<OrderedJson>& elements, int indent,
                 std::string* out) {
  const std::string pad(indent, ' ');
  absl::StrAppend(out, pad, "\"", std::string(key), "\": [");
  for (std::size_t i = 0; i < elements.size(); ++i) {
    absl::StrAppend(out, i == 0 ? "\n" : ",\n", pad, "  ", DumpInline(elements[i]));
  }
  absl::StrAppend(out, elements.empty() ? "]" : absl::StrCat("\n", pad, "]"));
}

OrderedJson StagePredictionToJson(const StagePrediction& stage) {
  OrderedJson out = OrderedJson::object();
  out["peak_units"] = stage.peak_units;
  out["peak_bytes"] = stage.peak_bytes;
  out["peak_units_without_offload"] = stage.peak_units_without_offload;
  out["peak_bytes_without_offload"] = stage.peak_bytes_without_offload;
  out["host_bytes"] = stage.host_bytes;
  out["offloaded_bytes"] = stage.offloaded_bytes;
  out["busy_time"] = DoubleToJson(stage.busy_time);
  out["end_time"] = DoubleToJson(stage.end_time);
  return out;
}

OrderedJson LinkToJson(const LinkTraffic& link) {
  OrderedJson out = OrderedJson::object();
  out["name"] = link.name;
  out["bytes_d2h"] = link.bytes_d2h;
  out["bytes_h2d"] = link.bytes_h2d;
  return out;
}

void AppendPredictions(const Predictions& predictions, std::string* out) {
  absl::StrAppend(out, "{\n    \"step_time\": ", DoubleToJson(predictions.step_time).dump(),
                  ",\n    \"bubble_ratio\": ", DoubleToJson(predictions.bubble_ratio).dump(),
                  ",\n    \"step_time_without_offload\": ",
                  DoubleToJson(predictions.step_time_without_offload).dump(),
                  ",\n    \"collisions\": ", predictions.collisions, ",\n");
  std::vector<OrderedJson> warnings(predictions.warnings.begin(), predictions.warnings.end());
  AppendLines("warnings", warnings, 4, out);
  out->append(",\n");
  std::vector<OrderedJson> stages;
  for (const StagePrediction& stage : predictions.stages) {
    stages.push_back(StagePredictionToJson(stage));
  }
  AppendLines("stages", stages, 4, out);
  out->append(",\n");
  std::vector<OrderedJson> links;
  for (const LinkTraffic& link : predictions.links) links.push_back(LinkToJson(link));
  AppendLines("links", links, 4, out);
  out->append("\n  }");
}

// ---------------------------------------------------------------------------------------------
// Reader.

// The optional member `key` of `value`, the name of an Enum value (name_of's inverse is
// from_name), into *out; left alone when absent.
template <typename Enum, typename NameFn, typename FromNameFn>
absl::Status ReadOptionalName(const Json& value, std::string_view path, std::string_view key,
                              std::string_view what, NameFn name_of, FromNameFn from_name,
                              Enum* out) {
  const Json* member = FindMember(value, key);
  if (member == nullptr) return absl::OkStatus();
  std::string name;
  PO_RETURN_IF_ERROR(ReadValue(*member, JoinPath(path, key), &name));
  const std::optional<Enum> parsed = from_name(name);
  if (!parsed.has_value()) {
    return FieldError(JoinPath(path, key),
                      absl::StrCat("unknown ", std::string(what), " \"", Echo(name),
                                   "\"; expected one of ", AllNames<Enum>(name_of)));
  }
  *out = *parsed;
  return absl::OkStatus();
}

absl::Status ReadSpec(const Json& value, std::string_view path, PipelineSpec* spec) {
  PO_RETURN_IF_ERROR(CheckObjectKeys(
      value, path,
      {"family", "stages", "microbatches", "chunks", "group_size", "split_backward", "placement",
       "offload", "offload_fraction", "offload_chunks", "memory_budget_bytes", "strict",
       "recompute", "recompute_fraction", "recompute_chunks"}));
  std::string family;
  PO_RETURN_IF_ERROR(ReadMember(value, path, "family", &family));
  const std::optional<Family> parsed_family = FamilyFromName(family);
  if (!parsed_family.has_value()) {
    return FieldError(JoinPath(path, "family"),
                      absl::StrCat("unknown family \"", Echo(family), "\"; expected one of ",
                                   AllNames<Family>(FamilyName)));
  }
  spec->family = *parsed_family;
  PO_RETURN_IF_ERROR(ReadMember(value, path, "stages", &spec->num_stages));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "microbatches", &spec->num_microbatches));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "chunks", &spec->chunks_per_stage));
  // The rest may be left out of hand-written files; PipelineSpec's defaults apply.
  constexpr bool kOptional = false;
  PO_RETURN_IF_ERROR(ReadMember(value, path, "group_size", &spec->group_size, kOptional));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "split_backward", &spec->split_backward, kOptional));
  PO_RETURN_IF_ERROR(ReadOptionalName(value, path, "placement", "placement", PlacementName,
                                      PlacementFromName, &spec->placement));
  PO_RETURN_IF_ERROR(ReadOptionalName(value, path, "offload", "offload policy",
                                      OffloadPolicyName, OffloadPolicyFromName, &spec->offload));
  PO_RETURN_IF_ERROR(ReadOptionalName(value, path, "recompute", "recompute mode", RecomputeName,
                                      RecomputeFromName, &spec->recompute));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "recompute_fraction", &spec->recompute_fraction, kOptional));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "recompute_chunks", &spec->recompute_chunks, kOptional));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "offload_fraction", &spec->offload_fraction, kOptional));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "offload_chunks", &spec->offload_chunks, kOptional));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "memory_budget_bytes", &spec->memory_budget_bytes, kOptional));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "strict", &spec->strict, kOptional));

  auto at_least = [&](std::string_view key, std::int64_t got, std::int64_t min) {
    return got >= min ? absl::OkStatus()
                      : FieldError(JoinPath(path, key),
                                   absl::StrCat("must be >= ", min, ", got ", got));
  };
  PO_RETURN_IF_ERROR(at_least("stages", spec->num_stages, 1));
  PO_RETURN_IF_ERROR(at_least("microbatches", spec->num_microbatches, 1));
  PO_RETURN_IF_ERROR(at_least("chunks", spec->chunks_per_stage, 1));
  PO_RETURN_IF_ERROR(at_least("group_size", spec->group_size, 0));
  PO_RETURN_IF_ERROR(at_least("offload_chunks", spec->offload_chunks, 0));
  PO_RETURN_IF_ERROR(at_least("memory_budget_bytes", spec->memory_budget_bytes, 0));
  PO_RETURN_IF_ERROR(at_least("recompute_chunks", spec->recompute_chunks, 0));
  if (!(spec->recompute_fraction > 0.0 && spec->recompute_fraction <= 1.0)) {
    return FieldError(JoinPath(path, "recompute_fraction"),
                      absl::StrCat("must be in (0, 1], got ", spec->recompute_fraction));
  }
  // Written as a negated range test so that NaN fails too.
  if (!(spec->offload_fraction >= 0.0 && spec->offload_fraction <= 1.0)) {
    return FieldError(JoinPath(path, "offload_fraction"),
                      absl::StrCat("must be in [0, 1], got ", spec->offload_fraction));
  }
  return absl::OkStatus();
}

// Fast path for the integer members of an op, which are most of a large file: read the value
// without building a path; build the path only to report an error.
template <typename PathFn>
absl::Status ReadOpInt(const Json& op, std::string_view key, const PathFn& path_of, int* out) {
  const Json* member = FindMember(op, key);
  if (member != nullptr && member->is_number_integer() && !member->is_number_unsigned()) {
    const std::int64_t value = member->get<std::int64_t>();
    if (value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max()) {
      *out = static_cast<int>(value);
      return absl::OkStatus();
    }
  }
  if (member != nullptr && member->is_number_unsigned() &&
      member->get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    *out = static_cast<int>(member->get<std::uint64_t>());
    return absl::OkStatus();
  }
  return ReadMember(op, path_of(), key, out);
}

absl::Status ReadOp(const Json& value, std::size_t stage_index, std::size_t op_index, Op* op) {
  auto path_of = [&] {
    return IndexPath(JoinPath(IndexPath("stages", stage_index), "ops"), op_index);
  };
  if (!value.is_object()) {
    return FieldError(path_of(), absl::StrCat("expected an object, got ", value.type_name()));
  }
  const Json* kind_member = FindMember(value, "op");
  if (kind_member == nullptr || !kind_member->is_string()) {
    std::string ignored;
    return ReadMember(value, path_of(), "op", &ignored);  // an error in both cases
  }
  const std::string& kind_name = kind_member->get_ref<const std::string&>();
  const std::optional<OpKind> kind = OpKindFromName(kind_name);
  if (!kind.has_value()) {
    return FieldError(JoinPath(path_of(), "op"),
                      absl::StrCat("unknown op kind \"", Echo(kind_name), "\"; expected one of ",
                                   AllOpKindNames()));
  }
  op->kind = *kind;
  PO_RETURN_IF_ERROR(ReadOpInt(value, "mb", path_of, &op->mb));
  PO_RETURN_IF_ERROR(ReadOpInt(value, "chunk", path_of, &op->chunk));
  op->peer = -1;
  // op, mb and chunk are present by now; any member beyond them and "peer" is a stranger (the
  // key check runs only then, keeping the common case free of string compares).
  if (value.size() != (value.contains("peer") ? 4u : 3u)) {
    PO_RETURN_IF_ERROR(CheckObjectKeys(value, path_of(), {"op", "mb", "chunk", "peer"}));
  }
  if (HasPeer(op->kind)) {
    if (!value.contains("peer")) {
      return FieldError(JoinPath(path_of(), "peer"),
                        absl::StrCat("missing; a ", kind_name, " op needs the peer stage"));
    }
    PO_RETURN_IF_ERROR(ReadOpInt(value, "peer", path_of, &op->peer));
    if (op->peer < 0) {
      return FieldError(JoinPath(path_of(), "peer"),
                        absl::StrCat("must be >= 0, got ", op->peer));
    }
  } else if (value.contains("peer")) {
    return FieldError(JoinPath(path_of(), "peer"),
                      absl::StrCat("not allowed on a ", kind_name,
                                   " op (only P2P ops and BARRIER have a peer)"));
  }
  // A BARRIER may guard no transfer, which it says with (mb, chunk) = (-1, -1) (schedule.h).
  const bool unguarded_barrier = op->kind == OpKind::kBarrier && op->mb == -1 && op->chunk == -1;
  if (!unguarded_barrier) {
    if (op->mb < 0) {
      return FieldError(JoinPath(path_of(), "mb"), absl::StrCat("must be >= 0, got ", op->mb));
    }
    if (op->chunk < 0) {
      return FieldError(JoinPath(path_of(), "chunk"),
                        absl::StrCat("must be >= 0, got ", op->chunk));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadStages(const Json& value, int num_stages, std::vector<StageProgram>* stages) {
  PO_RETURN_IF_ERROR(RequireArray(value, "stages"));
  if (value.size() != static_cast<std::size_t>(num_stages)) {
    return FieldError("stages", absl::StrCat("has ", value.size(),
                                             " stage programs but spec.stages is ", num_stages));
  }
  stages->resize(value.size());
  for (std::size_t d = 0; d < value.size(); ++d) {
    const std::string path = IndexPath("stages", d);
    const Json& program = value[d];
    PO_RETURN_IF_ERROR(CheckObjectKeys(program, path, {"stage", "ops"}));
    StageProgram& out = (*stages)[d];
    PO_RETURN_IF_ERROR(ReadMember(program, path, "stage", &out.stage));
    if (out.stage != static_cast<int>(d)) {
      return FieldError(JoinPath(path, "stage"),
                        absl::StrCat("expected ", d, ", got ", out.stage,
                                     " (stage programs must be numbered 0..p-1 in order)"));
    }
    const Json* ops = FindMember(program, "ops");
    if (ops == nullptr) return FieldError(JoinPath(path, "ops"), "missing required key");
    PO_RETURN_IF_ERROR(RequireArray(*ops, JoinPath(path, "ops")));
    out.ops.resize(ops->size());
    for (std::size_t i = 0; i < ops->size(); ++i) {
      PO_RETURN_IF_ERROR(ReadOp((*ops)[i], d, i, &out.ops[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadStagePrediction(const Json& value, std::string_view path, StagePrediction* out) {
  PO_RETURN_IF_ERROR(CheckObjectKeys(
      value, path,
      {"peak_units", "peak_bytes", "peak_units_without_offload", "peak_bytes_without_offload",
       "host_bytes", "offloaded_bytes", "busy_time", "end_time"}));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "peak_units", &out->peak_units));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "peak_bytes", &out->peak_bytes));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "peak_units_without_offload", &out->peak_units_without_offload));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "peak_bytes_without_offload", &out->peak_bytes_without_offload));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "host_bytes", &out->host_bytes));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "offloaded_bytes", &out->offloaded_bytes));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "busy_time", &out->busy_time));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "end_time", &out->end_time));
  return absl::OkStatus();
}

absl::Status ReadLink(const Json& value, std::string_view path, LinkTraffic* out) {
  PO_RETURN_IF_ERROR(CheckObjectKeys(value, path, {"name", "bytes_d2h", "bytes_h2d"}));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "name", &out->name));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "bytes_d2h", &out->bytes_d2h));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "bytes_h2d", &out->bytes_h2d));
  return absl::OkStatus();
}

// Predictions are machine output: every key is required.
absl::Status ReadPredictions(const Json& value, Predictions* out) {
  constexpr std::string_view path = "predictions";
  PO_RETURN_IF_ERROR(CheckObjectKeys(value, path,
                                     {"step_time", "bubble_ratio", "step_time_without_offload",
                                      "collisions", "warnings", "stages", "links"}));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "step_time", &out->step_time));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "bubble_ratio", &out->bubble_ratio));
  PO_RETURN_IF_ERROR(
      ReadMember(value, path, "step_time_without_offload", &out->step_time_without_offload));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "collisions", &out->collisions));
  PO_RETURN_IF_ERROR(ReadMember(value, path, "warnings", &out->warnings));

  const Json* stages = FindMember(value, "stages");
  if (stages == nullptr) return FieldError("predictions.stages", "missing required key");
  PO_RETURN_IF_ERROR(RequireArray(*stages, "predictions.stages"));
  out->stages.resize(stages->size());
  for (std::size_t i = 0; i < stages->size(); ++i) {
    PO_RETURN_IF_ERROR(
        ReadStagePrediction((*stages)[i], IndexPath("predictions.stages", i), &out->stages[i]));
  }
  const Json* links = FindMember(value, "links");
  if (links == nullptr) return FieldError("predictions.links", "missing required key");
  PO_RETURN_IF_ERROR(RequireArray(*links, "predictions.links"));
  out->links.resize(links->size());
  for (std::size_t i = 0; i < links->size(); ++i) {
    PO_RETURN_IF_ERROR(ReadLink((*links)[i], IndexPath("predictions.links", i), &out->links[i]));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ScheduleToJson(const Schedule& schedule) {
  std::string out = "{\n";
  absl::StrAppend(&out, "  \"format\": \"", std::string(kScheduleFormat), "\",\n");
  absl::StrAppend(&out, "  \"spec\": ", DumpInline(internal::SpecToJson(schedule.spec)), ",\n");
  out.append("  \"stages\": [");
  for (std::size_t d = 0; d < schedule.stages.size(); ++d) {
    const StageProgram& program = schedule.stages[d];
    absl::StrAppend(&out, d == 0 ? "\n" : ",\n", "    {\"stage\": ", program.stage,
                    ", \"ops\": [");
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      out.append(i == 0 ? "\n      " : ",\n      ");
      AppendOp(program.ops[i], &out);
    }
    out.append(program.ops.empty() ? "]}" : "\n    ]}");
  }
  out.append(schedule.stages.empty() ? "]" : "\n  ]");
  if (schedule.predictions.has_value()) {
    out.append(",\n  \"predictions\": ");
    AppendPredictions(*schedule.predictions, &out);
  }
  out.append("\n}\n");
  return out;
}

absl::StatusOr<Schedule> ParseScheduleJson(std::string_view json) {
  PO_ASSIGN_OR_RETURN(const Json document, internal::ParseJsonText(json));
  PO_RETURN_IF_ERROR(CheckObjectKeys(document, "", {"format", "spec", "stages", "predictions"}));

  const std::string supported =
      absl::StrCat("this reader supports \"", std::string(kScheduleFormat), "\"");
  const Json* format = FindMember(document, "format");
  if (format == nullptr) {
    return FieldError("format", absl::StrCat("missing required key; ", supported));
  }
  if (!format->is_string() || format->get_ref<const std::string&>() != kScheduleFormat) {
    // A string is quoted (shortened), a scalar printed; an array or object is named by its
    // kind, never dumped: it may be a huge or deeply nested tree.
    std::string shown = format->dump();
    if (format->is_string()) {
      shown = absl::StrCat("\"", Echo(format->get_ref<const std::string&>()), "\"");
    } else if (format->is_structured()) {
      shown = absl::StrCat("an ", format->type_name());
    }
    return FieldError("format", absl::StrCat("unsupported format ", shown, "; ", supported));
  }

  Schedule schedule;
  const Json* spec = FindMember(document, "spec");
  if (spec == nullptr) return FieldError("spec", "missing required key");
  PO_RETURN_IF_ERROR(ReadSpec(*spec, "spec", &schedule.spec));

  const Json* stages = FindMember(document, "stages");
  if (stages == nullptr) return FieldError("stages", "missing required key");
  PO_RETURN_IF_ERROR(ReadStages(*stages, schedule.spec.num_stages, &schedule.stages));

  if (const Json* predictions = FindMember(document, "predictions"); predictions != nullptr) {
    schedule.predictions.emplace();
    PO_RETURN_IF_ERROR(ReadPredictions(*predictions, &*schedule.predictions));
  }
  return schedule;
}

}  // namespace pipeoffload
