// The host link's ceilings, measured through the Backend interface (pinned host buffers from
// AllocateHost, copies on the D2H and H2D queues, events around them): what pipeline_bench
// gives its cost model, and what its achieved offload bandwidth is held against.
#ifndef PIPEOFFLOAD_BENCH_PIPELINE_BENCH_LINK_H_
#define PIPEOFFLOAD_BENCH_PIPELINE_BENCH_LINK_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "bench/pipeline_bench_plan.h"
#include "pipeoffload/backend.h"

namespace pipeoffload::bench {

// Copies of `bytes` bytes: D2H alone, H2D alone, then both at once (each direction's rate
// while the other runs; the smaller of the two is LinkFigures::duplex). Each figure is the
// median of `reps` timed copies after one untimed one. Allocates two device and two host
// buffers of `bytes` and frees them. Errors: InvalidArgument for bytes < 4096 or reps < 1; the
// backend's.
[[nodiscard]] absl::StatusOr<LinkFigures> MeasureLink(Backend& backend, std::int64_t bytes,
                                                      int reps);

}  // namespace pipeoffload::bench

#endif  // PIPEOFFLOAD_BENCH_PIPELINE_BENCH_LINK_H_
