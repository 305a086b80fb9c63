// Chrome trace JSON of a Timeline: parsed back with nlohmann, every op that occupies an engine
// is one X event on its (stage, engine) track, no two slices of a track overlap, RELEASE and
// BARRIER are instants, memory samples are counters, and the metadata names every track.
// Timelines are built by hand (hand-picked and generated), independent of the simulator.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/trace.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using nlohmann::json;

TimedOp Timed(int stage, int index, Op op, double start, double end, std::int64_t bytes = 0) {
  TimedOp timed;
  timed.stage = stage;
  timed.index = index;
  timed.op = op;
  timed.engine = EngineOf(op.kind);
  timed.start = start;
  timed.end = end;
  timed.bytes = bytes;
  return timed;
}

// Two stages, one microbatch, stage 0 offloads its entry: every engine and both instant kinds.
std::pair<Schedule, Timeline> HandTimeline() {
  Schedule schedule;
  schedule.spec.num_stages = 2;
  schedule.spec.offload = OffloadPolicy::kFull;
  using K = OpKind;
  Timeline t;
  t.stages.resize(2);
  t.stages[0] = {
      Timed(0, 0, {K::kForward, 0, 0, -1}, 0.0, 1.0),
      Timed(0, 1, {K::kSendActivation, 0, 0, 1}, 1.0, 1.25, 64),
      Timed(0, 2, {K::kOffload, 0, 0, -1}, 1.0, 3.0, 1024),
      Timed(0, 3, {K::kRelease, 0, 0, -1}, 3.0, 3.0),
      Timed(0, 4, {K::kBarrier, -1, -1, 1}, 3.0, 3.0),
      Timed(0, 5, {K::kReload, 0, 0, -1}, 3.5, 5.5, 1024),
      Timed(0, 6, {K::kRecvGrad, 0, 0, 1}, 5.5, 5.75, 64),
      Timed(0, 7, {K::kBackward, 0, 0, -1}, 5.75, 7.75),
  };
  t.stages[1] = {
      Timed(1, 0, {K::kRecvActivation, 0, 0, 0}, 1.0, 1.25, 64),
      Timed(1, 1, {K::kForward, 0, 0, -1}, 1.25, 2.25),
      Timed(1, 2, {K::kBarrier, -1, -1, 0}, 3.0, 3.0),
      Timed(1, 3, {K::kBackward, 0, 0, -1}, 3.25, 5.5),
      Timed(1, 4, {K::kSendGrad, 0, 0, 0}, 5.5, 5.75, 64),
  };
  t.memory = {{{0.0, 0, 0}, {0.0, 1024, 1}, {3.0, 0, 0}, {3.5, 1024, 1}, {7.75, 0, 0}},
              {{1.25, 1024, 1}, {5.5, 0, 0}}};
  t.predictions.step_time = 7.75;
  return {schedule, t};
}

struct ParsedTrace {
  json doc;
  std::map<std::pair<int, int>, std::vector<json>> slices;    // (pid, tid) -> X events
  std::map<std::pair<int, int>, std::vector<json>> instants;  // (pid, tid) -> i events
  std::map<int, std::vector<json>> counters;                  // pid -> C events
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<std::pair<int, int>, int> thread_sort;
  std::map<int, std::string> process_names;
};

ParsedTrace Parse(const std::string& text) {
  ParsedTrace out;
  out.doc = json::parse(text);  // throws (and fails the test) on invalid JSON
  for (const json& event : out.doc.at("traceEvents")) {
    const std::string ph = event.at("ph");
    const int pid = event.at("pid");
    if (ph == "X") out.slices[{pid, event.at("tid")}].push_back(event);
    if (ph == "i") out.instants[{pid, event.at("tid")}].push_back(event);
    if (ph == "C") out.counters[pid].push_back(event);
    if (ph == "M") {
      const std::string name = event.at("name");
      if (name == "process_name") out.process_names[pid] = event.at("args").at("name");
      if (name == "thread_name") out.thread_names[{pid, event.at("tid")}] = event["args"]["name"];
      if (name == "thread_sort_index") {
        out.thread_sort[{pid, event.at("tid")}] = event.at("args").at("sort_index");
      }
    }
  }
  return out;
}

// The properties every trace must have, for any timeline.
void CheckTraceMatches(const Schedule& schedule, const Timeline& timeline, double scale) {
  const ParsedTrace trace = Parse(TimelineToTraceJson(schedule, timeline, scale));
  CHECK(trace.doc.at("displayTimeUnit") == "ms");
  CHECK(trace.doc.at("otherData").at("stages") == schedule.spec.num_stages);
  CHECK(trace.doc.at("otherData").at("family") == std::string(FamilyName(schedule.spec.family)));
  CHECK(trace.doc.at("otherData").at("offload") ==
        std::string(OffloadPolicyName(schedule.spec.offload)));
  CHECK(trace.doc.at("otherData").at("microseconds_per_unit") == scale);

  const char* engine_names[kNumEngines] = {"compute", "send", "recv", "D2H", "H2D"};
  for (int d = 0; d < static_cast<int>(timeline.stages.size()); ++d) {
    CAPTURE(d);
    CHECK(trace.process_names.at(d) == "stage " + std::to_string(d));
    for (int tid = 0; tid < kNumEngines; ++tid) {
      CHECK(trace.thread_names.at({d, tid}) == engine_names[tid]);
      CHECK(trace.thread_sort.at({d, tid}) == tid);
    }
    // One X event per op on an engine, on that engine's track, in program order; instants for
    // the rest on the compute track.
    std::map<int, std::vector<const TimedOp*>> per_engine;
    std::vector<const TimedOp*> engineless;
    for (const TimedOp& timed : timeline.stages[d]) {
      if (timed.engine == Engine::kNone) {
        engineless.push_back(&timed);
      } else {
        per_engine[static_cast<int>(timed.engine)].push_back(&timed);
      }
    }
    for (int tid = 0; tid < kNumEngines; ++tid) {
      CAPTURE(tid);
      const auto it = trace.slices.find({d, tid});
      const std::size_t count = it == trace.slices.end() ? 0 : it->second.size();
      REQUIRE(count == per_engine[tid].size());
      for (std::size_t i = 0; i < count; ++i) {
        const json& event = it->second[i];
        const TimedOp& timed = *per_engine[tid][i];
        CHECK(event.at("name") == OpToString(timed.op));
        CHECK(event.at("ts").get<double>() == timed.start * scale);
        CHECK(event.at("dur").get<double>() ==
              Catch::Approx((timed.end - timed.start) * scale).margin(1e-9 * scale));
        CHECK(event.at("args").at("stage") == timed.stage);
        CHECK(event.at("args").at("mb") == timed.op.mb);
        CHECK(event.at("args").at("chunk") == timed.op.chunk);
        CHECK(event.at("args").at("peer") == timed.op.peer);
        CHECK(event.at("args").at("bytes") == timed.bytes);
        const std::string cat = event.at("cat");
        CHECK(cat == (IsCompute(timed.op.kind) ? "compute"
                      : IsP2P(timed.op.kind)   ? "comm"
                                               : "offload"));
      }
      // No two slices of one track overlap (Perfetto would not draw them).
      if (count > 1) {
        std::vector<std::pair<double, double>> spans;
        for (const json& event : it->second) {
          spans.emplace_back(event.at("ts").get<double>(),
                             event.at("ts").get<double>() + event.at("dur").get<double>());
        }
        std::sort(spans.begin(), spans.end());
        for (std::size_t i = 1; i < spans.size(); ++i) {
          CHECK(spans[i - 1].second <= spans[i].first + 1e-9 * std::abs(spans[i].first));
        }
      }
    }
    const auto instants = trace.instants.find({d, 0});
    const std::size_t instant_count =
        instants == trace.instants.end() ? 0 : instants->second.size();
    REQUIRE(instant_count == engineless.size());
    for (std::size_t i = 0; i < instant_count; ++i) {
      const json& event = instants->second[i];
      CHECK(event.at("name") == OpToString(engineless[i]->op));
      CHECK(event.at("s") == "t");
      CHECK(event.at("ts").get<double>() == engineless[i]->start * scale);
    }
  }
  // Counters: one per memory sample, same order, times and bytes.
  for (int d = 0; d < static_cast<int>(timeline.memory.size()); ++d) {
    CAPTURE(d);
    const auto it = trace.counters.find(d);
    const std::size_t count = it == trace.counters.end() ? 0 : it->second.size();
    REQUIRE(count == timeline.memory[d].size());
    for (std::size_t i = 0; i < count; ++i) {
      CHECK(it->second[i].at("name") == "activation bytes");
      CHECK(it->second[i].at("ts").get<double>() == timeline.memory[d][i].time * scale);
      CHECK(it->second[i].at("args").at("bytes") == timeline.memory[d][i].bytes);
    }
  }
  // Nothing else on tracks that do not exist.
  for (const auto& [key, events] : trace.slices) {
    CHECK(key.first < static_cast<int>(timeline.stages.size()));
    CHECK(key.second < kNumEngines);
  }
}

TEST_CASE("trace JSON of a hand-built timeline", "[io][trace]") {
  const auto [schedule, timeline] = HandTimeline();
  CheckTraceMatches(schedule, timeline, 1000.0);
  CheckTraceMatches(schedule, timeline, 1e6);

  // Spot checks against the numbers written above.
  const ParsedTrace trace = Parse(TimelineToTraceJson(schedule, timeline, 1000.0));
  const json& offload = trace.slices.at({0, 3}).at(0);
  CHECK(offload.at("name") == "OFFLOAD0.0");
  CHECK(offload.at("cat") == "offload");
  CHECK(offload.at("ts") == 1000.0);
  CHECK(offload.at("dur") == 2000.0);
  CHECK(offload.at("args").at("bytes") == 1024);
  const json& reload = trace.slices.at({0, 4}).at(0);
  CHECK(reload.at("name") == "RELOAD0.0");
  CHECK(reload.at("ts") == 3500.0);
  const json& send = trace.slices.at({0, 1}).at(0);
  CHECK(send.at("name") == "SEND_F0.0->1");
  CHECK(send.at("cat") == "comm");
  CHECK(send.at("args").at("peer") == 1);
  CHECK(trace.slices.at({1, 2}).size() == 1);  // stage 1's RECV_F
  CHECK(trace.instants.at({0, 0}).size() == 2);
  CHECK(trace.instants.at({0, 0}).at(1).at("name") == "BARRIER~1");
  CHECK(trace.counters.at(0).size() == 5);
  CHECK(trace.counters.at(1).at(0).at("ts") == 1250.0);
  CHECK(trace.doc.at("otherData").at("step_time") == 7.75);
}

TEST_CASE("trace JSON of an empty timeline is valid", "[io][trace]") {
  Schedule schedule;
  const ParsedTrace trace = Parse(TimelineToTraceJson(schedule, Timeline{}, 1.0));
  CHECK(trace.doc.at("traceEvents").empty());
  CHECK(trace.doc.at("otherData").at("stages") == 1);
}

// A timeline for any p, m, v: per stage, each engine's ops run back to back in program order
// (an op starts when its predecessor in the program has started and its engine is free),
// with durations like 0.1 that do not add up exactly in binary.
Timeline GeneratedTimeline(int p, int m, int v, std::mt19937& rng) {
  const double durations[] = {0.1, 0.2, 0.3, 1.0 / 3.0, 0.7, 1e-3};
  Timeline timeline;
  timeline.stages.resize(p);
  timeline.memory.resize(p);
  for (int d = 0; d < p; ++d) {
    std::vector<Op> ops;
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) {
        if (d > 0) ops.push_back({OpKind::kRecvActivation, mb, c, d - 1});
        ops.push_back({OpKind::kForward, mb, c, -1});
        if (d + 1 < p) ops.push_back({OpKind::kSendActivation, mb, c, d + 1});
        ops.push_back({OpKind::kOffload, mb, c, -1});
        ops.push_back({OpKind::kRelease, mb, c, -1});
      }
    }
    for (int c = v - 1; c >= 0; --c) {
      for (int mb = 0; mb < m; ++mb) {
        if (p > 1) ops.push_back({OpKind::kBarrier, mb, c, (d + 1) % p});
        ops.push_back({OpKind::kReload, mb, c, -1});
        if (d + 1 < p) ops.push_back({OpKind::kRecvGrad, mb, c, d + 1});
        ops.push_back({OpKind::kBackward, mb, c, -1});
        if (d > 0) ops.push_back({OpKind::kSendGrad, mb, c, d - 1});
      }
    }
    double engine_free[kNumEngines] = {};
    double previous_start = 0.0;
    std::int64_t bytes = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Engine engine = EngineOf(ops[i].kind);
      double start = previous_start;
      if (engine != Engine::kNone) start = std::max(start, engine_free[static_cast<int>(engine)]);
      const double duration =
          engine == Engine::kNone ? 0.0 : durations[rng() % std::size(durations)];
      const double end = start + duration;
      if (engine != Engine::kNone) engine_free[static_cast<int>(engine)] = end;
      previous_start = start;
      timeline.stages[d].push_back(Timed(d, static_cast<int>(i), ops[i], start, end,
                                         IsCompute(ops[i].kind) ? 0 : 4096));
      if (ops[i].kind == OpKind::kForward || ops[i].kind == OpKind::kReload) bytes += 4096;
      if (ops[i].kind == OpKind::kRelease || ops[i].kind == OpKind::kBackward) bytes -= 4096;
      if (ops[i].kind == OpKind::kForward || ops[i].kind == OpKind::kRelease ||
          ops[i].kind == OpKind::kReload || ops[i].kind == OpKind::kBackward) {
        timeline.memory[d].push_back({start, bytes, bytes / 4096});
      }
    }
  }
  return timeline;
}

TEST_CASE("trace JSON matches generated timelines track by track", "[io][trace]") {
  std::mt19937 rng(11);
  int checked = 0;
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, p, 2 * p}) {
      for (int v : {1, 2, 3}) {
        CAPTURE(p, m, v);
        Schedule schedule;
        schedule.spec.family = v == 1 ? Family::k1F1B : Family::kGroupInterleaved;
        schedule.spec.num_stages = p;
        schedule.spec.num_microbatches = m;
        schedule.spec.chunks_per_stage = v;
        const Timeline timeline = GeneratedTimeline(p, m, v, rng);
        CheckTraceMatches(schedule, timeline, 1000.0);
        ++checked;
      }
    }
  }
  CHECK(checked == 36);
}

}  // namespace
}  // namespace pipeoffload
