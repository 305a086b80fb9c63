// LayerNormApply (kernels_cuda.h) reproduces LayerNormForward's output bit for bit from the
// statistics the forward saved: the guarantee a lean GPT layer rests on when it recomputes its
// LayerNorm outputs for the weight gradients instead of saving them (gpt_cuda_layer.h). Every
// variant of the forward (row in registers with 1..8 packs per thread, the packed loop, the
// scalar path) against both variants of the apply (128-bit packs, scalar on misaligned
// pointers); outputs poisoned first, so an element the apply skips is NaN and differs.
#include <cmath>
#include <cstdint>
#include <vector>

#include "examples/gpt/cuda/kernels_cuda.h"
#include "tests/gpt_cuda/kernel_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda::testing {
namespace {

struct ApplyCase {
  int N, C;
};

TEST_CASE("LayerNormApply gives LayerNormForward's output bits", "[gpt_kernels][layernorm]") {
  // C = 100, 4, 1: scalar forward; 8 .. 8192: the cached kernels (1, 1, 2, 4, 8 packs per
  // thread); 8200: the packed loop.
  for (const ApplyCase& c : {ApplyCase{7, 100}, ApplyCase{5, 4}, ApplyCase{3, 1},
                             ApplyCase{1, 8}, ApplyCase{300, 768}, ApplyCase{17, 2048},
                             ApplyCase{9, 4096}, ApplyCase{33, 8192}, ApplyCase{3, 8200}}) {
    CAPTURE(c.N, c.C);
    TestStream stream;
    const std::int64_t size = std::int64_t{c.N} * c.C;
    const std::vector<bf16> x = ToBf16(RandomBf16Values(size, -1.0f, 3.0f, 91));
    const std::vector<bf16> w = ToBf16(RandomBf16Values(c.C, 0.5f, 1.5f, 92));
    const std::vector<bf16> b = ToBf16(RandomBf16Values(c.C, -0.5f, 0.5f, 93));
    DeviceArray<bf16> d_x(size), d_w(c.C), d_b(c.C), d_out(size);
    DeviceArray<float> d_mean(c.N), d_rstd(c.N);
    d_x.Upload(x);
    d_w.Upload(w);
    d_b.Upload(b);
    d_out.Poison();
    PO_TEST_OK(LayerNormForward(d_out.data(), d_mean.data(), d_rstd.data(), d_x.data(),
                                d_w.data(), d_b.data(), c.N, c.C, stream.get()));
    const std::vector<bf16> forward = d_out.Download();
    // The forward wrote finite values everywhere (else equal NaN bits could hide a skip).
    for (const float v : ToFloat(forward)) REQUIRE(std::isfinite(v));
    for (int offset = 0; offset < 2; ++offset) {
      CAPTURE(offset);
      // offset 1 misaligns every bf16 tensor: the scalar apply kernel.
      DeviceArray<bf16> a_x(size, offset), a_w(c.C, offset), a_b(c.C, offset),
          a_out(size, offset);
      a_x.Upload(x);
      a_w.Upload(w);
      a_b.Upload(b);
      a_out.Poison();
      PO_TEST_OK(LayerNormApply(a_out.data(), a_x.data(), a_w.data(), a_b.data(), d_mean.data(),
                                d_rstd.data(), c.N, c.C, stream.get()));
      CHECK(SameBits(a_out.Download(), forward));
    }
  }
}

TEST_CASE("LayerNormApply rejects bad sizes and null pointers", "[gpt_kernels][layernorm]") {
  DeviceArray<bf16> x(16), w(8), b(8), out(16);
  DeviceArray<float> mean(2), rstd(2);
  CHECK(LayerNormApply(out.data(), x.data(), w.data(), b.data(), mean.data(), rstd.data(), 0, 8,
                       nullptr)
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(LayerNormApply(out.data(), x.data(), w.data(), b.data(), nullptr, rstd.data(), 2, 8,
                       nullptr)
            .code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda::testing
