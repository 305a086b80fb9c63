// The layer-sliding header's small pieces: names, shape validation, and the Perfetto trace of
// an engine's records.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload {

std::string_view SlideDtypeName(SlideDtype dtype) {
  return dtype == SlideDtype::kFp32 ? "fp32" : "bf16";
}

std::string_view UnitPlaceName(UnitPlace place) {
  return place == UnitPlace::kSliding ? "sliding" : "resident";
}

std::string_view SlideEngineName(SlideEngineKind engine) {
  switch (engine) {
    case SlideEngineKind::kCompute: return "compute";
    case SlideEngineKind::kH2D: return "H2D";
    case SlideEngineKind::kD2H: return "D2H";
    case SlideEngineKind::kCpuAdam: return "CPU Adam";
    case SlideEngineKind::kNvme: return "NVMe";
  }
  return "?";
}

absl::Status ValidateSlidingModelShape(const SlidingModelShape& shape) {
  const int num_units = static_cast<int>(shape.units.size());
  if (num_units < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sliding model: needs at least 2 units (one reading tokens, one computing the loss), has ",
        num_units));
  }
  if (shape.activation_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sliding model: activation_bytes must be positive, is ", shape.activation_bytes));
  }
  if (shape.model_device_bytes < 0) {
    return absl::InvalidArgumentError("sliding model: model_device_bytes is negative");
  }
  for (int u = 0; u < num_units; ++u) {
    const SlidingUnitShape& unit = shape.units[static_cast<std::size_t>(u)];
    const std::string where = absl::StrCat("sliding model: unit ", u, " (", unit.name, "): ");
    if (unit.param_count <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "param_count must be positive, is ", unit.param_count));
    }
    if (unit.param_count > (std::int64_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "param_count ", unit.param_count,
                                                     " is over 2^40"));
    }
    if (unit.workspace_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, "workspace_bytes is negative"));
    }
    if (unit.borrowed_unit >= 0) {
      if (unit.borrowed_unit >= u) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "borrows unit ", unit.borrowed_unit, ", which is not an earlier unit"));
      }
      if (shape.units[static_cast<std::size_t>(unit.borrowed_unit)].borrowed_unit >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "borrows unit ", unit.borrowed_unit, ", which borrows itself"));
      }
    } else if (unit.borrowed_unit != -1) {
      return absl::InvalidArgumentError(absl::StrCat(where, "borrowed_unit must be -1 or >= 0"));
    }
    std::int64_t end = 0;
    for (const ParamRange& range : unit.decay) {
      if (range.offset < end || range.count <= 0 || range.offset + range.count > unit.param_count) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "decay range [", range.offset, ", +", range.count,
            ") is not sorted, disjoint, non-empty and inside the unit's ", unit.param_count,
            " parameters"));
      }
      end = range.offset + range.count;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUnitCall(const SlidingModelShape& shape, const UnitCall& call, bool backward,
                           int num_microbatches, std::string_view model) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(model), ": unit ", call.unit,
                                                   " mb ", call.mb, ": ", std::string(why)));
  };
  const int num_units = static_cast<int>(shape.units.size());
  if (num_microbatches == 0) {
    return absl::FailedPreconditionError(absl::StrCat(std::string(model), ": unit ", call.unit,
                                                      " mb ", call.mb, ": called before BeginStep"));
  }
  if (call.unit < 0 || call.unit >= num_units) return bad("unit out of range");
  if (!backward && call.unit == num_units - 1) {
    return bad("the last unit has no Forward (its forward runs inside Backward)");
  }
  if (call.num_microbatches != num_microbatches) {
    return bad("num_microbatches differs from BeginStep's");
  }
  if (call.mb < 0 || call.mb >= num_microbatches) return bad("mb out of range");
  if (call.params == nullptr) return bad("null params");
  if (call.unit > 0 && call.input == nullptr) return bad("null input");
  if (shape.units[static_cast<std::size_t>(call.unit)].workspace_bytes > 0 &&
      call.workspace == nullptr) {
    return bad("null workspace");
  }
  if (!backward) return call.output == nullptr ? bad("null output") : absl::OkStatus();
  if (call.unit < num_units - 1 && call.grad_output == nullptr) return bad("null grad_output");
  if (call.unit > 0 && call.grad_input == nullptr) return bad("null grad_input");
  if (call.grad_accum == nullptr) return bad("null grad_accum");
  return absl::OkStatus();
}

int SlidingPlan::resident_units() const {
  return static_cast<int>(std::count(placement.begin(), placement.end(), UnitPlace::kResident));
}

std::string SlideRecordsToTraceJson(const std::vector<SlideRecord>& records) {
  // One event per line, as lib/sim/trace_json.cc writes the pipeline's traces.
  constexpr int kPid = 0;
  std::string out = "{\"traceEvents\": [\n";
  auto line = [&](const nlohmann::ordered_json& event, bool last) {
    out += event.dump();
    out += last ? "\n" : ",\n";
  };
  line({{"name", "process_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", 0},
        {"args", {{"name", "sliding engine"}}}},
       false);
  for (int engine = 0; engine < kNumSlideEngines; ++engine) {
    line({{"name", "thread_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", engine},
          {"args", {{"name", std::string(SlideEngineName(static_cast<SlideEngineKind>(engine)))}}}},
         records.empty() && engine + 1 == kNumSlideEngines);
  }
  double origin = 0.0;
  if (!records.empty()) {
    origin = std::min_element(records.begin(), records.end(), [](const auto& a, const auto& b) {
               return a.start < b.start;
             })->start;
  }
  for (std::size_t i = 0; i < records.size(); ++i) {
    const SlideRecord& r = records[i];
    const double ts = (r.start - origin) * 1e6;
    line({{"name", r.name},
          {"cat", std::string(SlideEngineName(r.engine))},
          {"ph", "X"},
          {"pid", kPid},
          {"tid", static_cast<int>(r.engine)},
          {"ts", ts},
          {"dur", (r.end - origin) * 1e6 - ts},
          {"args", {{"unit", r.unit}, {"mb", r.mb}, {"bytes", r.bytes}}}},
         i + 1 == records.size());
  }
  out += "]}\n";
  return out;
}

}  // namespace pipeoffload
