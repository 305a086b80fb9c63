// Sliding model shapes for the planner and program tests: units of given sizes, no model.
#ifndef PIPEOFFLOAD_TESTS_SLIDE_SLIDE_TEST_SHAPES_H_
#define PIPEOFFLOAD_TESTS_SLIDE_SLIDE_TEST_SHAPES_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::testing {

// An embedding of `embed` elements, `layers` layers of `layer` elements, a head of `head`
// (tied: the head owns `head` elements and borrows the embedding's). fp32, activations of
// `activation` bytes, every unit's workspace `workspace` bytes.
inline SlidingModelShape TestShape(int layers, std::int64_t embed, std::int64_t layer,
                                   std::int64_t head, bool tied = false,
                                   std::int64_t activation = 1024, std::int64_t workspace = 4096) {
  SlidingModelShape shape;
  shape.param_dtype = SlideDtype::kFp32;
  shape.activation_bytes = activation;
  shape.model_device_bytes = 8192;
  auto add = [&](std::string name, std::int64_t count) {
    SlidingUnitShape unit;
    unit.name = std::move(name);
    unit.param_count = count;
    unit.decay = {{0, count / 2}};
    unit.workspace_bytes = workspace;
    shape.units.push_back(unit);
  };
  add("embed", embed);
  for (int l = 0; l < layers; ++l) add(absl::StrCat("layer.", l), layer);
  add("head", head);
  if (tied) shape.units.back().borrowed_unit = 0;
  return shape;
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_SLIDE_SLIDE_TEST_SHAPES_H_
