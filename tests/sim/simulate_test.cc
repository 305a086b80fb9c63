// Simulate and CountCollisions: exact start/end times of hand-built schedules (non-blocking
// P2P posts and their transfers, engines, offload timing, duplex vs solo bandwidth, a shared
// copy engine), collisions, memory peaks and samples (in program order and in time, with the
// hand-worked 1F1B p=4 m=4 po-h case where they differ), link traffic, hangs and bad input; 1F1B
// unit-cost properties over many configs; speed. Cases tagged [compiler] run the real compiler.
#include "pipeoffload/simulate.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lib/sim/simulate_parts.h"
#include "pipeoffload/compiler.h"
#include "pipeoffload/cost_model.h"
#include "pipeoffload/schedule.h"
#include "pipeoffload/validate.h"
#include "tests/testing/catch.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using Catch::Approx;

using namespace ::pipeoffload::testing;  // F(...), SendF(...), Make(...)

// F = 1, B = 2 (1.5 input + 0.5 weight gradient, unsplit); 100-byte entries moved at 50 bytes
// per unit alone (2 units) and 25 while the other direction runs (4 units); free P2P.
CostModel SmallCost() {
  CostModel cost;
  cost.forward_time = 1.0;
  cost.backward_time = 1.5;
  cost.weight_time = 0.5;
  cost.activation_bytes = 100;
  cost.boundary_bytes = 0;
  cost.p2p_latency = 0.0;
  cost.p2p_bandwidth = 1e9;
  cost.d2h_bandwidth = 50.0;
  cost.h2d_bandwidth = 50.0;
  cost.duplex_bandwidth = 25.0;
  cost.host_link_group_size = 1;
  return cost;
}

Timeline MustSimulate(const Schedule& schedule, const CostModel& cost) {
  REQUIRE(Validate(schedule).ok());
  absl::StatusOr<Timeline> timeline = Simulate(schedule, cost);
  INFO(timeline.status().message());
  REQUIRE(timeline.ok());
  return *std::move(timeline);
}

// Requires op `index` of `stage` to run on `engine` over [start, end].
void CheckOp(const Timeline& t, int stage, int index, Engine engine, double start, double end) {
  const TimedOp& op = t.stages[static_cast<std::size_t>(stage)][static_cast<std::size_t>(index)];
  CAPTURE(stage, index, OpToString(op.op));
  CHECK(op.stage == stage);
  CHECK(op.index == index);
  CHECK(op.engine == engine);
  CHECK(op.start == Approx(start));
  CHECK(op.end == Approx(end));
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }
bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// p=2, m=2 1F1B with comm in a rendezvous-safe order.
Schedule OneFOneB() {
  return Make(2, 2, 1, false,
              {{F(0), SendF(0, 1), F(1), SendF(1, 1), RecvB(0, 1), B(0), RecvB(1, 1), B(1)},
               {RecvF(0, 0), F(0), B(0), RecvF(1, 0), SendB(0, 0), F(1), B(1), SendB(1, 0)}});
}

TEST_CASE("EngineName", "[sim]") {
  CHECK(EngineName(Engine::kCompute) == "compute");
  CHECK(EngineName(Engine::kSend) == "send");
  CHECK(EngineName(Engine::kRecv) == "recv");
  CHECK(EngineName(Engine::kD2H) == "D2H");
  CHECK(EngineName(Engine::kH2D) == "H2D");
  CHECK(EngineName(Engine::kNone) == "none");
}

TEST_CASE("1F1B p=2 m=2 with comm cost: exact times, rendezvous waits", "[sim]") {
  CostModel cost = SmallCost();
  cost.boundary_bytes = 100;
  cost.p2p_bandwidth = 400.0;  // 0.25 per message
  cost.p2p_latency = 0.25;     // + 0.25 = 0.5
  const Timeline t = MustSimulate(OneFOneB(), cost);
  // Stage 0: SEND_F1 is issued at 1 and its F ends at 2, but stage 1 issues RECV_F1 only when
  // its B0 starts (2.5); RECV_B0 waits for stage 1's B0 to end (4.5).
  CheckOp(t, 0, 0, Engine::kCompute, 0.0, 1.0);
  CheckOp(t, 0, 1, Engine::kSend, 1.0, 1.5);
  CheckOp(t, 0, 2, Engine::kCompute, 1.0, 2.0);
  CheckOp(t, 0, 3, Engine::kSend, 2.5, 3.0);
  CheckOp(t, 0, 4, Engine::kRecv, 4.5, 5.0);
  CheckOp(t, 0, 5, Engine::kCompute, 5.0, 7.0);
  CheckOp(t, 0, 6, Engine::kRecv, 7.5, 8.0);
  CheckOp(t, 0, 7, Engine::kCompute, 8.0, 10.0);
  CheckOp(t, 1, 0, Engine::kRecv, 1.0, 1.5);
  CheckOp(t, 1, 1, Engine::kCompute, 1.5, 2.5);
  CheckOp(t, 1, 2, Engine::kCompute, 2.5, 4.5);
  CheckOp(t, 1, 3, Engine::kRecv, 2.5, 3.0);
  CheckOp(t, 1, 4, Engine::kSend, 4.5, 5.0);
  CheckOp(t, 1, 5, Engine::kCompute, 4.5, 5.5);
  CheckOp(t, 1, 6, Engine::kCompute, 5.5, 7.5);
  CheckOp(t, 1, 7, Engine::kSend, 7.5, 8.0);
  CHECK(t.stages[0][1].bytes == 100);
  CHECK(t.stages[0][0].bytes == 0);

  const Predictions& p = t.predictions;
  CHECK(p.step_time == Approx(10.0));
  CHECK(p.step_time_without_offload == Approx(10.0));
  CHECK(p.bubble_ratio == Approx(1.0 - 12.0 / 20.0));
  REQUIRE(p.stages.size() == 2);
  CHECK(p.stages[0].busy_time == Approx(6.0));
  CHECK(p.stages[1].busy_time == Approx(6.0));
  CHECK(p.stages[0].end_time == Approx(10.0));
  CHECK(p.stages[1].end_time == Approx(8.0));
  CHECK(p.stages[0].peak_units == 2);
  CHECK(p.stages[1].peak_units == 1);
  CHECK(p.stages[0].peak_bytes == 200);
  CHECK(p.collisions == 0);
  REQUIRE(p.links.size() == 4);
  CHECK(p.links[0] == LinkTraffic{"host:0", 0, 0});
  CHECK(p.links[1] == LinkTraffic{"host:1", 0, 0});
  CHECK(p.links[2] == LinkTraffic{"p2p:0->1", 200, 0});
  CHECK(p.links[3] == LinkTraffic{"p2p:1->0", 200, 0});
  // host links are listed for every group; P2P links in (from, to) order.
  cost.host_link_group_size = 2;
  const Timeline grouped = MustSimulate(OneFOneB(), cost);
  REQUIRE(grouped.predictions.links.size() == 3);
  CHECK(grouped.predictions.links[0].name == "host:0");
  CHECK(grouped.predictions.links[1] == LinkTraffic{"p2p:0->1", 200, 0});
  CHECK(grouped.predictions.links[2] == LinkTraffic{"p2p:1->0", 200, 0});
}

TEST_CASE("an early RECV is a post: it holds up nothing behind it", "[sim]") {
  CostModel cost = SmallCost();
  cost.boundary_bytes = 100;
  cost.p2p_bandwidth = 400.0;  // 0.25 per message
  cost.p2p_latency = 0.25;     // + 0.25 = 0.5
  // Stage 0 posts RECV_B0 before F1. Under blocking rendezvous that RECV would hold F1 until
  // stage 1 sends its gradient (4.5), and SEND_F1 would then deadlock against stage 1's RECV_F1,
  // which comes before its SEND_B0: Validate (blocking, the strongest check) rejects the order.
  // The runtime posts both and moves on, and so does the simulator.
  const Schedule s =
      Make(2, 2, 1, false,
           {{F(0), SendF(0, 1), RecvB(0, 1), F(1), SendF(1, 1), B(0), RecvB(1, 1), B(1)},
            {RecvF(0, 0), F(0), B(0), RecvF(1, 0), SendB(0, 0), F(1), B(1), SendB(1, 0)}});
  CHECK(Has(Message(Validate(s)), "(deadlock)"));
  const absl::StatusOr<Timeline> simulated = Simulate(s, cost);
  INFO(simulated.status().message());
  REQUIRE(simulated.ok());
  const Timeline& t = *simulated;
  CheckOp(t, 0, 0, Engine::kCompute, 0.0, 1.0);
  CheckOp(t, 0, 1, Engine::kSend, 1.0, 1.5);   // posted at 0; F0 ends at 1
  CheckOp(t, 0, 2, Engine::kRecv, 4.5, 5.0);   // posted at 0; stage 1's B0 ends at 4.5
  CheckOp(t, 0, 3, Engine::kCompute, 1.0, 2.0);  // F1 right after F0
  CheckOp(t, 0, 4, Engine::kSend, 2.5, 3.0);   // stage 1 posts RECV_F1 when its B0 starts
  CheckOp(t, 0, 5, Engine::kCompute, 5.0, 7.0);  // B0 waits for its gradient
  CheckOp(t, 0, 6, Engine::kRecv, 7.5, 8.0);
  CheckOp(t, 0, 7, Engine::kCompute, 8.0, 10.0);
  CheckOp(t, 1, 3, Engine::kRecv, 2.5, 3.0);
  CheckOp(t, 1, 4, Engine::kSend, 4.5, 5.0);
  CheckOp(t, 1, 5, Engine::kCompute, 4.5, 5.5);
  CHECK(t.predictions.step_time == Approx(10.0));
}

TEST_CASE("a transfer starts when both ends are posted, its data exists and engines free",
          "[sim]") {
  CostModel cost = SmallCost();
  cost.boundary_bytes = 100;
  cost.p2p_bandwidth = 100.0;  // 1 unit per message
  // Stage 0 sends F0 and F1 back to back; stage 1 posts both receives first. SEND_F1 is posted
  // at 1 (F1's start) and its data exists at 2, but the send engine is busy with SEND_F0 until
  // 2 (F0 ends at 1): both bounds meet at 2. Stage 1's F0 waits only for its own message.
  const Schedule s =
      Make(2, 2, 1, false,
           {{F(0), SendF(0, 1), F(1), SendF(1, 1), RecvB(0, 1), B(0), RecvB(1, 1), B(1)},
            {RecvF(0, 0), RecvF(1, 0), F(0), B(0), SendB(0, 0), F(1), B(1), SendB(1, 0)}});
  const Timeline t = MustSimulate(s, cost);
  CheckOp(t, 0, 1, Engine::kSend, 1.0, 2.0);
  CheckOp(t, 0, 3, Engine::kSend, 2.0, 3.0);
  CheckOp(t, 1, 0, Engine::kRecv, 1.0, 2.0);
  CheckOp(t, 1, 1, Engine::kRecv, 2.0, 3.0);  // the recv engine also frees at 2
  CheckOp(t, 1, 2, Engine::kCompute, 2.0, 3.0);
  CheckOp(t, 1, 3, Engine::kCompute, 3.0, 5.0);
  CheckOp(t, 1, 4, Engine::kSend, 5.0, 6.0);  // posted at 3 (B0's start); B0 ends at 5
  CheckOp(t, 1, 5, Engine::kCompute, 5.0, 6.0);  // F1's input arrived at 3
  CheckOp(t, 1, 6, Engine::kCompute, 6.0, 8.0);
  CheckOp(t, 1, 7, Engine::kSend, 8.0, 9.0);
  CheckOp(t, 0, 4, Engine::kRecv, 5.0, 6.0);
  CheckOp(t, 0, 5, Engine::kCompute, 6.0, 8.0);
  CheckOp(t, 0, 6, Engine::kRecv, 8.0, 9.0);
  CheckOp(t, 0, 7, Engine::kCompute, 9.0, 11.0);
  CHECK(t.predictions.step_time == Approx(11.0));
}

TEST_CASE("P2P engines serialise messages", "[sim]") {
  CostModel cost = SmallCost();
  cost.boundary_bytes = 100;
  cost.p2p_bandwidth = 50.0;  // 2 units per message
  const Schedule s =
      Make(2, 2, 1, false,
           {{F(0), F(1), SendF(0, 1), SendF(1, 1), RecvB(0, 1), B(0), RecvB(1, 1), B(1)},
            {RecvF(0, 0), RecvF(1, 0), F(0), B(0), SendB(0, 0), F(1), B(1), SendB(1, 0)}});
  const Timeline t = MustSimulate(s, cost);
  CheckOp(t, 0, 2, Engine::kSend, 1.0, 3.0);
  CheckOp(t, 0, 3, Engine::kSend, 3.0, 5.0);  // its F ended at 2; the send engine frees at 3
  CheckOp(t, 1, 1, Engine::kRecv, 3.0, 5.0);
  CheckOp(t, 1, 2, Engine::kCompute, 3.0, 4.0);  // waits for RECV_F0 only
}

TEST_CASE("offload timing: D2H after F, RELEASE waits for D2H, B waits for RELOAD", "[sim]") {
  CostModel cost = SmallCost();
  cost.d2h_bandwidth = cost.h2d_bandwidth = 25.0;  // 4 units per entry
  cost.duplex_bandwidth = 10.0;
  const Schedule s =
      Make(1, 2, 1, false, {{F(0), Offload(0), F(1), Release(0), B(1), Reload(0), B(0)}});
  const Timeline t = MustSimulate(s, cost);
  CheckOp(t, 0, 0, Engine::kCompute, 0.0, 1.0);
  CheckOp(t, 0, 1, Engine::kD2H, 1.0, 5.0);  // issued at 0, starts when F0 ends
  CheckOp(t, 0, 2, Engine::kCompute, 1.0, 2.0);
  CheckOp(t, 0, 3, Engine::kNone, 5.0, 5.0);      // RELEASE waits for the D2H ...
  CheckOp(t, 0, 4, Engine::kCompute, 5.0, 7.0);   // ... and gates the ops after it
  CheckOp(t, 0, 5, Engine::kH2D, 5.0, 9.0);       // solo: the D2H ended at 5
  CheckOp(t, 0, 6, Engine::kCompute, 9.0, 11.0);  // B0 waits for its RELOAD
  CHECK(t.stages[0][1].bytes == 100);
  CHECK(t.stages[0][5].bytes == 100);

  const Predictions& p = t.predictions;
  CHECK(p.step_time == Approx(11.0));
  CHECK(p.step_time_without_offload == Approx(6.0));  // F0 F1 B1 B0 back to back
  CHECK(p.stages[0].peak_units == 2);
  CHECK(p.stages[0].peak_bytes == 200);
  CHECK(p.stages[0].peak_units_without_offload == 2);
  CHECK(p.stages[0].host_bytes == 100);
  CHECK(p.stages[0].offloaded_bytes == 100);
  REQUIRE(p.links.size() == 1);
  CHECK(p.links[0] == LinkTraffic{"host:0", 100, 100});

  // Memory samples in time order: F allocates at its start, RELEASE frees at its time, RELOAD
  // allocates at its start, B frees at its end.
  const std::vector<MemorySample>& samples = t.memory[0];
  const std::vector<std::vector<double>> expected = {{0, 100, 1}, {1, 200, 2}, {5, 100, 1},
                                                     {5, 200, 2}, {7, 100, 1}, {11, 0, 0}};
  REQUIRE(samples.size() == expected.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    CAPTURE(i);
    CHECK(samples[i].time == Approx(expected[i][0]));
    CHECK(samples[i].bytes == static_cast<std::int64_t>(expected[i][1]));
    CHECK(samples[i].units == static_cast<std::int64_t>(expected[i][2]));
  }
}

// Offloads mb 0 and 1, reloads 0 while mb 1's D2H runs (duplex), then 1 alone (solo).
Schedule DuplexProbe() {
  return Make(1, 3, 1, false,
              {{F(0), Offload(0), F(1), Offload(1), F(2), Release(0), B(2), Reload(0), Release(1),
                B(0), Reload(1), B(1)}});
}

TEST_CASE("duplex vs solo bandwidth", "[sim]") {
  const Timeline t = MustSimulate(DuplexProbe(), SmallCost());
  CheckOp(t, 0, 1, Engine::kD2H, 1.0, 3.0);  // solo: 100 / 50
  CheckOp(t, 0, 3, Engine::kD2H, 3.0, 5.0);  // waits for the D2H engine; H2D idle: solo
  CheckOp(t, 0, 7, Engine::kH2D, 4.0, 8.0);  // starts inside OFFLOAD1: duplex, 100 / 25
  CheckOp(t, 0, 9, Engine::kCompute, 8.0, 10.0);
  CheckOp(t, 0, 10, Engine::kH2D, 8.0, 10.0);  // D2H idle again: solo
  CheckOp(t, 0, 11, Engine::kCompute, 10.0, 12.0);
  CHECK(t.predictions.step_time == Approx(12.0));
}

TEST_CASE("a shared copy engine serialises D2H and H2D", "[sim]") {
  CostModel cost = SmallCost();
  cost.shared_copy_engine = true;
  const Timeline t = MustSimulate(DuplexProbe(), cost);
  CheckOp(t, 0, 3, Engine::kD2H, 3.0, 5.0);
  CheckOp(t, 0, 7, Engine::kH2D, 5.0, 7.0);  // waits for OFFLOAD1; then alone: solo
  CheckOp(t, 0, 9, Engine::kCompute, 7.0, 9.0);
  CheckOp(t, 0, 10, Engine::kH2D, 7.0, 9.0);
  CHECK(t.predictions.step_time == Approx(11.0));
  // No two copies of the stage overlap, whatever their direction.
  std::vector<std::pair<double, double>> copies;
  for (const TimedOp& op : t.stages[0]) {
    if (op.engine == Engine::kD2H || op.engine == Engine::kH2D) {
      copies.push_back({op.start, op.end});
    }
  }
  std::sort(copies.begin(), copies.end());
  for (std::size_t i = 1; i < copies.size(); ++i) CHECK(copies[i].first >= copies[i - 1].second);
}

// Both stages of a pair offload their one entry; stage 0 reloads only after stage 1's B.
Schedule PairOffload(bool staggered) {
  if (!staggered) {
    return Make(2, 1, 1, false,
                {{F(0), Offload(0), SendF(0, 1), Release(0), RecvB(0, 1), Reload(0), B(0)},
                 {RecvF(0, 0), F(0), Offload(0), Release(0), Reload(0), B(0), SendB(0, 0)}});
  }
  // A BARRIER pair holds stage 1's D2H until stage 0's has finished.
  return Make(
      2, 1, 1, false,
      {{F(0), Offload(0), SendF(0, 1), Release(0), Barrier(1), RecvB(0, 1), Reload(0), B(0)},
       {RecvF(0, 0), F(0), Barrier(0), Offload(0), Release(0), Reload(0), B(0), SendB(0, 0)}});
}

TEST_CASE("collisions: two stages of one link group offloading at once", "[sim]") {
  CostModel cost = SmallCost();
  cost.host_link_group_size = 2;
  const Timeline t = MustSimulate(PairOffload(false), cost);
  CheckOp(t, 0, 1, Engine::kD2H, 1.0, 3.0);
  CheckOp(t, 1, 2, Engine::kD2H, 2.0, 4.0);  // overlaps stage 0's D2H on host link 0
  CheckOp(t, 1, 4, Engine::kH2D, 4.0, 6.0);
  // Stage 0's RECV_B0 is only posted, so its RELOAD starts right after the RELEASE, while
  // stage 1's D2H still runs: duplex, 100 / 25. It overlaps stage 1's H2D (4..6) too.
  CheckOp(t, 0, 5, Engine::kH2D, 3.0, 7.0);
  CheckOp(t, 0, 6, Engine::kCompute, 8.0, 10.0);  // B0 waits for the gradient (B0 on 1 ends 8)
  CHECK(t.predictions.collisions == 2);
  CHECK(CountCollisions(t, cost, 2) == 2);
  REQUIRE(t.predictions.links.size() == 3);
  CHECK(t.predictions.links[0] == LinkTraffic{"host:0", 200, 200});

  SECTION("one link per stage: no collision") {
    cost.host_link_group_size = 1;
    const Timeline solo = MustSimulate(PairOffload(false), cost);
    CHECK(solo.predictions.collisions == 0);
    CHECK(solo.predictions.links[0] == LinkTraffic{"host:0", 100, 100});
    CHECK(solo.predictions.links[1] == LinkTraffic{"host:1", 100, 100});
  }
  SECTION("staggered by a BARRIER: no collision") {
    const Timeline staggered = MustSimulate(PairOffload(true), cost);
    CheckOp(staggered, 0, 4, Engine::kNone, 3.0, 3.0);
    CheckOp(staggered, 1, 2, Engine::kNone, 3.0, 3.0);  // waits for stage 0's BARRIER
    // Stage 1's D2H starts as stage 0's D2H ends; stage 0's RELOAD starts then too (3..5,
    // solo: the D2H of 0..3 just ended), so this one runs duplex.
    CheckOp(staggered, 0, 6, Engine::kH2D, 3.0, 5.0);
    CheckOp(staggered, 1, 3, Engine::kD2H, 3.0, 7.0);
    CHECK(staggered.predictions.collisions == 0);
    CHECK(staggered.predictions.step_time == Approx(13.0));
  }
}

TEST_CASE("duplex across a shared host link", "[sim]") {
  // Stage 0 reloads right after its release while stage 1's D2H (2..4) runs on the same link.
  const Schedule s =
      Make(2, 1, 1, false,
           {{F(0), Offload(0), SendF(0, 1), Release(0), Reload(0), RecvB(0, 1), B(0)},
            {RecvF(0, 0), F(0), Offload(0), Release(0), Reload(0), B(0), SendB(0, 0)}});
  CostModel cost = SmallCost();
  cost.host_link_group_size = 2;
  const Timeline shared = MustSimulate(s, cost);
  CheckOp(shared, 0, 4, Engine::kH2D, 3.0, 7.0);  // duplex: 100 / 25
  CHECK(shared.predictions.collisions == 2);      // both D2H (1..3, 2..4) and H2D (3..7, 4..6)
  cost.host_link_group_size = 1;
  const Timeline own = MustSimulate(s, cost);
  CheckOp(own, 0, 4, Engine::kH2D, 3.0, 5.0);  // its own link's D2H is idle: solo
  CHECK(own.predictions.collisions == 0);
}


TEST_CASE("CountCollisions counts overlapping pairs per link direction", "[sim]") {
  Timeline t;
  t.stages = {
      {Timed(0, OpKind::kOffload, 0, 2), Timed(0, OpKind::kSendActivation, 1, 3, 1)},
      {Timed(1, OpKind::kReload, 2.5, 4), Timed(1, OpKind::kRecvActivation, 1, 3, 0)}};
  CostModel cost;
  cost.host_link_group_size = 1;
  cost.p2p_shares_host_link = false;
  CHECK(CountCollisions(t, cost, 2) == 0);
  cost.p2p_shares_host_link = true;  // the SEND is D2H on link 0 and H2D on link 1
  CHECK(CountCollisions(t, cost, 2) == 2);
  cost.host_link_group_size = 2;  // one link: D2H OFFLOAD x SEND, H2D SEND x RELOAD
  CHECK(CountCollisions(t, cost, 2) == 2);

  Timeline three;
  three.stages = {{Timed(0, OpKind::kOffload, 0, 3)},
                  {Timed(1, OpKind::kOffload, 1, 4)},
                  {Timed(2, OpKind::kOffload, 2, 5)},
                  {Timed(3, OpKind::kOffload, 4.5, 6)}};
  cost.host_link_group_size = 4;
  CHECK(CountCollisions(three, cost, 4) == 4);  // (0,1) (0,2) (1,2) (2,3)
  cost.host_link_group_size = 2;
  CHECK(CountCollisions(three, cost, 4) == 2);  // (0,1) on link 0, (2,3) on link 1

  Timeline touching;
  touching.stages = {{Timed(0, OpKind::kOffload, 0, 2)},
                     {Timed(1, OpKind::kOffload, 2, 4), Timed(1, OpKind::kReload, 0, 4)}};
  CHECK(CountCollisions(touching, cost, 2) == 0);  // end-to-start, and opposite directions
  touching.stages[1][0].start = 2.0 - 1e-13;       // rounding, not an overlap
  CHECK(CountCollisions(touching, cost, 2) == 0);
  touching.stages[1][0].start = 1.9;
  CHECK(CountCollisions(touching, cost, 2) == 1);
}

TEST_CASE("memory peaks with and without offload, per-virtual-stage bytes", "[sim]") {
  SECTION("full offload keeps one entry resident") {
    const Schedule s = Make(1, 3, 1, false,
                            {{F(0), Offload(0), Release(0), F(1), Offload(1), Release(1), F(2),
                              B(2), Reload(1), B(1), Reload(0), B(0)}});
    const Timeline t = MustSimulate(s, SmallCost());
    const StagePrediction& stage = t.predictions.stages[0];
    CHECK(stage.peak_units == 1);
    CHECK(stage.peak_bytes == 100);
    CHECK(stage.peak_units_without_offload == 3);
    CHECK(stage.peak_bytes_without_offload == 300);
    CHECK(stage.host_bytes == 200);  // entries 0 and 1 are on the host at once
    CHECK(stage.offloaded_bytes == 200);
    CHECK(t.memory[0].back().bytes == 0);
  }
  SECTION("bytes follow the virtual stage: 1F1B") {
    CostModel cost = SmallCost();
    cost.activation_bytes_per_virtual_stage = {300, 700};
    const Timeline t = MustSimulate(OneFOneB(), cost);
    CHECK(t.predictions.stages[0].peak_bytes == 600);
    CHECK(t.predictions.stages[1].peak_bytes == 700);
  }
  SECTION("bytes follow the virtual stage: two chunks on one stage") {
    CostModel cost = SmallCost();
    cost.activation_bytes_per_virtual_stage = {100, 300};
    const Schedule s =
        Make(1, 1, 2, false,
             {{F(0, 0), Offload(0, 0), Release(0, 0), F(0, 1), B(0, 1), Reload(0, 0), B(0, 0)}});
    const Timeline t = MustSimulate(s, cost);
    const StagePrediction& stage = t.predictions.stages[0];
    CHECK(stage.peak_units == 1);
    CHECK(stage.peak_bytes == 300);
    CHECK(stage.peak_units_without_offload == 2);
    CHECK(stage.peak_bytes_without_offload == 400);
    CHECK(stage.host_bytes == 100);
    CHECK(t.stages[0][1].bytes == 100);  // OFFLOAD of chunk 0 moves chunk 0's bytes
    CHECK(t.stages[0][1].end - t.stages[0][1].start == Approx(2.0));
  }
  SECTION("split backward frees at W") {
    const Schedule s = Make(1, 2, 1, true, {{F(0), F(1), B(0), B(1), W(0), W(1)}});
    const Timeline t = MustSimulate(s, SmallCost());
    CHECK(t.predictions.stages[0].peak_units == 2);
    // F0 F1 at 0 and 1; B0 1.5 (2..3.5), B1 (3.5..5), W0 (5..5.5), W1 (5.5..6).
    CHECK(t.memory[0].size() == 4);
    CHECK(t.memory[0][2].time == Approx(5.5));
    CHECK(t.memory[0][2].units == 1);
  }
}

TEST_CASE("hangs and bad input are clear errors", "[sim]") {
  SECTION("SEND without RECV hangs") {
    Schedule s = OneFOneB();
    s.stages[1].ops.erase(s.stages[1].ops.begin() + 3);  // RECV_F1 on stage 1
    const absl::Status status = Simulate(s, SmallCost()).status();
    INFO(Message(status));
    REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(Message(status), "hang"));
    // Stage 0 posts SEND_F1 and runs on until B1 needs a gradient stage 1 never sends.
    CHECK(Has(Message(status), "stage 0 op 3 SEND_F1.0->1 has no partner on stage 1"));
    CHECK(Has(Message(status), "stage 1 op 4 F1.0 needs RECV_F1.0, which is not in its program"));
    CHECK(Has(Message(status),
              "stage 0 op 7 B1.0 waits for the transfer of RECV_B1.0<-1 (op 6), which waits for "
              "its partner SEND_B1.0->0 (stage 1 op 6), but stage 1 is at op 4"));
    CHECK(Has(Message(status), "SEND_F1.0->1 *"));
  }
  SECTION("both stages SEND first: a blocking deadlock, but posts run through") {
    Schedule s = OneFOneB();
    std::swap(s.stages[1].ops[3], s.stages[1].ops[4]);  // stage 1: SEND_B0 before RECV_F1
    CHECK(Has(Message(Validate(s)), "(deadlock)"));
    const absl::StatusOr<Timeline> t = Simulate(s, SmallCost());
    INFO(t.status().message());
    REQUIRE(t.ok());
    // Free P2P: B0 on stage 1 ends at 4 and stage 0's B0 runs 4..6; stage 1's F1 (4..5) had
    // its input since 2.
    CheckOp(*t, 1, 3, Engine::kSend, 4.0, 4.0);
    CheckOp(*t, 1, 4, Engine::kRecv, 2.0, 2.0);
    CheckOp(*t, 0, 5, Engine::kCompute, 4.0, 6.0);
    CheckOp(*t, 1, 5, Engine::kCompute, 4.0, 5.0);
  }
  SECTION("a cycle through data hangs") {
    // Stage 0 sends F0's output only after B0, which needs stage 1's gradient, which needs F0.
    const Schedule s = Make(2, 1, 1, false,
                            {{F(0), RecvB(0, 1), B(0), SendF(0, 1)},
                             {RecvF(0, 0), F(0), B(0), SendB(0, 0)}});
    const absl::Status status = Simulate(s, SmallCost()).status();
    INFO(Message(status));
    REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(Message(status),
              "stage 0 op 2 B0.0 waits for the transfer of RECV_B0.0<-1 (op 1), which waits for "
              "its partner SEND_B0.0->0 (stage 1 op 3), but stage 1 is at op 1"));
    CHECK(Has(Message(status),
              "stage 1 op 1 F0.0 waits for the transfer of RECV_F0.0<-0 (op 0), which waits for "
              "its partner SEND_F0.0->1 (stage 0 op 3), but stage 0 is at op 2"));
    CHECK(Has(Message(status), "(* = blocked op)"));
    CHECK(Has(Message(Validate(s)), "(deadlock)"));
  }
  SECTION("receives in the wrong order hang: each engine keeps program order") {
    const Schedule s =
        Make(2, 2, 1, false,
             {{F(0), F(1), SendF(0, 1), SendF(1, 1), RecvB(0, 1), B(0), RecvB(1, 1), B(1)},
              {RecvF(1, 0), RecvF(0, 0), F(0), B(0), SendB(0, 0), F(1), B(1), SendB(1, 0)}});
    const absl::Status status = Simulate(s, SmallCost()).status();
    INFO(Message(status));
    REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(Message(status),
              "stage 1 op 2 F0.0 waits for the transfer of RECV_F0.0<-0 (op 1), which queues on "
              "stage 1's recv engine behind RECV_F1.0<-0 (stage 1 op 0)"));
    CHECK(Has(Message(status),
              "stage 0 op 2 SEND_F0.0->1 waits for its partner RECV_F0.0<-0 (stage 1 op 1), "
              "which queues behind RECV_F1.0<-0 (stage 1 op 0)"));
    CHECK(Has(Message(Validate(s)), "(deadlock)"));
  }
  SECTION("B before its RELOAD never starts") {
    const Schedule s = Make(1, 1, 1, false, {{F(0), Offload(0), Release(0), B(0), Reload(0)}});
    const absl::Status status = Simulate(s, SmallCost()).status();
    INFO(Message(status));
    REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(Message(status), "B0.0 needs RELOAD0.0, which comes later, at op 4"));
  }
  SECTION("malformed schedule") {
    Schedule s = OneFOneB();
    s.stages[0].ops[2].mb = 7;
    const absl::Status status = Simulate(s, SmallCost()).status();
    INFO(Message(status));
    REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(Message(status), "malformed"));
    CHECK(Has(Message(status), "mb 7 is not in [0, 2)"));
  }
  SECTION("malformed schedule, without its transfers") {
    // The planner runs StepTimeWithoutTransfers beside the simulation of a plan it has not yet
    // validated: it must refuse a bad schedule on its own, not index out of range.
    Schedule s = Make(1, 1, 1, false, {{F(0), Offload(0), Release(0), Reload(0), B(0)}});
    s.stages[0].ops[4].mb = 7;
    const absl::StatusOr<double> step = internal::StepTimeWithoutTransfers(s, SmallCost());
    INFO(Message(step.status()));
    REQUIRE(step.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(Message(step.status()), "the programs without offload ops"));
    CHECK(Has(Message(step.status()), "mb 7 is not in [0, 1)"));
  }
  SECTION("duplicate op") {
    Schedule s = OneFOneB();
    s.stages[0].ops.push_back(B(1));
    const absl::Status status = Simulate(s, SmallCost()).status();
    REQUIRE(status.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Has(Message(status), "duplicate B1.0"));
  }
  SECTION("bad cost models") {
    CostModel cost = SmallCost();
    cost.d2h_bandwidth = 0.0;
    absl::Status status = Simulate(OneFOneB(), cost).status();
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Has(Message(status), "d2h_bandwidth must be > 0"));
    cost = SmallCost();
    cost.activation_bytes_per_virtual_stage = {1, 2, 3};
    status = Simulate(OneFOneB(), cost).status();
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Has(Message(status), "activation_bytes_per_virtual_stage has 3 entries"));
    cost = SmallCost();
    cost.host_link_group_size = 0;
    CHECK(Has(Message(Simulate(OneFOneB(), cost).status()), "host_link_group_size"));
    cost = SmallCost();
    cost.forward_time = -1.0;
    CHECK(Has(Message(Simulate(OneFOneB(), cost).status()), "forward_time"));
    cost = SmallCost();
    cost.stage_time_scale = {1.0};
    CHECK(Has(Message(Simulate(OneFOneB(), cost).status()), "stage_time_scale"));
  }
}

// --- generated schedules ------------------------------------------------------------------

// A per-stage compute order lowered by list scheduling under free P2P: compute ops are placed
// in order of their earliest start, and each SEND is appended, together with its RECV on the
// receiver, at the time its producer ends (before any op that starts then). Every SEND/RECV
// pair is adjacent in that global order, so the programs are deadlock-free, and no op waits on
// a RECV placed ahead of it: the simulated makespan is the list schedule's.
Schedule LowerByTime(const PipelineSpec& spec, const std::vector<std::vector<Op>>& order,
                     const CostModel& cost, int offload_chunks) {
  const int p = spec.num_stages, m = spec.num_microbatches, num_virtual = spec.num_virtual_stages();
  Schedule schedule;
  schedule.spec = spec;
  for (int d = 0; d < p; ++d) schedule.stages.push_back({d, {}});
  const auto program = [&](int d) -> std::vector<Op>& {
    return schedule.stages[static_cast<std::size_t>(d)].ops;
  };
  std::vector<double> free(static_cast<std::size_t>(p), 0.0);
  // end[0][l * m + mb]: when F of virtual stage l ends; end[1]: its B; -1 = not placed yet.
  std::vector<std::vector<double>> end(
      2, std::vector<double>(static_cast<std::size_t>(num_virtual * m), -1.0));
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  const auto key = [m](int l, int mb) { return static_cast<std::size_t>(l * m + mb); };
  // Messages waiting for their producer to end: (time, placement order, sender, SEND op).
  struct Message {
    double time;
    long long seq;
    int from;
    Op send;
    bool operator>(const Message& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };
  std::priority_queue<Message, std::vector<Message>, std::greater<>> messages;
  long long seq = 0;
  const auto flush = [&](double until) {
    while (!messages.empty() && messages.top().time <= until) {
      const Message msg = messages.top();
      messages.pop();
      const int l = msg.send.chunk * p + msg.from;
      const int to_l = msg.send.kind == OpKind::kSendActivation ? l + 1 : l - 1;
      program(msg.from).push_back(msg.send);
      const Op recv{
          msg.send.kind == OpKind::kSendActivation ? OpKind::kRecvActivation : OpKind::kRecvGrad,
          msg.send.mb, to_l / p, msg.from};
      program(to_l % p).push_back(recv);
    }
  };
  while (true) {
    int best = -1;
    double best_start = 0.0;
    for (int d = 0; d < p; ++d) {
      if (next[static_cast<std::size_t>(d)] == order[static_cast<std::size_t>(d)].size()) continue;
      const Op& op = order[static_cast<std::size_t>(d)][next[static_cast<std::size_t>(d)]];
      const int l = op.chunk * p + d;
      double dep = 0.0;
      if (op.kind == OpKind::kForward && l > 0) dep = end[0][key(l - 1, op.mb)];
      if (op.kind == OpKind::kBackward) {
        dep = l == num_virtual - 1 ? end[0][key(l, op.mb)] : end[1][key(l + 1, op.mb)];
      }
      if (dep < 0) continue;
      const double start = std::max(dep, free[static_cast<std::size_t>(d)]);
      if (best < 0 || start < best_start) {
        best = d;
        best_start = start;
      }
    }
    if (best < 0) break;
    flush(best_start);
    const int d = best;
    const Op op = order[static_cast<std::size_t>(d)][next[static_cast<std::size_t>(d)]++];
    const int l = op.chunk * p + d;
    const double duration = op.kind == OpKind::kForward ? cost.ForwardTime(d)
                            : op.kind == OpKind::kBackward
                                ? cost.BackwardTime(d, spec.split_backward)
                                : cost.WeightTime(d);
    const double done = best_start + duration;
    free[static_cast<std::size_t>(d)] = done;
    const bool offloaded = op.chunk < offload_chunks;
    if (op.kind == OpKind::kBackward && offloaded) program(d).push_back(Reload(op.mb, op.chunk));
    program(d).push_back(op);
    if (op.kind == OpKind::kForward) {
      end[0][key(l, op.mb)] = done;
      if (offloaded) {
        program(d).push_back(Offload(op.mb, op.chunk));
        program(d).push_back(Release(op.mb, op.chunk));
      }
      if (l + 1 < num_virtual && p > 1) {
        messages.push({done, seq++, d, SendF(op.mb, (l + 1) % p, op.chunk)});
      }
    } else if (op.kind == OpKind::kBackward) {
      end[1][key(l, op.mb)] = done;
      if (l > 0 && p > 1) messages.push({done, seq++, d, SendB(op.mb, (l - 1) % p, op.chunk)});
    }
  }
  flush(1e300);
  return schedule;
}

// 1F1B (pipeoffload.md 1.2): w = min(p-d-1, m) warm-up forwards, then F/B pairs, then the rest.
std::vector<std::vector<Op>> OneFOneBOrder(int p, int m, bool split) {
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    std::vector<Op>& ops = order[static_cast<std::size_t>(d)];
    const int warmup = std::min(p - d - 1, m);
    const auto backward = [&](int mb) {
      ops.push_back(B(mb));
      if (split) ops.push_back(W(mb));
    };
    for (int mb = 0; mb < warmup; ++mb) ops.push_back(F(mb));
    for (int i = 0; i + warmup < m; ++i) {
      ops.push_back(F(i + warmup));
      backward(i);
    }
    for (int mb = std::max(0, m - warmup); mb < m; ++mb) backward(mb);
  }
  return order;
}

// 1F1B makespan under unit costs with free P2P. Unsplit, B (= B + W, 2 units) is on the
// backward chain: (m + p - 1) * 3. Split, SEND_B leaves when B ends and W runs off the chain,
// saving one unit per stage of the chain: (m + p - 1) * 3 - (p - 1), which is the reference
// generator's 110 for p=8, m=32 (pipeoffload.md section 1.3 table: 110/96, bubble 12.7%).
double OneFOneBMakespan(int p, int m, bool split) {
  return 3.0 * (m + p - 1) - (split ? p - 1 : 0);
}

TEST_CASE("1F1B under unit costs: makespan, peaks, bubble over many configs", "[sim]") {
  const int p = GENERATE(1, 2, 3, 4, 8);
  const int m = GENERATE(1, 2, 3, 4, 8, 16, 32);
  const bool split = GENERATE(false, true);
  CAPTURE(p, m, split);
  PipelineSpec spec;
  spec.num_stages = p;
  spec.num_microbatches = m;
  spec.split_backward = split;
  const CostModel cost = UnitCostModel(0.5);
  const Timeline t = MustSimulate(LowerByTime(spec, OneFOneBOrder(p, m, split), cost, 0), cost);
  const double makespan = OneFOneBMakespan(p, m, split);
  CHECK(t.predictions.step_time == Approx(makespan));
  CHECK(t.predictions.step_time_without_offload == Approx(makespan));
  CHECK(t.predictions.bubble_ratio == Approx(1.0 - 3.0 * m * p / (p * makespan)));
  if (!split) CHECK(t.predictions.bubble_ratio == Approx(static_cast<double>(p - 1) / (m + p - 1)));
  if (split && p == 8 && m == 32) CHECK(t.predictions.step_time == Approx(110.0));
  for (int d = 0; d < p; ++d) {
    CAPTURE(d);
    const StagePrediction& stage = t.predictions.stages[static_cast<std::size_t>(d)];
    CHECK(stage.peak_units == std::min(p - d, m));
    CHECK(stage.peak_bytes == std::min(p - d, m) * cost.activation_bytes);
    CHECK(stage.busy_time == Approx(3.0 * m));
    CHECK(t.memory[static_cast<std::size_t>(d)].back().units == 0);
  }
}

// Random single-field and single-op mutations of valid schedules (fixed seed). Whatever the
// input, neither Validate nor Simulate crashes, and the two agree: a schedule that validates
// simulates without error, and one that deadlocks hangs the simulator too.
TEST_CASE("random mutations: Validate OK implies Simulate OK; a hang implies invalid",
          "[sim][validate]") {
  std::vector<Schedule> bases = {OneFOneB(), PairOffload(true), PairOffload(false), DuplexProbe()};
  PipelineSpec spec;
  spec.num_stages = 3;
  spec.num_microbatches = 3;
  spec.chunks_per_stage = 2;
  spec.split_backward = true;
  std::vector<std::vector<Op>> order(3);
  for (int d = 0; d < 3; ++d) {
    for (int c = 0; c < 2; ++c) {
      for (int mb = 0; mb < 3; ++mb) order[static_cast<std::size_t>(d)].push_back(F(mb, c));
    }
    for (int c = 1; c >= 0; --c) {
      for (int mb = 0; mb < 3; ++mb) {
        order[static_cast<std::size_t>(d)].push_back(B(mb, c));
        order[static_cast<std::size_t>(d)].push_back(W(mb, c));
      }
    }
  }
  bases.push_back(LowerByTime(spec, order, SmallCost(), /*offload_chunks=*/1));
  spec.num_stages = 4;
  spec.chunks_per_stage = 1;
  spec.num_microbatches = 4;
  bases.push_back(LowerByTime(spec, OneFOneBOrder(4, 4, true), SmallCost(), 0));

  std::mt19937 rng(20240611);
  const auto pick = [&rng](int lo, int hi) {  // uniform in [lo, hi]
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  int validated = 0, hangs = 0, deadlocks = 0, deadlocks_run = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Schedule s = bases[static_cast<std::size_t>(trial) % bases.size()];
    REQUIRE(Validate(s).ok());
    const int p = s.spec.num_stages;
    const int mutations = pick(1, 2);
    for (int k = 0; k < mutations; ++k) {
      std::vector<Op>& ops = s.stages[static_cast<std::size_t>(pick(0, p - 1))].ops;
      if (ops.empty()) continue;
      const int i = pick(0, static_cast<int>(ops.size()) - 1);
      switch (pick(0, 7)) {
        case 0:
          ops.erase(ops.begin() + i);
          break;
        case 1:
          ops.insert(ops.begin() + pick(0, static_cast<int>(ops.size())),
                     ops[static_cast<std::size_t>(i)]);
          break;
        case 2: {
          const Op op = ops[static_cast<std::size_t>(i)];
          ops.erase(ops.begin() + i);
          ops.insert(ops.begin() + pick(0, static_cast<int>(ops.size())), op);
          break;
        }
        case 3:
          if (i + 1 < static_cast<int>(ops.size())) {
            std::swap(ops[static_cast<std::size_t>(i)], ops[static_cast<std::size_t>(i) + 1]);
          }
          break;
        case 4:
          ops[static_cast<std::size_t>(i)].mb = pick(-1, s.spec.num_microbatches);
          break;
        case 5:
          ops[static_cast<std::size_t>(i)].chunk = pick(-1, s.spec.chunks_per_stage);
          break;
        case 6:
          ops[static_cast<std::size_t>(i)].peer = pick(-2, p);
          break;
        default:
          ops[static_cast<std::size_t>(i)].kind = static_cast<OpKind>(pick(0, kNumOpKinds - 1));
          break;
      }
    }
    const absl::Status valid = Validate(s);
    const absl::Status simulated = Simulate(s, SmallCost()).status();
    CAPTURE(trial, valid.message(), simulated.message());
    if (valid.ok()) {
      ++validated;
      CHECK(simulated.ok());
    } else {
      CHECK(valid.code() == absl::StatusCode::kFailedPrecondition);
    }
    // Validate's blocking rendezvous is stricter than the simulator's posts: a hang here is
    // always an invalid schedule, while a blocking deadlock may run through (or hang, when the
    // data or an engine's order closes the cycle).
    if (Has(Message(simulated), "hang")) {
      ++hangs;
      CHECK_FALSE(valid.ok());
    }
    if (Has(Message(valid), "(deadlock)")) {
      ++deadlocks;
      if (simulated.ok()) ++deadlocks_run;
    }
  }
  // The mutations reach every side of the implications.
  CHECK(validated > 50);
  CHECK(hangs > 5);
  CHECK(deadlocks > 5);
  CHECK(deadlocks_run > 0);
  CHECK(deadlocks_run < deadlocks);
}

TEST_CASE("simulate runs p=64, m=512, v=4 with offload to the end", "[sim]") {
  PipelineSpec spec;
  spec.num_stages = 64;
  spec.num_microbatches = 512;
  spec.chunks_per_stage = 4;
  spec.split_backward = true;
  std::vector<std::vector<Op>> order(64);
  for (int d = 0; d < 64; ++d) {  // GPipe order: every F chunk by chunk, then every B and W
    for (int c = 0; c < 4; ++c) {
      for (int mb = 0; mb < 512; ++mb) order[static_cast<std::size_t>(d)].push_back(F(mb, c));
    }
    for (int c = 3; c >= 0; --c) {
      for (int mb = 0; mb < 512; ++mb) {
        order[static_cast<std::size_t>(d)].push_back(B(mb, c));
        order[static_cast<std::size_t>(d)].push_back(W(mb, c));
      }
    }
  }
  CostModel cost = UnitCostModel(0.25);
  const Schedule schedule = LowerByTime(spec, order, cost, /*offload_chunks=*/2);
  // How long it takes is bench/schedule_bench's to measure (timing has no place in a test: this
  // check once failed at 1.02 s of CPU time on a loaded 2-core machine).
  const absl::StatusOr<Timeline> timeline = Simulate(schedule, cost);
  REQUIRE(timeline.ok());
  // Every compute op ran; the GPipe makespan is bounded below by one stage's work.
  CHECK(timeline->predictions.step_time >= 3.0 * 512 * 4);
  CHECK(timeline->predictions.stages[0].offloaded_bytes == 2LL * 512 * cost.activation_bytes);
}

// --- with the compiler (these pass once schedules/ lands) ---------------------------------

TEST_CASE("compiled 1F1B under unit costs", "[sim][compiler]") {
  const int p = GENERATE(2, 4, 8);
  const int m = GENERATE(1, 4, 8, 32);
  const bool split = GENERATE(false, true);
  CAPTURE(p, m, split);
  PipelineSpec spec;
  spec.family = Family::k1F1B;
  spec.num_stages = p;
  spec.num_microbatches = m;
  spec.split_backward = split;
  const CostModel cost = UnitCostModel(0.5);
  absl::StatusOr<Schedule> compiled = Compile(spec, cost);
  INFO(compiled.status().message());
  REQUIRE(compiled.ok());
  absl::StatusOr<Schedule> order = BuildComputeOrder(spec, cost);
  REQUIRE(order.ok());
  absl::StatusOr<Schedule> lowered = LowerCommunication(*order);
  REQUIRE(lowered.ok());
  for (const Schedule* schedule : {&*compiled, &*lowered}) {
    const Timeline t = MustSimulate(*schedule, cost);
    const double makespan = OneFOneBMakespan(p, m, split);
    CHECK(t.predictions.step_time == Approx(makespan));
    CHECK(t.predictions.bubble_ratio == Approx(1.0 - 3.0 * m / makespan));
    if (!split) {
      CHECK(t.predictions.bubble_ratio == Approx(static_cast<double>(p - 1) / (m + p - 1)));
    }
    for (int d = 0; d < p; ++d) {
      CAPTURE(d);
      CHECK(t.predictions.stages[static_cast<std::size_t>(d)].peak_units == std::min(p - d, m));
    }
  }
}

TEST_CASE("1F1B p=4 m=4 po-h, unit costs: stage 0 holds 4 entries in time, 3 in program order",
          "[sim][memory][compiler]") {
  PipelineSpec spec;
  spec.num_stages = 4;
  spec.num_microbatches = 4;
  spec.offload = OffloadPolicy::kHalf;
  const CostModel cost = UnitCostModel(0.25);  // F = 1, B = 2, a copy 0.75
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  REQUIRE(schedule.ok());
  absl::StatusOr<Timeline> timeline = Simulate(*schedule, cost);
  REQUIRE(timeline.ok());
  // Stage 0 offloads mb 0 and 1 after their F (released at 1.75 and 3.5), runs F2 at 3.5-4.5
  // and F3 at 4.5-5.5, reloads mb 0 at 4.5-5.25, then B0 at 10-12 and RELOAD1 right after it
  // in program order, its copy starting at 10, when B0 is issued. Program order: B0 frees mb 0
  // before RELOAD1 allocates, so at most 3 (mb 0, 2, 3 after RELOAD0; mb 1, 2, 3 after
  // RELOAD1). In time, during [10, 12) mb 0 (B0 still running), 1 (its copy), 2 and 3: 4.
  const std::vector<TimedOp>& ops = timeline->stages[0];
  const auto find = [&](OpKind kind, int mb) {
    const auto it = std::find_if(ops.begin(), ops.end(), [&](const TimedOp& t) {
      return t.op.kind == kind && t.op.mb == mb;
    });
    REQUIRE(it != ops.end());
    return *it;
  };
  CHECK(find(OpKind::kBackward, 0).start == 10.0);
  CHECK(find(OpKind::kBackward, 0).end == 12.0);
  CHECK(find(OpKind::kBackward, 0).index + 1 == find(OpKind::kReload, 1).index);
  CHECK(find(OpKind::kReload, 1).start == 10.0);
  CHECK(find(OpKind::kRelease, 1).start == 3.5);
  const StagePrediction& stage0 = timeline->predictions.stages[0];
  CHECK(stage0.peak_units == 3);
  CHECK(stage0.peak_bytes == 3 * cost.activation_bytes);
  const std::vector<PeakInTime> peaks = PeaksInTime(*timeline);
  REQUIRE(peaks.size() == 4);
  CHECK(peaks[0].units == 4);
  CHECK(peaks[0].bytes == 4 * cost.activation_bytes);
  // The sample that reaches 4 is RELOAD1's, at 10; B0's free follows at 12.
  const std::vector<MemorySample>& samples = timeline->memory[0];
  const auto top = std::max_element(samples.begin(), samples.end(),
                                    [](const auto& a, const auto& b) { return a.units < b.units; });
  CHECK(top->time == 10.0);
  CHECK(std::next(top)->time == 12.0);
  CHECK(std::next(top)->units == 3);
}

TEST_CASE("at one instant a free comes before an allocation: 1F1B without offload, p = 1",
          "[sim][memory][compiler]") {
  // F0 0-1, B0 1-3, F1 3-4 ...: B0's end and F1's start are one instant; one entry at a time.
  PipelineSpec spec;
  spec.num_microbatches = 3;
  const CostModel cost = UnitCostModel(0.25);
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  REQUIRE(schedule.ok());
  absl::StatusOr<Timeline> timeline = Simulate(*schedule, cost);
  REQUIRE(timeline.ok());
  CHECK(PeaksInTime(*timeline)[0].units == 1);
  const std::vector<MemorySample>& samples = timeline->memory[0];
  REQUIRE(samples.size() == 6);
  CHECK(samples[1].time == 3.0);  // B0's free ...
  CHECK(samples[1].units == 0);
  CHECK(samples[2].time == 3.0);  // ... then F1's allocation
  CHECK(samples[2].units == 1);
}

}  // namespace
}  // namespace pipeoffload
