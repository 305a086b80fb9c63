// LlamaCudaModel (llama_cuda_model.h) against LlamaCpuModel on a tiny config, driven the way
// the sliding engine drives them (BeginStep; forwards ascending; per unit descending, a zeroed
// fp32 accumulator and every microbatch's Backward; StepLoss): the same tokens, the step's
// loss (1e-3 relative) and every unit's gradients, the tied head's borrowed part included
// (3e-2 norm-relative, 1.5e-1 element-wise against |want| + rms: bf16 activations through two
// layers and the head). Also the shape it reports, bitwise repeatability of a step, and its
// errors.
#include "examples/llama/cuda/llama_cuda_model.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "examples/llama/llama_cpu_model.h"
#include "examples/llama/llama_init.h"
#include "pipeoffload/cuda.h"
#include "tests/llama_cuda/llama_cuda_test_util.h"

namespace pipeoffload::llama::cuda::testing {
namespace {

constexpr int kB = 2, kT = 64, kM = 2;
constexpr std::int64_t kStep = 3;

LlamaConfig TinyConfig(bool qwen_like) {
  LlamaConfig config;
  config.name = qwen_like ? "tiny-qwen3-tied" : "tiny-llama";
  config.vocab_size = 256;
  config.hidden_size = 128;
  config.intermediate_size = 352;
  config.num_layers = 2;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_dim = 64;
  config.tie_word_embeddings = qwen_like;
  config.qk_norm = qwen_like;
  config.attention_bias = qwen_like;
  config.initializer_range = 0.08f;  // O(1) activations at H = 128: every branch matters
  return config;
}

std::unique_ptr<Backend> NewCudaBackend() {
  auto backend = CreateCudaBackend({0});
  INFO(backend.status().ToString());
  REQUIRE(backend.ok());
  return std::move(*backend);
}

// Every unit's parameters, bf16-rounded (own only; the tied head borrows unit 0's).
std::vector<std::vector<float>> Params(const LlamaConfig& config) {
  std::vector<std::vector<float>> params;
  for (int u = 0; u < NumUnits(config); ++u) {
    std::vector<float> p = InitUnitParams(config, u, 17);
    for (float& v : p) v = RoundBf16(v);
    params.push_back(std::move(p));
  }
  return params;
}

// The unit's view: own parameters, then the borrowed unit's.
std::vector<float> View(const SlidingModelShape& shape, const std::vector<std::vector<float>>& p,
                        int u) {
  std::vector<float> view = p[u];
  if (shape.units[u].borrowed_unit >= 0) {
    const std::vector<float>& b = p[shape.units[u].borrowed_unit];
    view.insert(view.end(), b.begin(), b.end());
  }
  return view;
}

struct StepResult {
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // per unit: own then borrowed
};

// One step on the CPU model, host buffers standing in for the engine's.
StepResult CpuStep(LlamaCpuModel& model, const std::vector<std::vector<float>>& p) {
  const SlidingModelShape& shape = model.Shape();
  const int U = static_cast<int>(shape.units.size());
  const std::int64_t act = shape.activation_bytes / 4;
  std::int64_t ws_floats = 0;
  for (const SlidingUnitShape& u : shape.units)
    ws_floats = std::max(ws_floats, u.workspace_bytes / 4);
  std::vector<float> ws(static_cast<std::size_t>(ws_floats + 1));
  // acts[u][mb]: unit u's input; grads_in[u][mb]: its gradient.
  std::vector<std::vector<std::vector<float>>> acts(U + 1), dacts(U + 1);
  for (auto* grid : {&acts, &dacts}) {
    for (auto& per_unit : *grid) per_unit.assign(kM, std::vector<float>(act));
  }
  REQUIRE(model.BeginStep(kStep, kM).ok());
  for (int u = 0; u + 1 < U; ++u) {
    const std::vector<float> view = View(shape, p, u);
    for (int mb = 0; mb < kM; ++mb) {
      UnitCall call{
          u, mb, kM, view.data(), u > 0 ? acts[u][mb].data() : nullptr, acts[u + 1][mb].data()};
      call.workspace = ws.data();
      const absl::Status status = model.Forward(call);
      INFO(status.ToString());
      REQUIRE(status.ok());
    }
  }
  StepResult result;
  result.grads.resize(U);
  for (int u = U - 1; u >= 0; --u) {
    const std::vector<float> view = View(shape, p, u);
    result.grads[u].assign(view.size(), 0.0f);
    for (int mb = 0; mb < kM; ++mb) {
      UnitCall call{u, mb, kM, view.data(), u > 0 ? acts[u][mb].data() : nullptr, nullptr};
      call.grad_output = u + 1 < U ? dacts[u + 1][mb].data() : nullptr;
      call.grad_input = u > 0 ? dacts[u][mb].data() : nullptr;
      call.grad_accum = result.grads[u].data();
      call.workspace = ws.data();
      const absl::Status status = model.Backward(call);
      INFO(status.ToString());
      REQUIRE(status.ok());
    }
  }
  auto loss = model.StepLoss();
  REQUIRE(loss.ok());
  result.loss = *loss;
  return result;
}

// The same step on the GPU model, device buffers standing in for the engine's.
StepResult GpuStep(LlamaCudaModel& model, const std::vector<std::vector<float>>& p) {
  const SlidingModelShape& shape = model.Shape();
  const int U = static_cast<int>(shape.units.size());
  const std::int64_t act = shape.activation_bytes / 2;
  std::int64_t ws_bytes = 1;
  for (const SlidingUnitShape& u : shape.units) ws_bytes = std::max(ws_bytes, u.workspace_bytes);
  DeviceArray<unsigned char> ws(ws_bytes);
  ws.Poison();
  std::vector<std::unique_ptr<DeviceArray<bf16>>> acts, dacts;  // [(u) * kM + mb]
  for (int i = 0; i < (U + 1) * kM; ++i) {
    acts.push_back(std::make_unique<DeviceArray<bf16>>(act));
    dacts.push_back(std::make_unique<DeviceArray<bf16>>(act));
    acts.back()->Poison();
    dacts.back()->Poison();
  }
  auto slot = [](std::vector<std::unique_ptr<DeviceArray<bf16>>>& grid, int u, int mb) {
    return grid[static_cast<std::size_t>(u * kM + mb)]->data();
  };
  std::vector<std::unique_ptr<DeviceArray<bf16>>> views;
  for (int u = 0; u < U; ++u) {
    const std::vector<float> view = View(shape, p, u);
    views.push_back(std::make_unique<DeviceArray<bf16>>(static_cast<std::int64_t>(view.size())));
    views.back()->Upload(ToBf16(view));
  }
  REQUIRE(model.BeginStep(kStep, kM).ok());
  for (int u = 0; u + 1 < U; ++u) {
    for (int mb = 0; mb < kM; ++mb) {
      UnitCall call{
          u, mb, kM, views[u]->data(), u > 0 ? slot(acts, u, mb) : nullptr, slot(acts, u + 1, mb)};
      call.workspace = ws.data();
      const absl::Status status = model.Forward(call);
      INFO(status.ToString());
      REQUIRE(status.ok());
    }
  }
  StepResult result;
  result.grads.resize(U);
  for (int u = U - 1; u >= 0; --u) {
    DeviceArray<float> accum(views[u]->count());
    PO_TEST_CUDA(cudaMemset(accum.data(), 0, accum.bytes()));
    PO_TEST_CUDA(cudaDeviceSynchronize());
    for (int mb = 0; mb < kM; ++mb) {
      UnitCall call{u, mb, kM, views[u]->data(), u > 0 ? slot(acts, u, mb) : nullptr, nullptr};
      call.grad_output = u + 1 < U ? slot(dacts, u + 1, mb) : nullptr;
      call.grad_input = u > 0 ? slot(dacts, u, mb) : nullptr;
      call.grad_accum = accum.data();
      call.workspace = ws.data();
      const absl::Status status = model.Backward(call);
      INFO(status.ToString());
      REQUIRE(status.ok());
    }
    result.grads[u] = accum.Download();
  }
  auto loss = model.StepLoss();
  INFO(loss.status().ToString());
  REQUIRE(loss.ok());
  result.loss = *loss;
  return result;
}

TEST_CASE("LlamaCudaModel's step matches LlamaCpuModel's: tokens, loss, every gradient",
          "[llama_cuda][model]") {
  const bool qwen_like = GENERATE(false, true);
  const LlamaConfig config = TinyConfig(qwen_like);
  CAPTURE(config.name);
  std::printf("model step, %s\n", config.name.c_str());
  const TokenData data = TokenData::Synthetic();
  auto backend = NewCudaBackend();
  LlamaCpuModelOptions cpu_options;
  cpu_options.batch_size = kB;
  cpu_options.seq_len = kT;
  cpu_options.max_microbatches = kM;
  cpu_options.data_seed = 9;
  auto cpu = ValueOrFail(LlamaCpuModel::Create(config, data, cpu_options));
  LlamaCudaModelOptions gpu_options;
  gpu_options.batch_size = kB;
  gpu_options.seq_len = kT;
  gpu_options.max_microbatches = kM;
  gpu_options.data_seed = 9;
  gpu_options.ce_chunk_rows = 48;  // several chunks, the last one short
  auto gpu = ValueOrFail(LlamaCudaModel::Create(*backend, config, data, gpu_options));
  const std::vector<std::vector<float>> params = Params(config);

  const StepResult want = CpuStep(*cpu, params);
  const StepResult got = GpuStep(*gpu, params);
  const int N = kB * kT;
  for (int mb = 0; mb < kM; ++mb) {
    CHECK(std::vector<std::int32_t>(gpu->tokens(mb), gpu->tokens(mb) + N) ==
          std::vector<std::int32_t>(cpu->tokens(mb), cpu->tokens(mb) + N));
    CHECK(std::vector<std::int32_t>(gpu->targets(mb), gpu->targets(mb) + N) ==
          std::vector<std::int32_t>(cpu->targets(mb), cpu->targets(mb) + N));
  }
  std::printf("  loss: got %.9g want %.9g (rel %.3e, tol 1e-3)\n", got.loss, want.loss,
              std::fabs(got.loss - want.loss) / want.loss);
  CHECK(std::fabs(got.loss - want.loss) <= 1e-3 * std::fabs(want.loss));
  const SlidingModelShape& shape = gpu->Shape();
  for (int u = 0; u < NumUnits(config); ++u) {
    REQUIRE(got.grads[u].size() == want.grads[u].size());
    for (const LlamaTensor& t : UnitTensors(config, u)) {
      auto at = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + t.offset, v.begin() + t.offset + t.numel());
      };
      ExpectClose("d " + t.hf_name, at(got.grads[u]), at(want.grads[u]), 3e-2, 1.5e-1);
    }
    if (shape.units[u].borrowed_unit >= 0) {
      const std::int64_t own = shape.units[u].param_count;
      ExpectClose("d head's borrowed embedding",
                  std::vector<float>(got.grads[u].begin() + own, got.grads[u].end()),
                  std::vector<float>(want.grads[u].begin() + own, want.grads[u].end()), 3e-2,
                  1.5e-1);
    }
  }
  // The same step again: the same bits (what the engine's "two budgets, same bits" rests on).
  const StepResult again = GpuStep(*gpu, params);
  CHECK(again.loss == got.loss);
  for (int u = 0; u < NumUnits(config); ++u)
    CHECK(BitMismatches(again.grads[u], got.grads[u]) == 0);
}

TEST_CASE("LlamaCudaModel reports the shape the engine plans with", "[llama_cuda][model]") {
  const LlamaConfig config = TinyConfig(true);
  const TokenData data = TokenData::Synthetic();
  auto backend = NewCudaBackend();
  LlamaCudaModelOptions options;
  options.batch_size = kB;
  options.seq_len = kT;
  options.max_microbatches = 3;
  auto model = ValueOrFail(LlamaCudaModel::Create(*backend, config, data, options));
  const SlidingModelShape& shape = model->Shape();
  CHECK(ValidateSlidingModelShape(shape).ok());
  CHECK(shape.param_dtype == SlideDtype::kBf16);
  CHECK(shape.activation_bytes == std::int64_t{kB} * kT * config.hidden_size * 2);
  const std::vector<SlidingUnitShape> units = LlamaUnitShapes(config);
  REQUIRE(shape.units.size() == units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    CHECK(shape.units[u].name == units[u].name);
    CHECK(shape.units[u].param_count == units[u].param_count);
    CHECK(shape.units[u].borrowed_unit == units[u].borrowed_unit);
    CHECK(shape.units[u].decay == units[u].decay);
  }
  CHECK(shape.units[0].workspace_bytes == 0);
  CHECK(shape.units[1].workspace_bytes == model->units().DecoderWorkspaceBytes());
  CHECK(shape.units.back().workspace_bytes == model->units().HeadWorkspaceBytes());
  // Tokens, targets and row index of 3 microbatches (ints, 256-byte rows), 3 loss sums, plus the
  // units' Linear workspace and RoPE table.
  const std::int64_t N = kB * kT;
  const std::int64_t ints = (2 * N + 3 * N + 1 + 63) / 64 * 64;
  CHECK(shape.model_device_bytes == 3 * ints * 4 + 3 * 8 + model->units().device_bytes());
}

TEST_CASE("LlamaCudaModel's errors name what is wrong", "[llama_cuda][model]") {
  const LlamaConfig config = TinyConfig(false);
  const TokenData data = TokenData::Synthetic();
  auto backend = NewCudaBackend();
  LlamaCudaModelOptions options;
  options.batch_size = 1;
  options.seq_len = 16;
  auto model = ValueOrFail(LlamaCudaModel::Create(*backend, config, data, options));
  DeviceArray<bf16> buf(1 << 16);
  UnitCall call{0, 0, 1, buf.data(), nullptr, buf.data()};
  CHECK(model->Forward(call).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(model->BeginStep(0, 2).code() == absl::StatusCode::kInvalidArgument);
  CHECK(model->BeginStep(-1, 1).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(model->BeginStep(0, 1).ok());
  call.unit = HeadUnit(config);
  CHECK(model->Forward(call).code() == absl::StatusCode::kInvalidArgument);
  call.unit = 0;
  call.num_microbatches = 2;
  CHECK(model->Forward(call).code() == absl::StatusCode::kInvalidArgument);
  auto loss = model->StepLoss();
  CHECK(loss.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(loss.status().message().find("mb 0") != std::string::npos);

  auto cpu_backend = ValueOrFail(CreateCpuBackend());
  CHECK(LlamaCudaModel::Create(*cpu_backend, config, data, options).status().code() ==
        absl::StatusCode::kInvalidArgument);
  LlamaConfig hd32 = config;
  hd32.head_dim = 32;
  hd32.num_heads = 4;
  hd32.num_kv_heads = 2;
  CHECK(LlamaCudaModel::Create(*backend, hd32, data, options).status().code() ==
        absl::StatusCode::kInvalidArgument);
  options.max_microbatches = 0;
  CHECK(LlamaCudaModel::Create(*backend, config, data, options).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipeoffload::llama::cuda::testing
