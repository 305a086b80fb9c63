// The C ABI's option structs: their defaults (the po_*_init functions), their layout rules,
// and their translation into the C++ PipelineSpec and CostModel. The defaults are po-schedule's,
// so a C or Python caller and the CLI compile the same schedule from the same choices.
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "lib/base/status_macros.h"
#include "lib/c_api/c_api_internal.h"

namespace pipeoffload::c_api {
namespace {

// The sizes in c_api_internal.h are those of an LP64 build (8-byte pointers).
static_assert(sizeof(void*) == 8, "the C ABI's struct sizes assume 64-bit pointers");
// No implicit padding anywhere, so a field appended later starts past the old sizeof (c_api.h);
// and each struct's size today is its first release's. When a field is appended, the second
// assertion of that struct changes to name the new last field, and the V1 size stays.
static_assert(offsetof(po_spec, reserved) + 4 == sizeof(po_spec));
static_assert(offsetof(po_spec, recompute) == kSpecSizeV1);
static_assert(offsetof(po_cost_options, cost_model_json) + 8 == sizeof(po_cost_options));
static_assert(sizeof(po_cost_options) == kCostOptionsSizeV1);
static_assert(offsetof(po_load_options, family) + 8 == sizeof(po_load_options));
static_assert(sizeof(po_load_options) == kLoadOptionsSizeV1);
static_assert(offsetof(po_prediction_summary, step_time_without_offload) + 8 ==
              sizeof(po_prediction_summary));
static_assert(sizeof(po_prediction_summary) == kSummarySizeV1);
static_assert(offsetof(po_stage_prediction, end_time) + 8 == sizeof(po_stage_prediction));
static_assert(sizeof(po_stage_prediction) == kStagePredictionSizeV1);
static_assert(offsetof(po_link_traffic, bytes_h2d) + 8 == sizeof(po_link_traffic));
static_assert(sizeof(po_link_traffic) == kLinkTrafficSizeV1);
static_assert(sizeof(po_op) == 16, "po_op is frozen");

po_spec DefaultSpec() {
  po_spec spec{};
  spec.struct_size = sizeof(po_spec);
  spec.num_stages = 8;         // po-schedule's --stages default
  spec.num_microbatches = 32;  // po-schedule's --microbatches default
  spec.chunks_per_stage = 1;
  spec.recompute_fraction = PipelineSpec().recompute_fraction;  // po-schedule's default, 1
  return spec;
}

po_cost_options DefaultCostOptions() {
  const GptShape shape;  // po-schedule's --gpt-* defaults are GptShape's
  po_cost_options options{};
  options.struct_size = sizeof(po_cost_options);
  options.gpt_hidden = shape.hidden;
  options.gpt_sequence = shape.sequence;
  options.gpt_layers_per_chunk = shape.layers_per_chunk;
  options.offload_ratio = 0.25;  // po-schedule's --offload-ratio default
  options.gpt_tflops = shape.flops_per_second / 1e12;
  return options;
}

absl::Status CheckAtLeastOne(const char* field, std::int32_t value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("po_cost_options.", field, " must be >= 1 (got ", value, ")"));
}

// The value `name` spells (NULL = `fallback`), or InvalidArgument naming `field` and the
// accepted names.
template <typename Enum>
absl::StatusOr<Enum> Named(const char* name, const char* fallback, std::string_view field,
                           std::optional<Enum> (*from_name)(std::string_view),
                           std::string_view what, std::string_view accepted) {
  const char* spelled = name != nullptr ? name : fallback;
  if (const std::optional<Enum> value = from_name(spelled); value.has_value()) return *value;
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": unknown ",
                                                 std::string(what), " \"", spelled,
                                                 "\"; expected ", std::string(accepted)));
}

}  // namespace

absl::StatusOr<Family> FamilyNamed(const char* name, std::string_view field) {
  return Named(name, "1f1b", field, &FamilyFromName, "family",
               "1f1b, interleaved or group-interleaved");
}

absl::StatusOr<OffloadPolicy> OffloadPolicyNamed(const char* name, std::string_view field) {
  return Named(name, "none", field, &OffloadPolicyFromName, "offload policy",
               "none, po-h, po-f, selective or auto");
}

absl::StatusOr<PipelineSpec> ToPipelineSpec(const po_spec* in) {
  PO_ASSIGN_OR_RETURN(const po_spec spec,
                      ReadVersioned(in, DefaultSpec(), kSpecSizeV1, "po_spec"));
  if (spec.reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("po_spec.reserved must be 0 (got ", spec.reserved, ")"));
  }
  PipelineSpec out;
  PO_ASSIGN_OR_RETURN(out.family, FamilyNamed(spec.family, "po_spec.family"));
  PO_ASSIGN_OR_RETURN(out.offload, OffloadPolicyNamed(spec.offload, "po_spec.offload"));
  PO_ASSIGN_OR_RETURN(out.recompute, Named(spec.recompute, "none", "po_spec.recompute",
                                           &RecomputeFromName, "recompute mode",
                                           "none, lean or full"));
  out.recompute_fraction = spec.recompute_fraction;  // the compiler checks the ranges
  out.recompute_chunks = spec.recompute_chunks;
  out.num_stages = spec.num_stages;
  out.num_microbatches = spec.num_microbatches;
  out.chunks_per_stage = spec.chunks_per_stage;
  out.group_size = spec.group_size;
  out.split_backward = spec.split_backward != 0;
  out.offload_fraction = spec.offload_fraction;
  out.offload_chunks = spec.offload_chunks;
  out.memory_budget_bytes = spec.memory_budget_bytes;
  out.strict = spec.strict != 0;
  return out;
}

po_spec FromPipelineSpec(const PipelineSpec& spec) {
  po_spec out = DefaultSpec();
  out.num_stages = spec.num_stages;
  out.num_microbatches = spec.num_microbatches;
  out.chunks_per_stage = spec.chunks_per_stage;
  out.group_size = spec.group_size;
  out.split_backward = spec.split_backward ? 1 : 0;
  out.offload_chunks = spec.offload_chunks;
  out.strict = spec.strict ? 1 : 0;
  // The names are string literals (schedule.cc), so their data() is static and NUL-terminated.
  out.family = FamilyName(spec.family).data();
  out.offload = OffloadPolicyName(spec.offload).data();
  out.offload_fraction = spec.offload_fraction;
  out.memory_budget_bytes = spec.memory_budget_bytes;
  out.recompute = RecomputeName(spec.recompute);  // static
  out.recompute_fraction = spec.recompute_fraction;
  out.recompute_chunks = spec.recompute_chunks;
  return out;
}

absl::StatusOr<CostChoice> ToCostModel(const po_cost_options* in) {
  PO_ASSIGN_OR_RETURN(const po_cost_options options,
                      ReadVersioned(in, DefaultCostOptions(), kCostOptionsSizeV1,
                                    "po_cost_options"));
  if (options.reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("po_cost_options.reserved must be 0 (got ", options.reserved, ")"));
  }
  CostChoice choice;
  choice.unit_costs = options.unit_costs != 0;
  if (choice.unit_costs) {
    if (!(std::isfinite(options.offload_ratio) && options.offload_ratio >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "po_cost_options.offload_ratio must be finite and >= 0 (got ", options.offload_ratio,
          ")"));
    }
    choice.cost = UnitCostModel(options.offload_ratio);
  } else {
    PO_RETURN_IF_ERROR(CheckAtLeastOne("gpt_hidden", options.gpt_hidden));
    PO_RETURN_IF_ERROR(CheckAtLeastOne("gpt_sequence", options.gpt_sequence));
    PO_RETURN_IF_ERROR(CheckAtLeastOne("gpt_layers_per_chunk", options.gpt_layers_per_chunk));
    if (!(std::isfinite(options.gpt_tflops) && options.gpt_tflops > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "po_cost_options.gpt_tflops must be finite and > 0 (got ", options.gpt_tflops, ")"));
    }
    GptShape shape;
    shape.hidden = options.gpt_hidden;
    shape.sequence = options.gpt_sequence;
    shape.layers_per_chunk = options.gpt_layers_per_chunk;
    shape.flops_per_second = options.gpt_tflops * 1e12;
    choice.cost = EstimateGptCostModel(shape);
  }
  if (options.cost_model_json != nullptr) {
    absl::StatusOr<CostModel> parsed = ParseCostModelJson(options.cost_model_json, choice.cost);
    if (!parsed.ok()) return Annotate(parsed.status(), "po_cost_options.cost_model_json");
    choice.cost = *std::move(parsed);
  }
  return choice;
}

}  // namespace pipeoffload::c_api

extern "C" {

void po_spec_init(po_spec* spec) {
  if (spec != nullptr) *spec = pipeoffload::c_api::DefaultSpec();
}

void po_cost_options_init(po_cost_options* options) {
  if (options != nullptr) *options = pipeoffload::c_api::DefaultCostOptions();
}

void po_load_options_init(po_load_options* options) {
  if (options == nullptr) return;
  *options = po_load_options{};
  options->struct_size = sizeof(po_load_options);
  options->format = PO_FORMAT_JSON;
}

}  // extern "C"
