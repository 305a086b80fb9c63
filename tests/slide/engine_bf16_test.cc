// The layer-sliding engine's bf16 path on the CPU backend: a toy model with bf16 parameters
// and wire gradients, so the split master (adam.h's SplitMaster: the bf16 parameter is the
// master's high half, its low half lives beside it) runs in CI. Against a reference written out
// here, bitwise: masters, m, v, losses and norms over several steps, for all-sliding,
// all-resident and mixed placements, with and without clipping, and with the NVMe tier (which
// then holds the masters' low halves with m and v, and the activation checkpoints).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/backend.h"
#include "pipeoffload/layer_sliding.h"
#include "tests/slide/nvme_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

constexpr int kUnits = 5;
constexpr std::int64_t kWidth = 96;   // activation floats per microbatch
constexpr int kMicrobatches = 2;
constexpr int kSteps = 4;

float Up(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Unit u has kWidth + 8 * u bf16 parameters w; only the first kWidth are read (the rest get
// zero gradients, which Adam still updates). Microbatch mb's forward: unit 0 writes
// y = w * (mb + 1); a middle unit y = x + w; the last unit's loss is the sum over microbatches
// of 0.5 * sum((x + w)^2) / (kWidth * M). Every gradient follows by hand.
class ToyBf16Model final : public SlidingModel {
 public:
  ToyBf16Model() {
    shape_.param_dtype = SlideDtype::kBf16;
    shape_.activation_bytes = kWidth * 4;
    shape_.model_device_bytes = 0;
    for (int u = 0; u < kUnits; ++u) {
      SlidingUnitShape unit;
      unit.name = u == 0 ? "embed" : u + 1 == kUnits ? "head" : absl::StrCat("layer.", u - 1);
      unit.param_count = kWidth + 8 * u;
      unit.decay = {{0, unit.param_count / 2}};
      shape_.units.push_back(unit);
    }
  }

  const SlidingModelShape& Shape() const override { return shape_; }

  absl::Status BeginStep(std::int64_t, int num_microbatches) override {
    num_microbatches_ = num_microbatches;
    loss_ = 0.0;
    return absl::OkStatus();
  }

  absl::Status Forward(const UnitCall& call) override {
    PO_RETURN_IF_ERROR(CheckUnitCall(shape_, call, false, num_microbatches_, "toy"));
    const auto* w = static_cast<const std::uint16_t*>(call.params);
    auto* y = static_cast<float*>(call.output);
    const auto* x = static_cast<const float*>(call.input);
    for (std::int64_t i = 0; i < kWidth; ++i) {
      y[i] = call.unit == 0 ? Up(w[i]) * static_cast<float>(call.mb + 1) : x[i] + Up(w[i]);
    }
    return absl::OkStatus();
  }

  absl::Status Backward(const UnitCall& call) override {
    PO_RETURN_IF_ERROR(CheckUnitCall(shape_, call, true, num_microbatches_, "toy"));
    const auto* w = static_cast<const std::uint16_t*>(call.params);
    const auto* x = static_cast<const float*>(call.input);
    const auto* dy = static_cast<const float*>(call.grad_output);
    auto* dx = static_cast<float*>(call.grad_input);
    const float scale = 1.0f / static_cast<float>(kWidth * num_microbatches_);
    for (std::int64_t i = 0; i < kWidth; ++i) {
      float g;
      if (call.unit + 1 == kUnits) {
        const float z = x[i] + Up(w[i]);
        loss_ += 0.5 * static_cast<double>(z) * z * scale;
        g = z * scale;
      } else {
        g = dy[i];
      }
      if (call.unit == 0) {
        call.grad_accum[i] += g * static_cast<float>(call.mb + 1);
      } else {
        call.grad_accum[i] += g;
        dx[i] = g;
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<double> StepLoss() override { return loss_; }

 private:
  SlidingModelShape shape_;
  int num_microbatches_ = 0;
  double loss_ = 0.0;
};

// The same training written out: split masters, the model's forward and backward in float on
// the high halves, the gradients accumulated in the engine's order (microbatches ascending),
// rounded to bf16, their norm summed unit by unit, then Adam on the split masters.
struct Reference {
  std::vector<std::vector<std::uint16_t>> hi, lo;
  std::vector<std::vector<float>> m, v;
  std::vector<double> losses, norms;
};

Reference TrainReference(const std::vector<std::vector<float>>& init, const SlidingOptions& o,
                         const std::vector<float>& lrs) {
  Reference r;
  for (const std::vector<float>& values : init) {
    std::vector<std::uint16_t> hi(values.size()), lo(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const SplitBf16 split = SplitMaster(values[i]);
      hi[i] = split.hi;
      lo[i] = split.lo;
    }
    r.hi.push_back(hi);
    r.lo.push_back(lo);
    r.m.emplace_back(values.size(), 0.0f);
    r.v.emplace_back(values.size(), 0.0f);
  }
  auto cpu_adam = CpuAdam::Create({});
  REQUIRE(cpu_adam.ok());
  std::int64_t adam_step = 0;
  for (const float lr : lrs) {
    std::vector<std::vector<float>> accum;
    for (const std::vector<std::uint16_t>& hi : r.hi) accum.emplace_back(hi.size(), 0.0f);
    double loss = 0.0;
    const float scale = 1.0f / static_cast<float>(kWidth * kMicrobatches);
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      std::vector<float> x(kWidth);
      for (std::int64_t i = 0; i < kWidth; ++i) x[i] = Up(r.hi[0][i]) * static_cast<float>(mb + 1);
      std::vector<std::vector<float>> inputs(kUnits);
      for (int u = 1; u < kUnits; ++u) {
        inputs[u] = x;
        if (u + 1 < kUnits) {
          for (std::int64_t i = 0; i < kWidth; ++i) x[i] = x[i] + Up(r.hi[u][i]);
        }
      }
      std::vector<float> g(kWidth);
      for (std::int64_t i = 0; i < kWidth; ++i) {
        const float z = inputs[kUnits - 1][i] + Up(r.hi[kUnits - 1][i]);
        loss += 0.5 * static_cast<double>(z) * z * scale;
        g[i] = z * scale;
      }
      for (int u = kUnits - 1; u >= 0; --u) {
        for (std::int64_t i = 0; i < kWidth; ++i) {
          accum[u][i] += u == 0 ? g[i] * static_cast<float>(mb + 1) : g[i];
        }
      }
    }
    std::vector<std::vector<std::uint16_t>> wire;
    double total = 0.0;
    for (int u = 0; u < kUnits; ++u) {
      std::vector<std::uint16_t> w(accum[u].size());
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = FloatToBf16Bits(accum[u][i]);
      total += (*cpu_adam)->SumOfSquaresBf16(w.data(), static_cast<std::int64_t>(w.size()));
      wire.push_back(std::move(w));
    }
    const double norm = std::sqrt(total);
    r.losses.push_back(loss);
    r.norms.push_back(norm);
    const float coefficient = ClipCoefficient(norm, o.max_grad_norm);
    AdamOptions adam = o.adam;
    adam.learning_rate = lr;
    ++adam_step;
    const absl::StatusOr<AdamStepScalars> decay = MakeAdamStepScalars(adam, adam_step, coefficient);
    adam.weight_decay = 0.0f;
    const absl::StatusOr<AdamStepScalars> no_decay =
        MakeAdamStepScalars(adam, adam_step, coefficient);
    REQUIRE(decay.ok());
    REQUIRE(no_decay.ok());
    for (int u = 0; u < kUnits; ++u) {
      const std::int64_t n = static_cast<std::int64_t>(r.hi[u].size());
      for (const bool decayed : {true, false}) {
        const std::int64_t begin = decayed ? 0 : n / 2;
        AdamSpan span;
        span.param_bf16 = r.hi[u].data() + begin;
        span.param_lo = r.lo[u].data() + begin;
        span.exp_avg = r.m[u].data() + begin;
        span.exp_avg_sq = r.v[u].data() + begin;
        span.grad_bf16 = wire[u].data() + begin;
        span.count = decayed ? n / 2 : n - n / 2;
        REQUIRE((*cpu_adam)->Update(decayed ? *decay : *no_decay, span).ok());
      }
    }
  }
  return r;
}

std::vector<std::vector<float>> InitialParams(const SlidingModelShape& shape) {
  std::vector<std::vector<float>> init;
  std::uint32_t state = 12345;
  for (const SlidingUnitShape& unit : shape.units) {
    std::vector<float> values(static_cast<std::size_t>(unit.param_count));
    for (float& value : values) {
      state = state * 1664525u + 1013904223u;
      // Uniform in [-1, 1) with all 32 bits of mantissa noise, so the low halves matter.
      value = static_cast<float>(static_cast<std::int32_t>(state)) * (1.0f / 2147483648.0f);
    }
    init.push_back(std::move(values));
  }
  return init;
}

std::uint32_t Bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

void RunCase(const std::string& name, SlidingOptions options) {
  INFO("case " << name);
  ToyBf16Model model;
  const std::vector<std::vector<float>> init = InitialParams(model.Shape());
  std::vector<float> lrs;
  for (int s = 0; s < kSteps; ++s) lrs.push_back(3e-3f * static_cast<float>(s + 1));
  const Reference want = TrainReference(init, options, lrs);

  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  REQUIRE(backend.ok());
  options.num_microbatches = kMicrobatches;
  options.gpu_memory_budget_bytes = std::int64_t{1} << 30;
  options.grad_chunk_elements = 40;  // several chunks per unit
  options.cpu.threads = 2;
  options.timeout_seconds = 60.0;
  absl::StatusOr<std::unique_ptr<LayerSlidingEngine>> engine =
      LayerSlidingEngine::Create(**backend, model, options);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  for (int u = 0; u < kUnits; ++u) REQUIRE((*engine)->SetUnitParams(u, init[u]).ok());
  // The masters read back exactly as set: the split is lossless on both sides.
  for (int u = 0; u < kUnits; ++u) {
    std::vector<float> back(init[u].size());
    REQUIRE((*engine)->GetUnitParams(u, back).ok());
    CHECK(back == init[u]);
  }
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s);
    absl::StatusOr<SlidingStepResult> result = (*engine)->Step({lrs[static_cast<std::size_t>(s)]});
    INFO(result.status().ToString());
    REQUIRE(result.ok());
    const absl::StatusOr<double> loss = model.StepLoss();
    REQUIRE(loss.ok());
    CHECK(*loss == want.losses[static_cast<std::size_t>(s)]);
    CHECK(result->grad_norm == want.norms[static_cast<std::size_t>(s)]);
  }
  for (int u = 0; u < kUnits; ++u) {
    INFO("unit " << u << " (" << std::string(UnitPlaceName((*engine)->plan().placement[static_cast<std::size_t>(u)])) << ")");
    const std::size_t n = init[u].size();
    std::vector<float> master(n), m(n), v(n);
    REQUIRE((*engine)->GetUnitParams(u, master).ok());
    REQUIRE((*engine)->GetUnitOptimizerState(u, m, v).ok());
    std::int64_t wrong = -1;
    for (std::size_t i = 0; i < n && wrong < 0; ++i) {
      const float joined = JoinSplitMaster(want.hi[u][i], want.lo[u][i]);
      if (Bits(master[i]) != Bits(joined) || Bits(m[i]) != Bits(want.m[u][i]) ||
          Bits(v[i]) != Bits(want.v[u][i])) {
        wrong = static_cast<std::int64_t>(i);
      }
    }
    CHECK(wrong == -1);
    // The masters moved off their bf16 grid: the low halves carry information.
    std::int64_t off_grid = 0;
    for (std::size_t i = 0; i < n; ++i) off_grid += (Bits(master[i]) & 0xffffu) != 0 ? 1 : 0;
    CHECK(off_grid > static_cast<std::int64_t>(n) / 2);
  }
  CHECK((*engine)->unit_update_counts() == std::vector<std::int64_t>(kUnits, kSteps));
}

SlidingOptions BaseOptions() {
  SlidingOptions o;
  o.adam.weight_decay = 0.1f;
  o.adam.beta2 = 0.95f;
  return o;
}

TEST_CASE("bf16 sliding on the CPU backend: split masters equal the written-out reference",
          "[slide][engine][bf16]") {
  SlidingOptions all_sliding = BaseOptions();
  all_sliding.placement.assign(kUnits, UnitPlace::kSliding);
  RunCase("all sliding, 2 slots", [&] {
    SlidingOptions o = all_sliding;
    o.num_slots = 2;
    return o;
  }());
  RunCase("all sliding, clipped", [&] {
    SlidingOptions o = all_sliding;
    o.max_grad_norm = 0.05;
    return o;
  }());
  SlidingOptions resident = BaseOptions();
  resident.all_resident = true;
  RunCase("all resident", resident);
  SlidingOptions mixed = all_sliding;
  mixed.placement[0] = mixed.placement[2] = UnitPlace::kResident;
  RunCase("embed and layer.1 resident", mixed);
  // m, v and the masters' low halves of the top 3 sliding units on the NVMe tier.
  const testing::TestDir dir;
  SlidingOptions nvme = mixed;
  nvme.nvme_dir = dir.path();
  nvme.nvme_fraction = 1.0;
  RunCase("NVMe", nvme);
  // The checkpoints (units 1 and 2) on the drive too, and alone, all sliding and clipped.
  SlidingOptions checkpoints = nvme;
  checkpoints.nvme_checkpoint_fraction = 1.0;
  RunCase("NVMe state and checkpoints", checkpoints);
  SlidingOptions only_checkpoints = all_sliding;
  only_checkpoints.max_grad_norm = 0.05;
  only_checkpoints.nvme_dir = dir.path();
  only_checkpoints.nvme_checkpoint_fraction = 1.0;
  RunCase("NVMe checkpoints only", only_checkpoints);
}

}  // namespace
}  // namespace pipeoffload
