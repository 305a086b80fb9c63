// What gpt_train's traced step says about the links (issue 7's checks on a real run): how many
// offload / reload copies overlapped in one direction of one host link (staggering), and how
// long each stage's P2P messages took (is P2P unaffected by offload? compare a run with and one
// without). Computed from the stages' measured last step, the one --trace writes.
#ifndef PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_LINKS_H_
#define PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_LINKS_H_

#include <cstdio>
#include <vector>

#include "absl/status/statusor.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/runtime.h"

namespace pipeoffload::gpt {

// One stage's P2P ops of the step: SEND spans run from posting to completion seen by the
// sender, RECV spans from posting to the data's arrival (so they include waiting for the
// peer's compute, and say little about the link alone).
struct P2PTimes {
  int sends = 0;
  int receives = 0;
  double send_seconds = 0.0;  // sum of the SEND spans
  double median_send_seconds = 0.0;
  double receive_seconds = 0.0;
  double median_receive_seconds = 0.0;
};

struct LinkReport {
  // Pairs of OFFLOAD (D2H) or RELOAD (H2D) copies that overlapped in time in one direction of
  // one host link, the stages of a link grouped as the plan's cost model groups them
  // (CountCollisions; host_link_group_size 1 = each stage its own link).
  int collisions = 0;
  int stages_per_link = 1;
  std::vector<P2PTimes> stages;  // [stage]
};

// The report of the stages' measured step (stats[d] of stage d), with links as `cost` has them.
// Errors: MeasuredTimeline's (InvalidArgument for stats out of stage order or empty).
[[nodiscard]] absl::StatusOr<LinkReport> MeasureLinks(const CostModel& cost,
                                                      const std::vector<IterationStats>& stats);

// "links (traced step): N overlapping copies in one direction of a host link (S stage(s) per
// link); P2P per stage: sends n, median x ms, total y ms; receives ..."
void PrintLinkReport(std::FILE* out, const LinkReport& report);

}  // namespace pipeoffload::gpt

#endif  // PIPEOFFLOAD_EXAMPLES_GPT_TRAIN_LINKS_H_
