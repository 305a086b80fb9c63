// Chrome / Perfetto trace JSON of a Timeline (trace.h; ecosystem.md section 5). Layout: pid =
// stage, tid = engine (0 compute, 1 send, 2 recv, 3 D2H, 4 H2D, the Engine enum's order), so
// ops that run at once on different engines never share a track (Perfetto does not draw
// overlapping slices of one track). Ops that occupy no engine (RELEASE, BARRIER) are instant
// events on the compute track; device activation memory is a counter per stage.
//
// Written one event per line, so traces diff and grep well.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/ir/json_fields.h"
#include "lib/ir/json_spec.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/trace.h"

namespace pipeoffload {
namespace {

using internal::OrderedJson;

constexpr std::string_view kCounterName = "activation bytes";

std::string_view Category(OpKind kind) {
  if (IsCompute(kind)) return "compute";
  if (IsP2P(kind)) return "comm";
  return "offload";  // OFFLOAD, RELEASE, RELOAD, and the BARRIERs that stagger them
}

OrderedJson Metadata(std::string_view name, int pid, int tid, const char* arg_name,
                     OrderedJson arg) {
  OrderedJson event = OrderedJson::object();
  event["name"] = std::string(name);
  event["ph"] = "M";
  event["pid"] = pid;
  event["tid"] = tid;
  event["args"] = OrderedJson::object({{arg_name, std::move(arg)}});
  return event;
}

OrderedJson OpEvent(const TimedOp& timed, int pid, double scale) {
  OrderedJson event = OrderedJson::object();
  event["name"] = OpToString(timed.op);
  event["cat"] = std::string(Category(timed.op.kind));
  const double ts = timed.start * scale;
  if (timed.engine == Engine::kNone) {
    event["ph"] = "i";
    event["s"] = "t";  // thread scope: a tick on the compute track
    event["pid"] = pid;
    event["tid"] = static_cast<int>(Engine::kCompute);
    event["ts"] = ts;
  } else {
    event["ph"] = "X";
    event["pid"] = pid;
    event["tid"] = static_cast<int>(timed.engine);
    event["ts"] = ts;
    // end * scale - ts rather than (end - start) * scale: back-to-back ops then tile the track
    // exactly instead of overlapping by a rounding error.
    event["dur"] = timed.end * scale - ts;
  }
  event["args"] = OrderedJson::object({{"stage", timed.stage},
                                       {"index", timed.index},
                                       {"mb", timed.op.mb},
                                       {"chunk", timed.op.chunk},
                                       {"bytes", timed.bytes},
                                       {"peer", timed.op.peer}});
  return event;
}

OrderedJson CounterEvent(const MemorySample& sample, int pid, double scale) {
  OrderedJson event = OrderedJson::object();
  event["name"] = std::string(kCounterName);
  event["ph"] = "C";
  event["pid"] = pid;
  event["tid"] = 0;
  event["ts"] = sample.time * scale;
  event["args"] = OrderedJson::object({{"bytes", sample.bytes}});
  return event;
}

}  // namespace

std::string TimelineToTraceJson(const Schedule& schedule, const Timeline& timeline,
                                double microseconds_per_unit) {
  std::vector<OrderedJson> events;
  const int num_stages = static_cast<int>(std::max(timeline.stages.size(),
                                                   timeline.memory.size()));
  for (int d = 0; d < num_stages; ++d) {
    events.push_back(Metadata("process_name", d, 0, "name", absl::StrCat("stage ", d)));
    events.push_back(Metadata("process_sort_index", d, 0, "sort_index", d));
    for (int tid = 0; tid < kNumEngines; ++tid) {
      events.push_back(Metadata("thread_name", d, tid, "name",
                                std::string(EngineName(static_cast<Engine>(tid)))));
      events.push_back(Metadata("thread_sort_index", d, tid, "sort_index", tid));
    }
  }
  for (std::size_t d = 0; d < timeline.stages.size(); ++d) {
    for (const TimedOp& timed : timeline.stages[d]) {
      events.push_back(OpEvent(timed, static_cast<int>(d), microseconds_per_unit));
    }
  }
  for (std::size_t d = 0; d < timeline.memory.size(); ++d) {
    for (const MemorySample& sample : timeline.memory[d]) {
      events.push_back(CounterEvent(sample, static_cast<int>(d), microseconds_per_unit));
    }
  }

  OrderedJson other = internal::SpecToJson(schedule.spec);
  other["microseconds_per_unit"] = internal::DoubleToJson(microseconds_per_unit);
  other["step_time"] = internal::DoubleToJson(timeline.predictions.step_time);

  std::string out = "{\"traceEvents\": [";
  for (std::size_t i = 0; i < events.size(); ++i) {
    out.append(i == 0 ? "\n" : ",\n");
    internal::AppendInline(events[i], &out);
  }
  absl::StrAppend(&out, events.empty() ? "]" : "\n]", ",\n\"displayTimeUnit\": \"ms\",\n",
                  "\"otherData\": ", internal::DumpInline(other), "\n}\n");
  return out;
}

}  // namespace pipeoffload
