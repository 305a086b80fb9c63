// The JSON readers' shape checks (lib/ir/json_fields.h, issue 17): nesting deeper than
// kMaxJsonDepth and NUL bytes are refused before nlohmann parses, with their exact position;
// brackets and escaped quotes inside strings do not count; both readers (schedule, cost model)
// apply the checks.
#include <string>

#include "lib/ir/json_fields.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule_io.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

std::string Nested(int depth) {
  return std::string(static_cast<std::size_t>(depth), '[') +
         std::string(static_cast<std::size_t>(depth), ']');
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST_CASE("JSON nesting is refused one level past the limit, at the bracket that exceeds it",
          "[io][json]") {
  CHECK(internal::kMaxJsonDepth == 32);
  CHECK(internal::ParseJsonText(Nested(32)).ok());
  const absl::StatusOr<internal::Json> deep = internal::ParseJsonText("\n " + Nested(33));
  REQUIRE(!deep.ok());
  CHECK(Message(deep.status()) ==
        "JSON nests deeper than 32 arrays and objects at line 2, column 34 (byte 34)");
  const absl::StatusOr<internal::Json> hostile = internal::ParseJsonText(Nested(100000));
  REQUIRE(!hostile.ok());
  CHECK(Message(hostile.status()) ==
        "JSON nests deeper than 32 arrays and objects at line 1, column 33 (byte 32)");
}

TEST_CASE("JSON strings do not nest, escaped quotes included", "[io][json]") {
  // 40 brackets inside a string, after an escaped quote that must not end it.
  const std::string text = "{\"k\": \"\\\"" + std::string(40, '[') + "\"}";
  const absl::StatusOr<internal::Json> parsed = internal::ParseJsonText(text);
  REQUIRE(parsed.ok());
  CHECK((*parsed)["k"].get<std::string>() == "\"" + std::string(40, '['));
}

TEST_CASE("JSON text with a NUL byte is refused where nlohmann would stop", "[io][json]") {
  const std::string text = std::string("{}\n\0{\"tail\": 1}", 15);
  const absl::StatusOr<internal::Json> parsed = internal::ParseJsonText(text);
  REQUIRE(!parsed.ok());
  CHECK(Message(parsed.status()) == "JSON text holds a NUL byte at line 2, column 1 (byte 3)");
}

TEST_CASE("schedule and cost-model readers refuse deep nesting and huge strings shortly",
          "[io][json]") {
  const absl::StatusOr<Schedule> schedule =
      ParseScheduleJson("{\"format\": " + Nested(100000) + "}");
  REQUIRE(!schedule.ok());
  CHECK(Message(schedule.status()).find("JSON nests deeper than 32") == 0);
  const absl::StatusOr<CostModel> cost =
      ParseCostModelJson("{\"stage_time_scale\": " + Nested(40) + "}", CostModel{});
  REQUIRE(!cost.ok());
  CHECK(Message(cost.status()).find("JSON nests deeper than 32") == 0);

  // A structured "format" is named by its kind, a long string shortened, never dumped whole.
  const absl::StatusOr<Schedule> structured = ParseScheduleJson("{\"format\": [[1, 2]]}");
  REQUIRE(!structured.ok());
  CHECK(Message(structured.status()) ==
        "format: unsupported format an array; this reader supports \"pipeoffload.schedule/1\"");
  const absl::StatusOr<Schedule> long_format =
      ParseScheduleJson("{\"format\": \"" + std::string(1'000'000, 'x') + "\"}");
  REQUIRE(!long_format.ok());
  CHECK(Message(long_format.status()) ==
        "format: unsupported format \"" + std::string(64, 'x') +
            "... (1000000 bytes)\"; this reader supports \"pipeoffload.schedule/1\"");
  // An unknown key as long is shortened too.
  const absl::StatusOr<CostModel> long_key =
      ParseCostModelJson("{\"" + std::string(1'000'000, 'k') + "\": 1}", CostModel{});
  REQUIRE(!long_key.ok());
  CHECK(Message(long_key.status()).find(std::string(64, 'k') + "... (1000000 bytes): unknown "
                                        "cost model key") == 0);
}

}  // namespace
}  // namespace pipeoffload
