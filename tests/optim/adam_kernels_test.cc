// The CPU Adam kernels: every ISA this CPU runs (and CpuAdam over it) against the scalar
// reference, bit for bit; the scalar reference against a double-precision textbook Adam within
// a stated ulp bound; bf16 outputs of every kernel on hand-picked values.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lib/optim/adam_kernels.h"
#include "pipeoffload/adam.h"
#include "tests/optim/adam_test_data.h"
#include "tests/optim/adam_test_impls.h"
#include "tests/testing/catch.h"

namespace pipeoffload {
namespace {

using testing::AdamBuffers;
using testing::AvailableIsas;
using testing::ArrayOffsets;
using testing::Bits;
using testing::CompareBuffers;
using testing::FromBits;
using testing::kUnaligned;

// PO_OPTIM_REQUIRE_ISAS=avx2,avx512: those ISAs must be available (so a run that was meant to
// exercise them cannot pass by silently testing less).
std::vector<std::string> RequiredIsas() {
  std::vector<std::string> names;
  const char* env = std::getenv("PO_OPTIM_REQUIRE_ISAS");
  if (env == nullptr) return names;
  std::stringstream list(env);
  std::string name;
  while (std::getline(list, name, ',')) {
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

AdamOptions Options(bool adamw) {
  AdamOptions options;
  options.learning_rate = 1e-2f;
  options.beta1 = 0.9f;
  options.beta2 = 0.999f;
  options.epsilon = 1e-8f;
  options.weight_decay = 0.05f;
  options.decoupled_weight_decay = adamw;
  return options;
}

TEST_CASE("every available ISA and CpuAdam match the scalar reference bitwise", "[optim][isa]") {
  const std::vector<CpuIsa> isas = AvailableIsas();
  std::string ran;
  for (CpuIsa isa : isas) ran += std::string(CpuIsaName(isa)) + " ";
  std::cout << "optim_tests [isa]: kernels run on this CPU: " << ran << "(best "
            << CpuIsaName(BestCpuIsa()) << ")\n";
  for (const std::string& name : RequiredIsas()) {
    CAPTURE(name, ran);
    CHECK(ran.find(name + " ") != std::string::npos);
  }

  // Implementations under test: each ISA's kernel called directly, and CpuAdam with 3 threads
  // for each ISA (its cuts fall inside the larger spans), each on arrays at different
  // misalignments and on 64-byte aligned arrays (where the bf16 copy takes the non-temporal
  // store path).
  using Impl = testing::AdamImpl<ArrayOffsets>;
  std::vector<Impl> impls;
  for (CpuIsa isa : isas) {
    for (const bool aligned : {false, true}) {
      const ArrayOffsets offsets = aligned ? ArrayOffsets{} : kUnaligned;
      const std::string suffix = aligned ? "/aligned" : "/unaligned";
      impls.push_back(
          {std::string(CpuIsaName(isa)) + suffix, internal::AdamKernelFor(isa), nullptr, offsets});
      // Software prefetch never changes the bits (the unaligned kernel runs with it).
      if (!aligned) impls.back().prefetch_bytes = 1024;
      CpuAdamOptions options;
      options.threads = 3;
      options.isa = isa;
      options.pick_best_isa = false;
      options.prefetch_bytes = aligned ? 4096 : 0;
      auto cpu_adam = CpuAdam::Create(options);
      REQUIRE(cpu_adam.ok());
      REQUIRE((*cpu_adam)->isa() == isa);
      impls.push_back({"CpuAdam/" + std::string(CpuIsaName(isa)) + suffix, nullptr,
                       std::move(*cpu_adam), offsets});
    }
  }

  const std::int64_t sizes[] = {1, 7, 15, 16, 17, 22, 1023, (std::int64_t{1} << 20) + 3};
  for (const std::int64_t size : sizes) {
    for (const bool adamw : {false, true}) {
      for (const bool with_bf16 : {false, true}) {
        CAPTURE(size, adamw, with_bf16);
        AdamBuffers want(size, ArrayOffsets{});
        want.FillState(static_cast<std::uint64_t>(size));
        std::vector<std::unique_ptr<AdamBuffers>> got;
        for (std::size_t k = 0; k < impls.size(); ++k) {
          got.push_back(std::make_unique<AdamBuffers>(size, impls[k].offsets));
          got.back()->CopyFrom(want);
        }
        constexpr int kSteps = 4;
        for (int step = 1; step <= kSteps; ++step) {
          CAPTURE(step);
          // Step 3 also unscales a loss scale of 1024 and clips.
          const float grad_scale = step == 3 ? 0.7f / 1024.0f : 1.0f;
          auto scalars = MakeAdamStepScalars(Options(adamw), step, grad_scale);
          REQUIRE(scalars.ok());
          want.FillGrad(1000 * static_cast<std::uint64_t>(size) + step);
          AdamUpdateScalar(*scalars, want.Span(with_bf16));
          for (std::size_t k = 0; k < impls.size(); ++k) {
            CAPTURE(impls[k].name);
            got[k]->CopyGradFrom(want);
            const AdamSpan span = got[k]->Span(with_bf16);
            if (impls[k].kernel != nullptr) {
              impls[k].kernel(*scalars, span, impls[k].prefetch_bytes);
            } else {
              REQUIRE(impls[k].cpu_adam->Update(*scalars, span).ok());
            }
            REQUIRE(CompareBuffers(want, *got[k], with_bf16) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("every ISA's bf16 output rounds hand-picked values exactly", "[optim][isa][bf16]") {
  // With m = v = g = 0 and eps > 0 the update is p - step_size * (0 / eps) = p - 0: the param
  // passes through unchanged (signalling NaNs get quieted) and the bf16 output is its rounding.
  const std::uint32_t values[] = {
      0x3f800000, 0x3f808000, 0x3f818000, 0xbf818000, 0x3f808001, 0x3f807fff, 0x3fff8000,
      0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7f7fffff, 0x7f7f7fff, 0x7f7f8000,
      0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x00008001, 0x007fffff, 0x00400000,
      0x7fc00000, 0xffc00000, 0x7f800001, 0xff812345, 0x7fffffff, 0x41200000, 0xc2c80000};
  const std::uint16_t want[] = {
      0x3f80, 0x3f80, 0x3f82, 0xbf82, 0x3f81, 0x3f80, 0x4000, 0x0000, 0x8000, 0x7f80,
      0xff80, 0x7f80, 0x7f7f, 0x7f80, 0x0000, 0x8000, 0x0000, 0x0002, 0x0001, 0x0080,
      0x0040, 0x7fc0, 0xffc0, 0x7fc0, 0xffc1, 0x7fff, 0x4120, 0xc2c8};
  constexpr std::int64_t kCount = sizeof(values) / sizeof(values[0]);  // 28: a vector + tail
  static_assert(sizeof(want) / sizeof(want[0]) == kCount);
  for (CpuIsa isa : AvailableIsas()) {
    for (const bool aligned : {false, true}) {  // plain and non-temporal bf16 stores
      CAPTURE(CpuIsaName(isa), aligned);
      AdamBuffers buffers(kCount, aligned ? ArrayOffsets{} : kUnaligned);
      for (std::int64_t i = 0; i < kCount; ++i) {
        buffers.param()[i] = FromBits(values[i]);
        buffers.exp_avg()[i] = 0.0f;
        buffers.exp_avg_sq()[i] = 0.0f;
        buffers.grad()[i] = 0.0f;
      }
      auto scalars = MakeAdamStepScalars(AdamOptions{}, 1);
      REQUIRE(scalars.ok());
      internal::AdamKernelFor(isa)(*scalars, buffers.Span(/*with_bf16=*/true), 0);
      for (std::int64_t i = 0; i < kCount; ++i) {
        CAPTURE(i, values[i], Bits(buffers.param()[i]));
        CHECK(buffers.bf16()[i] == want[i]);
        CHECK(buffers.bf16()[i] == FloatToBf16Bits(FromBits(values[i])));
        if (!std::isnan(FromBits(values[i]))) CHECK(Bits(buffers.param()[i]) == values[i]);
      }
    }
  }
}

// Distance in units in the last place of float at `reference`.
double UlpDistance(float got, double reference) {
  const float r = static_cast<float>(reference);
  const double ulp = std::nextafter(std::fabs(r), std::numeric_limits<float>::infinity()) -
                     std::fabs(r);
  return std::fabs(double{got} - reference) / ulp;
}

TEST_CASE("the scalar reference tracks a double-precision textbook Adam", "[optim][textbook]") {
  // Textbook Adam (Kingma & Ba, with AdamW's decoupled decay) in double, with the same fp32
  // hyper-parameters and gradients: m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t),
  // p -= lr * m_hat / (sqrt(v_hat) + eps). Only the arithmetic differs. The decay factor is the
  // fp32 one the kernels get (1 - 1e-5 rounded to fp32 is off by ~2e-8 relative; in double that
  // alone would drift p by ~T/3 ulp in one direction: a hyper-parameter difference like 0.9f vs
  // 0.9, not arithmetic error).
  //
  // Bound, per step and element: the fp32 update adds at most 1/2 ulp(p) when it subtracts the
  // step, 1/2 ulp(p) for the decay multiply, and errors in step_size * m / d of ~10 roundings
  // (and of m, v, which are averages and stay within a few ulps relative) on a step of at most
  // ~3 lr; with |p| >= 0.05 and lr = 1e-3 that is below 1 ulp(p). So after T steps the error is
  // at most 2T ulp(p); since the roundings are nearly independent it is ~sqrt(T) in practice,
  // and we also bound the mean.
  const bool adamw = GENERATE(false, true);
  CAPTURE(adamw);
  constexpr std::int64_t kCount = 4099;
  constexpr int kSteps = 200;
  AdamOptions options = Options(adamw);
  options.learning_rate = 1e-3f;
  options.weight_decay = 0.01f;

  std::vector<float> p(kCount), m(kCount, 0.0f), v(kCount, 0.0f), g(kCount);
  std::vector<double> p64(kCount), m64(kCount, 0.0), v64(kCount, 0.0);
  AdamBuffers init(kCount, ArrayOffsets{});
  init.FillState(7);
  for (std::int64_t i = 0; i < kCount; ++i) {
    // Keep |p| >= 0.05 (the bound above is in ulps of p).
    const float x = init.param()[i];
    p[i] = std::fabs(x) < 0.05f ? 0.5f : x;
    p64[i] = p[i];
  }
  const double b1 = options.beta1, b2 = options.beta2, lr = options.learning_rate;
  const double eps = options.epsilon, wd = options.weight_decay;
  if (adamw) {
    REQUIRE(std::fabs(double{MakeAdamStepScalars(options, 1)->decay_factor} - (1.0 - lr * wd)) <
            1e-7);
  }
  double worst = 0.0;
  double sum = 0.0;
  for (int t = 1; t <= kSteps; ++t) {
    AdamBuffers grads(kCount, ArrayOffsets{});
    grads.FillState(100 + t);  // benign gradients: the state generator's m is N(0, 0.01)
    for (std::int64_t i = 0; i < kCount; ++i) g[i] = grads.exp_avg()[i];
    auto scalars = MakeAdamStepScalars(options, t);
    REQUIRE(scalars.ok());
    AdamSpan span;
    span.param = p.data();
    span.exp_avg = m.data();
    span.exp_avg_sq = v.data();
    span.grad = g.data();
    span.count = kCount;
    AdamUpdateScalar(*scalars, span);
    for (std::int64_t i = 0; i < kCount; ++i) {
      double gi = g[i];
      if (!adamw) gi += wd * p64[i];
      m64[i] = b1 * m64[i] + (1.0 - b1) * gi;
      v64[i] = b2 * v64[i] + (1.0 - b2) * gi * gi;
      const double m_hat = m64[i] / (1.0 - std::pow(b1, t));
      const double v_hat = v64[i] / (1.0 - std::pow(b2, t));
      if (adamw) p64[i] *= double{scalars->decay_factor};
      p64[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
    for (std::int64_t i = 0; i < kCount; ++i) {
      const double ulps = UlpDistance(p[i], p64[i]);
      if (t == kSteps) sum += ulps;
      if (ulps > worst) worst = ulps;
      if (ulps > 2.0 * t) {
        CAPTURE(t, i, p[i], p64[i], ulps);
        REQUIRE(ulps <= 2.0 * t);
      }
    }
  }
  const double mean = sum / kCount;
  std::cout << "optim_tests [textbook] " << (adamw ? "AdamW" : "Adam") << ": after " << kSteps
            << " steps, worst " << worst << " ulp, mean " << mean << " ulp (bound " << 2 * kSteps
            << ")\n";
  // Sums of T nearly independent roundings grow like sqrt(T): observed means 3.4 ulp (Adam) and
  // 8.3 (AdamW, which rounds p twice per step), worst 22 and 49.
  CHECK(mean <= 16.0);
  // The reference must have moved the params for this test to mean anything.
  CHECK(p64[0] != static_cast<double>(init.param()[0]));
}

}  // namespace
}  // namespace pipeoffload
