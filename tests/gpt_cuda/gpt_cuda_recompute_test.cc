// Recompute on the CUDA GPT (StageModel::RetainedBytes / ForwardRetaining / RecomputeSaved,
// gpt_cuda_chunk.h), driven by hand as a runtime would: F keeps a retained block, a fresh
// poisoned entry is rebuilt from it right before B, and the retained block is poisoned after.
// Against the same model keeping every entry, on the same weights and data:
//  - full recompute: the forward outputs, the losses, the rebuilt entry (every byte B reads)
//    and every parameter gradient are bitwise equal: the forward reruns the same kernels on
//    the same values, whether its layers wrote one workspace (ForwardRetaining) or the entry;
//  - lean recompute: the same, except where gelu(fch) is concerned: the rebuild computes it from
//    the bf16 fch with GeluForward, the forward from the fp32 accumulator in cuBLASLt's fused
//    epilogue (gpt_cuda_layer.h "Lean"), so the fch_gelu slots agree within kGeluBound per
//    element and the fc-proj weight gradients within kFcProjTolerance (relative); bitwise
//    where no epilogue was fused. Every other byte and gradient is bitwise equal.
// Both on the full GPT (embedding, a middle chunk, the head and loss: p = 1, v = 3, with a
// two-layer chunk so the full-recompute workspace is shared by two layers) with split and unsplit
// backward, and on the benchmark's layer stack. Plus the sizes each mode retains, and the -1
// of a model created without recompute.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "examples/gpt/cuda/gpt_cuda_stage_model.h"
#include "examples/gpt/cuda/gpt_layer_stack.h"
#include "examples/gpt/gpt_data.h"
#include "tests/gpt_cuda/gpt_cuda_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

using model_testing::CopyToHost;
using model_testing::DeviceBytes;
using model_testing::RelativeError;
using model_testing::Report;
using model_testing::ValueOrFail;

// As gpt_cuda_lean_test.cc derives them: per element |g_rebuilt - g_forward| <= 2^-7 (|fch| +
// |g_forward|); the fc-proj weight gradient inherits g's ~2e-3 relative error, 1e-2 a margin of 5.
constexpr double kGeluBound = 1.0 / 128;
constexpr double kFcProjTolerance = 1e-2;

GptConfig RecomputeConfig() {
  GptConfig config;
  config.vocab_size = 256;
  config.seq_len = 64;
  config.n_embd = 128;
  config.n_head = 2;
  config.n_layer = 4;  // v = 3: layers 2 / 1 / 1
  config.batch_size = 2;
  config.num_microbatches = 3;
  return config;
}

// The recompute mode of entry (chunk, mb): none / lean / full in turn, or `only` everywhere.
Recompute ModeOf(bool mixed, Recompute only, int chunk, int mb) {
  if (!mixed) return only;
  constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kLean, Recompute::kFull};
  return kModes[(chunk + mb) % 3];
}

std::vector<std::uint8_t> Download(const DeviceBytes& buffer, std::int64_t bytes) {
  std::vector<std::uint8_t> host(static_cast<std::size_t>(bytes));
  CopyToHost(host.data(), buffer.data(), bytes);
  return host;
}

struct StepRun {
  std::map<std::pair<int, int>, std::vector<std::uint8_t>> outputs;  // (chunk, mb): F's output
  std::map<std::pair<int, int>, std::vector<std::uint8_t>> entries;  // what B read
  std::vector<double> losses;
  std::map<int, std::vector<float>> grads;  // tensor id -> gradient
};

// One training step's F, (RECOMPUTE,) B and W of a single-stage model with v chunks, in
// pipeline order (all F, then B in reverse chunk order, W after every B when split).
StepRun RunStep(GptCudaStageModel& model, bool split, bool mixed, Recompute only) {
  const int m = model.config().num_microbatches;
  const int v = model.chunks_per_stage();
  const std::int64_t boundary = model.BoundaryBytes();
  PO_MODEL_TEST_OK(model.StartIteration(0));
  std::map<std::pair<int, int>, std::unique_ptr<DeviceBytes>> activation, gradient, stash;
  StepRun run;
  for (int c = 0; c < v; ++c) {
    for (int mb = 0; mb < m; ++mb) {
      const Recompute mode = ModeOf(mixed, only, c, mb);
      const std::int64_t bytes = mode == Recompute::kNone ? model.SavedBytes(c, split)
                                                          : model.RetainedBytes(c, mode, split);
      REQUIRE(bytes > 0);
      auto entry = std::make_unique<DeviceBytes>(bytes);
      auto out = std::make_unique<DeviceBytes>(boundary);
      const void* input = c == 0 ? nullptr : activation[{c - 1, mb}]->data();
      void* output = c == v - 1 ? nullptr : out->data();
      if (mode == Recompute::kNone) {
        PO_MODEL_TEST_OK(model.Forward(mb, c, input, output, entry->data()));
      } else {
        PO_MODEL_TEST_OK(model.ForwardRetaining(mb, c, input, output, entry->data(), mode));
      }
      if (c < v - 1) run.outputs[{c, mb}] = Download(*out, boundary);
      activation[{c, mb}] = std::move(out);
      stash[{c, mb}] = std::move(entry);
    }
  }
  run.losses = ValueOrFail(model.Losses());
  for (int c = v - 1; c >= 0; --c) {
    for (int mb = 0; mb < m; ++mb) {
      const Recompute mode = ModeOf(mixed, only, c, mb);
      if (mode != Recompute::kNone) {
        auto rebuilt = std::make_unique<DeviceBytes>(model.SavedBytes(c, split));
        PO_MODEL_TEST_OK(
            model.RecomputeSaved(mb, c, stash[{c, mb}]->data(), rebuilt->data(), mode));
        stash[{c, mb}]->Poison();  // the runtime frees it: nothing may read it again
        stash[{c, mb}] = std::move(rebuilt);
      }
      run.entries[{c, mb}] = Download(*stash[{c, mb}], model.SavedBytes(c, false));
      auto grad_input = std::make_unique<DeviceBytes>(boundary);
      PO_MODEL_TEST_OK(model.Backward(mb, c, c == v - 1 ? nullptr : gradient[{c + 1, mb}]->data(),
                                      c == 0 ? nullptr : grad_input->data(), stash[{c, mb}]->data(),
                                      !split));
      gradient[{c, mb}] = std::move(grad_input);
    }
  }
  if (split) {
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb)
        PO_MODEL_TEST_OK(model.BackwardWeight(mb, c, stash[{c, mb}]->data()));
    }
  }
  for (int id = 0; id < model.num_tensors(); ++id)
    run.grads[id] = ValueOrFail(model.DownloadGrad(id));
  return run;
}

// Byte ranges [begin, end) of chunk c's fch_gelu slots in its saved entry (gpt_cuda_chunk.h).
std::vector<std::pair<std::int64_t, std::int64_t>> GeluRanges(GptCudaStageModel& model, int c) {
  const GptConfig& config = model.config();
  const LayerDims dims{config.batch_size, config.seq_len, config.n_embd, config.n_head};
  const LayerSavedLayout layer = MakeLayerSavedLayout(dims);
  const std::int64_t n = dims.N();
  std::int64_t at = model.chunk(c).is_first() ? AlignSlot(n * 4) : 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (int i = 0; i < model.chunk(c).num_layers(); ++i, at += layer.bytes) {
    ranges.push_back({at + layer.fch_gelu, at + layer.fch_gelu + 4 * n * dims.C * 2});
  }
  return ranges;
}

float Bf16At(const std::vector<std::uint8_t>& bytes, std::int64_t offset) {
  std::uint16_t bits = 0;
  std::memcpy(&bits, bytes.data() + offset, 2);
  const std::uint32_t wide = std::uint32_t{bits} << 16;
  float value = 0.0f;
  std::memcpy(&value, &wide, 4);
  return value;
}

// A lean entry against the kept one: bitwise outside the fch_gelu slots, within kGeluBound
// inside them (fch is the slot 8 C bytes per token before g: gpt_cuda_layer.h's order).
void CheckLeanEntry(GptCudaStageModel& model, int c, const std::vector<std::uint8_t>& got,
                    const std::vector<std::uint8_t>& want, std::int64_t* differing) {
  REQUIRE(got.size() == want.size());
  std::int64_t from = 0;
  const GptConfig& config = model.config();
  const LayerDims dims{config.batch_size, config.seq_len, config.n_embd, config.n_head};
  const LayerSavedLayout layer = MakeLayerSavedLayout(dims);
  for (const auto& [begin, end] : GeluRanges(model, c)) {
    CHECK(std::memcmp(got.data() + from, want.data() + from,
                      static_cast<std::size_t>(begin - from)) == 0);
    const std::int64_t fch = begin - (layer.fch_gelu - layer.fch);
    std::int64_t out_of_bound = 0;
    for (std::int64_t at = begin; at < end; at += 2) {
      const double g = Bf16At(got, at), g_want = Bf16At(want, at);
      const double bound =
          kGeluBound * (std::fabs(Bf16At(want, fch + (at - begin))) + std::fabs(g_want)) + 1e-30;
      if (!(std::fabs(g - g_want) <= bound)) ++out_of_bound;
      if (g != g_want) ++*differing;
    }
    CHECK(out_of_bound == 0);
    from = end;
  }
  CHECK(std::memcmp(got.data() + from, want.data() + from,
                    got.size() - static_cast<std::size_t>(from)) == 0);
}

bool IsFcProjWeight(const GptConfig& config, int id) {
  for (int l = 0; l < config.n_layer; ++l) {
    if (id == LayerTensorId(l, TensorKind::kFcProjWeight)) return true;
  }
  return false;
}

bool AllFinite(const std::vector<float>& values) {
  for (const float x : values) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

TEST_CASE("CUDA GPT recompute: full bitwise as keeping, lean within the GELU's rounding",
          "[gpt_cuda][gpt_cuda_recompute]") {
  const bool split = GENERATE(false, true);
  // Every entry full, every entry lean, or a mix of keep / lean / full.
  const int variant = GENERATE(0, 1, 2);
  const bool mixed = variant == 2;
  const Recompute only = variant == 0 ? Recompute::kFull : Recompute::kLean;
  CAPTURE(split, variant);
  const GptConfig config = RecomputeConfig();
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto backend = testing::NewCudaBackend();
  auto keep = ValueOrFail(GptCudaStageModel::Create(*backend, config, 1, 3, 0, data));
  auto recompute = ValueOrFail(GptCudaStageModel::Create(*backend, config, 1, 3, 0, data,
                                                         GptCudaStageOptions{.recompute = true}));
  const StepRun want = RunStep(*keep, split, /*mixed=*/false, Recompute::kNone);
  const StepRun got = RunStep(*recompute, split, mixed, only);

  CHECK(std::memcmp(got.losses.data(), want.losses.data(), 8 * want.losses.size()) == 0);
  for (const double loss : want.losses) REQUIRE(std::isfinite(loss));
  for (const auto& [key, bytes] : want.outputs) {
    INFO("output of chunk " << key.first << " mb " << key.second);
    CHECK(got.outputs.at(key) == bytes);
  }
  bool any_lean = false;
  std::int64_t gelu_differing = 0;
  for (const auto& [key, bytes] : want.entries) {
    const Recompute mode = ModeOf(mixed, only, key.first, key.second);
    INFO("entry of chunk " << key.first << " mb " << key.second << ": " << RecomputeName(mode));
    if (mode == Recompute::kLean) {
      any_lean = true;
      CheckLeanEntry(*recompute, key.first, got.entries.at(key), bytes, &gelu_differing);
    } else {
      CHECK(got.entries.at(key) == bytes);
    }
  }
  for (const auto& [id, grad] : want.grads) {
    INFO("gradient of tensor " << id);
    REQUIRE(AllFinite(grad));
    if (any_lean && IsFcProjWeight(config, id)) {
      const double error = RelativeError(got.grads.at(id), grad);
      Report("recompute", "lean fcproj_w grad, tensor " + std::to_string(id), error,
             kFcProjTolerance);
      CHECK(error <= kFcProjTolerance);
      if (gelu_differing == 0) CHECK(got.grads.at(id) == grad);
    } else {
      CHECK(got.grads.at(id) == grad);
    }
  }
  std::printf(
      "[recompute] split=%d variant=%d: %lld rebuilt gelu elements differ from "
      "forward's\n",
      split ? 1 : 0, variant, static_cast<long long>(gelu_differing));
  std::fflush(stdout);
}

TEST_CASE("CUDA GPT retained sizes: full keeps the input, lean the lean layout",
          "[gpt_cuda][gpt_cuda_recompute]") {
  const GptConfig config = RecomputeConfig();
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto backend = testing::NewCudaBackend();
  auto plain = ValueOrFail(GptCudaStageModel::Create(*backend, config, 1, 3, 0, data));
  auto model = ValueOrFail(GptCudaStageModel::Create(*backend, config, 1, 3, 0, data,
                                                     GptCudaStageOptions{.recompute = true}));
  auto lean_saved = ValueOrFail(GptCudaStageModel::Create(
      *backend, config, 1, 3, 0, data, GptCudaStageOptions{.lean_saved = true, .recompute = true}));
  const LayerDims dims{config.batch_size, config.seq_len, config.n_embd, config.n_head};
  LayerDims lean_dims = dims;
  lean_dims.lean_saved = true;
  const std::int64_t n = dims.N();
  const std::int64_t nc2 = AlignSlot(n * dims.C * 2);
  const std::int64_t lean_layer = MakeLayerSavedLayout(lean_dims).bytes;
  // The head's slots a lean block keeps: lnf_in, mean, rstd, logits, lse, targets (no lnf_out).
  const std::int64_t head =
      nc2 + 2 * AlignSlot(n * 4) + AlignSlot(n * config.vocab_size * 2) + 2 * AlignSlot(n * 4);
  const std::int64_t want_full[] = {AlignSlot(n * 4), nc2, nc2 + AlignSlot(n * 4)};
  const std::int64_t want_lean[] = {AlignSlot(n * 4) + 2 * lean_layer, lean_layer,
                                    lean_layer + head};
  for (int c = 0; c < 3; ++c) {
    CAPTURE(c);
    CHECK(model->RetainedBytes(c, Recompute::kFull, false) == want_full[c]);
    CHECK(model->RetainedBytes(c, Recompute::kFull, true) == want_full[c]);
    CHECK(model->RetainedBytes(c, Recompute::kLean, false) == want_lean[c]);
    // What lean leaves out: ln1, ln2 (2 C bytes per token each) and g (8 C) per layer, and
    // lnf_out on the last chunk.
    CHECK(model->SavedBytes(c, false) - want_lean[c] ==
          12 * n * dims.C * model->chunk(c).num_layers() + (c == 2 ? nc2 : 0));
    CHECK(model->RetainedBytes(c, Recompute::kNone, false) == -1);
    CHECK(plain->RetainedBytes(c, Recompute::kFull, false) == -1);
    CHECK(plain->RetainedBytes(c, Recompute::kLean, false) == -1);
    // A lean saved layout is lean already: only full recompute is offered.
    CHECK(lean_saved->RetainedBytes(c, Recompute::kLean, false) == -1);
    CHECK(lean_saved->RetainedBytes(c, Recompute::kFull, false) == want_full[c]);
  }
  CHECK(model->RetainedBytes(3, Recompute::kFull, false) == -1);
  CHECK(model->device_bytes() > plain->device_bytes());  // the workspace and the lean scratch
}

TEST_CASE("Layer stack recompute: full gives no-recompute's gradient bits, lean all but fc-proj's",
          "[gpt_cuda][gpt_cuda_recompute][gpt_cuda_stack]") {
  LayerStackShape shape;
  shape.hidden = 256;
  shape.heads = 4;
  shape.seq = 128;
  shape.batch = 2;
  shape.layers_per_chunk = 2;
  shape.chunks_per_stage = 2;
  const bool split = GENERATE(false, true);
  CAPTURE(split);
  LayerStackShape recompute_shape = shape;
  recompute_shape.recompute = true;
  auto backend = testing::NewCudaBackend();
  const LayerDims lean_dims{shape.batch, static_cast<int>(shape.seq),
                            static_cast<int>(shape.hidden), shape.heads, true};
  std::vector<std::vector<std::uint64_t>> hashes;  // keep, full, lean
  for (const Recompute mode : {Recompute::kNone, Recompute::kFull, Recompute::kLean}) {
    auto model = ValueOrFail(
        CreateCudaGptLayerStack(*backend, mode == Recompute::kNone ? shape : recompute_shape));
    if (mode == Recompute::kNone) {
      CHECK(model->RetainedBytes(0, Recompute::kFull, false) == -1);
    } else {
      CHECK(model->RetainedBytes(1, Recompute::kFull, split) == AlignSlot(shape.BoundaryBytes()));
      CHECK(model->RetainedBytes(1, Recompute::kLean, split) ==
            2 * MakeLayerSavedLayout(lean_dims).bytes);
    }
    // Two microbatches through both chunks (chunk 0 reads the fixed input, chunk 1's backward
    // starts from the fixed gradient), chunk 1's B before chunk 0's.
    const std::int64_t boundary = shape.BoundaryBytes();
    std::vector<std::unique_ptr<DeviceBytes>> entries, acts, grads;
    for (int c = 0; c < 2; ++c) {
      for (int mb = 0; mb < 2; ++mb) {
        const std::int64_t bytes = mode == Recompute::kNone ? model->SavedBytes(c, split)
                                                            : model->RetainedBytes(c, mode, split);
        entries.push_back(std::make_unique<DeviceBytes>(bytes));
        acts.push_back(std::make_unique<DeviceBytes>(boundary));
        const void* input = c == 0 ? nullptr : acts[static_cast<std::size_t>(mb)]->data();
        void* output = acts.back()->data();
        if (mode == Recompute::kNone) {
          PO_MODEL_TEST_OK(model->Forward(mb, c, input, output, entries.back()->data()));
        } else {
          PO_MODEL_TEST_OK(
              model->ForwardRetaining(mb, c, input, output, entries.back()->data(), mode));
        }
      }
    }
    for (int c = 1; c >= 0; --c) {
      for (int mb = 0; mb < 2; ++mb) {
        auto& entry = entries[static_cast<std::size_t>(2 * c + mb)];
        if (mode != Recompute::kNone) {
          auto rebuilt = std::make_unique<DeviceBytes>(model->SavedBytes(c, split));
          PO_MODEL_TEST_OK(model->RecomputeSaved(mb, c, entry->data(), rebuilt->data(), mode));
          entry->Poison();
          entry = std::move(rebuilt);
        }
        grads.push_back(std::make_unique<DeviceBytes>(boundary));
        const void* grad_output = c == 1 ? nullptr : grads[static_cast<std::size_t>(mb)]->data();
        PO_MODEL_TEST_OK(
            model->Backward(mb, c, grad_output, grads.back()->data(), entry->data(), !split));
      }
    }
    if (split) {
      for (int c = 0; c < 2; ++c) {
        for (int mb = 0; mb < 2; ++mb) {
          PO_MODEL_TEST_OK(
              model->BackwardWeight(mb, c, entries[static_cast<std::size_t>(2 * c + mb)]->data()));
        }
      }
    }
    hashes.push_back(ValueOrFail(LayerStackGradHashes(*model)));
  }
  REQUIRE(hashes[0].size() == 2 * 2 * 12);
  CHECK(hashes[1] == hashes[0]);
  for (std::size_t k = 0; k < hashes[0].size(); ++k) {
    INFO("parameter " << k);
    if (k % 12 != 10) CHECK(hashes[2][k] == hashes[0][k]);  // 10: fc-proj weight
  }
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
