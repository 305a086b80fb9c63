// Perfetto / Chrome trace JSON of a timeline, simulated or measured: the same layout for both so
// predicted and measured runs can be laid side by side (DESIGN.md section 3, ecosystem.md 5.3).
#ifndef PIPEOFFLOAD_TRACE_H_
#define PIPEOFFLOAD_TRACE_H_

#include <string>

#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload {

// One process per stage ("stage d"), one thread per engine (compute, send, recv, D2H, H2D, in
// that order), one "X" event per op that occupies an engine, named like OpToString ("F3.1"),
// with args {stage, mb, chunk, bytes, peer}; the stage's device activation bytes as a "C"
// counter track. Times are scaled by `microseconds_per_unit` (1e6 for seconds; 1000 makes unit
// costs readable). otherData carries the spec.
std::string TimelineToTraceJson(const Schedule& schedule, const Timeline& timeline,
                                double microseconds_per_unit);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_TRACE_H_
