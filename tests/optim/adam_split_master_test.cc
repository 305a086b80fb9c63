// Split masters (AdamSpan::param_lo; adam.h: SplitMaster / JoinSplitMaster): the halves invert
// exactly for every bit pattern and hi is the bf16 nearest the master (ties away from zero); the
// split update, on every ISA this CPU runs, directly and through CpuAdam on 1 and 3 threads, on
// every weight-decay variant, fp32 and bf16 gradients, every awkward size and misaligned arrays,
// gives m, v and a joined master with exactly the bits of the fp32 update on the joined master,
// and writes back SplitMaster of it; CheckAdamSpan rejects malformed split spans, naming the
// fields, with nothing written. Tags: [optim][split] (+ [isa] [threads] [errors]).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
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
using testing::Bits;
using testing::FromBits;
using testing::MakeCpuAdam;
using testing::kUnaligned;

enum class Decay { kNone, kL2, kDecoupled };

const char* DecayName(Decay decay) {
  switch (decay) {
    case Decay::kNone:
      return "none";
    case Decay::kL2:
      return "L2";
    case Decay::kDecoupled:
      return "decoupled";
  }
  return "?";
}

AdamOptions Options(Decay decay) {
  AdamOptions options;
  options.learning_rate = 1e-2f;
  options.weight_decay = decay == Decay::kNone ? 0.0f : 0.05f;
  options.decoupled_weight_decay = decay == Decay::kDecoupled;
  return options;
}

// Where the arrays of a split span start: AdamBuffers' offsets (its bf16 array holds hi; param is
// unused) and lo's, in elements past a 64-byte boundary.
struct SplitOffsets {
  ArrayOffsets base;
  int lo = 0;
};
// 64-byte aligned; nothing aligned to 16 bytes; hi 16- but not 32-byte aligned (an AVX2 vector
// of halves aligned, an AVX-512 one not). CpuAdam cuts on hi's cache lines, so the offsets also
// move its cuts.
constexpr SplitOffsets kAligned = {ArrayOffsets{}, 0};
constexpr SplitOffsets kMisaligned = {kUnaligned, 5};
constexpr SplitOffsets kHi16 = {ArrayOffsets{1, 3, 6, 5, 8, 3}, 9};

// A split span's storage: m, v, the gradients and hi (bf16()) in AdamBuffers, lo beside it.
class SplitBuffers {
 public:
  SplitBuffers(std::int64_t count, SplitOffsets offsets)
      : base_(count, offsets.base), lo_storage_(static_cast<std::size_t>(count) + 64, 0) {
    const auto address = reinterpret_cast<std::uintptr_t>(lo_storage_.data());
    lo_ = lo_storage_.data() + (64 - address % 64) % 64 / 2 + offsets.lo;
  }
  SplitBuffers(const SplitBuffers&) = delete;
  SplitBuffers& operator=(const SplitBuffers&) = delete;

  std::int64_t count() const { return base_.count(); }
  AdamBuffers& base() { return base_; }
  std::uint16_t* hi() { return base_.bf16(); }
  std::uint16_t* lo() { return lo_; }

  AdamSpan Span(bool bf16_grad) {
    AdamSpan span = base_.Span(/*with_bf16=*/true, bf16_grad);
    span.param = nullptr;
    span.param_lo = lo_;
    return span;
  }

  // The state of `from` (an unsplit reference) with its master split.
  void CopyFrom(AdamBuffers& from) {
    base_.CopyFrom(from);
    for (std::int64_t i = 0; i < count(); ++i) {
      const SplitBf16 s = SplitMaster(from.param()[i]);
      hi()[i] = s.hi;
      lo_[i] = s.lo;
    }
  }

 private:
  AdamBuffers base_;
  std::vector<std::uint16_t> lo_storage_;
  std::uint16_t* lo_;
};

// "" when `got` holds `want`'s m and v bit for bit, its halves join to want's master and are
// SplitMaster of it; else the first difference.
std::string CompareSplit(AdamBuffers& want, SplitBuffers& got) {
  const std::int64_t n = want.count();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t master = Bits(want.param()[i]);
    const std::uint32_t joined = Bits(JoinSplitMaster(got.hi()[i], got.lo()[i]));
    const SplitBf16 s = SplitMaster(want.param()[i]);
    if (joined != master || got.hi()[i] != s.hi || got.lo()[i] != s.lo) {
      return absl::StrFormat("master[%d]: want 0x%08x (hi 0x%04x lo 0x%04x), got 0x%08x (hi "
                             "0x%04x lo 0x%04x)",
                             i, master, s.hi, s.lo, joined, got.hi()[i], got.lo()[i]);
    }
  }
  const struct {
    const char* name;
    const float* want;
    const float* got;
  } arrays[] = {{"exp_avg", want.exp_avg(), got.base().exp_avg()},
                {"exp_avg_sq", want.exp_avg_sq(), got.base().exp_avg_sq()}};
  for (const auto& a : arrays) {
    const std::int64_t i = testing::FirstBitDifference(a.want, a.got, n);
    if (i >= 0) {
      return absl::StrFormat("%s[%d]: want 0x%08x got 0x%08x", a.name, i, Bits(a.want[i]),
                             Bits(a.got[i]));
    }
  }
  return "";
}

// "" when two split results hold the same bits.
std::string CompareSplit(SplitBuffers& want, SplitBuffers& got) {
  const std::int64_t n = want.count();
  const struct {
    const char* name;
    const std::uint16_t* want;
    const std::uint16_t* got;
  } halves[] = {{"hi", want.hi(), got.hi()}, {"lo", want.lo(), got.lo()}};
  for (const auto& h : halves) {
    const std::int64_t i = testing::FirstBitDifference(h.want, h.got, n);
    if (i >= 0) {
      return absl::StrFormat("%s[%d]: want 0x%04x got 0x%04x", h.name, i, h.want[i], h.got[i]);
    }
  }
  const std::int64_t m =
      testing::FirstBitDifference(want.base().exp_avg(), got.base().exp_avg(), n);
  if (m >= 0) return absl::StrFormat("exp_avg[%d] differs", m);
  const std::int64_t v =
      testing::FirstBitDifference(want.base().exp_avg_sq(), got.base().exp_avg_sq(), n);
  if (v >= 0) return absl::StrFormat("exp_avg_sq[%d] differs", v);
  return "";
}

// Bit patterns a split must get right: zeros, subnormals, the largest finite values, infinities,
// NaNs (quiet, signalling, payloads in the low half, the ones whose hi wraps), rounding ties
// and their neighbours, values whose low half has its top bit set or clear.
const std::uint32_t kEdgePatterns[] = {
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00007fff, 0x00008000, 0x00008001,
    0x0000ffff, 0x00018000, 0x007fffff, 0x807fffff, 0x00800000, 0x007f8000, 0x3f800000,
    0x3f808000, 0x3f818000, 0xbf808000, 0xbf818000, 0x3f807fff, 0x3f808001, 0x3fff8000,
    0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7f800001,
    0xff800001, 0x7f808000, 0x7fc00000, 0xffc00000, 0x7fbfffff, 0x7fff7fff, 0x7fff8000,
    0x7fffffff, 0xffff7fff, 0xffff8000, 0xffffffff, 0x41200000, 0xc2c80000, 0x12345678};

bool IsFinite(std::uint32_t bits) { return (bits & 0x7f800000u) != 0x7f800000u; }

// The bf16 nearest a finite float, ties away from zero, from the two candidates' values in double
// (exact here): the truncation and the next bf16 up in magnitude (past the largest finite one,
// 2^128: the infinity's encoding).
std::uint16_t NearestTiesAway(std::uint32_t bits) {
  const std::uint32_t sign = bits & 0x80000000u;
  const std::uint32_t down = (bits & 0x7fffffffu) >> 16;
  const double x = std::fabs(double{FromBits(bits)});
  const double lower = double{FromBits(down << 16)};
  const int exponent = static_cast<int>(down >> 7);  // biased; 0 for subnormals
  const double upper = lower + std::ldexp(1.0, std::max(exponent, 1) - 127 - 7);
  const std::uint32_t magnitude = x - lower < upper - x ? down : down + 1;
  return static_cast<std::uint16_t>((sign >> 16) | magnitude);
}

// "" when the split of `bits` joins back to it, lo is its low half and, for a finite value, hi
// is the nearest bf16 (ties away) and, except at an exact tie, FloatToBf16Bits' nearest-even.
std::string SplitProblem(std::uint32_t bits) {
  const SplitBf16 s = SplitMaster(FromBits(bits));
  const std::uint32_t joined = Bits(JoinSplitMaster(s.hi, s.lo));
  const std::string where =
      absl::StrFormat("0x%08x: hi 0x%04x lo 0x%04x joined 0x%08x", bits, s.hi, s.lo, joined);
  if (joined != bits) return where + ": does not join back";
  if (s.lo != (bits & 0xffffu)) return where + ": lo is not the low half";
  if (!IsFinite(bits)) return "";
  if (s.hi != NearestTiesAway(bits)) {
    return where + absl::StrFormat(": hi is not the nearest (ties away) 0x%04x",
                                   NearestTiesAway(bits));
  }
  const bool tie = (bits & 0xffffu) == 0x8000u;
  if (!tie && s.hi != FloatToBf16Bits(FromBits(bits))) {
    return where + absl::StrFormat(": hi differs from FloatToBf16Bits 0x%04x off a tie",
                                   FloatToBf16Bits(FromBits(bits)));
  }
  return "";
}

void CheckSplit(std::uint32_t bits) {
  const std::string problem = SplitProblem(bits);
  if (!problem.empty()) REQUIRE(problem == "");
}

TEST_CASE("SplitMaster and JoinSplitMaster invert each other exactly; hi rounds ties away",
          "[optim][split]") {
  // Hand-checked values: ties go away from zero (nearest-even would give 0x3f80 and 0x3f82 for
  // the first two), a carry past the largest bf16 reaches infinity, the wrapping NaNs.
  struct Want {
    std::uint32_t bits;
    std::uint16_t hi;
  };
  const Want hand[] = {{0x3f808000, 0x3f81}, {0x3f818000, 0x3f82}, {0xbf808000, 0xbf81},
                       {0x3f807fff, 0x3f80}, {0x7f7f8000, 0x7f80}, {0x7f7fffff, 0x7f80},
                       {0x00008000, 0x0001}, {0x80000000, 0x8000}, {0x7fff8000, 0x8000},
                       {0xffffffff, 0x0000}, {0x7f800001, 0x7f80}};
  for (const Want& w : hand) {
    CAPTURE(w.bits);
    CHECK(SplitMaster(FromBits(w.bits)).hi == w.hi);
    CHECK(SplitMaster(FromBits(w.bits)).lo == (w.bits & 0xffffu));
  }
  for (const std::uint32_t bits : kEdgePatterns) CheckSplit(bits);
  // Random patterns (every class: the exponent field is uniform too), and every exponent and
  // sign with the low halves around the rounding point.
  std::mt19937_64 random(20261130);
  for (int i = 0; i < (1 << 22); ++i) CheckSplit(static_cast<std::uint32_t>(random()));
  for (std::uint32_t top = 0; top < (1u << 16); ++top) {
    for (const std::uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      CheckSplit((top << 16) | low);
    }
  }
  // The other direction: every (hi, lo) pair is the split of exactly one master (so the halves
  // are a bijection with the 32-bit patterns, whatever stored them).
  for (std::uint32_t hi = 0; hi < (1u << 16); ++hi) {
    for (const std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                                   static_cast<std::uint32_t>(random() & 0xffffu)}) {
      const SplitBf16 s = SplitMaster(JoinSplitMaster(static_cast<std::uint16_t>(hi),
                                                      static_cast<std::uint16_t>(lo)));
      if (s.hi != hi || s.lo != lo) {
        CAPTURE(hi, lo, s.hi, s.lo);
        REQUIRE(s.hi == hi);
        REQUIRE(s.lo == lo);
      }
    }
  }
}

using Impl = testing::AdamImpl<SplitOffsets>;

// Scalar first (the reference split update), then every ISA: its kernel on each of the three
// offsets (with software prefetch on the misaligned one), CpuAdam on 1 thread, and on 3 threads
// (which cut the largest size into 3 parts) on each offset.
std::vector<Impl> SplitImpls() {
  std::vector<Impl> impls;
  for (CpuIsa isa : AvailableIsas()) {
    const std::string name(CpuIsaName(isa));
    const internal::AdamKernel kernel = internal::AdamKernelFor(isa);
    impls.push_back({name + "/aligned", kernel, nullptr, kAligned});
    impls.push_back({name + "/misaligned", kernel, nullptr, kMisaligned, 1024});
    impls.push_back({name + "/hi16", kernel, nullptr, kHi16});
    impls.push_back({"CpuAdam/1/" + name, nullptr, MakeCpuAdam(1, isa), kMisaligned});
    impls.push_back({"CpuAdam/3/" + name + "/aligned", nullptr, MakeCpuAdam(3, isa), kAligned});
    impls.push_back(
        {"CpuAdam/3/" + name + "/misaligned", nullptr, MakeCpuAdam(3, isa, 2048), kMisaligned});
    impls.push_back({"CpuAdam/3/" + name + "/hi16", nullptr, MakeCpuAdam(3, isa), kHi16});
  }
  return impls;
}

// FillState's masters with every 37th one (from a seed-dependent start) an edge pattern; with
// `non_finite` false the infinities and NaNs among them are left out.
void FillMasters(AdamBuffers& b, std::uint64_t seed, bool non_finite) {
  b.FillState(seed);
  constexpr std::size_t kEdges = sizeof(kEdgePatterns) / sizeof(kEdgePatterns[0]);
  std::size_t k = static_cast<std::size_t>(seed % kEdges);
  for (std::int64_t i = static_cast<std::int64_t>(seed % 37); i < b.count(); i += 37) {
    const std::uint32_t bits = kEdgePatterns[k++ % kEdges];
    if (non_finite || IsFinite(bits)) b.param()[i] = FromBits(bits);
  }
}

TEST_CASE("the split update has the fp32 update's bits on the joined master, every ISA and size",
          "[optim][split][isa][threads]") {
  const std::vector<Impl> impls = SplitImpls();
  REQUIRE(impls[0].name == "scalar/aligned");
  // 3 * 2^16 + 1001: CpuAdam cuts it into 3 parts (spans under 2^16 per thread use fewer).
  const std::int64_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 31, 33, 511, 512, 513, 1031,
                                3 * (std::int64_t{1} << 16) + 1001};
  for (const std::int64_t size : sizes) {
    for (const Decay decay : {Decay::kNone, Decay::kL2, Decay::kDecoupled}) {
      for (const bool bf16_grad : {false, true}) {
        CAPTURE(size, DecayName(decay), bf16_grad);
        // Infinite and NaN masters with finite gradients: every NaN then has one source per
        // element (the master, or an inf / inf), so its bits do not depend on operand order.
        AdamBuffers want(size, ArrayOffsets{});
        FillMasters(want, static_cast<std::uint64_t>(size) * 3 + static_cast<std::uint64_t>(decay),
                    /*non_finite=*/true);
        const std::vector<float> start(want.param(), want.param() + size);
        std::vector<std::unique_ptr<SplitBuffers>> got;
        for (const Impl& impl : impls) {
          got.push_back(std::make_unique<SplitBuffers>(size, impl.offsets));
          got.back()->CopyFrom(want);
        }
        for (int step = 1; step <= 3; ++step) {
          CAPTURE(step);
          const float grad_scale = step == 2 ? 0.7f / 1024.0f : 1.0f;
          auto scalars = MakeAdamStepScalars(Options(decay), step, grad_scale);
          REQUIRE(scalars.ok());
          const std::uint64_t seed = 1000 * static_cast<std::uint64_t>(size) + step;
          if (bf16_grad) {
            want.FillGradBf16(seed, /*non_finite=*/false);
          } else {
            want.FillGrad(seed);
          }
          // The reference: the unsplit fp32 update on the joined master.
          AdamUpdateScalar(*scalars, want.Span(/*with_bf16=*/false, bf16_grad));
          for (std::size_t k = 0; k < impls.size(); ++k) {
            CAPTURE(impls[k].name);
            got[k]->base().CopyGradFrom(want);
            impls[k].Run(*scalars, got[k]->Span(bf16_grad));
            REQUIRE(CompareSplit(want, *got[k]) == "");
            // Every ISA gives the scalar split update's bits.
            REQUIRE(CompareSplit(*got[0], *got[k]) == "");
          }
        }
        if (size >= 1031) {
          // The edge patterns reached the kernels (NaN masters), and the steps moved most
          // masters.
          std::int64_t nan = 0;
          std::int64_t moved = 0;
          for (std::int64_t i = 0; i < size; ++i) {
            const float p = want.param()[i];
            nan += std::isnan(p) ? 1 : 0;
            moved += Bits(p) != Bits(start[static_cast<std::size_t>(i)]) ? 1 : 0;
          }
          CHECK(nan > 0);
          CHECK(moved > size / 2);
        }
      }
    }
  }
}

TEST_CASE("every ISA's split kernel writes exact halves of hand-picked masters",
          "[optim][split][isa]") {
  // With m = v = g = 0 and eps > 0 the update is p - step_size * (0 / eps) = p - 0: the master
  // passes through unchanged (signalling NaNs get quieted), so the halves written are its split.
  constexpr std::int64_t kCount = sizeof(kEdgePatterns) / sizeof(kEdgePatterns[0]);
  for (CpuIsa isa : AvailableIsas()) {
    for (const SplitOffsets& offsets : {kAligned, kMisaligned, kHi16}) {
      for (const bool bf16_grad : {false, true}) {
        CAPTURE(CpuIsaName(isa), offsets.lo, bf16_grad);
        AdamBuffers init(kCount, ArrayOffsets{});
        for (std::int64_t i = 0; i < kCount; ++i) {
          init.param()[i] = FromBits(kEdgePatterns[i]);
          init.exp_avg()[i] = 0.0f;
          init.exp_avg_sq()[i] = 0.0f;
          init.grad()[i] = 0.0f;
          init.grad_bf16()[i] = 0;
        }
        SplitBuffers got(kCount, offsets);
        got.CopyFrom(init);
        auto scalars = MakeAdamStepScalars(AdamOptions{}, 1);
        REQUIRE(scalars.ok());
        internal::AdamKernelFor(isa)(*scalars, got.Span(bf16_grad), 0);
        for (std::int64_t i = 0; i < kCount; ++i) {
          const std::uint32_t bits = kEdgePatterns[i];
          // x86 quiets a signalling NaN by setting the top mantissa bit.
          const std::uint32_t want = std::isnan(FromBits(bits)) ? bits | 0x00400000u : bits;
          const SplitBf16 s = SplitMaster(FromBits(want));
          CAPTURE(i, bits, got.hi()[i], got.lo()[i]);
          CHECK(got.hi()[i] == s.hi);
          CHECK(got.lo()[i] == s.lo);
          CHECK(Bits(JoinSplitMaster(got.hi()[i], got.lo()[i])) == want);
        }
      }
    }
  }
}

// Every array of `b`, the halves and both gradients included, to prove a rejected call wrote
// nothing.
std::vector<std::uint8_t> Bytes(SplitBuffers& b) {
  std::vector<std::uint8_t> out;
  const auto n = static_cast<std::size_t>(b.count());
  auto append = [&](const void* data, std::size_t bytes) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    out.insert(out.end(), p, p + bytes);
  };
  append(b.base().param(), n * 4);
  append(b.base().exp_avg(), n * 4);
  append(b.base().exp_avg_sq(), n * 4);
  append(b.base().grad(), n * 4);
  append(b.hi(), n * 2);
  append(b.lo(), n * 2);
  append(b.base().grad_bf16(), n * 2);
  return out;
}

TEST_CASE("CheckAdamSpan and CpuAdam::Update reject malformed split spans, writing nothing",
          "[optim][split][errors]") {
  constexpr std::int64_t kCount = 300000;  // large enough to be threaded
  SplitBuffers buffers(kCount, kMisaligned);
  AdamBuffers init(kCount, ArrayOffsets{});
  init.FillState(3);
  init.FillGradBf16(4, /*non_finite=*/false);
  buffers.CopyFrom(init);
  const std::vector<std::uint8_t> before = Bytes(buffers);
  auto cpu_adam = MakeCpuAdam(3, BestCpuIsa());
  auto scalars = MakeAdamStepScalars(AdamOptions{}, 1);
  REQUIRE(scalars.ok());

  const AdamSpan good = buffers.Span(/*bf16_grad=*/true);
  REQUIRE(CheckAdamSpan(good).ok());
  std::vector<testing::BadAdamSpan> cases;
  auto add = [&](std::vector<std::string> words, auto change) {
    AdamSpan s = good;
    change(s);
    cases.push_back({std::move(words), s});
  };
  add({"param", "param_lo", "must be null"},
      [&](AdamSpan& s) { s.param = buffers.base().param(); });
  add({"param_bf16", "param_lo", "is null"}, [](AdamSpan& s) { s.param_bf16 = nullptr; });
  add({"exp_avg", "is null"}, [](AdamSpan& s) { s.exp_avg = nullptr; });
  add({"exp_avg_sq", "is null"}, [](AdamSpan& s) { s.exp_avg_sq = nullptr; });
  add({"grad", "grad_bf16", "both are null"}, [](AdamSpan& s) { s.grad_bf16 = nullptr; });
  add({"param_bf16", "param_lo", "overlap"}, [](AdamSpan& s) { s.param_lo = s.param_bf16; });
  // (16: AdamBuffers leaves more than that after each array, so lo stays inside hi's storage.)
  add({"param_bf16", "param_lo", "overlap"}, [](AdamSpan& s) { s.param_lo = s.param_bf16 + 16; });
  add({"exp_avg", "param_lo", "overlap"},
      [](AdamSpan& s) { s.param_lo = reinterpret_cast<std::uint16_t*>(s.exp_avg + 100); });
  add({"exp_avg_sq", "param_lo", "overlap"}, [](AdamSpan& s) {
    s.param_lo = reinterpret_cast<std::uint16_t*>(s.exp_avg_sq + kCount) - 1;
  });
  add({"grad_bf16", "param_lo", "overlap"},
      [](AdamSpan& s) { s.param_lo = const_cast<std::uint16_t*>(s.grad_bf16) + 7; });
  add({"grad", "param_lo", "overlap"}, [&](AdamSpan& s) {
    s.grad_bf16 = nullptr;
    s.grad = buffers.base().grad();
    s.param_lo = reinterpret_cast<std::uint16_t*>(buffers.base().grad() + kCount / 2);
  });
  // Without param_lo the old rules hold: a null param is an error.
  add({"param", "is null"}, [](AdamSpan& s) { s.param_lo = nullptr; });
  for (const testing::BadAdamSpan& c : cases) {
    testing::ExpectRefused(c, *cpu_adam, *scalars);
    const bool unchanged = Bytes(buffers) == before;  // (a bool: Catch would print the bytes)
    REQUIRE(unchanged);
  }
  // With nothing to do, no pointer is needed; touching arrays are fine.
  AdamSpan empty;
  empty.param_lo = buffers.lo();
  CHECK(CheckAdamSpan(empty).ok());
  AdamSpan adjacent = good;
  adjacent.count = 100;
  adjacent.param_lo = adjacent.param_bf16 + 100;
  CHECK(CheckAdamSpan(adjacent).ok());
  // A valid split span runs, on every ISA, and changes the master.
  for (CpuIsa isa : AvailableIsas()) {
    CAPTURE(CpuIsaName(isa));
    SplitBuffers run(1000, kMisaligned);
    run.CopyFrom(init);
    const std::vector<std::uint8_t> start = Bytes(run);
    REQUIRE(MakeCpuAdam(2, isa)->Update(*scalars, run.Span(/*bf16_grad=*/true)).ok());
    const bool changed = Bytes(run) != start;
    CHECK(changed);
  }
}

}  // namespace
}  // namespace pipeoffload
