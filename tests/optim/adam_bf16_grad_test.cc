// bf16 gradients (AdamSpan::grad_bf16) in every CPU kernel, CpuAdam and the sums of squares: each
// must give exactly the bits of the fp32 path run on the upcast gradients (adam.h), on every ISA
// this CPU runs, every awkward size, special values (bf16 subnormals, zeros of both signs,
// infinities, NaN payloads, huge and tiny grad_scale) and every thread count; and bad gradient
// pointers are rejected with nothing written. Tags: [optim][bf16grad] (+ [isa] [threads] [errors]).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
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
using testing::ArrayOffsets;
using testing::AvailableIsas;
using testing::CompareBuffers;
using testing::MakeCpuAdam;
using testing::kUnaligned;

AdamOptions Options(bool adamw) {
  AdamOptions options;
  options.learning_rate = 1e-2f;
  options.weight_decay = 0.05f;
  options.decoupled_weight_decay = adamw;
  return options;
}

using Impl = testing::AdamImpl<ArrayOffsets>;

// Every ISA's kernel and CpuAdam (3 threads, so its cuts fall inside the larger spans), each on
// misaligned arrays with software prefetch and on 64-byte aligned ones (where the bf16 copy takes
// the non-temporal path and the bf16 gradient loads are aligned).
std::vector<Impl> AllImpls() {
  std::vector<Impl> impls;
  for (CpuIsa isa : AvailableIsas()) {
    for (const bool aligned : {false, true}) {
      const ArrayOffsets offsets = aligned ? ArrayOffsets{} : kUnaligned;
      const std::string suffix = aligned ? "/aligned" : "/unaligned";
      const int prefetch = aligned ? 0 : 1024;
      impls.push_back({std::string(CpuIsaName(isa)) + suffix, internal::AdamKernelFor(isa),
                       nullptr, offsets, prefetch});
      impls.push_back({"CpuAdam/" + std::string(CpuIsaName(isa)) + suffix, nullptr,
                       MakeCpuAdam(3, isa, 4096 - prefetch), offsets});
    }
  }
  return impls;
}

std::int64_t CountNaN(const float* x, std::int64_t count) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < count; ++i) n += std::isnan(x[i]) ? 1 : 0;
  return n;
}

TEST_CASE("bf16 gradients give the fp32 path's bits on the upcast gradients, every ISA and size",
          "[optim][bf16grad][isa]") {
  const std::vector<Impl> impls = AllImpls();
  // Per step: an ordinary step, a tiny scale (g underflows into fp32 subnormals and g * g to 0), a
  // loss-scale unscale with clipping, and a huge scale (g * g overflows) together with infinite
  // and NaN gradients. The non-finite ones come last: from a finite state every NaN then has one
  // source per element, so its bits do not depend on which operand an instruction propagates.
  const float scales[] = {1.0f, 1e-30f, 0.7f / 1024.0f, 1e30f};
  const std::int64_t sizes[] = {1, 7, 15, 16, 17, 22, 1023, (std::int64_t{1} << 20) + 3};
  for (const std::int64_t size : sizes) {
    for (const bool adamw : {false, true}) {
      for (const bool with_bf16 : {false, true}) {
        CAPTURE(size, adamw, with_bf16);
        AdamBuffers want(size, ArrayOffsets{});
        want.FillState(static_cast<std::uint64_t>(size) + 11);
        std::vector<std::unique_ptr<AdamBuffers>> got;
        for (const Impl& impl : impls) {
          got.push_back(std::make_unique<AdamBuffers>(size, impl.offsets));
          got.back()->CopyFrom(want);
        }
        for (int step = 1; step <= 4; ++step) {
          CAPTURE(step);
          auto scalars = MakeAdamStepScalars(Options(adamw), step, scales[step - 1]);
          REQUIRE(scalars.ok());
          want.FillGradBf16(1000 * static_cast<std::uint64_t>(size) + step, step == 4);
          // The reference: the scalar kernel's fp32 path on the upcast values.
          AdamUpdateScalar(*scalars, want.Span(with_bf16, /*bf16_grad=*/false));
          for (std::size_t k = 0; k < impls.size(); ++k) {
            CAPTURE(impls[k].name);
            got[k]->CopyGradFrom(want);
            impls[k].Run(*scalars, got[k]->Span(with_bf16, /*bf16_grad=*/true));
            REQUIRE(CompareBuffers(want, *got[k], with_bf16) == "");
          }
        }
        if (size >= 1023) {
          // The special values were there: infinite and NaN gradients made NaN params.
          CHECK(CountNaN(want.param(), size) > size / 100);
        }
      }
    }
  }
}

TEST_CASE("every bf16 bit pattern as a gradient gives the fp32 path's bits",
          "[optim][bf16grad][isa]") {
  // All 65536 patterns: every subnormal, both zeros, both infinities, every NaN payload. One
  // step from a finite state, so NaN bits are determined (see above).
  constexpr std::int64_t kCount = std::int64_t{1} << 16;
  const std::vector<Impl> impls = AllImpls();
  AdamBuffers init(kCount, ArrayOffsets{});
  init.FillState(77);
  for (std::int64_t i = 0; i < kCount; ++i) {
    init.grad_bf16()[i] = static_cast<std::uint16_t>(i);
    init.grad()[i] = Bf16BitsToFloat(static_cast<std::uint16_t>(i));
  }
  for (const float scale : {1.0f, 1e-30f, 1e30f, 0.7f / 1024.0f}) {
    for (const bool adamw : {false, true}) {
      for (const bool with_bf16 : {false, true}) {
        CAPTURE(scale, adamw, with_bf16);
        auto scalars = MakeAdamStepScalars(Options(adamw), 3, scale);
        REQUIRE(scalars.ok());
        AdamBuffers want(kCount, ArrayOffsets{});
        want.CopyFrom(init);
        AdamUpdateScalar(*scalars, want.Span(with_bf16, /*bf16_grad=*/false));
        // The reference reached the special cases: the 2 * 127 NaN patterns at least.
        REQUIRE(CountNaN(want.param(), kCount) >= 2 * 127);
        for (const Impl& impl : impls) {
          CAPTURE(impl.name);
          AdamBuffers got(kCount, impl.offsets);
          got.CopyFrom(init);
          impl.Run(*scalars, got.Span(with_bf16, /*bf16_grad=*/true));
          REQUIRE(CompareBuffers(want, got, with_bf16) == "");
        }
      }
    }
  }
}

TEST_CASE("CpuAdam with bf16 gradients gives the same bits for 1 to 4 threads",
          "[optim][bf16grad][threads]") {
  // 2^20 + 37 elements: every thread count below uses all its threads, cutting at different
  // places.
  constexpr std::int64_t kCount = (std::int64_t{1} << 20) + 37;
  const CpuIsa isa = BestCpuIsa();
  CAPTURE(CpuIsaName(isa));
  const bool adamw = GENERATE(false, true);
  CAPTURE(adamw);
  AdamBuffers init(kCount, kUnaligned);
  init.FillState(99);
  std::vector<std::unique_ptr<AdamBuffers>> grads;
  for (int step = 1; step <= 3; ++step) {
    grads.push_back(std::make_unique<AdamBuffers>(kCount, ArrayOffsets{}));
    grads.back()->FillGradBf16(700 + step, /*non_finite=*/false);
  }
  // bf16_grad false: the fp32 path on the upcast values (the reference), true: the bf16 path.
  auto run = [&](AdamBuffers& buffers, CpuAdam& cpu_adam, bool bf16_grad) {
    buffers.CopyFrom(init);
    for (int step = 1; step <= 3; ++step) {
      auto scalars = MakeAdamStepScalars(Options(adamw), step);
      REQUIRE(scalars.ok());
      buffers.CopyGradFrom(*grads[static_cast<std::size_t>(step - 1)]);
      REQUIRE(cpu_adam.Update(*scalars, buffers.Span(/*with_bf16=*/true, bf16_grad)).ok());
    }
  };
  AdamBuffers want(kCount, ArrayOffsets{});
  run(want, *MakeCpuAdam(1, CpuIsa::kScalar), /*bf16_grad=*/false);
  for (const int threads : {1, 2, 3, 4}) {
    CAPTURE(threads);
    AdamBuffers got(kCount, kUnaligned);
    run(got, *MakeCpuAdam(threads, isa), /*bf16_grad=*/true);
    REQUIRE(CompareBuffers(want, got, true) == "");
  }
}

// Every array of `b`, bf16 gradients included, to prove a rejected call wrote nothing.
std::vector<std::uint8_t> Bytes(AdamBuffers& b) {
  std::vector<std::uint8_t> out;
  const auto n = static_cast<std::size_t>(b.count());
  auto append = [&](const void* data, std::size_t bytes) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    out.insert(out.end(), p, p + bytes);
  };
  append(b.param(), n * 4);
  append(b.exp_avg(), n * 4);
  append(b.exp_avg_sq(), n * 4);
  append(b.grad(), n * 4);
  append(b.bf16(), n * 2);
  append(b.grad_bf16(), n * 2);
  return out;
}

TEST_CASE("CheckAdamSpan and CpuAdam::Update reject bad gradient pointers, writing nothing",
          "[optim][bf16grad][errors]") {
  constexpr std::int64_t kCount = 300000;  // large enough to be threaded
  AdamBuffers buffers(kCount, kUnaligned);
  buffers.FillState(1);
  buffers.FillGradBf16(2, /*non_finite=*/false);
  const std::vector<std::uint8_t> before = Bytes(buffers);
  auto cpu_adam = MakeCpuAdam(3, BestCpuIsa());
  auto scalars = MakeAdamStepScalars(AdamOptions{}, 1);
  REQUIRE(scalars.ok());

  const AdamSpan good = buffers.Span(/*with_bf16=*/true, /*bf16_grad=*/true);
  REQUIRE(CheckAdamSpan(good).ok());
  std::vector<testing::BadAdamSpan> cases;
  auto add = [&](std::vector<std::string> words, auto change) {
    AdamSpan s = good;
    change(s);
    cases.push_back({std::move(words), s});
  };
  add({"grad", "grad_bf16", "both are set"}, [&](AdamSpan& s) { s.grad = buffers.grad(); });
  add({"grad", "grad_bf16", "both are null"}, [](AdamSpan& s) { s.grad_bf16 = nullptr; });
  add({"grad_bf16", "param", "overlap"},
      [](AdamSpan& s) { s.grad_bf16 = reinterpret_cast<std::uint16_t*>(s.param + 10); });
  // Each bad gradient lies inside the array it overlaps: one that ran past that array's end
  // would also overlap whatever the allocator put next, and the message would name that.
  add({"grad_bf16", "param_bf16", "overlap"},
      [](AdamSpan& s) { s.grad_bf16 = s.param_bf16; });
  add({"exp_avg_sq", "grad_bf16", "overlap"}, [](AdamSpan& s) {
    s.grad_bf16 = reinterpret_cast<std::uint16_t*>(s.exp_avg_sq + kCount) - kCount;
  });
  for (const testing::BadAdamSpan& c : cases) {
    testing::ExpectRefused(c, *cpu_adam, *scalars);
    REQUIRE(Bytes(buffers) == before);
  }
  // With nothing to do, no pointer is needed; touching arrays are fine.
  AdamSpan empty;
  CHECK(CheckAdamSpan(empty).ok());
  AdamSpan adjacent = good;
  adjacent.count = 100;
  adjacent.grad_bf16 = reinterpret_cast<std::uint16_t*>(adjacent.param + 100);
  CHECK(CheckAdamSpan(adjacent).ok());
}

// A double's bits (so NaN and -0 compare exactly).
std::uint64_t DoubleBits(double x) {
  std::uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

TEST_CASE("SumOfSquaresBf16 has the bits of SumOfSquares on the upcast values",
          "[optim][bf16grad][threads]") {
  const std::int64_t count = GENERATE(std::int64_t{0}, std::int64_t{1}, std::int64_t{17},
                                      internal::kSumBlock - 1, internal::kSumBlock,
                                      internal::kSumBlock + 1, std::int64_t{1} << 20,
                                      (std::int64_t{3} << 20) + 12345);
  const bool non_finite = GENERATE(false, true);
  CAPTURE(count, non_finite);
  AdamBuffers data(count, kUnaligned);  // grad_bf16 2 bytes past a 64-byte boundary
  data.FillGradBf16(static_cast<std::uint64_t>(count) + 5, non_finite);
  if (!non_finite) {
    // Drop the huge values (their squares, 1e60, would hide every other term).
    for (std::int64_t i = 0; i < count; ++i) {
      if (std::fabs(data.grad()[i]) > 1e10f) {
        data.grad_bf16()[i] = 0x3f80;  // 1.0
        data.grad()[i] = 1.0f;
      }
    }
  }
  // The contract, independently: scalar block sums of the upcast values, in block order.
  double want = 0.0;
  for (std::int64_t begin = 0; begin < count; begin += internal::kSumBlock) {
    want += internal::SumOfSquaresBlockScalar(data.grad() + begin,
                                              std::min(internal::kSumBlock, count - begin));
  }
  if (!non_finite && count > 0) CHECK(want > 0.0);
  if (non_finite && count >= 1023) CHECK(std::isnan(want));
  for (CpuIsa isa : AvailableIsas()) {
    for (const int threads : {1, 2, 3, 4, 7}) {
      CAPTURE(CpuIsaName(isa), threads);
      auto cpu_adam = MakeCpuAdam(threads, isa);
      const double got = cpu_adam->SumOfSquaresBf16(data.grad_bf16(), count);
      const double fp32 = cpu_adam->SumOfSquares(data.grad(), count);
      CAPTURE(got, fp32, want);
      CHECK(DoubleBits(got) == DoubleBits(fp32));
      // Across ISAs only finite sums are the same bits (a NaN's payload may differ).
      if (!std::isnan(want)) CHECK(DoubleBits(got) == DoubleBits(want));
    }
  }
}

TEST_CASE("bf16 block sum-of-squares kernels follow the lane tree exactly",
          "[optim][bf16grad][isa]") {
  // 1e8 swamps the small squares unless they meet first: any other order changes the bits.
  std::vector<std::uint16_t> x(100);
  std::vector<float> upcast(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = FloatToBf16Bits((i % 5 == 0) ? 1e8f : 1.0f + static_cast<float>(i) * 0.25f);
    upcast[i] = Bf16BitsToFloat(x[i]);
  }
  for (std::int64_t n = 0; n <= 100; ++n) {
    const double want = internal::SumOfSquaresBlockScalar(upcast.data(), n);
    CHECK(internal::SumOfSquaresBf16BlockScalar(x.data(), n) == want);
    for (CpuIsa isa : AvailableIsas()) {
      CAPTURE(n, CpuIsaName(isa));
      CHECK(internal::SumOfSquaresBf16BlockKernelFor(isa)(x.data(), n) == want);
      // Misaligned by one element.
      CHECK(internal::SumOfSquaresBf16BlockKernelFor(isa)(x.data() + 1, n > 0 ? n - 1 : 0) ==
            internal::SumOfSquaresBlockScalar(upcast.data() + 1, n > 0 ? n - 1 : 0));
    }
  }
  auto cpu_adam = MakeCpuAdam(2, BestCpuIsa());
  const std::uint16_t one = 0x3f80;
  CHECK(cpu_adam->SumOfSquaresBf16(nullptr, 0) == 0.0);
  CHECK(cpu_adam->SumOfSquaresBf16(&one, -5) == 0.0);
  CHECK(std::isnan(cpu_adam->SumOfSquaresBf16(nullptr, 10)));
  CHECK(cpu_adam->SumOfSquaresBf16(&one, 1) == 1.0);
}

}  // namespace
}  // namespace pipeoffload
