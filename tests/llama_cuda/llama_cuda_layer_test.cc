// The Llama units on the GPU (llama_cuda_layer.h) against the CPU units (llama_layer_cpu.h) on
// the same bf16-rounded parameters and inputs: the decoder's forward and backward (GQA, MHA at
// hd 128, qk_norm, attention_bias), input gradient and every parameter tensor's gradient, and
// the head's loss and gradients chunked and materialised. Workspaces and outputs are poisoned;
// accumulators start non-zero (half the CPU's gradient), so "+=" is what is checked; every
// backward runs twice from the same state and must give the same bits.
// Tolerances (ExpectClose: norm-relative, element-wise against |want| + rms), for bf16
// activations through ~10 roundings of 2^-9 each, fp32 accumulation everywhere:
//   decoder out 1e-2 / 5e-2, dx 2e-2 / 1e-1, parameter gradients 3e-2 / 1.5e-1;
//   head loss 1e-3 relative, dx and gradients 2e-2 / 1e-1.
#include "examples/llama/cuda/llama_cuda_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "examples/llama/llama_config.h"
#include "examples/llama/llama_layer_cpu.h"
#include "tests/llama_cuda/llama_cuda_test_util.h"

namespace pipeoffload::llama::cuda::testing {
namespace {

struct UnitsCase {
  const char* name;
  int H, NH, NKV, hd, F;
  bool qk_norm, bias;
};

LlamaConfig CaseConfig(const UnitsCase& c, int V) {
  LlamaConfig config;
  config.name = c.name;
  config.vocab_size = V;
  config.hidden_size = c.H;
  config.intermediate_size = c.F;
  config.num_layers = 1;
  config.num_heads = c.NH;
  config.num_kv_heads = c.NKV;
  config.head_dim = c.hd;
  config.rope_theta = 10000.0f;
  config.qk_norm = c.qk_norm;
  config.attention_bias = c.bias;
  return config;
}

// A unit's parameters at unit scale, bf16-rounded: norms 1 + N(0, 0.1), biases N(0, 0.1),
// matrices N(0, 1 / sqrt(fan_in)) (so activations stay O(1) and every branch matters).
std::vector<float> UnitScaleParams(const LlamaConfig& config, int unit, std::uint64_t seed) {
  std::vector<float> params(UnitParamCount(config, unit));
  std::uint64_t s = seed;
  for (const LlamaTensor& t : UnitTensors(config, unit)) {
    const float stddev = t.is_norm || t.cols == 1 ? 0.1f : 1.0f / std::sqrt(float(t.cols));
    const std::vector<float> v = NormalBf16(t.numel(), stddev, ++s, t.is_norm ? 1.0f : 0.0f);
    std::copy(v.begin(), v.end(), params.begin() + t.offset);
  }
  return params;
}

// Per tensor of `unit`, got[t] against want[t] (the accumulators minus their start).
void CompareGrads(const LlamaConfig& config, int unit, const std::vector<float>& got,
                  const std::vector<float>& want, std::int64_t shift, double norm_tol,
                  double elem_tol) {
  for (const LlamaTensor& t : UnitTensors(config, unit)) {
    const auto at = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + shift + t.offset,
                                v.begin() + shift + t.offset + t.numel());
    };
    ExpectClose("d " + t.hf_name, at(got), at(want), norm_tol, elem_tol);
  }
}

std::vector<float> Minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}

std::vector<float> Half(const std::vector<float>& a) {
  std::vector<float> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = 0.5f * a[i];
  return out;
}

TEST_CASE("The GPU decoder unit matches the CPU's forward and backward",
          "[llama_cuda][units][decoder]") {
  const UnitsCase c = GENERATE(UnitsCase{"gqa", 256, 4, 2, 64, 344, false, false},
                               UnitsCase{"mha-hd128", 256, 2, 2, 128, 352, false, false},
                               UnitsCase{"qk_norm", 256, 4, 1, 64, 344, true, false},
                               UnitsCase{"bias+qk_norm", 128, 2, 1, 64, 176, true, true},
                               UnitsCase{"attention_bias", 256, 4, 2, 64, 344, false, true});
  CAPTURE(c.name);
  std::printf("decoder unit %s\n", c.name);
  const LlamaConfig config = CaseConfig(c, 256);
  const int B = 2, T = 48, N = B * T, H = c.H;
  const int unit = LayerUnit(0);
  const std::vector<float> params = UnitScaleParams(config, unit, 100);
  const std::vector<float> x = NormalBf16(std::int64_t{N} * H, 1.0f, 101);
  const std::vector<float> dout = NormalBf16(std::int64_t{N} * H, 1.0f, 102);

  LlamaCpuUnits cpu(config, B, T, N);
  std::vector<float> ws(cpu.DecoderWorkspaceFloats());
  std::vector<float> want_out(std::int64_t{N} * H), want_dx(std::int64_t{N} * H);
  std::vector<float> want_grads(params.size(), 0.0f);
  cpu.DecoderForward(params.data(), x.data(), want_out.data(), ws.data());
  cpu.DecoderBackward(params.data(), x.data(), dout.data(), want_dx.data(), want_grads.data(),
                      ws.data());

  TestStream stream;
  auto units = ValueOrFail(LlamaCudaUnits::Create(config, B, T, 0, 0, stream.get()));
  DeviceArray<bf16> d_params(static_cast<std::int64_t>(params.size()));
  DeviceArray<bf16> d_x(std::int64_t{N} * H), d_dout(std::int64_t{N} * H);
  DeviceArray<bf16> d_out(std::int64_t{N} * H), d_dx(std::int64_t{N} * H);
  DeviceArray<float> d_grads(static_cast<std::int64_t>(params.size()));
  DeviceArray<unsigned char> d_ws(units->DecoderWorkspaceBytes());
  d_params.Upload(ToBf16(params));
  d_x.Upload(ToBf16(x));
  d_dout.Upload(ToBf16(dout));
  d_out.Poison();
  d_ws.Poison();
  PO_TEST_OK(units->DecoderForward(d_params.data(), d_x.data(), d_out.data(), d_ws.data()));
  const std::vector<bf16> out = d_out.Download();
  ExpectClose("decoder out", ToFloat(out), want_out, 1e-2, 5e-2);

  const std::vector<float> grads0 = Half(want_grads);
  std::vector<float> grads[2];
  std::vector<bf16> dx[2];
  for (int run = 0; run < 2; ++run) {
    d_grads.Upload(grads0);
    d_dx.Poison();
    d_ws.Poison();
    PO_TEST_OK(units->DecoderBackward(d_params.data(), d_x.data(), d_dout.data(), d_dx.data(),
                                      d_grads.data(), d_ws.data()));
    grads[run] = d_grads.Download();
    dx[run] = d_dx.Download();
  }
  ExpectClose("decoder dx", ToFloat(dx[0]), want_dx, 2e-2, 1e-1);
  CompareGrads(config, unit, Minus(grads[0], grads0), want_grads, 0, 3e-2, 1.5e-1);
  CHECK(BitMismatches(dx[0], dx[1]) == 0);
  CHECK(BitMismatches(grads[0], grads[1]) == 0);
  // Forward again after the backward: the same bits (nothing depends on the workspace's past).
  d_out.Poison();
  PO_TEST_OK(units->DecoderForward(d_params.data(), d_x.data(), d_out.data(), d_ws.data()));
  CHECK(BitMismatches(out, d_out.Download()) == 0);

  // dx may alias dout.
  d_grads.Upload(grads0);
  PO_TEST_OK(units->DecoderBackward(d_params.data(), d_x.data(), d_dout.data(), d_dout.data(),
                                    d_grads.data(), d_ws.data()));
  CHECK(BitMismatches(d_dout.Download(), dx[0]) == 0);
  CHECK(BitMismatches(d_grads.Download(), grads[0]) == 0);
}

TEST_CASE("The GPU head unit matches the CPU's loss and gradients, chunked or not",
          "[llama_cuda][units][head]") {
  const int ce_chunk_rows = GENERATE(0, 40, 96);
  CAPTURE(ce_chunk_rows);
  std::printf("head unit, ce_chunk_rows %d\n", ce_chunk_rows);
  const LlamaConfig config = CaseConfig({"head", 256, 4, 2, 64, 344, false, false}, 512);
  const int B = 2, T = 48, N = B * T, H = config.hidden_size, V = config.vocab_size;
  const int unit = HeadUnit(config);
  const std::vector<float> params = UnitScaleParams(config, unit, 200);
  const std::vector<float> x = NormalBf16(std::int64_t{N} * H, 1.0f, 201);
  std::vector<std::int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 131 + 7) % V;
  const float grad_scale = 1.0f / (2.0f * N);  // as if the step had two microbatches

  LlamaCpuUnits cpu(config, B, T, 40);
  std::vector<float> ws(cpu.HeadWorkspaceFloats());
  std::vector<float> want_dx(std::int64_t{N} * H), want_grads(params.size(), 0.0f);
  const double want_loss = cpu.HeadLossBackward(params.data(), x.data(), targets.data(), grad_scale,
                                                want_dx.data(), want_grads.data(), ws.data());

  TestStream stream;
  auto units = ValueOrFail(LlamaCudaUnits::Create(config, B, T, ce_chunk_rows, 0, stream.get()));
  if (ce_chunk_rows == 0) CHECK(units->ce_chunk_rows() == N);  // the chunk fits the decoder's
  CHECK(units->HeadWorkspaceBytes() >=
        std::int64_t{units->ce_chunk_rows()} * V * 2 + 2 * std::int64_t{N} * H * 2);
  DeviceArray<bf16> d_params(static_cast<std::int64_t>(params.size()));
  DeviceArray<bf16> d_x(std::int64_t{N} * H), d_dx(std::int64_t{N} * H);
  DeviceArray<float> d_grads(static_cast<std::int64_t>(params.size()));
  DeviceArray<std::int32_t> d_targets(N);
  DeviceArray<double> d_loss(1);
  DeviceArray<unsigned char> d_ws(units->HeadWorkspaceBytes());
  d_params.Upload(ToBf16(params));
  d_x.Upload(ToBf16(x));
  d_targets.Upload(targets);
  const std::vector<float> grads0 = Half(want_grads);
  std::vector<float> grads[2];
  std::vector<bf16> dx[2];
  double loss[2] = {0.0, 0.0};
  for (int run = 0; run < 2; ++run) {
    d_grads.Upload(grads0);
    d_dx.Poison();
    d_ws.Poison();
    d_loss.Poison();
    PO_TEST_OK(units->HeadLossBackward(d_params.data(), d_x.data(), d_targets.data(), grad_scale,
                                       d_dx.data(), d_grads.data(), d_loss.data(), d_ws.data()));
    grads[run] = d_grads.Download();
    dx[run] = d_dx.Download();
    loss[run] = d_loss.Download()[0];
  }
  std::printf("  loss sum: got %.9g want %.9g (rel %.3e, tol 1e-3)\n", loss[0], want_loss,
              std::fabs(loss[0] - want_loss) / std::fabs(want_loss));
  CHECK(std::fabs(loss[0] - want_loss) <= 1e-3 * std::fabs(want_loss));
  ExpectClose("head dx", ToFloat(dx[0]), want_dx, 2e-2, 1e-1);
  CompareGrads(config, unit, Minus(grads[0], grads0), want_grads, 0, 2e-2, 1e-1);
  CHECK(loss[0] == loss[1]);
  CHECK(BitMismatches(dx[0], dx[1]) == 0);
  CHECK(BitMismatches(grads[0], grads[1]) == 0);
}

TEST_CASE("LlamaCudaUnits rejects configs its kernels do not take", "[llama_cuda][units]") {
  TestStream stream;
  LlamaConfig config = CaseConfig({"bad", 128, 2, 1, 64, 176, false, false}, 256);
  config.head_dim = 32;
  config.hidden_size = 64;
  auto hd32 = LlamaCudaUnits::Create(config, 1, 8, 0, 0, stream.get());
  CHECK(hd32.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(hd32.status().message().find("head_dim") != std::string::npos);
  config = CaseConfig({"bad", 128, 2, 1, 64, 180, false, false}, 256);
  auto f180 = LlamaCudaUnits::Create(config, 1, 8, 0, 0, stream.get());
  CHECK(f180.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(f180.status().message().find("intermediate_size") != std::string::npos);
  config = CaseConfig({"ok", 128, 2, 1, 64, 176, false, false}, 256);
  CHECK(LlamaCudaUnits::Create(config, 1, 8, 9, 0, stream.get()).status().code() ==
        absl::StatusCode::kInvalidArgument);  // ce_chunk_rows > N
}

}  // namespace
}  // namespace pipeoffload::llama::cuda::testing
