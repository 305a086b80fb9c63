// po_predictions: what the simulator predicts for a schedule (simulate.h), handed across the
// boundary as versioned summary / per-stage / per-link structs and warning strings that the
// handle owns.
#include <memory>
#include <utility>

#include "lib/base/status_macros.h"
#include "lib/c_api/c_api_internal.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::c_api {
namespace {

absl::Status Publish(Predictions predictions, po_predictions** out) {
  auto handle = std::make_unique<po_predictions>();
  handle->predictions = std::move(predictions);
  *out = handle.release();
  return absl::OkStatus();
}

absl::Status SimulateSchedule(const po_schedule* schedule, const po_cost_options* cost,
                              po_predictions** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_RETURN_IF_ERROR(NotNull(schedule, "schedule"));
  CostModel model = schedule->cost;
  if (cost != nullptr) {
    PO_ASSIGN_OR_RETURN(CostChoice choice, ToCostModel(cost));
    model = std::move(choice.cost);
  }
  // Every handle's schedule passed Validate (schedule_handle.cc), as Simulate requires.
  PO_ASSIGN_OR_RETURN(Timeline timeline, Simulate(schedule->schedule, model));
  return Publish(std::move(timeline.predictions), out);
}

absl::Status StoredPredictions(const po_schedule* schedule, po_predictions** out) {
  PO_RETURN_IF_ERROR(ClearOut(out));
  PO_RETURN_IF_ERROR(NotNull(schedule, "schedule"));
  if (!schedule->schedule.predictions.has_value()) {
    return absl::FailedPreconditionError(
        "the schedule carries no predictions (its file had none); call po_schedule_simulate");
  }
  return Publish(*schedule->schedule.predictions, out);
}

absl::Status GetSummary(const po_predictions* predictions, po_prediction_summary* out) {
  PO_RETURN_IF_ERROR(NotNull(predictions, "predictions"));
  const Predictions& p = predictions->predictions;
  po_prediction_summary summary{};
  summary.num_stages = static_cast<std::int32_t>(p.stages.size());
  summary.num_links = static_cast<std::int32_t>(p.links.size());
  summary.num_warnings = static_cast<std::int32_t>(p.warnings.size());
  summary.collisions = p.collisions;
  summary.step_time = p.step_time;
  summary.bubble_ratio = p.bubble_ratio;
  summary.step_time_without_offload = p.step_time_without_offload;
  return WriteVersioned(summary, out, kSummarySizeV1, "po_prediction_summary");
}

absl::Status GetStage(const po_predictions* predictions, std::int32_t stage,
                      po_stage_prediction* out) {
  PO_RETURN_IF_ERROR(NotNull(predictions, "predictions"));
  const auto& stages = predictions->predictions.stages;
  PO_RETURN_IF_ERROR(CheckIndex(stage, stages.size(), "stage"));
  const StagePrediction& s = stages[static_cast<std::size_t>(stage)];
  po_stage_prediction result{};
  result.stage = stage;
  result.peak_units = s.peak_units;
  result.peak_bytes = s.peak_bytes;
  result.peak_units_without_offload = s.peak_units_without_offload;
  result.peak_bytes_without_offload = s.peak_bytes_without_offload;
  result.host_bytes = s.host_bytes;
  result.offloaded_bytes = s.offloaded_bytes;
  result.busy_time = s.busy_time;
  result.end_time = s.end_time;
  return WriteVersioned(result, out, kStagePredictionSizeV1, "po_stage_prediction");
}

absl::Status GetLink(const po_predictions* predictions, std::int32_t index,
                     po_link_traffic* out) {
  PO_RETURN_IF_ERROR(NotNull(predictions, "predictions"));
  const auto& links = predictions->predictions.links;
  PO_RETURN_IF_ERROR(CheckIndex(index, links.size(), "link"));
  const LinkTraffic& link = links[static_cast<std::size_t>(index)];
  po_link_traffic result{};
  result.name = link.name.c_str();  // owned by the handle, which never changes (c_api.h)
  result.bytes_d2h = link.bytes_d2h;
  result.bytes_h2d = link.bytes_h2d;
  return WriteVersioned(result, out, kLinkTrafficSizeV1, "po_link_traffic");
}

absl::Status GetWarning(const po_predictions* predictions, std::int32_t index,
                        const char** out) {
  PO_RETURN_IF_ERROR(NotNull(predictions, "predictions"));
  PO_RETURN_IF_ERROR(NotNull(out, "out"));
  const auto& warnings = predictions->predictions.warnings;
  PO_RETURN_IF_ERROR(CheckIndex(index, warnings.size(), "warning"));
  *out = warnings[static_cast<std::size_t>(index)].c_str();
  return absl::OkStatus();
}

}  // namespace
}  // namespace pipeoffload::c_api

namespace c_api = pipeoffload::c_api;

extern "C" {

po_status po_schedule_simulate(const po_schedule* schedule, const po_cost_options* cost,
                               po_predictions** out) {
  return c_api::Boundary(__func__,
                         [&] { return c_api::SimulateSchedule(schedule, cost, out); });
}

po_status po_schedule_predictions(const po_schedule* schedule, po_predictions** out) {
  return c_api::Boundary(__func__, [&] { return c_api::StoredPredictions(schedule, out); });
}

void po_predictions_free(po_predictions* predictions) { delete predictions; }

po_status po_predictions_summary(const po_predictions* predictions,
                                 po_prediction_summary* out) {
  return c_api::Boundary(__func__, [&] { return c_api::GetSummary(predictions, out); });
}

po_status po_predictions_stage(const po_predictions* predictions, int32_t stage,
                               po_stage_prediction* out) {
  return c_api::Boundary(__func__, [&] { return c_api::GetStage(predictions, stage, out); });
}

po_status po_predictions_link(const po_predictions* predictions, int32_t index,
                              po_link_traffic* out) {
  return c_api::Boundary(__func__, [&] { return c_api::GetLink(predictions, index, out); });
}

po_status po_predictions_warning(const po_predictions* predictions, int32_t index,
                                 const char** out) {
  return c_api::Boundary(__func__, [&] { return c_api::GetWarning(predictions, index, out); });
}

}  // extern "C"
