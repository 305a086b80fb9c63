// Argument checks and size helpers of the GPT's CUDA kernels: everything here returns before any
// CUDA call, so it runs on machines without a GPU (label cpu).
#include <cstdint>
#include <string>

#include "examples/gpt/cuda/kernels_cuda.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

// Non-null stand-ins: never dereferenced, because the size checks fail first.
bf16* const kBf16 = reinterpret_cast<bf16*>(std::uintptr_t{4096});
float* const kFloat = reinterpret_cast<float*>(std::uintptr_t{4096});
std::int32_t* const kInt = reinterpret_cast<std::int32_t*>(std::uintptr_t{4096});
void* const kWorkspace = reinterpret_cast<void*>(std::uintptr_t{4096});

void ExpectInvalid(const absl::Status& status, const std::string& function,
                   const std::string& fragment) {
  INFO(status.ToString());
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  CHECK(message.rfind(function + ": ", 0) == 0);
  CHECK(message.find(fragment) != std::string::npos);
}

TEST_CASE("GPT kernels reject bad sizes and null pointers by name", "[gpt_kernels_args]") {
  ExpectInvalid(EncoderForward(kBf16, kInt, kBf16, kBf16, 0, 4, 8, nullptr), "EncoderForward",
                "B = 0 is out of range");
  ExpectInvalid(EncoderForward(kBf16, nullptr, kBf16, kBf16, 1, 4, 8, nullptr), "EncoderForward",
                "tokens is null");
  ExpectInvalid(EncoderBackward(kFloat, kFloat, kBf16, kInt, 1, -3, 8, nullptr), "EncoderBackward",
                "T = -3");
  ExpectInvalid(EncoderBackward(kFloat, kFloat, kBf16, kInt, 65536, 65536, 8, nullptr),
                "EncoderBackward", "B * T = 4294967296");
  ExpectInvalid(LayerNormForward(kBf16, kFloat, kFloat, kBf16, kBf16, kBf16, 4, 0, nullptr),
                "LayerNormForward", "C = 0");
  ExpectInvalid(LayerNormForward(kBf16, kFloat, nullptr, kBf16, kBf16, kBf16, 4, 8, nullptr),
                "LayerNormForward", "rstd is null");
  ExpectInvalid(LayerNormApply(kBf16, kBf16, kBf16, kBf16, kFloat, kFloat, 0, 8, nullptr),
                "LayerNormApply", "N = 0");
  ExpectInvalid(LayerNormApply(kBf16, kBf16, kBf16, nullptr, kFloat, kFloat, 4, 8, nullptr),
                "LayerNormApply", "b is null");
  ExpectInvalid(LayerNormApply(kBf16, kBf16, kBf16, kBf16, kFloat, nullptr, 4, 8, nullptr),
                "LayerNormApply", "rstd is null");
  ExpectInvalid(LayerNormBackwardInput(kBf16, kBf16, kBf16, kBf16, kFloat, kFloat, 0, 8, nullptr),
                "LayerNormBackwardInput", "N = 0");
  ExpectInvalid(
      LayerNormBackwardWeight(kFloat, kFloat, nullptr, kBf16, kBf16, kFloat, kFloat, 4, 8, nullptr),
      "LayerNormBackwardWeight", "scratch is null");
  ExpectInvalid(BiasBackward(kFloat, kFloat, kBf16, 4, (1 << 22) + 1, nullptr), "BiasBackward",
                "OC = 4194305 is out of range [1, 4194304]");
  ExpectInvalid(GeluForward(kBf16, kBf16, -1, nullptr), "GeluForward", "n = -1");
  ExpectInvalid(GeluBackward(kBf16, nullptr, kBf16, 4, nullptr), "GeluBackward", "inp is null");
  ExpectInvalid(Add(kBf16, kBf16, nullptr, 4, nullptr), "Add", "b is null");
  ExpectInvalid(Fp32ToBf16(kBf16, kFloat, -5, nullptr), "Fp32ToBf16", "n = -5");
  ExpectInvalid(Bf16ToFp32(nullptr, kBf16, 5, nullptr), "Bf16ToFp32", "out is null");
  ExpectInvalid(SoftmaxCrossEntropyForward(kFloat, kFloat, kBf16, kInt, 4, 0, nullptr),
                "SoftmaxCrossEntropyForward", "V = 0");
  ExpectInvalid(SoftmaxCrossEntropyBackward(kBf16, kBf16, kFloat, nullptr, 1.0f, 4, 8, nullptr),
                "SoftmaxCrossEntropyBackward", "targets is null");
}

TEST_CASE("Attention rejects bad shapes and pointers by name", "[gpt_kernels_args]") {
  const AttentionShape good{2, 16, 4, 64};
  AttentionShape bad = good;
  SECTION("T beyond kMaxAttentionT (the flash kernel's grid limit)") {
    REQUIRE(kMaxAttentionT == 65535 * 64);
    bad.T = kMaxAttentionT + 1;
    ExpectInvalid(AttentionForward(kBf16, kFloat, kBf16, bad, nullptr), "AttentionForward",
                  "T = 4194241");
  }
  SECTION("no heads") {
    bad.NH = 0;
    ExpectInvalid(AttentionBackward(kBf16, kBf16, kBf16, kBf16, kFloat, kWorkspace, bad, nullptr),
                  "AttentionBackward", "NH = 0");
  }
  SECTION("a head size the flash kernel lacks") {
    bad.hs = 96;
    ExpectInvalid(AttentionForward(kBf16, kFloat, kBf16, bad, nullptr), "AttentionForward",
                  "hs = 96 is not a head size of the flash attention (64 or 128)");
  }
  SECTION("null qkv and dqkv: checked before the column blocks are formed") {
    ExpectInvalid(AttentionForward(kBf16, kFloat, nullptr, good, nullptr), "AttentionForward",
                  "qkv is null");
    ExpectInvalid(
        AttentionBackward(nullptr, kBf16, kBf16, kBf16, kFloat, kWorkspace, good, nullptr),
        "AttentionBackward", "dqkv is null");
  }
  SECTION("null lse, workspace; misaligned workspace (the flash kernel's checks)") {
    ExpectInvalid(AttentionForward(kBf16, nullptr, kBf16, good, nullptr),
                  "FlashAttentionForward", "lse is null");
    ExpectInvalid(AttentionBackward(kBf16, kBf16, kBf16, kBf16, kFloat, nullptr, good, nullptr),
                  "FlashAttentionBackward", "workspace is null");
    void* misaligned = reinterpret_cast<void*>(std::uintptr_t{4096 + 2});
    ExpectInvalid(
        AttentionBackward(kBf16, kBf16, kBf16, kBf16, kFloat, misaligned, good, nullptr),
        "FlashAttentionBackward", "workspace is not 4-byte aligned");
  }
}

TEST_CASE("Attention maps the fused QKV onto the flash kernel's row strides",
          "[gpt_kernels_args]") {
  // C = 4 * 64 = 256: q, k, v rows 3C = 768 apart, one kv head per query head, dense out.
  const examples::cuda::AttentionDims d = FlashDims({2, 16, 4, 64});
  CHECK(d.B == 2);
  CHECK(d.T == 16);
  CHECK(d.NH == 4);
  CHECK(d.NKV == 4);
  CHECK(d.hd == 64);
  CHECK(d.q_row_stride == 768);
  CHECK(d.kv_row_stride == 768);
  CHECK(d.out_row_stride == 256);
  // The backward's workspace: B * NH * T floats (dot(dout, out) per query); none when invalid.
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  CHECK(AttentionBackwardWorkspaceBytes({2, 16, 4, 64}) == 2 * 4 * 16 * 4);
  CHECK(AttentionBackwardWorkspaceBytes({1, 2048, 64, 128}) == kMiB / 2);
  CHECK(AttentionBackwardWorkspaceBytes({1, 0, 5, 64}) == 0);
  CHECK(AttentionBackwardWorkspaceBytes({1, 64, 5, 96}) == 0);
}

TEST_CASE("Column-sum scratch sizes", "[gpt_kernels_args]") {
  // Chunks of 32 rows, one partial sum per chunk and column (two columns sets for LayerNorm).
  CHECK(BiasScratchFloats(1, 100) == 100);
  CHECK(BiasScratchFloats(32, 100) == 100);
  CHECK(BiasScratchFloats(33, 100) == 200);
  CHECK(LayerNormWeightScratchFloats(4096, 8192) == 128 * 2 * 8192);
  CHECK(LayerNormWeightScratchFloats(0, 8) == 0);
  CHECK(BiasScratchFloats(8, -1) == 0);
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
