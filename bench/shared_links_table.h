// offload_table --shared-links (issue 15, "Shared host links"): whether stages that share a host
// link plan as low a peak as stages on a link each.
#ifndef PIPEOFFLOAD_BENCH_SHARED_LINKS_TABLE_H_
#define PIPEOFFLOAD_BENCH_SHARED_LINKS_TABLE_H_

namespace pipeoffload::bench {

// Sweeps unit-cost group-interleaved plans (p in {4, 8, 16}, v in {1, 2, 4}, g in
// [ceil(p/2), p], selective offload of chunks [0, c) for c in 1..v, k in {0.25, 0.5, 0.75, 1},
// m = 4p, split backward) and prints, as markdown, per config the per-stage peaks (chunk units)
// with pairs sharing a host link (host_link_group_size 2) and on separate links (1), each
// stage's interval-cover bound (schedules/peak_bound.h), and the step both ways; then a summary:
// configs within one unit on every stage, the worst gap, steps that differ. `worst` >= 0 prints
// the summary and the `worst` rows with the largest gap only.
void PrintSharedLinksTable(int worst);

}  // namespace pipeoffload::bench

#endif  // PIPEOFFLOAD_BENCH_SHARED_LINKS_TABLE_H_
