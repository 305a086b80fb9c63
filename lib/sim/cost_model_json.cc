// The JSON form of a CostModel (cost_model.h): one key per field, named as the field. The reader
// takes any subset of the keys over caller-given defaults and rejects what the simulator could
// not use (negative times, bandwidths that are not positive, unknown keys).
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/echo.h"
#include "lib/base/status_macros.h"
#include "lib/ir/json_fields.h"
#include "pipeoffload/cost_model.h"

namespace pipeoffload {
namespace {

using internal::DoubleToJson;
using internal::FieldError;
using internal::IndexPath;
using internal::Json;
using internal::OrderedJson;
using internal::ReadValue;

// What a numeric field accepts.
enum class Range {
  kNonNegative,  // finite and >= 0 (times, latency, margin, multipliers)
  kPositive,     // > 0; +Infinity allowed (bandwidths: a free link)
  kDerivable,    // finite; negative = derived from other fields (recompute times)
};

struct DoubleField {
  std::string_view name;
  double CostModel::*member;
  Range range;
};

constexpr DoubleField kDoubleFields[] = {
    {"forward_time", &CostModel::forward_time, Range::kNonNegative},
    {"backward_time", &CostModel::backward_time, Range::kNonNegative},
    {"weight_time", &CostModel::weight_time, Range::kNonNegative},
    {"d2h_bandwidth", &CostModel::d2h_bandwidth, Range::kPositive},
    {"h2d_bandwidth", &CostModel::h2d_bandwidth, Range::kPositive},
    {"duplex_bandwidth", &CostModel::duplex_bandwidth, Range::kPositive},
    {"p2p_bandwidth", &CostModel::p2p_bandwidth, Range::kPositive},
    {"p2p_latency", &CostModel::p2p_latency, Range::kNonNegative},
    {"reload_margin_in_backward_times", &CostModel::reload_margin_in_backward_times,
     Range::kNonNegative},
    {"recompute_full_time", &CostModel::recompute_full_time, Range::kDerivable},
    {"recompute_lean_time", &CostModel::recompute_lean_time, Range::kDerivable},
};

// Integer fields with their least accepted value (-1: negative derives, cost_model.h).
struct BytesField {
  std::string_view name;
  std::int64_t CostModel::*member;
  std::int64_t min;
};

constexpr BytesField kBytesFields[] = {
    {"activation_bytes", &CostModel::activation_bytes, 0},
    {"boundary_bytes", &CostModel::boundary_bytes, 0},
    {"retained_full_bytes", &CostModel::retained_full_bytes, -1},
    {"retained_lean_bytes", &CostModel::retained_lean_bytes, 0},
    {"lean_rebuild_bytes", &CostModel::lean_rebuild_bytes, -1},
};

struct BytesVectorField {
  std::string_view name;
  std::vector<std::int64_t> CostModel::*member;
  std::int64_t min;
};

constexpr BytesVectorField kBytesVectorFields[] = {
    {"activation_bytes_per_virtual_stage", &CostModel::activation_bytes_per_virtual_stage, 0},
    {"retained_full_bytes_per_virtual_stage", &CostModel::retained_full_bytes_per_virtual_stage,
     -1},
    {"retained_lean_bytes_per_virtual_stage", &CostModel::retained_lean_bytes_per_virtual_stage,
     0},
    {"lean_rebuild_bytes_per_virtual_stage", &CostModel::lean_rebuild_bytes_per_virtual_stage,
     -1},
};

// Every key, in the header's field order (the order the writer uses).
constexpr std::string_view kKeys[] = {"forward_time",
                                      "backward_time",
                                      "weight_time",
                                      "stage_time_scale",
                                      "activation_bytes",
                                      "activation_bytes_per_virtual_stage",
                                      "boundary_bytes",
                                      "d2h_bandwidth",
                                      "h2d_bandwidth",
                                      "duplex_bandwidth",
                                      "shared_copy_engine",
                                      "p2p_bandwidth",
                                      "p2p_latency",
                                      "p2p_shares_host_link",
                                      "host_link_group_size",
                                      "reload_margin_in_backward_times",
                                      "recompute_full_time",
                                      "recompute_lean_time",
                                      "retained_full_bytes",
                                      "retained_lean_bytes",
                                      "retained_full_bytes_per_virtual_stage",
                                      "retained_lean_bytes_per_virtual_stage",
                                      "lean_rebuild_bytes",
                                      "lean_rebuild_bytes_per_virtual_stage"};

absl::Status CheckRange(double value, std::string_view path, Range range) {
  if (range == Range::kDerivable) {
    if (!std::isfinite(value)) {
      return FieldError(path, absl::StrCat("must be finite (negative: derived), got ", value));
    }
    return absl::OkStatus();
  }
  if (range == Range::kPositive) {
    // Written so that NaN fails too.
    if (!(value > 0.0)) {
      return FieldError(path, absl::StrCat("must be > 0, got ", value));
    }
    return absl::OkStatus();
  }
  if (!(value >= 0.0) || std::isinf(value)) {
    return FieldError(path, absl::StrCat("must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckAtLeast(std::int64_t value, std::string_view path, std::int64_t min) {
  if (value < min) return FieldError(path, absl::StrCat("must be >= ", min, ", got ", value));
  return absl::OkStatus();
}

// Reads one member of the document into `cost`. REQUIRES: `key` is one of kKeys.
absl::Status ReadField(const std::string& key, const Json& value, CostModel* cost) {
  for (const DoubleField& field : kDoubleFields) {
    if (field.name != key) continue;
    PO_RETURN_IF_ERROR(ReadValue(value, key, &(cost->*field.member)));
    return CheckRange(cost->*field.member, key, field.range);
  }
  if (key == "stage_time_scale") {
    PO_RETURN_IF_ERROR(ReadValue(value, key, &cost->stage_time_scale));
    for (std::size_t i = 0; i < cost->stage_time_scale.size(); ++i) {
      PO_RETURN_IF_ERROR(
          CheckRange(cost->stage_time_scale[i], IndexPath(key, i), Range::kNonNegative));
    }
    return absl::OkStatus();
  }
  for (const BytesVectorField& field : kBytesVectorFields) {
    if (field.name != key) continue;
    std::vector<std::int64_t>& bytes = cost->*field.member;
    PO_RETURN_IF_ERROR(ReadValue(value, key, &bytes));
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      PO_RETURN_IF_ERROR(CheckAtLeast(bytes[i], IndexPath(key, i), field.min));
    }
    return absl::OkStatus();
  }
  for (const BytesField& field : kBytesFields) {
    if (field.name != key) continue;
    PO_RETURN_IF_ERROR(ReadValue(value, key, &(cost->*field.member)));
    return CheckAtLeast(cost->*field.member, key, field.min);
  }
  if (key == "host_link_group_size") {
    PO_RETURN_IF_ERROR(ReadValue(value, key, &cost->host_link_group_size));
    return CheckAtLeast(cost->host_link_group_size, key, 1);
  }
  if (key == "shared_copy_engine") return ReadValue(value, key, &cost->shared_copy_engine);
  if (key == "p2p_shares_host_link") return ReadValue(value, key, &cost->p2p_shares_host_link);
  return FieldError(key, "has no reader (a bug: kKeys and ReadField disagree)");
}

}  // namespace

absl::StatusOr<CostModel> ParseCostModelJson(std::string_view json, const CostModel& defaults) {
  PO_ASSIGN_OR_RETURN(const Json document, internal::ParseJsonText(json));
  if (!document.is_object()) {
    return FieldError("", absl::StrCat("a cost model is a JSON object, got ",
                                       internal::JsonKind(document)));
  }
  CostModel cost = defaults;
  for (const auto& [key, value] : document.items()) {
    bool known = false;
    for (std::string_view name : kKeys) known = known || name == key;
    if (!known) {
      return FieldError(Echo(key), absl::StrCat("unknown cost model key; expected one of ",
                                                internal::JoinNames(kKeys)));
    }
    PO_RETURN_IF_ERROR(ReadField(key, value, &cost));
  }
  return cost;
}

std::string CostModelToJson(const CostModel& cost) {
  OrderedJson scale = OrderedJson::array();
  for (double s : cost.stage_time_scale) scale.push_back(DoubleToJson(s));
  const std::vector<std::pair<std::string_view, OrderedJson>> fields = {
      {"forward_time", DoubleToJson(cost.forward_time)},
      {"backward_time", DoubleToJson(cost.backward_time)},
      {"weight_time", DoubleToJson(cost.weight_time)},
      {"stage_time_scale", scale},
      {"activation_bytes", cost.activation_bytes},
      {"activation_bytes_per_virtual_stage", cost.activation_bytes_per_virtual_stage},
      {"boundary_bytes", cost.boundary_bytes},
      {"d2h_bandwidth", DoubleToJson(cost.d2h_bandwidth)},
      {"h2d_bandwidth", DoubleToJson(cost.h2d_bandwidth)},
      {"duplex_bandwidth", DoubleToJson(cost.duplex_bandwidth)},
      {"shared_copy_engine", cost.shared_copy_engine},
      {"p2p_bandwidth", DoubleToJson(cost.p2p_bandwidth)},
      {"p2p_latency", DoubleToJson(cost.p2p_latency)},
      {"p2p_shares_host_link", cost.p2p_shares_host_link},
      {"host_link_group_size", cost.host_link_group_size},
      {"reload_margin_in_backward_times", DoubleToJson(cost.reload_margin_in_backward_times)},
      {"recompute_full_time", DoubleToJson(cost.recompute_full_time)},
      {"recompute_lean_time", DoubleToJson(cost.recompute_lean_time)},
      {"retained_full_bytes", cost.retained_full_bytes},
      {"retained_lean_bytes", cost.retained_lean_bytes},
      {"retained_full_bytes_per_virtual_stage", cost.retained_full_bytes_per_virtual_stage},
      {"retained_lean_bytes_per_virtual_stage", cost.retained_lean_bytes_per_virtual_stage},
      {"lean_rebuild_bytes", cost.lean_rebuild_bytes},
      {"lean_rebuild_bytes_per_virtual_stage", cost.lean_rebuild_bytes_per_virtual_stage},
  };
  std::string out = "{";
  for (std::size_t i = 0; i < fields.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "\n  \"" : ",\n  \"", std::string(fields[i].first),
                    "\": ", internal::DumpInline(fields[i].second));
  }
  out.append("\n}\n");
  return out;
}

}  // namespace pipeoffload
