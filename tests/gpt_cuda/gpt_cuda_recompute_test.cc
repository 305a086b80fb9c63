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
// Lean entries B reads in place (StageModel::BackwardReadsRetained: unsplit, no head), as the
// runtime hands them over (no RecomputeSaved, the lean block as `saved`): every input gradient
// and parameter gradient bitwise as rebuilding the entry first; which (chunk, mode, split) say
// so; and the refusals of a lean block the chunk cannot read.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "examples/gpt/cuda/gpt_cuda_stage_model.h"
#include "examples/gpt/cuda/gpt_layer_stack.h"
#include "examples/gpt/gpt_data.h"
#include "pipeoffload/cuda_stream.h"
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
  // What B read (entries B read in place: absent), and what it wrote for the previous chunk.
  std::map<std::pair<int, int>, std::vector<std::uint8_t>> entries;
  std::map<std::pair<int, int>, std::vector<std::uint8_t>> input_grads;
  std::vector<double> losses;
  std::map<int, std::vector<float>> grads;  // tensor id -> gradient
  int read_in_place = 0;                    // entries B got as their retained block
};

// One training step's F, (RECOMPUTE,) B and W of a single-stage model with v chunks, in
// pipeline order (all F, then B in reverse chunk order, W after every B when split).
// `in_place`: an entry whose mode the model's BackwardReadsRetained names goes to B as the
// runtime then passes it, the retained block itself, without RecomputeSaved.
StepRun RunStep(GptCudaStageModel& model, bool split, bool mixed, Recompute only,
                bool in_place = false) {
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
      const bool reads_retained =
          in_place && mode != Recompute::kNone && model.BackwardReadsRetained(c, mode, split);
      if (reads_retained) {
        ++run.read_in_place;
      } else {
        if (mode != Recompute::kNone) {
          auto rebuilt = std::make_unique<DeviceBytes>(model.SavedBytes(c, split));
          PO_MODEL_TEST_OK(
              model.RecomputeSaved(mb, c, stash[{c, mb}]->data(), rebuilt->data(), mode));
          stash[{c, mb}]->Poison();  // the runtime frees it: nothing may read it again
          stash[{c, mb}] = std::move(rebuilt);
        }
        run.entries[{c, mb}] = Download(*stash[{c, mb}], model.SavedBytes(c, false));
      }
      auto grad_input = std::make_unique<DeviceBytes>(boundary);
      PO_MODEL_TEST_OK(model.Backward(mb, c, c == v - 1 ? nullptr : gradient[{c + 1, mb}]->data(),
                                      c == 0 ? nullptr : grad_input->data(), stash[{c, mb}]->data(),
                                      !split));
      if (c > 0) run.input_grads[{c, mb}] = Download(*grad_input, boundary);
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

// The layer stacks here: two chunks of two layers, small enough for seconds.
LayerStackShape SmallStack() {
  LayerStackShape shape;
  shape.hidden = 256;
  shape.heads = 4;
  shape.seq = 128;
  shape.batch = 2;
  shape.layers_per_chunk = 2;
  shape.chunks_per_stage = 2;
  return shape;
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

TEST_CASE(
    "CUDA GPT retained sizes: full keeps the input, lean the lean layout, which B reads in "
    "place unsplit and without the head",
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
    // B reads a lean block in place only unsplit and without the head (2), which reads lnf_out.
    CHECK(model->BackwardReadsRetained(c, Recompute::kLean, false) == (c < 2));
    CHECK(model->chunk(c).BackwardReadsLean() == (c < 2));
    CHECK_FALSE(model->BackwardReadsRetained(c, Recompute::kLean, true));
    CHECK_FALSE(model->BackwardReadsRetained(c, Recompute::kFull, false));
    CHECK_FALSE(model->BackwardReadsRetained(c, Recompute::kNone, false));
    CHECK_FALSE(plain->BackwardReadsRetained(c, Recompute::kLean, false));
    CHECK_FALSE(lean_saved->BackwardReadsRetained(c, Recompute::kLean, false));
  }
  CHECK(model->RetainedBytes(3, Recompute::kFull, false) == -1);
  CHECK_FALSE(model->BackwardReadsRetained(-1, Recompute::kLean, false));
  CHECK_FALSE(model->BackwardReadsRetained(3, Recompute::kLean, false));
  CHECK(model->device_bytes() > plain->device_bytes());  // the workspace and the lean scratch

  // A lean block of the head handed to B without its rebuild: refused, naming why.
  const std::int64_t boundary = model->BoundaryBytes();
  DeviceBytes input(boundary), grad_input(boundary),
      retained(model->RetainedBytes(2, Recompute::kLean, false));
  input.Zero();
  PO_MODEL_TEST_OK(model->StartIteration(0));
  PO_MODEL_TEST_OK(model->ForwardRetaining(0, 2, input.data(), nullptr, retained.data(),
                                           Recompute::kLean));
  const absl::Status status =
      model->Backward(0, 2, nullptr, grad_input.data(), retained.data(), true);
  INFO(status.ToString());
  CHECK(absl::IsInvalidArgument(status));
  CHECK(absl::StrContains(status.message(), "head"));
  PO_MODEL_TEST_OK(model->Synchronize());
}

TEST_CASE("Layer stack recompute: full gives no-recompute's gradient bits, lean all but fc-proj's",
          "[gpt_cuda][gpt_cuda_recompute][gpt_cuda_stack]") {
  LayerStackShape shape = SmallStack();
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

TEST_CASE("CUDA GPT lean entries B reads in place: RecomputeSaved + B's bits",
          "[gpt_cuda][gpt_cuda_recompute]") {
  // Every entry lean, or a mix of keep / lean / full (a Forward and a ForwardRetaining(kFull)
  // beside lean ones of the same chunk: each B must see its own entry's layout).
  const bool mixed = GENERATE(false, true);
  CAPTURE(mixed);
  const GptConfig config = RecomputeConfig();
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto backend = testing::NewCudaBackend();
  const GptCudaStageOptions options{.recompute = true};
  auto rebuilding = ValueOrFail(GptCudaStageModel::Create(*backend, config, 1, 3, 0, data, options));
  auto in_place = ValueOrFail(GptCudaStageModel::Create(*backend, config, 1, 3, 0, data, options));
  const StepRun want = RunStep(*rebuilding, /*split=*/false, mixed, Recompute::kLean);
  const StepRun got = RunStep(*in_place, /*split=*/false, mixed, Recompute::kLean,
                              /*in_place=*/true);
  // The lean entries of chunks 0 and 1 (the head's are rebuilt).
  int lean_without_head = 0;
  for (int c = 0; c < 2; ++c) {
    for (int mb = 0; mb < config.num_microbatches; ++mb) {
      lean_without_head += ModeOf(mixed, Recompute::kLean, c, mb) == Recompute::kLean ? 1 : 0;
    }
  }
  REQUIRE(lean_without_head > 0);
  CHECK(got.read_in_place == lean_without_head);
  CHECK(std::memcmp(got.losses.data(), want.losses.data(), 8 * want.losses.size()) == 0);
  CHECK(got.outputs == want.outputs);
  for (const auto& [key, bytes] : got.entries) {  // the entries both rebuilt or kept
    INFO("entry of chunk " << key.first << " mb " << key.second);
    CHECK(want.entries.at(key) == bytes);
  }
  REQUIRE(got.input_grads.size() == want.input_grads.size());
  for (const auto& [key, bytes] : want.input_grads) {
    INFO("input gradient of chunk " << key.first << " mb " << key.second);
    CHECK(got.input_grads.at(key) == bytes);
  }
  for (const auto& [id, grad] : want.grads) {
    INFO("gradient of tensor " << id);
    REQUIRE(AllFinite(grad));
    CHECK(got.grads.at(id) == grad);
  }
}

TEST_CASE("GptCudaChunk refuses a lean block it cannot read, naming why",
          "[gpt_cuda][gpt_cuda_recompute]") {
  const GptConfig config = RecomputeConfig();
  auto backend = testing::NewCudaBackend();
  cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
  const LayerDims dims{config.batch_size, config.seq_len, config.n_embd, config.n_head};
  const std::int64_t boundary = std::int64_t{dims.N()} * dims.C * 2;
  // Every check comes before a kernel: these buffers are never read.
  DeviceBytes grad_output(boundary), grad_input(boundary), block(boundary);
  const auto* dout = static_cast<const bf16*>(grad_output.data());
  auto* dinp = static_cast<bf16*>(grad_input.data());
  // Backward of virtual stage `stage` (of 3) on a lean block: its status's message.
  const auto refusal = [&](GptCudaContext& context, int stage, bool with_weight_grad) {
    auto chunk = ValueOrFail(GptCudaChunk::CreateGpt(config, stage, 3, context));
    // BackwardReadsLean covers the static conditions; Backward itself refuses a split backward.
    if (with_weight_grad) CHECK_FALSE(chunk->BackwardReadsLean());
    const absl::Status status =
        chunk->Backward(stage == 2 ? nullptr : dout, stage == 0 ? nullptr : dinp,
                        block.bytes_ptr(), with_weight_grad, 1.0f, EntryLayout::kLeanRetained);
    INFO(status.ToString());
    CHECK(absl::IsInvalidArgument(status));
    return std::string(status.message());
  };
  LayerDims scratch = dims;
  scratch.lean_scratch = true;
  auto with_scratch = ValueOrFail(GptCudaContext::Create(scratch, 0, stream));
  for (int stage : {0, 1}) {
    auto chunk = ValueOrFail(GptCudaChunk::CreateGpt(config, stage, 3, *with_scratch));
    CHECK(chunk->BackwardReadsLean());
  }
  CHECK(absl::StrContains(refusal(*with_scratch, 2, true), "head"));
  CHECK(absl::StrContains(refusal(*with_scratch, 1, false), "split backward"));
  auto without_scratch = ValueOrFail(GptCudaContext::Create(dims, 0, stream));
  CHECK(absl::StrContains(refusal(*without_scratch, 1, true), "lean scratch"));
  LayerDims lean = dims;
  lean.lean_saved = true;
  auto lean_saved = ValueOrFail(GptCudaContext::Create(lean, 0, stream));
  CHECK(absl::StrContains(refusal(*lean_saved, 0, true), "lean_saved"));
}

TEST_CASE("Layer stack lean entries B reads in place: RecomputeSaved + B's bits",
          "[gpt_cuda][gpt_cuda_recompute][gpt_cuda_stack]") {
  LayerStackShape shape = SmallStack();
  shape.recompute = true;
  auto backend = testing::NewCudaBackend();
  {
    LayerStackShape plain = shape;
    plain.recompute = false;
    LayerStackShape lean_saved = shape;
    lean_saved.lean_saved = true;
    auto without = ValueOrFail(CreateCudaGptLayerStack(*backend, plain));
    auto lean = ValueOrFail(CreateCudaGptLayerStack(*backend, lean_saved));
    for (int c = 0; c < 2; ++c) {
      CHECK_FALSE(without->BackwardReadsRetained(c, Recompute::kLean, false));
      CHECK_FALSE(lean->BackwardReadsRetained(c, Recompute::kLean, false));
    }
  }
  const std::int64_t boundary = shape.BoundaryBytes();
  struct Run {
    std::vector<std::vector<std::uint8_t>> input_grads;
    std::vector<std::uint64_t> hashes;
  };
  // Two microbatches through both chunks, every entry lean (chunk 1's B before chunk 0's), then
  // a third microbatch of chunk 0 kept full; `in_place`: B reads the lean blocks as they are.
  const auto run = [&](bool in_place) {
    auto model = ValueOrFail(CreateCudaGptLayerStack(*backend, shape));
    for (int c = 0; c < 2; ++c) {
      CHECK(model->BackwardReadsRetained(c, Recompute::kLean, false));
      CHECK_FALSE(model->BackwardReadsRetained(c, Recompute::kLean, true));
      CHECK_FALSE(model->BackwardReadsRetained(c, Recompute::kFull, false));
    }
    CHECK_FALSE(model->BackwardReadsRetained(2, Recompute::kLean, false));
    std::vector<std::unique_ptr<DeviceBytes>> retained, acts, grads;  // [2 c + mb], grads by B
    for (int c = 0; c < 2; ++c) {
      for (int mb = 0; mb < 2; ++mb) {
        retained.push_back(
            std::make_unique<DeviceBytes>(model->RetainedBytes(c, Recompute::kLean, false)));
        acts.push_back(std::make_unique<DeviceBytes>(boundary));
        const void* input = c == 0 ? nullptr : acts[static_cast<std::size_t>(mb)]->data();
        PO_MODEL_TEST_OK(model->ForwardRetaining(mb, c, input, acts.back()->data(),
                                                 retained.back()->data(), Recompute::kLean));
      }
    }
    Run result;
    for (int c = 1; c >= 0; --c) {
      for (int mb = 0; mb < 2; ++mb) {
        DeviceBytes& entry = *retained[static_cast<std::size_t>(2 * c + mb)];
        std::unique_ptr<DeviceBytes> rebuilt;
        void* saved = entry.data();
        if (!in_place) {
          rebuilt = std::make_unique<DeviceBytes>(model->SavedBytes(c, false));
          PO_MODEL_TEST_OK(
              model->RecomputeSaved(mb, c, entry.data(), rebuilt->data(), Recompute::kLean));
          entry.Poison();
          saved = rebuilt->data();
        }
        grads.push_back(std::make_unique<DeviceBytes>(boundary));
        const void* grad_output = c == 1 ? nullptr : grads[static_cast<std::size_t>(mb)]->data();
        PO_MODEL_TEST_OK(model->Backward(mb, c, grad_output, grads.back()->data(), saved, true));
        result.input_grads.push_back(Download(*grads.back(), boundary));
      }
    }
    // In place, the entry was first written lean, then rewritten full by Forward: B must read
    // the full layout (the model forgets the lean mark), as the run that only kept it does.
    DeviceBytes full(model->SavedBytes(0, false)), lean(model->RetainedBytes(0, Recompute::kLean,
                                                                              false)),
        output(boundary), grad_input(boundary);
    if (in_place) {
      PO_MODEL_TEST_OK(
          model->ForwardRetaining(2, 0, nullptr, output.data(), lean.data(), Recompute::kLean));
    }
    PO_MODEL_TEST_OK(model->Forward(2, 0, nullptr, output.data(), full.data()));
    PO_MODEL_TEST_OK(
        model->Backward(2, 0, grads[0]->data(), grad_input.data(), full.data(), true));
    result.input_grads.push_back(Download(grad_input, boundary));
    result.hashes = ValueOrFail(LayerStackGradHashes(*model));
    return result;
  };
  const Run want = run(false);
  const Run got = run(true);
  REQUIRE(want.hashes.size() == 2 * 2 * 12);
  CHECK(got.hashes == want.hashes);
  REQUIRE(got.input_grads.size() == want.input_grads.size());
  for (std::size_t i = 0; i < want.input_grads.size(); ++i) {
    INFO("input gradient " << i);
    CHECK(got.input_grads[i] == want.input_grads[i]);
  }
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
