// Tests of pipeline_bench's results: the link-use summary, the JSON lines (round trip, older
// lines without the newer fields), the markdown table and the checklist of issue 5's targets.
// Tag: [pipeline_bench].
#include <cstdint>
#include <string>
#include <vector>

#include "bench/pipeline_bench_report.h"
#include "tests/testing/catch.h"

namespace pipeoffload::bench {
namespace {

using Catch::Approx;

TEST_CASE("link use: busy time is a union; the ceiling is solo or duplex by overlap",
          "[pipeline_bench]") {
  // D2H [0,2] and [1,3] (100 B each) are busy over [0,3]; H2D [2,4] (50 B) over [2,4]; both
  // directions run in [2,3]. Capacity at 100 B/s alone, 50 each way together:
  // 100 * 2 + 100 * 1 + 2 * 50 * 1 = 400 B for 250 B moved.
  const std::vector<CopyInterval> copies = {
      {true, 0.0, 2.0, 100}, {true, 1.0, 3.0, 100}, {false, 2.0, 4.0, 50}, {false, 5.0, 5.0, 7}};
  const LinkUse use = SummarizeCopies(copies, 100.0, 100.0, 50.0);
  CHECK(use.d2h_gbs == Approx(200.0 / 3.0 / 1e9));
  CHECK(use.h2d_gbs == Approx(25.0 / 1e9));
  CHECK(use.efficiency == Approx(0.625));
  CHECK(SummarizeCopies({}, 1.0, 1.0, 1.0).efficiency == 0.0);
}

PolicyRun Policy(const std::string& name, std::vector<double> steps,
                 std::vector<std::int64_t> peaks, double offload_gbs, double predicted) {
  PolicyRun run;
  run.name = name;
  run.order = "1f1b";
  run.step_seconds = std::move(steps);
  run.stash_peak = peaks;
  run.predicted_peak = std::move(peaks);
  run.arena_bytes = {1, 2};
  run.model_bytes = {3, 4};
  run.wait_seconds = {0.5, 0.25};
  run.offload_gbs = offload_gbs;
  run.link_efficiency = offload_gbs / 55.0;
  run.predicted_step = predicted;
  return run;
}

BenchRun Run(int hidden, std::vector<PolicyRun> policies) {
  BenchRun run;
  run.model = "gpt";
  run.hidden = hidden;
  run.heads = hidden / 128;
  run.sequence = 2048;
  run.stages = 2;
  run.microbatches = 8;
  run.chunks = 2;
  run.layers_per_chunk = 1;
  run.family = "group-interleaved";
  run.gemm_flops = 800e12;
  run.d2h_gbs = 55.0;
  run.model_flops_per_step = 600e12;
  run.policies = std::move(policies);
  return run;
}

// `line` without the field `key` (as JSON lines written before it existed): erases `"key":`
// and its value up to the comma at the same depth.
std::string WithoutKey(std::string line, const std::string& key) {
  const std::string quoted = "\"" + key + "\":";
  for (std::size_t at = line.find(quoted); at != std::string::npos; at = line.find(quoted)) {
    std::size_t end = at + quoted.size();
    int depth = 0;
    for (; end < line.size(); ++end) {
      const char c = line[end];
      if (c == '[' || c == '{') ++depth;
      if (c == ']' || c == '}') {
        if (depth == 0) break;
        --depth;
      }
      if (c == ',' && depth == 0) break;
    }
    if (line[end] == ',') {
      line.erase(at, end + 1 - at);
    } else {
      line.erase(at - 1, end - (at - 1));  // the last field: take the comma before it
    }
  }
  return line;
}

TEST_CASE("report: JSON lines round-trip; bad lines name the field", "[pipeline_bench]") {
  BenchRun run = Run(8192, {Policy("1f1b", {1.0, 1.1, 0.9}, {400, 300}, 0.0, 1.0),
                            Policy("po-f", {1.02}, {100, 100}, 50.0, 1.0)});
  run.policies[1].auto_choice = "auto: chose x";
  run.policies[1].stash_physical_peak = {130, 120};
  run.policies[1].calibrated_step = 1.04;
  run.policies[1].release_wait = {0.125, 0.0};
  run.policies[1].p2p_peak = {64, 32};
  run.calibration_scale = 1.0625;
  run.release_mode = "defer";
  absl::StatusOr<std::vector<BenchRun>> parsed =
      ParseRuns(RunToJsonLine(run) + "\n" + RunToJsonLine(Run(2048, {})));
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 2);
  const BenchRun& back = (*parsed)[0];
  CHECK(back.hidden == 8192);
  CHECK(back.family == "group-interleaved");
  CHECK(back.gemm_flops == 800e12);
  CHECK(back.calibration_scale == 1.0625);
  CHECK(back.release_mode == "defer");
  REQUIRE(back.policies.size() == 2);
  CHECK(back.policies[0].step_seconds == std::vector<double>{1.0, 1.1, 0.9});
  CHECK(back.policies[0].MedianStep() == 1.0);
  CHECK(back.policies[1].stash_peak == std::vector<std::int64_t>{100, 100});
  CHECK(back.policies[1].stash_physical_peak == std::vector<std::int64_t>{130, 120});
  CHECK(back.policies[1].calibrated_step == 1.04);
  CHECK(back.policies[1].release_wait == std::vector<double>{0.125, 0.0});
  CHECK(back.policies[1].p2p_peak == std::vector<std::int64_t>{64, 32});
  CHECK(back.policies[1].auto_choice == "auto: chose x");
  CHECK(back.policies[1].StashTotal() == 250);  // physical
  CHECK(back.policies[1].wait_seconds == std::vector<double>{0.5, 0.25});
  CHECK(RunToJsonLine(back) == RunToJsonLine(run));  // every field survives

  absl::StatusOr<std::vector<BenchRun>> bad = ParseRuns("{\"model\": \"gpt\"}");
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("line 1: missing \"hidden\"") !=
        std::string::npos);
  bad = ParseRuns("\n{\"model\": 3}");
  CHECK(std::string(bad.status().message()).find("line 2: \"model\" has the wrong type") !=
        std::string::npos);
  bad = ParseRuns("not json");
  CHECK(std::string(bad.status().message()).find("not a JSON object") != std::string::npos);
  absl::StatusOr<std::vector<PeerRun>> peers = ParsePeers("{\"hidden\": 1}");
  CHECK(std::string(peers.status().message()).find("missing \"seq\"") != std::string::npos);
  // The newer fields are optional, but not of any type.
  std::string mistyped = RunToJsonLine(run);
  mistyped.replace(mistyped.find("\"calibration_scale\":1.0625"),
                   std::string("\"calibration_scale\":1.0625").size(),
                   "\"calibration_scale\":\"x\"");
  bad = ParseRuns(mistyped);
  CHECK(std::string(bad.status().message()).find("\"calibration_scale\" has the wrong type") !=
        std::string::npos);
}

TEST_CASE("report: lines from before physical peaks and calibration still read",
          "[pipeline_bench]") {
  BenchRun run = Run(4096, {Policy("1f1b", {1.0}, {400, 300}, 0.0, 1.0),
                            Policy("po-h", {1.05}, {200, 150}, 50.0, 1.0)});
  run.policies[1].stash_physical_peak = {260, 150};
  run.policies[1].calibrated_step = 1.04;
  run.calibration_scale = 1.0625;
  std::string old = RunToJsonLine(run);
  for (const std::string key :
       {"stash_physical_peak", "calibrated_step", "calibration_scale", "release_mode",
        "p2p_peak"}) {
    old = WithoutKey(old, key);
    CHECK(old.find(key) == std::string::npos);
  }
  absl::StatusOr<std::vector<BenchRun>> parsed = ParseRuns(old);
  REQUIRE(parsed.ok());
  const BenchRun& back = (*parsed)[0];
  CHECK(back.release_mode == "wait");  // the runtime then blocked in RELEASE
  CHECK(back.calibration_scale == 0.0);
  REQUIRE(back.policies.size() == 2);
  const PolicyRun& po_h = back.policies[1];
  CHECK(po_h.stash_physical_peak.empty());
  CHECK(po_h.p2p_peak.empty());
  CHECK(po_h.calibrated_step == 0.0);
  // The physical peak falls back to the logical one (equal under a blocking RELEASE).
  CHECK(po_h.PhysicalPeak(0) == 200);
  CHECK(po_h.PhysicalPeak(1) == 150);
  CHECK(po_h.PhysicalPeak(2) == 0);
  CHECK(po_h.StashTotal() == 350);
  CHECK(StageZeroCut(po_h, back.policies[0]) == Approx(0.5));
  CHECK(StageZeroCut(run.policies[1], run.policies[0]) == Approx(1.0 - 260.0 / 400.0));
}

TEST_CASE("report: one markdown row per policy, failures say why", "[pipeline_bench]") {
  BenchRun run = Run(8192, {Policy("1f1b", {1.0}, {4'000'000'000, 3'000'000'000}, 0.0, 1.05),
                            Policy("po-f", {1.02}, {1'000'000'000, 1'000'000'000}, 44.0, 1.0)});
  run.calibration_scale = 0.95;
  run.policies[0].calibrated_step = 1.0;
  run.policies.emplace_back();
  run.policies.back().name = "auto";
  run.policies.back().order = "gi";
  run.policies.back().error = "no plan fits";
  PolicyRun& po_f = run.policies[1];
  po_f.stash_physical_peak = {1'200'000'000, 1'100'000'000};
  po_f.calibrated_step = 1.03;
  po_f.release_wait = {0.125, 0.0625};
  po_f.barrier_wait = {0.0, 0.0};
  po_f.p2p_peak = {500'000'000, 250'000'000};
  std::string text = RunToMarkdown(run);
  INFO(text);
  // 600 TFLOP / 1.02 s; stage 0 4 -> 1.2 GB physical (1 logical); 44 / 55 GB/s of the link;
  // predicted 1.0 (solo) and 1.03 (calibrated) vs 1.02.
  CHECK(text.find("| po-f | 1f1b | 1.0200 | +2.0% | 588.2 | 1.20 (70%) | 1.00/1.00/1.20, "
                  "1.00/1.00/1.10 | 0.00 | 44.0 / 0.0 (80%) | 1.0000 (-2.0%) | 1.0300 (+1.0%) | "
                  "0.0000 |") != std::string::npos);
  CHECK(text.find("| 1f1b | 1f1b | 1.0000 | - | 600.0 | 4.00 | 4.00/4.00/4.00, 3.00/3.00/3.00 "
                  "| 0.00 | - | 1.0500 (+5.0%) | 1.0000 (+0.0%) |") != std::string::npos);
  CHECK(text.find("| auto | gi | failed: no plan fits |") != std::string::npos);
  CHECK(text.find("RELEASE: defer.") != std::string::npos);
  CHECK(text.find("Calibrated simulation: compute costs x 0.9500") != std::string::npos);
  CHECK(text.find("Logical stash peak == predicted, to the byte, at every stage.") !=
        std::string::npos);
  CHECK(text.find("po-f: busy 0.000 of 1.020 s, waits 0.500 (r 0.125 b 0.000) / 0.250 (r 0.062 "
                  "b 0.000);") != std::string::npos);
  // Needed = model + physical stash + measured P2P, per stage and in all; only po-f has a P2P
  // peak here (1f1b reads as an older line and is left out of that line).
  CHECK(text.find("P2P peak): po-f: 0.00+1.20+0.50 / 0.00+1.10+0.25 (all stages 3.05);") !=
        std::string::npos);

  // Without 1f1b: no calibration, said once; a logical peak off its prediction is named.
  run.calibration_scale = 0.0;
  po_f.calibrated_step = 0.0;
  po_f.predicted_peak[1] = 999;
  text = RunToMarkdown(run);
  CHECK(text.find("Calibrated simulation: unavailable (1f1b did not run).") != std::string::npos);
  CHECK(text.find("| 1.0000 (-2.0%) | - | 0.0000 |") != std::string::npos);
  CHECK(text.find("Logical stash peak != predicted at: po-f stage 1: 1000000000 measured vs 999 "
                  "predicted;") != std::string::npos);
}

TEST_CASE("checklist: each target PASS or MISS with its numbers", "[pipeline_bench]") {
  std::vector<BenchRun> runs = {
      Run(8192, {Policy("1f1b", {1.0}, {400, 300}, 0.0, 0.85),
                 Policy("po-f", {1.02}, {100, 100}, 50.0, 1.0),
                 Policy("po-f:shared", {1.06}, {80, 80}, 50.0, 1.0)}),
      Run(4096, {Policy("1f1b", {1.0}, {400, 300}, 0.0, 1.0),
                 Policy("po-h", {1.02}, {200, 150}, 40.0, 1.0)}),
      Run(2048, {Policy("1f1b", {1.0}, {400, 300}, 0.0, 1.0),
                 Policy("po-f", {1.02}, {100, 100}, 50.0, 1.0),
                 Policy("po-f@4", {1.10}, {100, 100}, 50.0, 1.0),
                 Policy("auto", {1.01}, {300, 300}, 50.0, 1.0)})};
  // po-h's physical stage-0 peak (240) is what the cut is judged on, not the logical 200.
  runs[1].policies[1].stash_physical_peak = {240, 150};
  for (BenchRun& run : runs) {
    run.calibration_scale = 1.0;
    for (PolicyRun& r : run.policies) r.calibrated_step = r.MedianStep() * 0.99;
  }
  runs[2].policies[2].calibrated_step = 1.045;  // po-f@4: the worst, 5.0%
  std::vector<PeerRun> peers(2);
  peers[0].hidden = peers[1].hidden = 8192;
  peers[0].mode = "none";
  peers[0].step_s = 0.9;
  peers[1].mode = "save_on_cpu";
  peers[1].step_s = 5.0;
  peers[1].activation_bytes = 150;
  std::string text = Checklist(runs, peers);
  INFO(text);
  // 600 of 800 TFLOP/s.
  CHECK(text.find("- PASS baseline (1f1b, no offload) at h=8192") != std::string::npos);
  CHECK(text.find("= 75%") != std::string::npos);
  // po-f: +2.0%, 400 -> 100 is a 75% cut; po-f:shared beside it.
  CHECK(text.find("- PASS po-f at h=8192") != std::string::npos);
  CHECK(text.find("+2.0%, cut 75% (0.00 -> 0.00 GB); po-f:shared: +6.0%, cut 80%") !=
        std::string::npos);
  // po-h: +2.0% but 400 -> 240 physical is a 40% cut (the logical 200 would pass).
  CHECK(text.find("- MISS po-h at h=4096") != std::string::npos);
  CHECK(text.find("+2.0%, cut 40%") != std::string::npos);
  // 40 of 55 GB/s is 73%.
  CHECK(text.find("- MISS offload copies >= 85%") != std::string::npos);
  CHECK(text.find("73% (po-h at h=4096: D2H 40.0") != std::string::npos);
  // Calibrated: worst 1.045 vs 1.10 (po-f@4 at 2048), 5.0%; solo beside: 1.0 vs 1.10 is 9.1%
  // (1f1b's solo 0.85 vs 1.0 at 8192, 15%, is not an offload policy: not judged).
  CHECK(text.find("- PASS one-GPU simulation, compute calibrated on the measured 1f1b step") !=
        std::string::npos);
  CHECK(text.find("5.0% (po-f@4 at h=2048: 1.0450 predicted vs 1.1000 s); from the solo costs: "
                  "9.1% (po-f@4 at h=2048: 1.0000 predicted vs 1.1000 s)") != std::string::npos);
  // auto +1.0% and 700 -> 600 bytes; po-f +2%, po-f@4 +10%.
  CHECK(text.find("- PASS h=2048 (transfer-bound)") != std::string::npos);
  CHECK(text.find(", po-f +2.0%, po-f@4 +10.0%") != std::string::npos);
  // Peer: 1.02 / 0.9 = 1.13x; 100 bytes on the largest stage vs 150 of save_on_cpu: PASS.
  CHECK(text.find("- PASS h=8192: our po-f step") != std::string::npos);
  CHECK(text.find("1.13x") != std::string::npos);
  std::vector<PeerRun> tight = peers;
  tight[1].activation_bytes = 100;  // not less: MISS
  CHECK(Checklist(runs, tight).find("- MISS h=8192: our po-f step") != std::string::npos);

  // A calibrated miss; auto's physical peaks above the baseline's (no saving); the peer judged
  // on po-f's physical peak (160 > 150).
  std::vector<BenchRun> worse = runs;
  worse[2].policies[2].calibrated_step = 1.25;
  worse[2].policies[3].stash_physical_peak = {400, 400};
  worse[0].policies[1].stash_physical_peak = {100, 160};
  text = Checklist(worse, peers);
  INFO(text);
  CHECK(text.find("- MISS one-GPU simulation") != std::string::npos);
  CHECK(text.find("13.6% (po-f@4 at h=2048") != std::string::npos);
  CHECK(text.find("- MISS h=2048 (transfer-bound)") != std::string::npos);
  CHECK(text.find("- MISS h=8192: our po-f step") != std::string::npos);

  // No 1f1b alongside: the calibrated prediction is unavailable, the solo one still printed;
  // no po-f at 2048: auto's numbers without a verdict.
  std::vector<BenchRun> bare = runs;
  for (BenchRun& run : bare) run.calibration_scale = 0.0;
  bare[2].policies.resize(1);
  bare[2].policies.push_back(runs[2].policies[3]);
  text = Checklist(bare, peers);
  INFO(text);
  CHECK(text.find("- n/a  one-GPU simulation") != std::string::npos);
  CHECK(text.find("calibrated prediction unavailable (needs 1f1b and an offload policy in the "
                  "same run); from the solo costs: 5.7% (po-f:shared at h=8192") !=
        std::string::npos);
  CHECK(text.find("- n/a  h=2048 (transfer-bound): auto within 3% of the baseline and saving "
                  "memory, po-f costing more: po-f not run; auto +1.0%") != std::string::npos);

  // Lines from before the split default name the split plan P:split: it is shown beside too.
  std::vector<BenchRun> older = runs;
  older[1].policies.push_back(Policy("po-h:split", {1.01}, {200, 150}, 60.0, 1.0));
  CHECK(Checklist(older, peers).find("+2.0%, cut 40% (0.00 -> 0.00 GB); po-h:split: +1.0%, cut "
                                     "50%\n") != std::string::npos);

  // Nothing at all: every line n/a, no crash.
  const std::string empty = Checklist({}, {});
  CHECK(empty.find("PASS") == std::string::npos);
  CHECK(empty.find("MISS") == std::string::npos);
}

}  // namespace
}  // namespace pipeoffload::bench
