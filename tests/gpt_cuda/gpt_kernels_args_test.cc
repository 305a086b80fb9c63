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
cublasHandle_t const kHandle = reinterpret_cast<cublasHandle_t>(std::uintptr_t{4096});

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

TEST_CASE("Attention rejects bad shapes, workspaces and handles by name", "[gpt_kernels_args]") {
  const AttentionShape good{2, 16, 4, 64, 0};
  AttentionShape bad = good;
  SECTION("T beyond kMaxAttentionT") {
    bad.T = kMaxAttentionT + 1;
    ExpectInvalid(AttentionForward(kBf16, kFloat, kBf16, kWorkspace, bad, kHandle, nullptr),
                  "AttentionForward", "T = 16385");
  }
  SECTION("no heads") {
    bad.NH = 0;
    ExpectInvalid(
        AttentionBackward(kBf16, kBf16, kBf16, kBf16, kFloat, kWorkspace, bad, kHandle, nullptr),
        "AttentionBackward", "NH = 0");
  }
  SECTION("negative heads_per_group") {
    bad.heads_per_group = -1;
    ExpectInvalid(AttentionForward(kBf16, kFloat, kBf16, kWorkspace, bad, kHandle, nullptr),
                  "AttentionForward", "heads_per_group = -1");
  }
  SECTION("negative row_blocks") {
    bad.row_blocks = -2;
    ExpectInvalid(
        AttentionBackward(kBf16, kBf16, kBf16, kBf16, kFloat, kWorkspace, bad, kHandle, nullptr),
        "AttentionBackward", "row_blocks = -2");
  }
  SECTION("null workspace, handle, lse") {
    ExpectInvalid(AttentionForward(kBf16, kFloat, kBf16, nullptr, good, kHandle, nullptr),
                  "AttentionForward", "workspace is null");
    ExpectInvalid(AttentionForward(kBf16, kFloat, kBf16, kWorkspace, good, nullptr, nullptr),
                  "AttentionForward", "cublas is null");
    ExpectInvalid(
        AttentionBackward(kBf16, kBf16, kBf16, kBf16, nullptr, kWorkspace, good, kHandle, nullptr),
        "AttentionBackward", "lse is null");
  }
  SECTION("misaligned workspace") {
    void* misaligned = reinterpret_cast<void*>(std::uintptr_t{4096 + 4});
    ExpectInvalid(AttentionForward(kBf16, kFloat, kBf16, misaligned, good, kHandle, nullptr),
                  "AttentionForward", "16-byte aligned");
  }
}

TEST_CASE("Attention workspace: heads grouped to 1 GiB, 1 GiB at most at T = 4096",
          "[gpt_kernels_args]") {
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  // T = 4096: 128 MiB of scores and score gradients per head, so 8 heads per group.
  CHECK(AttentionHeadsPerGroup({1, 4096, 64, 128, 0}) == 8);
  CHECK(AttentionWorkspaceBytes({1, 4096, 64, 128, 0}) == 1024 * kMiB);
  CHECK(AttentionWorkspaceBytes({8, 4096, 64, 128, 0}) <= 1024 * kMiB);
  CHECK(AttentionHeadsPerGroup({1, 2048, 64, 128, 0}) == 32);
  CHECK(AttentionWorkspaceBytes({1, 2048, 64, 128, 0}) == 1024 * kMiB);
  // Short sequences: every head in one group (capped at NH).
  CHECK(AttentionHeadsPerGroup({4, 1024, 12, 64, 0}) == 12);
  CHECK(AttentionWorkspaceBytes({4, 1024, 12, 64, 0}) == 96 * kMiB);
  // T = 16384: one head (2 GiB) even though it exceeds the budget.
  CHECK(AttentionHeadsPerGroup({1, 16384, 64, 128, 0}) == 1);
  CHECK(AttentionWorkspaceBytes({1, 16384, 64, 128, 0}) == 2048 * kMiB);
  // An explicit group size wins, capped at NH.
  CHECK(AttentionHeadsPerGroup({1, 64, 5, 64, 2}) == 2);
  CHECK(AttentionHeadsPerGroup({1, 64, 5, 64, 9}) == 5);
  CHECK(AttentionWorkspaceBytes({1, 64, 5, 64, 2}) == 8 * 64 * 64 * 2);
  CHECK(AttentionWorkspaceBytes({1, 4096, 64, 128, 2}) == 256 * kMiB);
  // Invalid shapes need nothing.
  CHECK(AttentionWorkspaceBytes({1, 0, 5, 64, 0}) == 0);
  CHECK(AttentionWorkspaceBytes({1, 64, 5, 0, 0}) == 0);
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
