// MeasureLinks and its line (see the header).
#include "examples/gpt/train_links.h"

#include <algorithm>

#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload::gpt {
namespace {

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

absl::StatusOr<LinkReport> MeasureLinks(const CostModel& cost,
                                        const std::vector<IterationStats>& stats) {
  absl::StatusOr<Timeline> timeline = MeasuredTimeline(stats);
  if (!timeline.ok()) return timeline.status();
  LinkReport report;
  const int p = static_cast<int>(stats.size());
  report.collisions = CountCollisions(*timeline, cost, p);
  report.stages_per_link = std::clamp(cost.host_link_group_size, 1, p);
  for (const std::vector<TimedOp>& stage : timeline->stages) {
    P2PTimes times;
    std::vector<double> sends;
    std::vector<double> receives;
    for (const TimedOp& timed : stage) {
      const double span = timed.end - timed.start;
      if (IsSend(timed.op.kind)) {
        sends.push_back(span);
        times.send_seconds += span;
      } else if (IsP2P(timed.op.kind)) {  // a receive
        receives.push_back(span);
        times.receive_seconds += span;
      }
    }
    times.sends = static_cast<int>(sends.size());
    times.receives = static_cast<int>(receives.size());
    times.median_send_seconds = Median(std::move(sends));
    times.median_receive_seconds = Median(std::move(receives));
    report.stages.push_back(times);
  }
  return report;
}

void PrintLinkReport(std::FILE* out, const LinkReport& report) {
  std::fprintf(out,
               "links (traced step): %d overlapping copies in one direction of a host link (%d "
               "stage(s) per link); P2P per stage:",
               report.collisions, report.stages_per_link);
  for (std::size_t d = 0; d < report.stages.size(); ++d) {
    const P2PTimes& t = report.stages[d];
    std::fprintf(out,
                 "%s %zu: sends %d, median %.3f ms, total %.1f ms; receives %d, median %.3f ms, "
                 "total %.1f ms",
                 d == 0 ? "" : ";", d, t.sends, 1e3 * t.median_send_seconds, 1e3 * t.send_seconds,
                 t.receives, 1e3 * t.median_receive_seconds, 1e3 * t.receive_seconds);
  }
  std::fprintf(out, "\n");
}

}  // namespace pipeoffload::gpt
