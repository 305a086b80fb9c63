// Tests of CoverIndex (schedules/cover_index.h) against the scan it replaces in CoverPoint: of
// the placements whose RELEASE key is before a point and RELOAD key after it
// (StagePlan::Covers), the one with the latest RELOAD key, equal ones the lowest rank. Random
// placements on few gaps and times, so that equal keys are common. Tag: [planner].
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "schedules/cover_index.h"
#include "schedules/offload_stage_plan.h"
#include "tests/testing/catch.h"

namespace pipeoffload::internal {
namespace {

// What CoverPoint scanned for: keys as StagePlan::ReleaseKey / ReloadKey give them, with the
// sequence number of the next commit (after `at`'s).
int ScanLatestCovering(const std::vector<std::optional<Placement>>& placed,
                       const std::vector<int>& rank, const ProgramKey& at) {
  const std::int64_t next = at.seq + 1;
  int best = -1;
  ProgramKey best_reload;
  for (int e = 0; e < static_cast<int>(placed.size()); ++e) {
    if (!placed[e]) continue;
    const Placement& p = *placed[e];
    const ProgramKey release{p.release_gap, false, p.release_time, p.release_rank, next + 1};
    const ProgramKey reload{p.reload_gap, false, p.reload_start, kRankReload, next + 2};
    if (!(release < at && at < reload)) continue;
    if (best < 0 || best_reload < reload || (!(reload < best_reload) && rank[e] < rank[best])) {
      best = e;
      best_reload = reload;
    }
  }
  return best;
}

TEST_CASE("CoverIndex answers as the scan of every placement does", "[planner]") {
  std::mt19937 rng(15);
  const int gaps = 40, entries = 30;
  const auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  for (int round = 0; round < 200; ++round) {
    CoverIndex index(gaps, entries);
    std::vector<std::optional<Placement>> placed(entries);
    std::vector<int> rank(entries);
    for (int e = 0; e < entries; ++e) rank[e] = (e * 7) % entries;
    for (int step = 0; step < 100; ++step) {
      const int e = pick(entries);
      if (pick(4) == 0) {
        index.Drop(e);
        placed[e].reset();
      } else {
        Placement p;
        p.release_gap = pick(gaps - 1);
        p.release_time = pick(3);
        p.release_rank = pick(2) == 0 ? kRankRelease : kRankOffload;
        p.reload_gap = p.release_gap + pick(gaps - p.release_gap);
        p.reload_start = pick(3);
        index.Put(e, rank[e], p);
        placed[e] = p;
      }
      const ProgramKey at{pick(gaps), pick(3) == 0, static_cast<double>(pick(3)), pick(4),
                          pick(1000)};
      REQUIRE(index.LatestCovering(at) == ScanLatestCovering(placed, rank, at));
    }
  }
}

}  // namespace
}  // namespace pipeoffload::internal
