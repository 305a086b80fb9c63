// The canonical schedule JSON: exact round trips (doubles bit for bit, over hand-built and
// generated schedules), the file's layout, and a clear, located error for every kind of bad
// document, never an exception or a crash.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeoffload/schedule.h"
#include "pipeoffload/schedule_io.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using nlohmann::json;

std::uint64_t Bits(double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

Op MakeOp(OpKind kind, int mb, int chunk, int peer = -1) { return Op{kind, mb, chunk, peer}; }

// p = 2, m = 2, 1F1B with comms; stage 0 offloads (0, 0) and the stages pair with BARRIERs,
// one guarding a transfer and one guarding none. Predictions hold awkward doubles.
Schedule HandSchedule() {
  Schedule s;
  s.spec.family = Family::k1F1B;
  s.spec.num_stages = 2;
  s.spec.num_microbatches = 2;
  s.spec.offload = OffloadPolicy::kSelective;
  s.spec.offload_fraction = 0.1 + 0.2;  // 0.30000000000000004
  s.spec.offload_chunks = 1;
  s.spec.memory_budget_bytes = std::numeric_limits<std::int64_t>::max();
  s.spec.strict = true;
  s.stages.resize(2);
  s.stages[0].stage = 0;
  s.stages[0].ops = {
      MakeOp(OpKind::kForward, 0, 0),        MakeOp(OpKind::kSendActivation, 0, 0, 1),
      MakeOp(OpKind::kOffload, 0, 0),        MakeOp(OpKind::kBarrier, 0, 0, 1),
      MakeOp(OpKind::kForward, 1, 0),        MakeOp(OpKind::kSendActivation, 1, 0, 1),
      MakeOp(OpKind::kRelease, 0, 0),        MakeOp(OpKind::kReload, 0, 0),
      MakeOp(OpKind::kRecvGrad, 0, 0, 1),    MakeOp(OpKind::kBackward, 0, 0),
      MakeOp(OpKind::kBarrier, -1, -1, 1),   MakeOp(OpKind::kRecvGrad, 1, 0, 1),
      MakeOp(OpKind::kBackward, 1, 0),
  };
  s.stages[1].stage = 1;
  s.stages[1].ops = {
      MakeOp(OpKind::kRecvActivation, 0, 0, 0), MakeOp(OpKind::kForward, 0, 0),
      MakeOp(OpKind::kBarrier, 0, 0, 0),        MakeOp(OpKind::kBackward, 0, 0),
      MakeOp(OpKind::kSendGrad, 0, 0, 0),       MakeOp(OpKind::kRecvActivation, 1, 0, 0),
      MakeOp(OpKind::kForward, 1, 0),           MakeOp(OpKind::kBarrier, -1, -1, 0),
      MakeOp(OpKind::kBackward, 1, 0),          MakeOp(OpKind::kSendGrad, 1, 0, 0),
  };
  Predictions pred;
  pred.step_time = 1e-300;
  pred.bubble_ratio = 1.0 / 3.0;
  pred.step_time_without_offload = std::numeric_limits<double>::denorm_min();
  pred.collisions = 3;
  pred.warnings = {"planned 1 of 2 entries (\"po-h\" needs 55.2 GB/s)\nsecond line \\ tab\t",
                   "unicode: 45 \xC2\xB5s", ""};
  StagePrediction s0;
  s0.peak_units = 2;
  s0.peak_bytes = std::numeric_limits<std::int64_t>::max();
  s0.peak_units_without_offload = 3;
  s0.peak_bytes_without_offload = (std::int64_t{1} << 53) + 1;  // not exact as a double
  s0.host_bytes = 1 << 20;
  s0.offloaded_bytes = 123456789012345;
  s0.busy_time = -0.0;
  s0.end_time = std::numeric_limits<double>::max();
  StagePrediction s1;
  s1.busy_time = 0.1 * 3;
  s1.end_time = std::numeric_limits<double>::infinity();
  pred.stages = {s0, s1};
  pred.links = {{"host:0", 1 << 20, 1 << 20}, {"p2p:0->1", 65536, 0}};
  s.predictions = pred;
  return s;
}

void RequireSameDoubles(const Schedule& a, const Schedule& b) {
  REQUIRE(Bits(a.spec.offload_fraction) == Bits(b.spec.offload_fraction));
  REQUIRE(a.predictions.has_value() == b.predictions.has_value());
  if (!a.predictions.has_value()) return;
  const Predictions& x = *a.predictions;
  const Predictions& y = *b.predictions;
  REQUIRE(Bits(x.step_time) == Bits(y.step_time));
  REQUIRE(Bits(x.bubble_ratio) == Bits(y.bubble_ratio));
  REQUIRE(Bits(x.step_time_without_offload) == Bits(y.step_time_without_offload));
  REQUIRE(x.stages.size() == y.stages.size());
  for (std::size_t i = 0; i < x.stages.size(); ++i) {
    REQUIRE(Bits(x.stages[i].busy_time) == Bits(y.stages[i].busy_time));
    REQUIRE(Bits(x.stages[i].end_time) == Bits(y.stages[i].end_time));
  }
}

TEST_CASE("schedule JSON round trip is exact, doubles bit for bit", "[io][json]") {
  const Schedule original = HandSchedule();
  const std::string text = ScheduleToJson(original);
  INFO(text);
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
  REQUIRE(parsed.ok());
  REQUIRE(*parsed == original);
  RequireSameDoubles(*parsed, original);
  CHECK(std::signbit(parsed->predictions->stages[0].busy_time));  // -0.0 stays negative
  CHECK(parsed->predictions->stages[0].peak_bytes_without_offload ==
        (std::int64_t{1} << 53) + 1);
  // Writing again gives the same bytes.
  CHECK(ScheduleToJson(*parsed) == text);
}

TEST_CASE("schedule JSON carries recompute ops by name", "[io][json]") {
  Schedule s = HandSchedule();
  s.stages[0].ops.insert(s.stages[0].ops.begin() + 1, Op{OpKind::kRecompute, 0, 0, -1});
  s.stages[1].ops.push_back(Op{OpKind::kRecomputeLean, 1, 0, -1});
  const std::string text = ScheduleToJson(s);
  INFO(text);
  CHECK(text.find("{\"op\": \"RECOMPUTE\", \"mb\": 0, \"chunk\": 0}") != std::string::npos);
  CHECK(text.find("{\"op\": \"RECOMPUTE_LEAN\", \"mb\": 1, \"chunk\": 0}") !=
        std::string::npos);
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
  REQUIRE(parsed.ok());
  CHECK(*parsed == s);
  // A recompute op takes no peer, like the other non-P2P kinds.
  std::string with_peer = text;
  const std::string lean = "\"RECOMPUTE_LEAN\", \"mb\": 1, \"chunk\": 0";
  with_peer.replace(with_peer.find(lean), lean.size(), lean + ", \"peer\": 0");
  const absl::Status refused = ParseScheduleJson(with_peer).status();
  INFO(refused.ToString());
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.message()).find("not allowed on a RECOMPUTE_LEAN") !=
        std::string::npos);
}

TEST_CASE("schedule JSON keeps non-finite doubles", "[io][json]") {
  Schedule s = HandSchedule();
  s.predictions->step_time = -std::numeric_limits<double>::infinity();
  s.predictions->bubble_ratio = std::numeric_limits<double>::quiet_NaN();
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(ScheduleToJson(s));
  REQUIRE(parsed.ok());
  CHECK(parsed->predictions->step_time == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(parsed->predictions->bubble_ratio));
  CHECK(parsed->predictions->stages[1].end_time == std::numeric_limits<double>::infinity());
  // The text stays standard JSON (no bare NaN/Infinity literals), so any JSON tool reads it.
  CHECK(json::accept(ScheduleToJson(s)));
}

TEST_CASE("schedule JSON layout: fixed keys, one op per line, peer only where it belongs",
          "[io][json]") {
  const Schedule s = HandSchedule();
  const std::string text = ScheduleToJson(s);
  const json doc = json::parse(text);
  CHECK(doc["format"] == "pipeoffload.schedule/1");
  std::vector<std::string> spec_keys;
  for (const auto& [key, value] : doc["spec"].items()) spec_keys.push_back(key);
  std::sort(spec_keys.begin(), spec_keys.end());
  CHECK(spec_keys == std::vector<std::string>{"chunks", "family", "group_size",
                                              "memory_budget_bytes", "microbatches", "offload",
                                              "offload_chunks", "offload_fraction",
                                              "split_backward", "stages", "strict"});
  CHECK(doc["spec"]["family"] == "1f1b");
  CHECK(doc["spec"]["offload"] == "selective");
  std::vector<std::string> stage_keys;
  for (const auto& [key, value] : doc["predictions"]["stages"][0].items()) {
    stage_keys.push_back(key);
  }
  std::sort(stage_keys.begin(), stage_keys.end());
  CHECK(stage_keys == std::vector<std::string>{"busy_time", "end_time", "host_bytes",
                                               "offloaded_bytes", "peak_bytes",
                                               "peak_bytes_without_offload", "peak_units",
                                               "peak_units_without_offload"});

  std::size_t op_lines = 0;
  std::size_t total_ops = 0;
  for (const StageProgram& program : s.stages) total_ops += program.ops.size();
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    if (line.find("\"op\":") != std::string::npos) {
      ++op_lines;
      CHECK(line.find("\"op\":", line.find("\"op\":") + 1) == std::string::npos);
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  CHECK(op_lines == total_ops);
  CHECK(text.find("{\"op\": \"F\", \"mb\": 0, \"chunk\": 0}") != std::string::npos);
  CHECK(text.find("{\"op\": \"SEND_F\", \"mb\": 1, \"chunk\": 0, \"peer\": 1}") !=
        std::string::npos);
  CHECK(text.find("{\"op\": \"BARRIER\", \"mb\": -1, \"chunk\": -1, \"peer\": 0}") !=
        std::string::npos);
  for (const auto& program : doc["stages"]) {
    for (const auto& op : program["ops"]) {
      const std::optional<OpKind> kind = OpKindFromName(op["op"].get<std::string>());
      REQUIRE(kind.has_value());
      CHECK(op.contains("peer") == HasPeer(*kind));
    }
  }
}

TEST_CASE("schedule JSON writing never throws, even on invalid UTF-8", "[io][json]") {
  Schedule s = HandSchedule();
  s.predictions->warnings = {"bad \xFF\xFE bytes"};
  s.predictions->links[0].name = "host:\xC3";
  std::string text;
  REQUIRE_NOTHROW(text = ScheduleToJson(s));
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
  REQUIRE(parsed.ok());
  CHECK(parsed->predictions->warnings[0] == "bad \xEF\xBF\xBD\xEF\xBF\xBD bytes");  // U+FFFD
  CHECK(parsed->stages == s.stages);
}

TEST_CASE("schedule JSON without predictions has no predictions key", "[io][json]") {
  Schedule s = HandSchedule();
  s.predictions.reset();
  const std::string text = ScheduleToJson(s);
  CHECK(text.find("predictions") == std::string::npos);
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
  REQUIRE(parsed.ok());
  CHECK_FALSE(parsed->predictions.has_value());
  CHECK(*parsed == s);
}

// A random but well-formed schedule: every op kind, every family and policy, doubles drawn from
// random bit patterns (finite ones), so the round trip is tested far from friendly values.
Schedule RandomSchedule(std::mt19937_64& rng) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto random_double = [&] {
    while (true) {
      const std::uint64_t bits = rng();
      double value = 0;
      std::memcpy(&value, &bits, sizeof value);
      if (std::isfinite(value)) return value;
    }
  };
  Schedule s;
  s.spec.family = static_cast<Family>(uniform(0, 2));
  s.spec.num_stages = uniform(1, 6);
  s.spec.num_microbatches = uniform(1, 40);
  s.spec.chunks_per_stage = uniform(1, 4);
  s.spec.group_size = uniform(0, s.spec.num_stages);
  s.spec.split_backward = uniform(0, 1) == 1;
  s.spec.offload = static_cast<OffloadPolicy>(uniform(0, 4));
  s.spec.offload_fraction = std::ldexp(static_cast<double>(rng() >> 11), -53);  // in [0, 1)
  s.spec.offload_chunks = uniform(0, 3);
  s.spec.memory_budget_bytes = static_cast<std::int64_t>(rng() >> 1);
  s.spec.strict = uniform(0, 1) == 1;
  for (int d = 0; d < s.spec.num_stages; ++d) {
    StageProgram program;
    program.stage = d;
    const int num_ops = uniform(0, 60);
    for (int i = 0; i < num_ops; ++i) {
      Op op;
      op.kind = static_cast<OpKind>(uniform(0, kNumOpKinds - 1));
      op.mb = uniform(0, s.spec.num_microbatches - 1);
      op.chunk = uniform(0, s.spec.chunks_per_stage - 1);
      if (HasPeer(op.kind)) op.peer = uniform(0, s.spec.num_stages - 1);
      if (op.kind == OpKind::kBarrier && uniform(0, 3) == 0) op.mb = op.chunk = -1;
      program.ops.push_back(op);
    }
    s.stages.push_back(program);
  }
  if (uniform(0, 3) != 0) {
    Predictions pred;
    pred.step_time = random_double();
    pred.bubble_ratio = random_double();
    pred.step_time_without_offload = random_double();
    pred.collisions = uniform(0, 100);
    for (int d = 0; d < s.spec.num_stages; ++d) {
      StagePrediction stage;
      stage.peak_units = static_cast<std::int64_t>(rng() >> 1);
      stage.peak_bytes = -static_cast<std::int64_t>(rng() >> 2);
      stage.peak_units_without_offload = uniform(0, 100);
      stage.peak_bytes_without_offload = static_cast<std::int64_t>(rng() >> 1);
      stage.host_bytes = static_cast<std::int64_t>(rng() >> 1);
      stage.offloaded_bytes = static_cast<std::int64_t>(rng() >> 1);
      stage.busy_time = random_double();
      stage.end_time = random_double();
      pred.stages.push_back(stage);
    }
    for (int i = uniform(0, 3); i > 0; --i) {
      pred.links.push_back({"host:" + std::to_string(i), uniform(0, 1 << 30), uniform(0, 9)});
      pred.warnings.push_back("warning " + std::to_string(rng()));
    }
    s.predictions = pred;
  }
  return s;
}

TEST_CASE("schedule JSON round trip is exact over generated schedules", "[io][json]") {
  std::mt19937_64 rng(20240611);
  for (int iteration = 0; iteration < 300; ++iteration) {
    const Schedule original = RandomSchedule(rng);
    const std::string text = ScheduleToJson(original);
    CAPTURE(iteration);
    absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
    INFO(parsed.status().ToString());
    REQUIRE(parsed.ok());
    REQUIRE(*parsed == original);
    RequireSameDoubles(*parsed, original);
  }
}

TEST_CASE("hand-written schedule JSON may leave out the optional spec keys", "[io][json]") {
  const char* text = R"({"format": "pipeoffload.schedule/1",
    "spec": {"family": "interleaved", "stages": 1, "microbatches": 2, "chunks": 2},
    "stages": [{"stage": 0, "ops": [{"op": "F", "mb": 0, "chunk": 0}]}]})";
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
  REQUIRE(parsed.ok());
  PipelineSpec expected;
  expected.family = Family::kInterleaved;
  expected.num_stages = 1;
  expected.num_microbatches = 2;
  expected.chunks_per_stage = 2;
  CHECK(parsed->spec == expected);
  REQUIRE(parsed->stages.size() == 1);
  CHECK(parsed->stages[0].ops == std::vector<Op>{MakeOp(OpKind::kForward, 0, 0)});
}

// Parses the hand schedule's document after `edit`, expecting InvalidArgument with `message`.
void ExpectError(const std::function<void(json&)>& edit, const std::string& message) {
  json doc = json::parse(ScheduleToJson(HandSchedule()));
  edit(doc);
  const std::string text = doc.dump();
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
  INFO("document: " << text.substr(0, 400));
  INFO("status: " << parsed.status().ToString());
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(parsed.status().message()).find(message) != std::string::npos);
}

TEST_CASE("schedule JSON errors name the path and what is wrong", "[io][json]") {
  SECTION("unknown op kind") {
    ExpectError([](json& d) { d["stages"][1]["ops"][2]["op"] = "FOO"; },
                "stages[1].ops[2].op: unknown op kind \"FOO\"; expected one of F, B, W, "
                "SEND_F, RECV_F, SEND_B, RECV_B, OFFLOAD, RELEASE, RELOAD, BARRIER");
  }
  SECTION("op kind of the wrong type") {
    ExpectError([](json& d) { d["stages"][0]["ops"][4]["op"] = 7; },
                "stages[0].ops[4].op: expected a string, got the integer 7");
  }
  SECTION("missing keys") {
    ExpectError([](json& d) { d["spec"].erase("microbatches"); },
                "spec.microbatches: missing required key");
    ExpectError([](json& d) { d["stages"][0]["ops"][3].erase("mb"); },
                "stages[0].ops[3].mb: missing required key");
    ExpectError([](json& d) { d["stages"][0]["ops"][3].erase("op"); },
                "stages[0].ops[3].op: missing required key");
    ExpectError([](json& d) { d["stages"][1].erase("ops"); },
                "stages[1].ops: missing required key");
    ExpectError([](json& d) { d.erase("stages"); }, "stages: missing required key");
    ExpectError([](json& d) { d.erase("spec"); }, "spec: missing required key");
    ExpectError([](json& d) { d["predictions"].erase("step_time"); },
                "predictions.step_time: missing required key");
    ExpectError([](json& d) { d["predictions"]["stages"][1].erase("end_time"); },
                "predictions.stages[1].end_time: missing required key");
  }
  SECTION("wrong types") {
    ExpectError([](json& d) { d["spec"]["stages"] = "2"; },
                "spec.stages: expected an integer, got string");
    ExpectError([](json& d) { d["stages"][0]["ops"][0]["mb"] = 1.5; },
                "stages[0].ops[0].mb: expected an integer, got the number 1.5");
    ExpectError([](json& d) { d["spec"]["split_backward"] = 1; },
                "spec.split_backward: expected true or false, got the integer 1");
    ExpectError([](json& d) { d["spec"]["offload_fraction"] = "half"; },
                "spec.offload_fraction: expected a number");
    ExpectError([](json& d) { d["stages"][0]["ops"] = json::object(); },
                "stages[0].ops: expected an array, got object");
    ExpectError([](json& d) { d["stages"][1] = json::array(); },
                "stages[1]: expected an object, got array");
    ExpectError([](json& d) { d["stages"][1]["ops"][0] = "F0.0"; },
                "stages[1].ops[0]: expected an object, got string");
    ExpectError([](json& d) { d["predictions"]["warnings"][1] = 5; },
                "predictions.warnings[1]: expected a string, got the integer 5");
    ExpectError([](json& d) { d["predictions"]["links"][0]["bytes_d2h"] = nullptr; },
                "predictions.links[0].bytes_d2h: expected an integer, got null");
  }
  SECTION("integers out of range") {
    ExpectError([](json& d) { d["stages"][0]["ops"][0]["chunk"] = 3000000000u; },
                "stages[0].ops[0].chunk: integer 3000000000 is out of range");
    ExpectError([](json& d) { d["spec"]["memory_budget_bytes"] = 18446744073709551615u; },
                "spec.memory_budget_bytes: integer 18446744073709551615 is out of range");
    ExpectError([](json& d) { d["stages"][0]["ops"][1]["peer"] = -5000000000; },
                "stages[0].ops[1].peer: integer -5000000000 is out of range");
  }
  SECTION("format string") {
    ExpectError([](json& d) { d["format"] = "pipeoffload.schedule/2"; },
                "format: unsupported format \"pipeoffload.schedule/2\"; this reader supports "
                "\"pipeoffload.schedule/1\"");
    ExpectError([](json& d) { d.erase("format"); },
                "format: missing required key; this reader supports \"pipeoffload.schedule/1\"");
    ExpectError([](json& d) { d["format"] = 1; }, "format: unsupported format 1");
  }
  SECTION("negative numbers") {
    ExpectError([](json& d) { d["stages"][0]["ops"][0]["mb"] = -1; },
                "stages[0].ops[0].mb: must be >= 0, got -1");
    ExpectError([](json& d) { d["stages"][1]["ops"][1]["chunk"] = -2; },
                "stages[1].ops[1].chunk: must be >= 0, got -2");
    // A BARRIER guards no transfer only with both -1; one alone is a mistake.
    ExpectError([](json& d) { d["stages"][0]["ops"][3]["mb"] = -1; },
                "stages[0].ops[3].mb: must be >= 0, got -1");
    ExpectError([](json& d) { d["stages"][0]["ops"][1]["peer"] = -1; },
                "stages[0].ops[1].peer: must be >= 0, got -1");
    ExpectError([](json& d) { d["spec"]["stages"] = 0; }, "spec.stages: must be >= 1, got 0");
    ExpectError([](json& d) { d["spec"]["group_size"] = -1; },
                "spec.group_size: must be >= 0, got -1");
    ExpectError([](json& d) { d["spec"]["offload_fraction"] = 1.5; },
                "spec.offload_fraction: must be in [0, 1], got 1.5");
    ExpectError([](json& d) { d["spec"]["offload_fraction"] = "NaN"; },
                "spec.offload_fraction: must be in [0, 1], got nan");
  }
  SECTION("stage numbering and count") {
    ExpectError([](json& d) { std::swap(d["stages"][0], d["stages"][1]); },
                "stages[0].stage: expected 0, got 1 (stage programs must be numbered 0..p-1 in "
                "order)");
    ExpectError([](json& d) { d["spec"]["stages"] = 3; },
                "stages: has 2 stage programs but spec.stages is 3");
    ExpectError([](json& d) { d["stages"].erase(1); },
                "stages: has 1 stage programs but spec.stages is 2");
  }
  SECTION("peers") {
    ExpectError([](json& d) { d["stages"][0]["ops"][1].erase("peer"); },
                "stages[0].ops[1].peer: missing; a SEND_F op needs the peer stage");
    ExpectError([](json& d) { d["stages"][0]["ops"][3].erase("peer"); },
                "stages[0].ops[3].peer: missing; a BARRIER op needs the peer stage");
    ExpectError([](json& d) { d["stages"][0]["ops"][0]["peer"] = 1; },
                "stages[0].ops[0].peer: not allowed on a F op");
  }
  SECTION("unknown keys and names") {
    ExpectError([](json& d) { d["stages"][0]["ops"][0]["micro"] = 1; },
                "stages[0].ops[0].micro: unknown key; expected one of op, mb, chunk, peer");
    ExpectError([](json& d) { d["spec"]["microbatch"] = 1; },
                "spec.microbatch: unknown key; expected one of family, stages, microbatches");
    ExpectError([](json& d) { d["extra"] = 1; },
                "extra: unknown key; expected one of format, spec, stages, predictions");
    ExpectError([](json& d) { d["spec"]["family"] = "gpipe"; },
                "spec.family: unknown family \"gpipe\"; expected one of 1f1b, interleaved, "
                "group-interleaved");
    ExpectError([](json& d) { d["spec"]["offload"] = "half"; },
                "spec.offload: unknown offload policy \"half\"; expected one of none, po-h, po-f, "
                "selective, auto");
  }
  SECTION("not an object at the top") {
    ExpectError([](json& d) { d = json::array(); }, "the document: expected an object, got array");
  }
}

TEST_CASE("schedule JSON syntax errors give line, column and byte", "[io][json]") {
  const std::string text = "{\n  \"format\": \"pipeoffload.schedule/1\",\n  oops\n}";
  absl::StatusOr<Schedule> parsed = ParseScheduleJson(text);
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(parsed.status().message());
  INFO(message);
  CHECK(message.find("JSON syntax error at line 3, column 3 (byte 42)") == 0);
  CHECK(text[42] == 'o');  // the byte is a 0-based offset

  for (const char* bad : {"", "   ", "{", "{}x", "[1,]", "{\"format\" 1}", "nul", "\"\\x\"",
                          "{\"a\": 1e999}"}) {
    CAPTURE(bad);
    absl::StatusOr<Schedule> result = ParseScheduleJson(bad);
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(!result.status().message().empty());
  }
}

TEST_CASE("schedule JSON reader survives truncated and corrupted documents", "[io][json]") {
  Schedule small = HandSchedule();
  const std::string text = ScheduleToJson(small);
  // Every proper prefix that stops before the closing brace is an error, never a crash.
  const std::size_t closing = text.rfind('}');
  for (std::size_t length = 0; length < closing; ++length) {
    CAPTURE(length);
    REQUIRE_FALSE(ParseScheduleJson(std::string_view(text).substr(0, length)).ok());
  }
  // Single-byte corruptions may or may not stay valid; none may throw or crash, and an accepted
  // one must still produce a schedule that writes back to valid JSON.
  std::mt19937 rng(7);
  const std::string replacements = "{}[],:\"0-9aZ \\\n";
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string corrupted = text;
    corrupted[rng() % corrupted.size()] = replacements[rng() % replacements.size()];
    absl::StatusOr<Schedule> parsed = ParseScheduleJson(corrupted);
    if (parsed.ok()) {
      CHECK(json::accept(ScheduleToJson(*parsed)));
    } else {
      ++rejected;
      CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    }
  }
  CHECK(rejected > 1000);
}

}  // namespace
}  // namespace pipeoffload
