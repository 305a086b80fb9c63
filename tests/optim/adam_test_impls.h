// What the CPU Adam tests run: the ISAs this CPU has, a CpuAdam pinned to one of them, and one
// implementation under test (an ISA's kernel called directly, or a CpuAdam over it) with the
// array offsets it runs on.
#ifndef PIPEOFFLOAD_TESTS_OPTIM_ADAM_TEST_IMPLS_H_
#define PIPEOFFLOAD_TESTS_OPTIM_ADAM_TEST_IMPLS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/optim/adam_kernels.h"
#include "pipeoffload/adam.h"
#include "tests/testing/catch.h"

namespace pipeoffload::testing {

inline std::vector<CpuIsa> AvailableIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

// A CpuAdam of `threads` threads on exactly `isa`.
inline std::unique_ptr<CpuAdam> MakeCpuAdam(int threads, CpuIsa isa, int prefetch_bytes = 0) {
  CpuAdamOptions options;
  options.threads = threads;
  options.isa = isa;
  options.pick_best_isa = false;
  options.prefetch_bytes = prefetch_bytes;
  auto cpu_adam = CpuAdam::Create(options);
  REQUIRE(cpu_adam.ok());
  REQUIRE((*cpu_adam)->isa() == isa);
  REQUIRE((*cpu_adam)->threads() == threads);
  return std::move(*cpu_adam);
}

// One implementation under test: an ISA's kernel called directly, or CpuAdam over it.
// `Offsets`: where the test places its arrays (ArrayOffsets, or a test's own).
template <typename Offsets>
struct AdamImpl {
  std::string name;
  internal::AdamKernel kernel;  // or null: use cpu_adam
  std::unique_ptr<CpuAdam> cpu_adam;
  Offsets offsets;
  std::int64_t prefetch_bytes = 0;

  void Run(const AdamStepScalars& scalars, const AdamSpan& span) const {
    if (kernel != nullptr) {
      kernel(scalars, span, prefetch_bytes);
    } else {
      const absl::Status status = cpu_adam->Update(scalars, span);
      INFO(status.ToString());
      REQUIRE(status.ok());
    }
  }
};

// A span CheckAdamSpan must refuse, and the words its message must contain.
struct BadAdamSpan {
  std::vector<std::string> words;
  AdamSpan span;
};

// `bad` is refused with InvalidArgument naming every word by CheckAdamSpan and by
// `cpu_adam`.Update (prefixed "CpuAdam::Update"), and the scalar reference leaves it alone (the
// caller checks that nothing was written).
inline void ExpectRefused(const BadAdamSpan& bad, CpuAdam& cpu_adam,
                          const AdamStepScalars& scalars) {
  CAPTURE(bad.words);
  CHECK(CheckAdamSpan(bad.span).code() == absl::StatusCode::kInvalidArgument);
  const absl::Status status = cpu_adam.Update(scalars, bad.span);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  CAPTURE(message);
  for (const std::string& word : bad.words) CHECK(message.find(word) != std::string::npos);
  CHECK(message.find("CpuAdam::Update") != std::string::npos);
  AdamUpdateScalar(scalars, bad.span);
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_OPTIM_ADAM_TEST_IMPLS_H_
