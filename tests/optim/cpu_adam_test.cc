// CpuAdam: results independent of the thread count (Update and SumOfSquares, bit for bit), the
// worker pool and the cache-line cuts behind it, and bad input rejected with nothing written.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lib/optim/adam_kernels.h"
#include "lib/optim/worker_pool.h"
#include "pipeoffload/adam.h"
#include "tests/optim/adam_test_data.h"
#include "tests/optim/adam_test_impls.h"
#include "tests/testing/catch.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace pipeoffload {
namespace {

using testing::AdamBuffers;
using testing::ArrayOffsets;
using testing::Bits;
using testing::CompareBuffers;
using testing::kUnaligned;
using testing::MakeCpuAdam;

TEST_CASE("CpuAdam::Update gives the same bits for every thread count", "[optim][threads]") {
  // 2^20 + 37 elements: at 64 Ki elements per thread minimum, every count below uses all its
  // threads, and the cuts land at different places for each.
  constexpr std::int64_t kCount = (std::int64_t{1} << 20) + 37;
  const CpuIsa isa = BestCpuIsa();
  CAPTURE(CpuIsaName(isa));
  AdamBuffers want(kCount, kUnaligned);
  want.FillState(99);
  AdamBuffers init(kCount, kUnaligned);
  init.CopyFrom(want);
  const bool adamw = GENERATE(false, true);
  CAPTURE(adamw);
  AdamOptions options;
  options.weight_decay = 0.1f;
  options.decoupled_weight_decay = adamw;
  // The gradients of the 3 steps, generated once.
  std::vector<std::unique_ptr<AdamBuffers>> grads;
  for (int step = 1; step <= 3; ++step) {
    grads.push_back(std::make_unique<AdamBuffers>(kCount, ArrayOffsets{}));
    grads.back()->FillGrad(500 + step);
  }
  auto run = [&](AdamBuffers& buffers, CpuAdam& cpu_adam) {
    for (int step = 1; step <= 3; ++step) {
      auto scalars = MakeAdamStepScalars(options, step);
      REQUIRE(scalars.ok());
      buffers.CopyGradFrom(*grads[static_cast<std::size_t>(step - 1)]);
      REQUIRE(cpu_adam.Update(*scalars, buffers.Span(/*with_bf16=*/true)).ok());
    }
  };
  run(want, *MakeCpuAdam(1, isa));
  // The single-threaded result is the scalar reference's (the [isa] case proves the kernels
  // equal; this pins that one thread is not special either).
  AdamBuffers scalar(kCount, ArrayOffsets{});
  scalar.CopyFrom(init);
  run(scalar, *MakeCpuAdam(1, CpuIsa::kScalar));
  REQUIRE(CompareBuffers(scalar, want, true) == "");
  for (const int threads : {2, 3, 4, 5, 7, 16}) {
    CAPTURE(threads);
    AdamBuffers got(kCount, kUnaligned);
    got.CopyFrom(init);
    run(got, *MakeCpuAdam(threads, isa));
    REQUIRE(CompareBuffers(want, got, true) == "");
  }
}

TEST_CASE("CpuAdam::SumOfSquares gives the same bits for every thread count and ISA",
          "[optim][threads]") {
  const std::int64_t count = GENERATE(std::int64_t{0}, std::int64_t{1}, std::int64_t{17},
                                      internal::kSumBlock - 1, internal::kSumBlock,
                                      internal::kSumBlock + 1, std::int64_t{1} << 20,
                                      (std::int64_t{3} << 20) + 12345);
  CAPTURE(count);
  AdamBuffers data(count, kUnaligned);
  data.FillGrad(static_cast<std::uint64_t>(count) + 3);
  // Drop the huge values (their squares are 1e60: they would hide every other term).
  for (std::int64_t i = 0; i < count; ++i) {
    if (std::fabs(data.grad()[i]) > 1e10f) data.grad()[i] = 1.0f;
  }
  const float* x = data.grad();

  // Independent expectation of the contract: block sums by the scalar tree, added in order.
  double want = 0.0;
  for (std::int64_t begin = 0; begin < count; begin += internal::kSumBlock) {
    want += internal::SumOfSquaresBlockScalar(
        x + begin, std::min(internal::kSumBlock, count - begin));
  }
  // And it is a sum of squares: close to a compensated long-double sum.
  long double exact = 0.0L;
  for (std::int64_t i = 0; i < count; ++i) exact += static_cast<long double>(x[i]) * x[i];
  CHECK(want == Approx(static_cast<double>(exact)).epsilon(1e-12));

  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!CpuSupports(isa)) continue;
    for (const int threads : {1, 2, 3, 4, 7}) {
      CAPTURE(CpuIsaName(isa), threads);
      const double got = MakeCpuAdam(threads, isa)->SumOfSquares(x, count);
      CHECK(Bits(static_cast<float>(got)) == Bits(static_cast<float>(want)));
      CHECK(got == want);  // bitwise for doubles that are not NaN
    }
  }
}

TEST_CASE("block sum-of-squares kernels follow the lane tree exactly", "[optim][threads][isa]") {
  // Values chosen so that the order of additions changes the result: 1e16 swamps 1 unless the
  // ones meet first. Every kernel must give the scalar tree's bits for every length.
  std::vector<float> x(100);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 5 == 0) ? 1e8f : 1.0f + i * 0.25f;
  for (std::int64_t n = 0; n <= 100; ++n) {
    const double want = internal::SumOfSquaresBlockScalar(x.data(), n);
    for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (!CpuSupports(isa)) continue;
      CAPTURE(n, CpuIsaName(isa));
      CHECK(internal::SumOfSquaresBlockKernelFor(isa)(x.data(), n) == want);
    }
  }
}

TEST_CASE("WorkerPool runs each index once on its own thread, many times over",
          "[optim][threads]") {
  internal::WorkerPool pool(4);
  REQUIRE(pool.size() == 4);
  for (int round = 0; round < 500; ++round) {
    const int active = 1 + round % 4;
    std::vector<int> calls(4, 0);
    std::vector<std::thread::id> ids(4);
    pool.Run(active, [&](int i) {
      ++calls[static_cast<std::size_t>(i)];  // each index is touched by one thread only
      ids[static_cast<std::size_t>(i)] = std::this_thread::get_id();
    });
    for (int i = 0; i < 4; ++i) {
      CAPTURE(round, active, i);
      REQUIRE(calls[static_cast<std::size_t>(i)] == (i < active ? 1 : 0));
    }
    REQUIRE(ids[0] == std::this_thread::get_id());
    std::set<std::thread::id> distinct(ids.begin(), ids.begin() + active);
    REQUIRE(static_cast<int>(distinct.size()) == active);
  }
}

TEST_CASE("AlignedSplit cuts on aligned boundaries and covers every element",
          "[optim][threads]") {
  for (std::int64_t count : {0, 1, 15, 16, 17, 100, 1000, 65536 + 5}) {
    for (int parts : {1, 2, 3, 7, 16}) {
      for (std::int64_t first : {0, 1, 7, 15}) {
        CAPTURE(count, parts, first);
        const std::vector<std::int64_t> b = internal::AlignedSplit(count, parts, 16, first);
        REQUIRE(b.size() == static_cast<std::size_t>(parts) + 1);
        REQUIRE(b.front() == 0);
        REQUIRE(b.back() == count);
        for (std::size_t i = 1; i < b.size(); ++i) {
          REQUIRE(b[i - 1] <= b[i]);
          if (i + 1 < b.size() && b[i] != count && b[i] != 0) REQUIRE((b[i] - first) % 16 == 0);
        }
        // Balanced: no part more than one line above an even share (plus the unaligned head).
        for (std::size_t i = 1; i < b.size(); ++i) {
          REQUIRE(b[i] - b[i - 1] <= (count + parts - 1) / parts + 16 + first);
        }
      }
    }
  }
}

#if defined(__x86_64__)
TEST_CASE("CpuAdam's workers use the caller's FTZ/DAZ mode", "[optim][threads]") {
  // With DAZ|FTZ on the calling thread, denormal inputs count as zero. If the workers kept their
  // own (default) mode, a threaded update would differ from a one-thread update where the
  // denormals fall on a worker's part.
  constexpr std::int64_t kCount = std::int64_t{1} << 19;
  AdamBuffers init(kCount, ArrayOffsets{});
  init.FillState(5);
  init.FillGrad(6);  // 2% denormal gradients, 1% denormal params
  auto scalars = MakeAdamStepScalars(AdamOptions{}, 1);
  REQUIRE(scalars.ok());
  const unsigned saved = _mm_getcsr();
  auto run = [&](AdamBuffers& buffers, int threads, bool daz) {
    buffers.CopyFrom(init);
    auto cpu_adam = MakeCpuAdam(threads, BestCpuIsa());
    if (daz) _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
    const absl::Status status = cpu_adam->Update(*scalars, buffers.Span(true));
    _mm_setcsr(saved);
    REQUIRE(status.ok());
  };
  AdamBuffers one(kCount, ArrayOffsets{}), four(kCount, ArrayOffsets{});
  AdamBuffers plain(kCount, ArrayOffsets{});
  run(one, 1, true);
  run(four, 4, true);
  run(plain, 4, false);
  CHECK(CompareBuffers(one, four, true) == "");
  // The mode mattered (else this test proves nothing).
  CHECK(CompareBuffers(one, plain, true) != "");
}
#endif

// Snapshot of every array of a span, to prove a rejected call wrote nothing.
struct Snapshot {
  explicit Snapshot(AdamBuffers& b)
      : p(b.param(), b.param() + b.count()),
        m(b.exp_avg(), b.exp_avg() + b.count()),
        v(b.exp_avg_sq(), b.exp_avg_sq() + b.count()),
        g(b.grad(), b.grad() + b.count()),
        bf16(b.bf16(), b.bf16() + b.count()) {}
  bool operator==(const Snapshot& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return testing::FirstBitDifference(a.data(), b.data(), static_cast<std::int64_t>(a.size())) < 0;
    };
    return same(p, o.p) && same(m, o.m) && same(v, o.v) && same(g, o.g) && bf16 == o.bf16;
  }
  std::vector<float> p, m, v, g;
  std::vector<std::uint16_t> bf16;
};

TEST_CASE("CpuAdam::Update rejects bad spans and writes nothing", "[optim][errors]") {
  constexpr std::int64_t kCount = 300000;  // large enough to be threaded
  AdamBuffers buffers(kCount, kUnaligned);
  buffers.FillState(1);
  buffers.FillGrad(2);
  const Snapshot before(buffers);
  auto cpu_adam = MakeCpuAdam(3, BestCpuIsa());
  auto scalars = MakeAdamStepScalars(AdamOptions{}, 1);
  REQUIRE(scalars.ok());

  struct Case {
    const char* what;  // must appear in the message
    AdamSpan span;
  };
  const AdamSpan good = buffers.Span(true);
  std::vector<Case> cases;
  auto add = [&](const char* what, auto change) {
    AdamSpan s = good;
    change(s);
    cases.push_back({what, s});
  };
  add("count", [](AdamSpan& s) { s.count = -1; });
  add("count", [](AdamSpan& s) { s.count = std::numeric_limits<std::int64_t>::max(); });
  add("param", [](AdamSpan& s) { s.param = nullptr; });
  add("exp_avg", [](AdamSpan& s) { s.exp_avg = nullptr; });
  add("exp_avg_sq", [](AdamSpan& s) { s.exp_avg_sq = nullptr; });
  add("grad", [](AdamSpan& s) { s.grad = nullptr; });
  add("overlap", [](AdamSpan& s) { s.exp_avg = s.param + 100; });
  add("overlap", [](AdamSpan& s) { s.grad = s.exp_avg_sq + kCount - 1; });
  add("overlap", [](AdamSpan& s) { s.param_bf16 = reinterpret_cast<std::uint16_t*>(s.param); });
  for (const Case& c : cases) {
    CAPTURE(c.what, c.span.count);
    const absl::Status status = cpu_adam->Update(*scalars, c.span);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    const std::string message(status.message());
    CAPTURE(message);
    CHECK(message.find(c.what) != std::string::npos);
    CHECK(message.find("CpuAdam::Update") != std::string::npos);
    CHECK(CheckAdamSpan(c.span).code() == absl::StatusCode::kInvalidArgument);
    // The reference kernel leaves an invalid span alone too.
    AdamUpdateScalar(*scalars, c.span);
    REQUIRE(Snapshot(buffers) == before);
  }
  // Null pointers are fine with nothing to do, and a null bf16 output is allowed.
  AdamSpan empty;
  CHECK(cpu_adam->Update(*scalars, empty).ok());
  CHECK(CheckAdamSpan(empty).ok());
  AdamSpan no_bf16 = good;
  no_bf16.param_bf16 = nullptr;
  CHECK(CheckAdamSpan(no_bf16).ok());
  REQUIRE(Snapshot(buffers) == before);
  // Adjacent (touching, not overlapping) arrays are fine.
  AdamSpan adjacent = good;
  adjacent.count = 100;
  adjacent.exp_avg = adjacent.param + 100;
  CHECK(CheckAdamSpan(adjacent).ok());
}

TEST_CASE("SumOfSquares on bad input gives 0 or NaN, never a crash", "[optim][errors]") {
  auto cpu_adam = MakeCpuAdam(2, BestCpuIsa());
  const float one = 1.0f;
  CHECK(cpu_adam->SumOfSquares(nullptr, 0) == 0.0);
  CHECK(cpu_adam->SumOfSquares(&one, -5) == 0.0);
  CHECK(std::isnan(cpu_adam->SumOfSquares(nullptr, 10)));
  CHECK(cpu_adam->SumOfSquares(&one, 1) == 1.0);
}

TEST_CASE("CpuAdam::Create rejects bad options", "[optim][errors]") {
  CpuAdamOptions options;
  options.threads = -1;
  auto bad = CpuAdam::Create(options);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()).find("threads") != std::string::npos);
  options.threads = 100000;
  CHECK(CpuAdam::Create(options).status().code() == absl::StatusCode::kInvalidArgument);
  options.threads = 1;
  for (const int prefetch : {-2, -64, (1 << 16) + 1}) {
    options.prefetch_bytes = prefetch;
    auto bad_prefetch = CpuAdam::Create(options);
    REQUIRE_FALSE(bad_prefetch.ok());
    CHECK(bad_prefetch.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(bad_prefetch.status().message()).find("prefetch_bytes") !=
          std::string::npos);
  }
  options.prefetch_bytes = 1024;
  auto explicit_prefetch = CpuAdam::Create(options);
  REQUIRE(explicit_prefetch.ok());
  CHECK((*explicit_prefetch)->prefetch_bytes() == 1024);
  options.prefetch_bytes = 0;

  options.threads = 1;
  options.pick_best_isa = false;
  options.isa = static_cast<CpuIsa>(42);  // not an ISA: never supported
  auto unsupported = CpuAdam::Create(options);
  REQUIRE_FALSE(unsupported.ok());
  CHECK(unsupported.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(unsupported.status().message()).find("instruction set") != std::string::npos);

  // The defaults: every allowed CPU, the best ISA.
  auto defaults = CpuAdam::Create();
  REQUIRE(defaults.ok());
  CHECK((*defaults)->threads() >= 1);
  CHECK((*defaults)->isa() == BestCpuIsa());
#if defined(__x86_64__)
  CHECK((*defaults)->prefetch_bytes() == (__builtin_cpu_is("intel") ? 2048 : 0));
#else
  CHECK((*defaults)->prefetch_bytes() == 0);
#endif
  CHECK(CpuIsaName(CpuIsa::kAvx512) == "avx512");
  CHECK(CpuIsaName(CpuIsa::kAvx2) == "avx2");
  CHECK(CpuIsaName(CpuIsa::kScalar) == "scalar");
  CHECK(CpuSupports(CpuIsa::kScalar));
}

}  // namespace
}  // namespace pipeoffload
