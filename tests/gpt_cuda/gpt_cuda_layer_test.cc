// The CUDA GPT's linear layers, one layer, and a whole one-chunk model against the CPU fp32
// model (examples/gpt) on the same bf16-rounded parameters and inputs: relative error within
// the stated bf16 tolerances, every output poisoned first (NaN never passes); plus bitwise
// determinism (run twice) and split backward (B then W) bitwise equal to the full backward;
// the layer and the model both with full and with lean saved activations (LayerDims::lean_saved).
//
// Tolerances (||gpu - cpu|| / ||cpu||), from bf16 storage of activations (2^-9 relative per
// rounding) compounded over a layer's ~10 roundings, with fp32 accumulation everywhere; in
// brackets what the H200 measured (2026-11-29), so each bound keeps a 4-5x margin at least:
//   linear layers 1e-2 [1.6e-3 .. 2.4e-3; the fp32 weight gradient 1.2e-7];
//   layer output 1e-2 [2.2e-3], input gradient 1e-2 [2.2e-3], parameter gradients 2e-2
//   [6.8e-4 .. 4.4e-3]; mean loss 1e-3 [1.7e-6].
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "examples/gpt/cuda/gpt_cuda_chunk.h"
#include "examples/gpt/cuda/gpt_layer_stack.h"
#include "examples/gpt/cuda/kernels_cuda.h"
#include "examples/gpt/cuda/linear.h"
#include "examples/gpt/gpt_chunk.h"
#include "examples/gpt/gpt_data.h"
#include "examples/gpt/kernels_cpu.h"
#include "pipeoffload/cuda_stream.h"
#include "tests/gpt_cuda/gpt_cuda_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt::cuda {
namespace {

using model_testing::BitwiseEqual;
using model_testing::CopyToDevice;
using model_testing::DeviceBytes;
using model_testing::DownloadBf16;
using model_testing::RandomBf16Values;
using model_testing::RelativeError;
using model_testing::Report;
using model_testing::ToBf16Bits;
using model_testing::ValueOrFail;

constexpr double kLinearTolerance = 1e-2;
constexpr double kOutputTolerance = 1e-2;
constexpr double kInputGradTolerance = 1e-2;
constexpr double kParamGradTolerance = 2e-2;
constexpr double kLossTolerance = 1e-3;

void UploadBf16(const DeviceBytes& device, const std::vector<float>& values) {
  const std::vector<std::uint16_t> bits = ToBf16Bits(values);
  REQUIRE(device.size() >= static_cast<std::int64_t>(bits.size() * 2));
  CopyToDevice(device.data(), bits.data(), static_cast<std::int64_t>(bits.size() * 2));
}

// Rounds every parameter of a CPU chunk to bf16, so both models compute with the same values.
void RoundParamsToBf16(GptChunk& cpu) {
  for (int local = 0; local < static_cast<int>(cpu.params().tensors().size()); ++local) {
    float* p = cpu.params().param(local);
    const std::int64_t n = cpu.params().tensors()[static_cast<std::size_t>(local)].spec.numel();
    for (std::int64_t i = 0; i < n; ++i) p[i] = RoundToBf16(p[i]);
  }
}

// Every parameter gradient of `gpu` against `cpu` (which holds the same tensors).
void CompareParamGrads(const char* test, const GptChunk& cpu, const GptCudaChunk& gpu,
                       cudaStream_t stream) {
  for (const DeviceTensor& tensor : gpu.params().tensors()) {
    const int cpu_local = cpu.params().Find(tensor.id, false);
    REQUIRE(cpu_local >= 0);
    const float* want_ptr = cpu.params().grad(cpu_local);
    const std::vector<float> want(want_ptr, want_ptr + tensor.spec.numel());
    const std::vector<float> got =
        ValueOrFail(gpu.params().DownloadGrad(gpu.params().Find(tensor.id), stream));
    const double error = RelativeError(got, want);
    Report(test, "grad " + tensor.spec.name, error, kParamGradTolerance);
    INFO(tensor.spec.name << " relative error " << error);
    CHECK(error <= kParamGradTolerance);
  }
}

std::vector<std::vector<float>> AllGrads(const GptCudaChunk& gpu, cudaStream_t stream) {
  std::vector<std::vector<float>> grads;
  for (int local = 0; local < static_cast<int>(gpu.params().tensors().size()); ++local) {
    grads.push_back(ValueOrFail(gpu.params().DownloadGrad(local, stream)));
  }
  return grads;
}

TEST_CASE("Linear layers match the CPU matmuls in bf16 tolerance", "[gpt_cuda][gpt_cuda_linear]") {
  auto backend = testing::NewCudaBackend();
  cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
  auto linear = ValueOrFail(Linear::Create(stream));
  const int N = 96, IC = 128, OC = 192;
  const std::vector<float> x = RandomBf16Values(std::int64_t{N} * IC, 1.0f, 1);
  const std::vector<float> w = RandomBf16Values(std::int64_t{OC} * IC, 0.05f, 2);
  const std::vector<float> b = RandomBf16Values(OC, 0.5f, 3);
  const std::vector<float> residual = RandomBf16Values(std::int64_t{N} * OC, 1.0f, 4);
  const std::vector<float> dy = RandomBf16Values(std::int64_t{N} * OC, 1.0f, 5);
  DeviceBytes dx_dev(std::int64_t{N} * IC * 2), dw_dev(std::int64_t{OC} * IC * 2), db_dev(OC * 2),
      dres(std::int64_t{N} * OC * 2), ddy(std::int64_t{N} * OC * 2);
  UploadBf16(dx_dev, x);
  UploadBf16(dw_dev, w);
  UploadBf16(db_dev, b);
  UploadBf16(dres, residual);
  UploadBf16(ddy, dy);
  const auto* xd = static_cast<const bf16*>(dx_dev.data());
  const auto* wd = static_cast<const bf16*>(dw_dev.data());
  const auto* bd = static_cast<const bf16*>(db_dev.data());

  // CPU references.
  std::vector<float> pre(static_cast<std::size_t>(N) * OC);
  ::pipeoffload::gpt::MatmulForward(pre.data(), x.data(), w.data(), b.data(), N, IC, OC);
  std::vector<float> with_residual(pre.size());
  ::pipeoffload::gpt::ResidualForward(with_residual.data(), residual.data(), pre.data(),
                                      static_cast<std::int64_t>(pre.size()));
  std::vector<float> gelu(pre.size());
  ::pipeoffload::gpt::GeluForward(gelu.data(), pre.data(), static_cast<std::int64_t>(pre.size()));

  SECTION("forward with bias and residual") {
    DeviceBytes out(std::int64_t{N} * OC * 2);
    PO_MODEL_TEST_OK(linear->Forward(static_cast<bf16*>(out.data()), xd, wd, bd,
                                     static_cast<const bf16*>(dres.data()), nullptr, {N, IC, OC}));
    const double error =
        RelativeError(DownloadBf16(out.data(), std::int64_t{N} * OC), with_residual);
    Report("linear", "forward bias+residual", error, kLinearTolerance);
    CHECK(error <= kLinearTolerance);
  }
  SECTION("forward with bias and GELU keeps the pre-activation") {
    DeviceBytes out(std::int64_t{N} * OC * 2), pre_dev(std::int64_t{N} * OC * 2);
    PO_MODEL_TEST_OK(linear->Forward(static_cast<bf16*>(out.data()), xd, wd, bd, nullptr,
                                     static_cast<bf16*>(pre_dev.data()), {N, IC, OC}));
    const double gelu_error = RelativeError(DownloadBf16(out.data(), std::int64_t{N} * OC), gelu);
    const double pre_error = RelativeError(DownloadBf16(pre_dev.data(), std::int64_t{N} * OC), pre);
    Report("linear", "forward gelu out", gelu_error, kLinearTolerance);
    Report("linear", "forward gelu pre-activation", pre_error, kLinearTolerance);
    CHECK(gelu_error <= kLinearTolerance);
    CHECK(pre_error <= kLinearTolerance);
  }
  SECTION("backward input, plain and through the GELU") {
    std::vector<float> dx(static_cast<std::size_t>(N) * IC);
    ::pipeoffload::gpt::MatmulBackwardInput(dx.data(), dy.data(), w.data(), N, IC, OC);
    DeviceBytes out(std::int64_t{N} * IC * 2);
    PO_MODEL_TEST_OK(linear->BackwardInput(static_cast<bf16*>(out.data()),
                                           static_cast<const bf16*>(ddy.data()), wd, nullptr,
                                           {N, IC, OC}));
    const double error = RelativeError(DownloadBf16(out.data(), std::int64_t{N} * IC), dx);
    Report("linear", "backward input", error, kLinearTolerance);
    CHECK(error <= kLinearTolerance);
    // Through a GELU whose pre-activation (N, IC) is x: dgelu = gelu'(x) * (dy W).
    std::vector<float> dgelu(dx.size());
    ::pipeoffload::gpt::GeluBackward(dgelu.data(), x.data(), dx.data(),
                                     static_cast<std::int64_t>(dx.size()));
    out.Poison();
    PO_MODEL_TEST_OK(linear->BackwardInput(
        static_cast<bf16*>(out.data()), static_cast<const bf16*>(ddy.data()), wd, xd, {N, IC, OC}));
    const double gelu_error = RelativeError(DownloadBf16(out.data(), std::int64_t{N} * IC), dgelu);
    Report("linear", "backward input through gelu", gelu_error, kLinearTolerance);
    CHECK(gelu_error <= kLinearTolerance);
  }
  SECTION("backward weight accumulates in fp32, the same bits every time") {
    std::vector<float> dw(static_cast<std::size_t>(OC) * IC, 0.0f);
    ::pipeoffload::gpt::MatmulBackwardWeight(dw.data(), nullptr, dy.data(), x.data(), N, IC, OC);
    ::pipeoffload::gpt::MatmulBackwardWeight(dw.data(), nullptr, dy.data(), x.data(), N, IC, OC);
    DeviceBytes grad(std::int64_t{OC} * IC * 4);
    grad.Zero();
    for (int rep = 0; rep < 2; ++rep) {
      PO_MODEL_TEST_OK(linear->BackwardWeight(
          static_cast<float*>(grad.data()), static_cast<const bf16*>(ddy.data()), xd, {N, IC, OC}));
    }
    std::vector<float> got(dw.size());
    model_testing::CopyToHost(got.data(), grad.data(), grad.size());
    const double error = RelativeError(got, dw);
    Report("linear", "backward weight (2x accumulated)", error, kLinearTolerance);
    CHECK(error <= kLinearTolerance);
    // Pinned plans: a third call plans nothing new and adds the same bits again.
    const std::int64_t plans = linear->stats().plans;
    grad.Zero();
    for (int rep = 0; rep < 2; ++rep) {
      PO_MODEL_TEST_OK(linear->BackwardWeight(
          static_cast<float*>(grad.data()), static_cast<const bf16*>(ddy.data()), xd, {N, IC, OC}));
    }
    std::vector<float> again(dw.size());
    model_testing::CopyToHost(again.data(), grad.data(), grad.size());
    CHECK(linear->stats().plans == plans);
    CHECK(BitwiseEqual(again, got));
  }
  SECTION("bad shapes are InvalidArgument, nothing launched") {
    DeviceBytes out(std::int64_t{N} * OC * 2);
    const std::int64_t launches = linear->stats().launches;
    CHECK(
        linear->Forward(static_cast<bf16*>(out.data()), xd, wd, bd, nullptr, nullptr, {N, IC, 100})
            .code() == absl::StatusCode::kInvalidArgument);
    CHECK(linear->Forward(static_cast<bf16*>(out.data()), xd, wd, bd, nullptr, nullptr, {0, IC, OC})
              .code() == absl::StatusCode::kInvalidArgument);
    CHECK(linear->Forward(nullptr, xd, wd, bd, nullptr, nullptr, {N, IC, OC}).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(linear->stats().launches == launches);
  }
}

GptConfig SmallConfig() {
  GptConfig config;
  config.vocab_size = 256;
  config.seq_len = 64;
  config.n_embd = 128;
  config.n_head = 2;  // head size 64
  config.n_layer = 3;
  config.batch_size = 2;
  config.num_microbatches = 1;
  return config;
}

TEST_CASE("One CUDA layer matches the CPU layer, forward and backward",
          "[gpt_cuda][gpt_cuda_layer]") {
  const GptConfig config = SmallConfig();
  // Full and lean saved activations (gpt_cuda_layer.h): the same tolerances for both.
  const bool lean = GENERATE(false, true);
  CAPTURE(lean);
  const char* const tag = lean ? "layer lean" : "layer";
  // Virtual stage 1 of 3 holds exactly layer 1: no embedding, no head.
  GptChunk cpu(config, 1, 3);
  REQUIRE(cpu.layers().size() == 1);
  RoundParamsToBf16(cpu);
  auto backend = testing::NewCudaBackend();
  cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
  const LayerDims dims{config.batch_size, config.seq_len, config.n_embd, config.n_head, lean};
  auto context = ValueOrFail(GptCudaContext::Create(dims, 0, stream));
  auto gpu = ValueOrFail(GptCudaChunk::CreateGpt(config, 1, 3, *context));
  REQUIRE(gpu->num_layers() == 1);
  // The per-layer saved bytes the header documents: 32 C (lean: 20 C) + 16 + 4 NH per token,
  // plus slots.
  const std::int64_t n = dims.N();
  const std::int64_t nc = n * dims.C;
  const std::int64_t per_token_c = lean ? 20 : 32;
  CHECK(gpu->SavedBytes(false) == MakeLayerSavedLayout(dims).bytes);
  CHECK(gpu->SavedBytes(false) >= per_token_c * nc + 16 * n + 4 * dims.NH * n);
  CHECK(gpu->SavedBytes(false) < per_token_c * nc + 16 * n + 4 * dims.NH * n + 13 * 256);
  CHECK(gpu->SavedBytes(true) - gpu->SavedBytes(false) == MakeLayerGradLayout(dims).bytes);

  const std::vector<float> x = RandomBf16Values(nc, 1.0f, 11);
  const std::vector<float> dy = RandomBf16Values(nc, 1.0f, 12);
  DeviceBytes x_dev(nc * 2), dy_dev(nc * 2), out_dev(nc * 2), dx_dev(nc * 2),
      saved(gpu->SavedBytes(true));
  UploadBf16(x_dev, x);
  UploadBf16(dy_dev, dy);
  const auto* xd = static_cast<const bf16*>(x_dev.data());
  const auto* dyd = static_cast<const bf16*>(dy_dev.data());

  // CPU: forward and full backward.
  std::vector<float> cpu_saved(static_cast<std::size_t>(cpu.SavedBytes(true) / 4));
  std::vector<float> cpu_out(static_cast<std::size_t>(nc)), cpu_dx(static_cast<std::size_t>(nc));
  cpu.Forward(nullptr, nullptr, x.data(), cpu_out.data(),
              reinterpret_cast<std::byte*>(cpu_saved.data()));
  cpu.Backward(dy.data(), cpu_dx.data(), reinterpret_cast<std::byte*>(cpu_saved.data()),
               /*with_weight_grad=*/true, 0.0f);

  PO_MODEL_TEST_OK(gpu->Forward(nullptr, nullptr, xd, static_cast<bf16*>(out_dev.data()),
                                saved.bytes_ptr(), nullptr));
  const std::vector<float> out = DownloadBf16(out_dev.data(), nc);
  const double out_error = RelativeError(out, cpu_out);
  Report(tag, "forward output", out_error, kOutputTolerance);
  CHECK(out_error <= kOutputTolerance);

  PO_MODEL_TEST_OK(gpu->Backward(dyd, static_cast<bf16*>(dx_dev.data()), saved.bytes_ptr(),
                                 /*with_weight_grad=*/true, 0.0f, EntryLayout::kSaved));
  const std::vector<float> dx = DownloadBf16(dx_dev.data(), nc);
  const double dx_error = RelativeError(dx, cpu_dx);
  Report(tag, "input gradient", dx_error, kInputGradTolerance);
  CHECK(dx_error <= kInputGradTolerance);
  CompareParamGrads(tag, cpu, *gpu, stream);
  const std::vector<std::vector<float>> full_grads = AllGrads(*gpu, stream);

  SECTION("the forward is deterministic: a second run gives the same bits") {
    out_dev.Poison();
    saved.Poison();
    PO_MODEL_TEST_OK(gpu->Forward(nullptr, nullptr, xd, static_cast<bf16*>(out_dev.data()),
                                  saved.bytes_ptr(), nullptr));
    CHECK(BitwiseEqual(DownloadBf16(out_dev.data(), nc), out));
  }
  SECTION("split backward (B, then W from the saved region) equals the full backward bitwise") {
    PO_MODEL_TEST_OK(gpu->params().ZeroGrads(stream));
    saved.Poison();
    dx_dev.Poison();
    PO_MODEL_TEST_OK(gpu->Forward(nullptr, nullptr, xd, static_cast<bf16*>(out_dev.data()),
                                  saved.bytes_ptr(), nullptr));
    PO_MODEL_TEST_OK(gpu->Backward(dyd, static_cast<bf16*>(dx_dev.data()), saved.bytes_ptr(),
                                   /*with_weight_grad=*/false, 0.0f, EntryLayout::kSaved));
    // B alone leaves the weight gradients untouched.
    for (const std::vector<float>& grad : AllGrads(*gpu, stream)) {
      CHECK(BitwiseEqual(grad, std::vector<float>(grad.size(), 0.0f)));
    }
    CHECK(BitwiseEqual(DownloadBf16(dx_dev.data(), nc), dx));
    PO_MODEL_TEST_OK(gpu->BackwardWeight(saved.bytes_ptr()));
    const std::vector<std::vector<float>> split_grads = AllGrads(*gpu, stream);
    REQUIRE(split_grads.size() == full_grads.size());
    for (std::size_t t = 0; t < full_grads.size(); ++t) {
      INFO("tensor " << gpu->params().tensors()[t].spec.name);
      CHECK(BitwiseEqual(split_grads[t], full_grads[t]));
    }
  }
}

TEST_CASE("A whole one-chunk CUDA GPT matches the CPU model: loss and every gradient",
          "[gpt_cuda][gpt_cuda_layer]") {
  GptConfig config = SmallConfig();
  config.n_layer = 2;
  const bool lean = GENERATE(false, true);
  CAPTURE(lean);
  const char* const tag = lean ? "model lean" : "model";
  GptChunk cpu(config, 0, 1);
  RoundParamsToBf16(cpu);
  auto backend = testing::NewCudaBackend();
  cudaStream_t stream = ValueOrFail(CudaComputeStream(*backend));
  const LayerDims dims{config.batch_size, config.seq_len, config.n_embd, config.n_head, lean};
  auto context = ValueOrFail(GptCudaContext::Create(dims, 0, stream));
  auto gpu = ValueOrFail(GptCudaChunk::CreateGpt(config, 0, 1, *context));
  REQUIRE(gpu->is_first());
  REQUIRE(gpu->is_last());

  const int n = dims.N();
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(n)), targets(tokens.size());
  GptData::Synthetic().Microbatch(config.seed, 0, 0, config.batch_size, config.seq_len,
                                  tokens.data(), targets.data());
  DeviceBytes tokens_dev(n * 4), targets_dev(n * 4), losses_dev(n * 4),
      saved(gpu->SavedBytes(false));
  CopyToDevice(tokens_dev.data(), tokens.data(), n * 4);
  CopyToDevice(targets_dev.data(), targets.data(), n * 4);

  std::vector<float> cpu_saved(static_cast<std::size_t>(cpu.SavedBytes(false) / 4));
  const float dloss = 1.0f / static_cast<float>(n);
  const double cpu_loss = cpu.Forward(tokens.data(), targets.data(), nullptr, nullptr,
                                      reinterpret_cast<std::byte*>(cpu_saved.data()));
  cpu.Backward(nullptr, nullptr, reinterpret_cast<std::byte*>(cpu_saved.data()), true, dloss);

  PO_MODEL_TEST_OK(gpu->Forward(static_cast<const std::int32_t*>(tokens_dev.data()),
                                static_cast<const std::int32_t*>(targets_dev.data()), nullptr,
                                nullptr, saved.bytes_ptr(),
                                static_cast<float*>(losses_dev.data())));
  std::vector<float> losses(static_cast<std::size_t>(n));
  model_testing::CopyToHost(losses.data(), losses_dev.data(), n * 4);
  double gpu_loss = 0.0;
  for (float loss : losses) gpu_loss += loss;  // NaN propagates and fails below
  gpu_loss /= n;
  const double loss_error = std::abs(gpu_loss - cpu_loss) / cpu_loss;
  Report(tag, "mean loss (cpu " + std::to_string(cpu_loss) + ")", loss_error, kLossTolerance);
  CHECK(loss_error <= kLossTolerance);

  PO_MODEL_TEST_OK(
      gpu->Backward(nullptr, nullptr, saved.bytes_ptr(), true, dloss, EntryLayout::kSaved));
  CompareParamGrads(tag, cpu, *gpu, stream);
}

TEST_CASE("Layer stack shapes: sizes, FLOPs and errors", "[gpt_cuda][gpt_cuda_stack]") {
  LayerStackShape shape;
  shape.hidden = 4096;
  shape.heads = 32;
  shape.seq = 2048;
  shape.layers_per_chunk = 2;
  REQUIRE(CheckLayerStackShape(shape).ok());
  const double h = 4096.0, s = 2048.0;
  CHECK(shape.BoundaryBytes() == 2 * 4096 * 2048);
  CHECK(shape.ForwardFlops() == Catch::Approx(2.0 * (24.0 * h * h * s + 4.0 * s * s * h)));
  // 32 h + 16 + 4 NH bytes per token per layer, slots 256-byte aligned (these sizes already are).
  CHECK(shape.SavedBytes() == 2 * (32 * 4096 * 2048 + 16 * 2048 + 4 * 32 * 2048));
  auto bad = [](auto mutate) {
    LayerStackShape broken;
    mutate(broken);
    return CheckLayerStackShape(broken).code();
  };
  CHECK(bad([](LayerStackShape& x) { x.hidden = 100; }) == absl::StatusCode::kInvalidArgument);
  CHECK(bad([](LayerStackShape& x) { x.heads = 7; }) == absl::StatusCode::kInvalidArgument);
  CHECK(bad([](LayerStackShape& x) { x.heads = 128; }) == absl::StatusCode::kInvalidArgument);
  CHECK(bad([](LayerStackShape& x) { x.seq = 0; }) == absl::StatusCode::kInvalidArgument);
  CHECK(bad([](LayerStackShape& x) { x.seq = kMaxAttentionT + 8; }) ==
        absl::StatusCode::kInvalidArgument);  // the flash kernel's limit
  CHECK(bad([](LayerStackShape& x) { x.seq = 100; }) == absl::StatusCode::kInvalidArgument);
  CHECK(bad([](LayerStackShape& x) { x.layers_per_chunk = 0; }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(bad([](LayerStackShape& x) { x.chunks_per_stage = 0; }) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(bad([](LayerStackShape& x) { x.batch = 0; }) == absl::StatusCode::kInvalidArgument);
  auto backend = testing::NewCudaBackend();
  LayerStackShape too_big;
  too_big.heads = 3;
  CHECK(CreateCudaGptLayerStack(*backend, too_big).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload::gpt::cuda
