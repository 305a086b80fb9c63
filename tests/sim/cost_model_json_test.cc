// Cost model JSON: the keys are the CostModel field names, a subset overrides the defaults, the
// round trip is exact (doubles bit for bit), and every bad value names its key.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeoffload/cost_model.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

std::uint64_t Bits(double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

std::vector<std::uint64_t> Bits(const std::vector<double>& values) {
  std::vector<std::uint64_t> out;
  for (double v : values) out.push_back(Bits(v));
  return out;
}

// Every field, doubles compared bit for bit.
void RequireSameCost(const CostModel& a, const CostModel& b) {
  CHECK(Bits(a.forward_time) == Bits(b.forward_time));
  CHECK(Bits(a.backward_time) == Bits(b.backward_time));
  CHECK(Bits(a.weight_time) == Bits(b.weight_time));
  CHECK(Bits(a.stage_time_scale) == Bits(b.stage_time_scale));
  CHECK(a.activation_bytes == b.activation_bytes);
  CHECK(a.activation_bytes_per_virtual_stage == b.activation_bytes_per_virtual_stage);
  CHECK(a.boundary_bytes == b.boundary_bytes);
  CHECK(Bits(a.d2h_bandwidth) == Bits(b.d2h_bandwidth));
  CHECK(Bits(a.h2d_bandwidth) == Bits(b.h2d_bandwidth));
  CHECK(Bits(a.duplex_bandwidth) == Bits(b.duplex_bandwidth));
  CHECK(a.shared_copy_engine == b.shared_copy_engine);
  CHECK(Bits(a.p2p_bandwidth) == Bits(b.p2p_bandwidth));
  CHECK(Bits(a.p2p_latency) == Bits(b.p2p_latency));
  CHECK(a.p2p_shares_host_link == b.p2p_shares_host_link);
  CHECK(a.host_link_group_size == b.host_link_group_size);
  CHECK(Bits(a.reload_margin_in_backward_times) == Bits(b.reload_margin_in_backward_times));
  CHECK(Bits(a.recompute_full_time) == Bits(b.recompute_full_time));
  CHECK(Bits(a.recompute_lean_time) == Bits(b.recompute_lean_time));
  CHECK(a.retained_full_bytes == b.retained_full_bytes);
  CHECK(a.retained_lean_bytes == b.retained_lean_bytes);
  CHECK(a.retained_full_bytes_per_virtual_stage == b.retained_full_bytes_per_virtual_stage);
  CHECK(a.retained_lean_bytes_per_virtual_stage == b.retained_lean_bytes_per_virtual_stage);
  CHECK(a.lean_rebuild_bytes == b.lean_rebuild_bytes);
  CHECK(a.lean_rebuild_bytes_per_virtual_stage == b.lean_rebuild_bytes_per_virtual_stage);
}

// Every field moved away from its default, to values that are hard to print exactly.
CostModel AwkwardCost() {
  CostModel cost;
  cost.forward_time = 0.1 + 0.2;
  cost.backward_time = 1e-300;
  cost.weight_time = std::numeric_limits<double>::denorm_min();
  cost.stage_time_scale = {1.0 / 3.0, 2.0, 0.0, 1e300};
  cost.activation_bytes = std::numeric_limits<std::int64_t>::max();
  cost.activation_bytes_per_virtual_stage = {0, 1, (std::int64_t{1} << 53) + 1};
  cost.boundary_bytes = 12345;
  cost.d2h_bandwidth = 55.2e9;
  cost.h2d_bandwidth = 54.9e9 + 0.5;
  cost.duplex_bandwidth = 44.6e9 / 7;
  cost.shared_copy_engine = true;
  cost.p2p_bandwidth = std::numeric_limits<double>::infinity();  // a free link
  cost.p2p_latency = 1e-5;
  cost.p2p_shares_host_link = true;
  cost.host_link_group_size = 4;
  cost.reload_margin_in_backward_times = 0.7;
  cost.recompute_full_time = 0.1 + 0.7;
  cost.recompute_lean_time = -0.0;
  cost.retained_full_bytes = (std::int64_t{1} << 53) + 3;
  cost.retained_lean_bytes = 7;
  cost.retained_full_bytes_per_virtual_stage = {-1, 0, 5};
  cost.retained_lean_bytes_per_virtual_stage = {9, 0};
  cost.lean_rebuild_bytes = 0;
  cost.lean_rebuild_bytes_per_virtual_stage = {-1, 0, (std::int64_t{1} << 53) + 5};
  return cost;
}

TEST_CASE("cost model JSON round trip is exact", "[io][cost]") {
  const CostModel original = AwkwardCost();
  const std::string text = CostModelToJson(original);
  INFO(text);
  absl::StatusOr<CostModel> parsed = ParseCostModelJson(text, CostModel{});
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  RequireSameCost(*parsed, original);
  CHECK(CostModelToJson(*parsed) == text);

  for (const CostModel& cost : {CostModel{}, UnitCostModel(0.25), UnitCostModel(0.0),
                                EstimateGptCostModel(GptShape{})}) {
    absl::StatusOr<CostModel> again = ParseCostModelJson(CostModelToJson(cost), AwkwardCost());
    REQUIRE(again.ok());
    RequireSameCost(*again, cost);
  }
}

TEST_CASE("cost model JSON keys are the field names", "[io][cost]") {
  const nlohmann::json doc = nlohmann::json::parse(CostModelToJson(CostModel{}));
  std::vector<std::string> keys;
  for (const auto& [key, value] : doc.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> expected = {"forward_time",
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
  std::sort(expected.begin(), expected.end());
  CHECK(keys == expected);
  CHECK(doc["forward_time"] == 1.0);
  CHECK(doc["activation_bytes"] == 1 << 20);
  CHECK(doc["stage_time_scale"] == nlohmann::json::array());
  CHECK(doc["shared_copy_engine"] == false);
}

TEST_CASE("cost model JSON overrides only the keys it names", "[io][cost]") {
  const CostModel defaults = AwkwardCost();
  absl::StatusOr<CostModel> parsed = ParseCostModelJson(
      R"({"forward_time": 2, "stage_time_scale": [1, 1.5], "shared_copy_engine": false,
          "p2p_bandwidth": 3e11, "host_link_group_size": 1})",
      defaults);
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  CostModel expected = defaults;
  expected.forward_time = 2.0;
  expected.stage_time_scale = {1.0, 1.5};
  expected.shared_copy_engine = false;
  expected.p2p_bandwidth = 3e11;
  expected.host_link_group_size = 1;
  RequireSameCost(*parsed, expected);

  absl::StatusOr<CostModel> empty = ParseCostModelJson("{}", defaults);
  REQUIRE(empty.ok());
  RequireSameCost(*empty, defaults);
}

void ExpectError(const std::string& json, const std::string& message) {
  absl::StatusOr<CostModel> parsed = ParseCostModelJson(json, CostModel{});
  INFO("json: " << json);
  INFO("status: " << parsed.status().ToString());
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(parsed.status().message()).find(message) != std::string::npos);
}

TEST_CASE("cost model JSON errors name the key", "[io][cost]") {
  SECTION("unknown keys list the valid ones") {
    ExpectError(R"({"forward": 1})",
                "forward: unknown cost model key; expected one of forward_time, backward_time, "
                "weight_time, stage_time_scale, activation_bytes, "
                "activation_bytes_per_virtual_stage, boundary_bytes, d2h_bandwidth, "
                "h2d_bandwidth, duplex_bandwidth, shared_copy_engine, p2p_bandwidth, "
                "p2p_latency, p2p_shares_host_link, host_link_group_size, "
                "reload_margin_in_backward_times, recompute_full_time, recompute_lean_time, "
                "retained_full_bytes, retained_lean_bytes, "
                "retained_full_bytes_per_virtual_stage, retained_lean_bytes_per_virtual_stage, "
                "lean_rebuild_bytes, lean_rebuild_bytes_per_virtual_stage");
  }
  SECTION("wrong types name the expected type") {
    ExpectError(R"({"forward_time": "1"})", "forward_time: expected a number");
    ExpectError(R"({"shared_copy_engine": 1})",
                "shared_copy_engine: expected true or false, got the integer 1");
    ExpectError(R"({"activation_bytes": 1.5})",
                "activation_bytes: expected an integer, got the number 1.5");
    ExpectError(R"({"host_link_group_size": 1e10})", "host_link_group_size: expected an integer");
    ExpectError(R"({"host_link_group_size": 10000000000})",
                "host_link_group_size: integer 10000000000 is out of range");
    ExpectError(R"({"stage_time_scale": 1})", "stage_time_scale: expected an array, got the "
                                              "integer 1");
    ExpectError(R"({"stage_time_scale": [1, "x"]})", "stage_time_scale[1]: expected a number");
    ExpectError(R"({"activation_bytes_per_virtual_stage": [1, 2.5]})",
                "activation_bytes_per_virtual_stage[1]: expected an integer");
    ExpectError(R"({"p2p_latency": null})", "p2p_latency: expected a number");
  }
  SECTION("negative times and non-positive bandwidths") {
    ExpectError(R"({"backward_time": -1})", "backward_time: must be finite and >= 0, got -1");
    ExpectError(R"({"weight_time": "Infinity"})", "weight_time: must be finite and >= 0, got inf");
    ExpectError(R"({"d2h_bandwidth": 0})", "d2h_bandwidth: must be > 0, got 0");
    ExpectError(R"({"h2d_bandwidth": -5e9})", "h2d_bandwidth: must be > 0, got -5e+09");
    ExpectError(R"({"duplex_bandwidth": "NaN"})", "duplex_bandwidth: must be > 0, got nan");
    ExpectError(R"({"p2p_bandwidth": 0.0})", "p2p_bandwidth: must be > 0, got 0");
    ExpectError(R"({"p2p_latency": -1e-9})", "p2p_latency: must be finite and >= 0");
    ExpectError(R"({"recompute_lean_time": "Infinity"})",
                "recompute_lean_time: must be finite (negative: derived), got inf");
    ExpectError(R"({"reload_margin_in_backward_times": -0.5})",
                "reload_margin_in_backward_times: must be finite and >= 0, got -0.5");
    ExpectError(R"({"retained_lean_bytes": -1})", "retained_lean_bytes: must be >= 0, got -1");
    ExpectError(R"({"retained_full_bytes_per_virtual_stage": [0, -2]})",
                "retained_full_bytes_per_virtual_stage[1]: must be >= -1, got -2");
    ExpectError(R"({"lean_rebuild_bytes": -2})", "lean_rebuild_bytes: must be >= -1, got -2");
    ExpectError(R"({"lean_rebuild_bytes_per_virtual_stage": [0, -3]})",
                "lean_rebuild_bytes_per_virtual_stage[1]: must be >= -1, got -3");
    ExpectError(R"({"stage_time_scale": [1, -1]})",
                "stage_time_scale[1]: must be finite and >= 0, got -1");
  }
  SECTION("negative sizes") {
    ExpectError(R"({"activation_bytes": -1})", "activation_bytes: must be >= 0, got -1");
    ExpectError(R"({"boundary_bytes": -2})", "boundary_bytes: must be >= 0, got -2");
    ExpectError(R"({"activation_bytes_per_virtual_stage": [4, -5]})",
                "activation_bytes_per_virtual_stage[1]: must be >= 0, got -5");
    ExpectError(R"({"host_link_group_size": 0})", "host_link_group_size: must be >= 1, got 0");
  }
  SECTION("not an object, or not JSON") {
    ExpectError("[]", "a cost model is a JSON object, got array");
    ExpectError("3", "a cost model is a JSON object, got the integer 3");
    ExpectError("{\"forward_time\": }", "JSON syntax error at line 1, column 18 (byte 17)");
    ExpectError("", "JSON syntax error at line 1, column 1 (byte 0)");
  }
}

}  // namespace
}  // namespace pipeoffload
