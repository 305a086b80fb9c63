// The SVG picture of a timeline (timeline_svg.h): it parses as XML, draws exactly one block per
// op that occupies an engine in its stage's group (F / B / W, OFFLOAD / RELOAD, P2P where
// drawn), marks each stage's memory peak, stays within its size limits, survives odd timelines,
// and reproduces tests/golden/1f1b_p2_m4_po-h.svg byte for byte (scripts/update_golden.sh
// rewrites that file, as it does the other goldens).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/simulate.h"
#include "pipeoffload/timeline_svg.h"
#include "tests/testing/catch.h"
#include "tests/testing/golden_file.h"
#include "tests/testing/mini_xml.h"
#include "tests/testing/schedule_builders.h"

namespace pipeoffload {
namespace {

using testing::MakeSpec;
using testing::XmlElement;

std::string Show(const std::map<std::string, int>& counts) {
  std::string out;
  for (const auto& [key, count] : counts) out += key + ":" + std::to_string(count) + " ";
  return out;
}

XmlElement ParseSvg(const std::string& svg) {
  XmlElement root;
  testing::MiniXmlParser parser(svg);
  const bool ok = parser.Parse(&root);
  INFO(parser.error());
  REQUIRE(ok);
  REQUIRE(root.name == "svg");
  return root;
}

// The root's child <g id="...">, or an empty element when there is none.
XmlElement Group(const XmlElement& root, const std::string& id) {
  for (const XmlElement& child : root.children) {
    if (child.name == "g" && child.Attribute("id") == id) return child;
  }
  return {};
}

// "class:count ..." of the op blocks under `element`: <rect>s with a class other than the
// background band's and the legend swatches'.
std::string OpBlocks(const XmlElement& element) {
  std::map<std::string, int> counts;
  element.Walk([&](const XmlElement& e) {
    const std::string cls = e.Attribute("class");
    if (e.name == "rect" && !cls.empty() && cls != "band" && cls != "swatch") ++counts[cls];
  });
  return Show(counts);
}

struct Picture {
  Schedule schedule;
  Timeline timeline;
  std::string svg;
};

Picture Draw(const PipelineSpec& spec, bool unit_costs) {
  const CostModel cost = unit_costs ? UnitCostModel(0.25) : EstimateGptCostModel(GptShape{});
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  INFO(schedule.status().ToString());
  REQUIRE(schedule.ok());
  absl::StatusOr<Timeline> timeline = Simulate(*schedule, cost);
  REQUIRE(timeline.ok());
  std::string svg = TimelineToSvg(*schedule, *timeline, {unit_costs});
  return {*std::move(schedule), *std::move(timeline), std::move(svg)};
}

struct Case {
  PipelineSpec spec;
  bool unit_costs;
};

std::vector<Case> Cases() {
  using F = Family;
  using O = OffloadPolicy;
  return {
      {MakeSpec(F::k1F1B, 2, 4, 1, 0, false, O::kHalf), true},
      {MakeSpec(F::k1F1B, 4, 8, 1, 0, false, O::kFull), false},
      {MakeSpec(F::k1F1B, 4, 8, 1, 0, true, O::kNone), true},
      {MakeSpec(F::kInterleaved, 2, 4, 2, 0, false, O::kHalf), true},
      {MakeSpec(F::kGroupInterleaved, 4, 8, 2, 2, true, O::kFull), false},
      {MakeSpec(F::kGroupInterleaved, 4, 8, 2, 2, false, O::kFull), true},
      {MakeSpec(F::k1F1B, 20, 20, 1, 0, false, O::kHalf), false},  // compact rows, no P2P
  };
}

TEST_CASE("SVG draws one block per op, in its stage's group", "[io][svg]") {
  for (const Case& c : Cases()) {
    const Picture picture = Draw(c.spec, c.unit_costs);
    const PipelineSpec& spec = picture.schedule.spec;
    const std::string family(FamilyName(spec.family)), policy(OffloadPolicyName(spec.offload));
    CAPTURE(family, spec.num_stages, spec.num_microbatches, policy, spec.split_backward,
            c.unit_costs);
    const XmlElement root = ParseSvg(picture.svg);
    // Unit costs make P2P free; compact pictures (p > 16) leave it out.
    const bool p2p_drawn = !c.unit_costs && spec.num_stages <= 16;
    std::map<std::string, int> total_expected;
    int offloads = 0;
    for (const StageProgram& program : picture.schedule.stages) {
      CAPTURE(program.stage);
      std::map<std::string, int> expected;
      for (const Op& op : program.ops) {
        if (EngineOf(op.kind) == Engine::kNone || (IsP2P(op.kind) && !p2p_drawn)) continue;
        ++expected[std::string(OpKindName(op.kind))];
        offloads += op.kind == OpKind::kOffload;
      }
      CHECK(OpBlocks(Group(root, "stage-" + std::to_string(program.stage))) == Show(expected));
      for (const auto& [kind, count] : expected) total_expected[kind] += count;
    }
    CHECK(OpBlocks(root) == Show(total_expected));  // and none outside the stage groups
    if (spec.offload != OffloadPolicy::kNone) CHECK(offloads > 0);
    if (spec.split_backward) CHECK(total_expected["W"] > 0);
  }
}

// The value the memory curve shows last at each instant, as the writer draws it.
std::vector<std::int64_t> SettledUnits(const std::vector<MemorySample>& samples) {
  std::vector<std::int64_t> settled;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (i + 1 == samples.size() || samples[i + 1].time != samples[i].time) {
      settled.push_back(samples[i].units);
    }
  }
  return settled;
}

std::vector<std::string> Texts(const XmlElement& element) {
  std::vector<std::string> texts;
  element.Walk([&](const XmlElement& e) {
    if (e.name == "text") texts.push_back(e.text);
  });
  return texts;
}

bool Contains(const std::vector<std::string>& texts, const std::string& text) {
  return std::find(texts.begin(), texts.end(), text) != texts.end();
}

std::string Slots(std::int64_t n) { return std::to_string(n) + (n == 1 ? " slot" : " slots"); }

TEST_CASE("SVG memory plots mark each stage's peak", "[io][svg]") {
  for (const OffloadPolicy policy : {OffloadPolicy::kNone, OffloadPolicy::kHalf,
                                     OffloadPolicy::kFull}) {
    const Picture picture =
        Draw(MakeSpec(Family::k1F1B, 4, 8, 1, 0, false, policy), /*unit_costs=*/true);
    const XmlElement root = ParseSvg(picture.svg);
    for (int d = 0; d < 4; ++d) {
      const std::string name(OffloadPolicyName(policy));
      CAPTURE(name, d);
      const XmlElement plot = Group(root, "memory-" + std::to_string(d));
      REQUIRE(plot.name == "g");
      const std::vector<std::int64_t> settled =
          SettledUnits(picture.timeline.memory[static_cast<std::size_t>(d)]);
      const std::int64_t peak = *std::max_element(settled.begin(), settled.end());
      const StagePrediction& predicted = picture.timeline.predictions.stages[d];
      int paths = 0, circles = 0, dashed = 0;
      plot.Walk([&](const XmlElement& e) {
        paths += e.name == "path" && e.Attribute("class") == "mem";
        dashed += e.name == "line" && e.Attribute("class") == "noofl";
        if (e.name == "circle" && e.Attribute("class") == "peak") {
          ++circles;
          REQUIRE(e.children.size() == 1);
          CHECK(e.children[0].text == "peak " + Slots(peak));
        }
      });
      CHECK(paths == 1);
      CHECK(circles == 1);
      CHECK(dashed == (predicted.peak_units_without_offload > peak ? 1 : 0));
      const std::vector<std::string> texts = Texts(plot);
      CHECK(Contains(texts, "peak " + Slots(peak)));
      CHECK(Contains(texts, "table: " + Slots(predicted.peak_units)) ==
            (predicted.peak_units != peak));
    }
  }
}

double Attribute(const XmlElement& e, const std::string& key) {
  return std::strtod(e.Attribute(key).c_str(), nullptr);
}

TEST_CASE("SVG width follows the step time within its limits", "[io][svg]") {
  // 104 px of labels and 24 of margin around a plot of [560, 1800] px.
  const XmlElement small = ParseSvg(Draw(MakeSpec(Family::k1F1B, 2, 2, 1), true).svg);
  CHECK(Attribute(small, "width") == 688.0);
  const XmlElement mid = ParseSvg(Draw(MakeSpec(Family::k1F1B, 4, 16, 1), true).svg);
  CHECK(Attribute(mid, "width") > 688.0);
  CHECK(Attribute(mid, "width") < 1928.0);
  const Picture large = Draw(MakeSpec(Family::k1F1B, 64, 128, 1, 0, false,
                                      OffloadPolicy::kHalf), false);
  const XmlElement root = ParseSvg(large.svg);
  CHECK(Attribute(root, "width") == 1928.0);
  CHECK(Attribute(root, "height") < 3200.0);
  CHECK(large.svg.size() < 4'000'000);
  CHECK(Group(root, "memory-63").name == "g");
}

// Non-finite, negative and out-of-range values, as a measured or hand-made timeline may have.
TEST_CASE("SVG of odd timelines is still well-formed and finite", "[io][svg]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<Timeline> timelines(3);
  timelines[1].stages = {{testing::Timed(0, OpKind::kForward, 0.0, 0.0)}, {}};
  timelines[1].memory = {{}, {{nan, -5, -1}}};
  Timeline& odd = timelines[2];
  odd.predictions.step_time = 1e300;
  odd.predictions.bubble_ratio = nan;
  odd.stages.resize(2);
  const OpKind kinds[] = {OpKind::kForward, OpKind::kBackward, OpKind::kBackwardWeight,
                          OpKind::kOffload, OpKind::kReload, OpKind::kSendGrad,
                          OpKind::kRelease};
  const double spans[][2] = {{nan, 1.0}, {-inf, inf}, {-3.0, -1.0}, {2.0, 1.0}, {0.0, 1e-300}};
  const int mbs[] = {-1, 0, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()};
  int i = 0;
  for (const OpKind kind : kinds) {
    for (const auto& span : spans) {
      TimedOp t = testing::Timed(i % 2, kind, span[0], span[1], 0);
      t.engine = EngineOf(kind);
      t.op.mb = mbs[i % 4];
      t.bytes = i % 3 == 0 ? -1 : std::numeric_limits<std::int64_t>::max();
      odd.stages[static_cast<std::size_t>(i % 2)].push_back(t);
      ++i;
    }
  }
  odd.memory = {{{0.0, 1, 1}, {inf, std::numeric_limits<std::int64_t>::max(), 7}, {1.0, -9, -9}}};
  odd.predictions.stages.resize(5);
  odd.predictions.stages[0].peak_bytes_without_offload = std::numeric_limits<std::int64_t>::max();
  for (const bool unit_costs : {true, false}) {
    for (const Timeline& timeline : timelines) {
      CAPTURE(unit_costs, timeline.stages.size());
      const std::string svg = TimelineToSvg(Schedule{}, timeline, {unit_costs});
      ParseSvg(svg);
      std::string lower = svg;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      CHECK(lower.find("nan") == std::string::npos);
      CHECK(lower.find("inf") == std::string::npos);
      CHECK(svg == TimelineToSvg(Schedule{}, timeline, {unit_costs}));
    }
  }
}

TEST_CASE("SVG golden picture: 1f1b p=2 m=4 with po-h, unit costs", "[golden][svg]") {
  // Same inputs as `po-schedule --stages 2 --microbatches 4 --policy po-h --unit-costs
  // --format svg`, which tests/cli checks against the same file.
  const std::string svg =
      Draw(MakeSpec(Family::k1F1B, 2, 4, 1, 0, false, OffloadPolicy::kHalf), true).svg;
  testing::MatchGolden("1f1b_p2_m4_po-h.svg", svg);
}

}  // namespace
}  // namespace pipeoffload
