// The JSON object of a PipelineSpec, shared by the canonical schedule file (schedule_json.cc,
// which defines it) and the trace's otherData (lib/sim/trace_json.cc), so both spell the spec
// the same way.
#ifndef PIPEOFFLOAD_LIB_IR_JSON_SPEC_H_
#define PIPEOFFLOAD_LIB_IR_JSON_SPEC_H_

#include "lib/ir/json_fields.h"
#include "pipeoffload/schedule.h"

namespace pipeoffload::internal {

// {"family": "1f1b", "stages": p, "microbatches": m, "chunks": v, "group_size": g,
//  "split_backward": b, "placement": "v", "offload": "none", "offload_fraction": f,
//  "offload_chunks": c, "memory_budget_bytes": n, "strict": b, "recompute": "lean",
//  "recompute_fraction": f, "recompute_chunks": c}, in that order; "placement" only when it is
//  not "loop", the default, and the recompute keys only when recompute is not "none".
OrderedJson SpecToJson(const PipelineSpec& spec);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_IR_JSON_SPEC_H_
