// An SVG picture of a timeline, simulated or measured: what `po-schedule --format svg` draws and
// docs/pictures.md explains. A pure function of its inputs (no files, no clock), so the same
// timeline always gives the same bytes.
#ifndef PIPEOFFLOAD_TIMELINE_SVG_H_
#define PIPEOFFLOAD_TIMELINE_SVG_H_

#include <string>

#include "pipeoffload/schedule.h"
#include "pipeoffload/simulate.h"

namespace pipeoffload {

struct SvgOptions {
  // true: times are cost units and memory is counted in stash slots (--unit-costs).
  // false: times are seconds (the axis shows ms) and memory is bytes (labels show GiB).
  bool unit_costs = false;
};

// Draws `timeline` (of `schedule`, whose spec names the picture): a title and a legend; per
// stage a compute row of F / B / W blocks (colour = microbatch from a fixed 10-colour palette,
// shade = op kind, labelled with the microbatch where the block is wide enough), a D2H and an
// H2D lane when the timeline has offload transfers, a send and a recv lane when its P2P takes
// time (up to 16 stages; above that rows are thin and P2P is left out); a time axis; and per
// stage the device activation memory over time, its peak marked, plus the peak without
// offload (dashed) when the predictions have a higher one and the table's program-order peak
// when it differs from the curve's.
//
// The width follows the step time (a median compute block is about 28 px) and stays within
// [560, 1800] px of plot; the height follows the number of stages (about 3,000 px at p = 64).
//
// Structure (tests and scripts rely on it): one element per line; stage d's rows are the group
// <g id="stage-d">, its memory plot <g id="memory-d">; every compute, OFFLOAD and RELOAD op
// (and every P2P op when its lanes are drawn) is one <rect> whose class is its OpKindName ("F",
// "OFFLOAD", "SEND_F", ...) with a <title> tooltip; nothing else has such a class. Any timeline is accepted (empty, zero or non-finite times).
std::string TimelineToSvg(const Schedule& schedule, const Timeline& timeline,
                          const SvgOptions& options);

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_TIMELINE_SVG_H_
