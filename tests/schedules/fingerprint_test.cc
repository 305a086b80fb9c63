// Schedule fingerprints (issue 15): Compile over a grid of generated specs (families, p, m, v,
// split, every policy, four cost models) and the seven cases of bench/schedule_bench at p=64
// m=512, each reduced to a 64-bit hash of its op streams, one of its predictions (every double
// by its bits) and one of Simulate's timeline of it (every start and end by its bits). The hashes
// are compared with tests/golden/schedule_fingerprints.txt, which was written by the compiler
// before the compile-time work of issue 15: that work must not change any schedule, prediction
// or simulated time by a single bit. Only scripts/update_golden.sh rewrites the file
// (PO_UPDATE_GOLDEN=1); a diff there is a change of behaviour to justify, not to accept.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pipeoffload/compiler.h"
#include "pipeoffload/simulate.h"
#include "tests/testing/catch.h"
#include "tests/testing/golden_file.h"

namespace pipeoffload {
namespace {

// FNV-1a over 64-bit words: enough to tell any two op streams or timelines apart in practice,
// and stable across compilers and machines (std::hash is neither).
class Hash {
 public:
  void Add(std::uint64_t word) {
    for (int i = 0; i < 8; ++i) {
      value_ ^= (word >> (8 * i)) & 0xff;
      value_ *= 0x100000001b3ull;
    }
  }
  void Add(double x) { Add(std::bit_cast<std::uint64_t>(x)); }
  void Add(int x) { Add(static_cast<std::uint64_t>(static_cast<std::int64_t>(x))); }
  void Add(std::int64_t x) { Add(static_cast<std::uint64_t>(x)); }
  void Add(const std::string& text) {
    Add(static_cast<std::uint64_t>(text.size()));
    for (const char c : text) Add(static_cast<std::uint64_t>(static_cast<unsigned char>(c)));
  }
  void Add(const Op& op) {
    Add(static_cast<int>(op.kind));
    Add(op.mb);
    Add(op.chunk);
    Add(op.peer);
  }
  std::string Hex() const {
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value_));
    return text;
  }

 private:
  std::uint64_t value_ = 0xcbf29ce484222325ull;
};

std::string OpsHash(const Schedule& schedule, std::size_t* ops) {
  Hash h;
  *ops = 0;
  for (const StageProgram& program : schedule.stages) {
    h.Add(program.stage);
    h.Add(static_cast<int>(program.ops.size()));
    for (const Op& op : program.ops) h.Add(op);
    *ops += program.ops.size();
  }
  return h.Hex();
}

std::string PredictionsHash(const Predictions& p) {
  Hash h;
  h.Add(p.step_time);
  h.Add(p.bubble_ratio);
  h.Add(p.step_time_without_offload);
  for (const StagePrediction& s : p.stages) {
    h.Add(s.peak_units);
    h.Add(s.peak_bytes);
    h.Add(s.peak_units_without_offload);
    h.Add(s.peak_bytes_without_offload);
    h.Add(s.host_bytes);
    h.Add(s.offloaded_bytes);
    h.Add(s.busy_time);
    h.Add(s.end_time);
  }
  for (const LinkTraffic& link : p.links) {
    h.Add(link.name);
    h.Add(link.bytes_d2h);
    h.Add(link.bytes_h2d);
  }
  h.Add(p.collisions);
  for (const std::string& warning : p.warnings) h.Add(warning);
  return h.Hex();
}

std::string TimelineHash(const Timeline& timeline) {
  Hash h;
  for (const auto& stage : timeline.stages) {
    for (const TimedOp& t : stage) {
      h.Add(t.stage);
      h.Add(t.index);
      h.Add(t.op);
      h.Add(static_cast<int>(t.engine));
      h.Add(t.start);
      h.Add(t.end);
      h.Add(t.bytes);
    }
  }
  for (const auto& samples : timeline.memory) {
    for (const MemorySample& sample : samples) {
      h.Add(sample.time);
      h.Add(sample.bytes);
      h.Add(sample.units);
    }
  }
  return h.Hex();
}

// One line: the case, then either its error or its op count and three hashes.
std::string Fingerprint(const std::string& name, const PipelineSpec& spec, const CostModel& cost) {
  absl::StatusOr<Schedule> schedule = Compile(spec, cost);
  if (!schedule.ok()) return name + " error " + std::string(schedule.status().message()) + "\n";
  std::size_t ops = 0;
  const std::string ops_hash = OpsHash(*schedule, &ops);
  std::string line = name + " ops=" + std::to_string(ops) + " program=" + ops_hash;
  line += " predictions=" +
          (schedule->predictions ? PredictionsHash(*schedule->predictions) : std::string("none"));
  // auto prices its pick with a re-chunked model (offload_planner.h), so its timeline under
  // `cost` says nothing about the compiler; its predictions above cover it.
  if (spec.offload != OffloadPolicy::kAuto) {
    absl::StatusOr<Timeline> timeline = Simulate(*schedule, cost);
    line += " timeline=" + (timeline.ok() ? TimelineHash(*timeline)
                                          : "error:" + std::string(timeline.status().message()));
  }
  return line + "\n";
}

struct Shape {
  const char* name;
  Family family;
  int v, g;  // g: 0 for the family's default, -1 for the smallest, ceil(p/2)
};

struct Policy {
  const char* name;
  OffloadPolicy offload;
  double fraction;
  int chunks;
};

struct Cost {
  const char* name;
  CostModel model;
};

std::vector<Cost> Costs() {
  CostModel slow_link = UnitCostModel(0.5);
  slow_link.host_link_group_size = 1;
  CostModel shared = UnitCostModel(0.25);
  shared.shared_copy_engine = true;
  shared.p2p_shares_host_link = true;
  shared.boundary_bytes = 1 << 14;
  shared.p2p_bandwidth = 1 << 24;
  shared.host_link_group_size = 4;
  CostModel uneven = EstimateGptCostModel(GptShape{});
  uneven.stage_time_scale = {1.0, 1.25, 0.75, 1.5, 1.0, 0.5, 1.125, 1.0};
  uneven.p2p_shares_host_link = true;
  return {{"unit0.25", UnitCostModel(0.25)},
          {"unit0.5-link1", slow_link},
          {"shared-engine", shared},
          {"gpt-uneven", uneven}};
}

constexpr Shape kShapes[] = {
    {"1f1b", Family::k1F1B, 1, 0},
    {"interleaved-v2", Family::kInterleaved, 2, 0},
    {"interleaved-v4", Family::kInterleaved, 4, 0},
    {"group-v2", Family::kGroupInterleaved, 2, 0},
    {"group-v4-gmin", Family::kGroupInterleaved, 4, -1},
};

constexpr Policy kPolicies[] = {
    {"none", OffloadPolicy::kNone, 0.0, 0},
    {"po-h", OffloadPolicy::kHalf, 0.0, 0},
    {"po-f", OffloadPolicy::kFull, 0.0, 0},
    {"selective-c1", OffloadPolicy::kSelective, 0.0, 1},
    {"selective-f0.3", OffloadPolicy::kSelective, 0.3, 0},
    {"auto", OffloadPolicy::kAuto, 0.0, 0},
};

std::string RenderGrid() {
  std::string out =
      "# Schedule fingerprints (tests/schedules/fingerprint_test.cc), written by\n"
      "# scripts/update_golden.sh; recorded before issue 15's compile-time work. Review diffs.\n";
  for (const Cost& cost : Costs()) {
    for (const Shape& shape : kShapes) {
      for (const int p : {2, 4, 8}) {
        CostModel model = cost.model;
        // One scale per stage: the first p of the model's (CheckCostModel wants exactly p).
        if (!model.stage_time_scale.empty()) model.stage_time_scale.resize(p);
        for (const int m : {8, 16}) {
          for (const bool split : {false, true}) {
            for (const Policy& policy : kPolicies) {
              PipelineSpec spec;
              spec.family = shape.family;
              spec.num_stages = p;
              spec.num_microbatches = m;
              spec.chunks_per_stage = shape.v;
              spec.group_size = shape.g < 0 ? (p + 1) / 2 : shape.g;
              spec.split_backward = split;
              spec.offload = policy.offload;
              spec.offload_fraction = policy.fraction;
              spec.offload_chunks = policy.chunks;
              // auto: room for three of the stage's entries.
              spec.memory_budget_bytes = 3 * model.ActivationBytes(0, 0, p);
              const std::string name = std::string(cost.name) + "/" + shape.name +
                                       "/p" + std::to_string(p) + "/m" + std::to_string(m) +
                                       (split ? "/split/" : "/") + policy.name;
              out += Fingerprint(name, spec, model);
            }
          }
        }
      }
    }
  }
  return out;
}

// bench/schedule_bench's cases, as it defines them.
std::string RenderBench() {
  const CostModel cost = UnitCostModel(0.25);
  const auto spec = [](Family family, int v, OffloadPolicy offload) {
    PipelineSpec s;
    s.family = family;
    s.num_stages = 64;
    s.num_microbatches = 512;
    s.chunks_per_stage = v;
    s.offload = offload;
    return s;
  };
  PipelineSpec selective = spec(Family::kGroupInterleaved, 4, OffloadPolicy::kSelective);
  selective.offload_chunks = 3;
  PipelineSpec automatic = spec(Family::kGroupInterleaved, 4, OffloadPolicy::kAuto);
  automatic.memory_budget_bytes = 8 * cost.ActivationBytes(0, 0, 64);
  std::string out =
      "# bench/schedule_bench's cases (p=64 m=512, unit costs, k = 0.25), written by\n"
      "# scripts/update_golden.sh; recorded before issue 15's compile-time work. Review diffs.\n";
  out += Fingerprint("1f1b", spec(Family::k1F1B, 1, OffloadPolicy::kNone), cost);
  out += Fingerprint("interleaved", spec(Family::kInterleaved, 4, OffloadPolicy::kNone), cost);
  out += Fingerprint("group", spec(Family::kGroupInterleaved, 4, OffloadPolicy::kNone), cost);
  out += Fingerprint("po-h", spec(Family::kGroupInterleaved, 4, OffloadPolicy::kHalf), cost);
  out += Fingerprint("po-f", spec(Family::kGroupInterleaved, 4, OffloadPolicy::kFull), cost);
  out += Fingerprint("selective", selective, cost);
  out += Fingerprint("auto", automatic, cost);
  return out;
}

TEST_CASE("compiled schedules keep their fingerprints over a grid of specs",
          "[golden][fingerprint]") {
  testing::MatchGolden("schedule_fingerprints.txt", RenderGrid());
}

TEST_CASE("the schedule_bench cases at p=64 m=512 keep their fingerprints",
          "[golden][fingerprint]") {
  testing::MatchGolden("schedule_bench_fingerprints.txt", RenderBench());
}

// The planner plans link groups on several threads (lib/base/parallel_for.h): the schedule and
// its predictions must not depend on how many. Plans with 4 and 2 link groups (pairs, and the
// shared-engine model's groups of four), on one thread, on three, and on more than groups.
TEST_CASE("compiled schedules do not depend on the compiler's threads", "[fingerprint]") {
  const char* const before = std::getenv("PO_COMPILE_THREADS");
  const std::string saved = before == nullptr ? "" : before;
  const std::vector<Cost> costs = Costs();
  for (const Cost& cost : {costs[0], costs[2]}) {
    for (const Policy& policy : kPolicies) {
      if (policy.offload == OffloadPolicy::kNone) continue;
      PipelineSpec spec;
      spec.family = Family::kGroupInterleaved;
      spec.num_stages = 8;
      spec.num_microbatches = 32;
      spec.chunks_per_stage = 2;
      spec.group_size = 4;
      spec.split_backward = true;
      spec.offload = policy.offload;
      spec.offload_fraction = policy.fraction;
      spec.offload_chunks = policy.chunks;
      spec.memory_budget_bytes = 3 * cost.model.ActivationBytes(0, 0, 8);
      std::vector<std::string> prints;
      for (const char* threads : {"1", "3", "16"}) {
        ::setenv("PO_COMPILE_THREADS", threads, 1);
        prints.push_back(Fingerprint(policy.name, spec, cost.model));
      }
      INFO(cost.name << " / " << policy.name);
      CHECK(prints[1] == prints[0]);
      CHECK(prints[2] == prints[0]);
    }
  }
  if (before == nullptr) {
    ::unsetenv("PO_COMPILE_THREADS");
  } else {
    ::setenv("PO_COMPILE_THREADS", saved.c_str(), 1);
  }
}

}  // namespace
}  // namespace pipeoffload
