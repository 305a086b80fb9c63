// The byte layout of one CUDA GPT layer's saved activations, full and lean
// (LayerDims::lean_saved, gpt_cuda_layer.h), and the layer stack's SavedBytes built on it: pure
// arithmetic, no GPU (label cpu). The full layout must stay exactly what it was (offload
// predictions and stored benchmarks depend on it); the lean one drops exactly ln1_out, ln2_out
// and fch_gelu, 12 C bytes per token.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "examples/gpt/cuda/gpt_cuda_layer.h"
#include "examples/gpt/cuda/gpt_layer_stack.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

LayerDims Dims(int B, int T, int C, int NH, bool lean) { return LayerDims{B, T, C, NH, lean}; }

// The slots a layout holds, as (offset, size) for the present ones, in declaration order.
std::vector<std::pair<std::int64_t, std::int64_t>> PresentSlots(const LayerDims& d,
                                                                const LayerSavedLayout& l) {
  const std::int64_t n = d.N();
  const std::int64_t nc = n * d.C;
  const std::int64_t lse = std::int64_t{d.B} * d.NH * d.T * 4;
  const std::vector<std::pair<std::int64_t, std::int64_t>> all = {
      {l.x, 2 * nc},        {l.ln1_mean, 4 * n}, {l.ln1_rstd, 4 * n}, {l.ln1_out, 2 * nc},
      {l.qkv, 6 * nc},      {l.atty, 2 * nc},    {l.lse, lse},        {l.res2, 2 * nc},
      {l.ln2_mean, 4 * n},  {l.ln2_rstd, 4 * n}, {l.ln2_out, 2 * nc}, {l.fch, 8 * nc},
      {l.fch_gelu, 8 * nc}};
  std::vector<std::pair<std::int64_t, std::int64_t>> present;
  for (const auto& slot : all) {
    if (slot.first != kNoSlot) present.push_back(slot);
  }
  return present;
}

TEST_CASE("Saved layouts: the full one unchanged, the lean one without ln1, ln2 and gelu",
          "[gpt_cuda_layout]") {
  SECTION("exact offsets for a small unaligned size (B=1, T=3, C=64, NH=1)") {
    const LayerSavedLayout full = MakeLayerSavedLayout(Dims(1, 3, 64, 1, false));
    CHECK(full.x == 0);
    CHECK(full.ln1_mean == 512);
    CHECK(full.ln1_rstd == 768);
    CHECK(full.ln1_out == 1024);
    CHECK(full.qkv == 1536);
    CHECK(full.atty == 2816);
    CHECK(full.lse == 3328);
    CHECK(full.res2 == 3584);
    CHECK(full.ln2_mean == 4096);
    CHECK(full.ln2_rstd == 4352);
    CHECK(full.ln2_out == 4608);
    CHECK(full.fch == 5120);
    CHECK(full.fch_gelu == 6656);
    CHECK(full.bytes == 8192);
    const LayerSavedLayout lean = MakeLayerSavedLayout(Dims(1, 3, 64, 1, true));
    CHECK(lean.x == 0);
    CHECK(lean.ln1_mean == 512);
    CHECK(lean.ln1_rstd == 768);
    CHECK(lean.ln1_out == kNoSlot);
    CHECK(lean.qkv == 1024);
    CHECK(lean.atty == 2304);
    CHECK(lean.lse == 2816);
    CHECK(lean.res2 == 3072);
    CHECK(lean.ln2_mean == 3584);
    CHECK(lean.ln2_rstd == 3840);
    CHECK(lean.ln2_out == kNoSlot);
    CHECK(lean.fch == 4096);
    CHECK(lean.fch_gelu == kNoSlot);
    CHECK(lean.bytes == 5632);
  }
  SECTION("h = 4096, s = 2048: 32 h + 16 + 4 NH bytes per token full, 20 h + 16 + 4 NH lean") {
    CHECK(MakeLayerSavedLayout(Dims(1, 2048, 4096, 32, false)).bytes == 268730368);
    CHECK(MakeLayerSavedLayout(Dims(1, 2048, 4096, 32, true)).bytes == 168067072);
    CHECK(MakeLayerSavedLayout(Dims(2, 1024, 8192, 64, false)).bytes ==
          32LL * 8192 * 2048 + 16 * 2048 + 4 * 64 * 2048);
    CHECK(MakeLayerSavedLayout(Dims(2, 1024, 8192, 64, true)).bytes ==
          20LL * 8192 * 2048 + 16 * 2048 + 4 * 64 * 2048);
  }
  SECTION("for many sizes: lean = full less exactly the three slots; slots disjoint, aligned") {
    for (int B : {1, 2, 3}) {
      for (int T : {1, 7, 64, 100, 2048}) {
        for (int C : {64, 128, 192, 1024}) {
          for (int hs : {64, 128}) {
            if (C % hs != 0) continue;
            const int NH = C / hs;
            CAPTURE(B, T, C, NH);
            const LayerDims full_dims = Dims(B, T, C, NH, false);
            const LayerDims lean_dims = Dims(B, T, C, NH, true);
            const LayerSavedLayout full = MakeLayerSavedLayout(full_dims);
            const LayerSavedLayout lean = MakeLayerSavedLayout(lean_dims);
            const std::int64_t nc = std::int64_t{B} * T * C;
            CHECK(full.bytes - lean.bytes == 2 * AlignSlot(2 * nc) + AlignSlot(8 * nc));
            CHECK(lean.ln1_out == kNoSlot);
            CHECK(lean.ln2_out == kNoSlot);
            CHECK(lean.fch_gelu == kNoSlot);
            for (const auto& [dims, layout] :
                 {std::make_pair(full_dims, full), std::make_pair(lean_dims, lean)}) {
              auto slots = PresentSlots(dims, layout);
              CHECK(slots.size() == (dims.lean_saved ? 10u : 13u));
              std::sort(slots.begin(), slots.end());
              std::int64_t end = 0;
              for (const auto& [offset, size] : slots) {
                CHECK(offset % kSlotAlignment == 0);
                CHECK(offset >= end);  // disjoint
                end = offset + size;
              }
              CHECK(end <= layout.bytes);
              CHECK(layout.bytes == AlignSlot(end));  // nothing wasted past the last slot
            }
          }
        }
      }
    }
  }
}

TEST_CASE("LayerActivationsAt leaves the lean layout's missing slots null", "[gpt_cuda_layout]") {
  // A stand-in base address, never dereferenced: only pointer arithmetic.
  auto* base = reinterpret_cast<std::byte*>(std::uintptr_t{1} << 20);
  const LayerDims dims = Dims(2, 64, 128, 2, true);
  const LayerSavedLayout layout = MakeLayerSavedLayout(dims);
  const LayerActivations a = LayerActivationsAt(base, layout);
  CHECK(a.ln1_out == nullptr);
  CHECK(a.ln2_out == nullptr);
  CHECK(a.fch_gelu == nullptr);
  CHECK(reinterpret_cast<std::byte*>(a.x) == base + layout.x);
  CHECK(reinterpret_cast<std::byte*>(a.qkv) == base + layout.qkv);
  CHECK(reinterpret_cast<std::byte*>(a.fch) == base + layout.fch);
  CHECK(reinterpret_cast<std::byte*>(a.ln2_rstd) == base + layout.ln2_rstd);
  const LayerActivations full =
      LayerActivationsAt(base, MakeLayerSavedLayout(Dims(2, 64, 128, 2, false)));
  CHECK(full.ln1_out != nullptr);
  CHECK(full.ln2_out != nullptr);
  CHECK(full.fch_gelu != nullptr);
}

TEST_CASE("Layer stack SavedBytes follows lean_saved", "[gpt_cuda_layout]") {
  LayerStackShape shape;
  shape.hidden = 4096;
  shape.heads = 32;
  shape.seq = 2048;
  shape.layers_per_chunk = 2;
  CHECK(shape.SavedBytes() == 2 * 268730368LL);
  shape.lean_saved = true;
  REQUIRE(CheckLayerStackShape(shape).ok());
  CHECK(shape.SavedBytes() == 2 * 168067072LL);
  // The boundary and the FLOPs do not change: recomputation is not model work.
  LayerStackShape full = shape;
  full.lean_saved = false;
  CHECK(shape.BoundaryBytes() == full.BoundaryBytes());
  CHECK(shape.ForwardFlops() == full.ForwardFlops());
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
