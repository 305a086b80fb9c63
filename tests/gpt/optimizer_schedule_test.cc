// The GPT trainers' learning-rate schedule, global-norm clipping and init scale
// (examples/gpt/optimizer_schedule.h, gpt_config.cc):
//  - LearningRateAt's warm-up, cosine and floor, value by value;
//  - the global norm is independent of the order the stages' sums arrive in, and incomplete
//    sums are errors;
//  - a clip that triggers changes the step exactly as "every gradient times min(1, c / norm)"
//    says: bitwise the step of the same gradients scaled by hand;
//  - GPT-2 init: residual projections at 0.02 / sqrt(2 L), other matrices 0.02 (sampled std
//    within a tolerance), and the first loss at C 256 within 0.1 of ln V.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "examples/gpt/gpt_stage_model.h"
#include "examples/gpt/optimizer_schedule.h"
#include "examples/gpt/reference_trainer.h"
#include "tests/gpt/test_models.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

TEST_CASE("learning rate: linear warm-up, half-cosine decay, then the floor", "[gpt][schedule]") {
  AdamWConfig config;
  config.learning_rate = 1e-3f;
  config.warmup_steps = 4;
  config.decay_steps = 10;
  config.min_learning_rate = 1e-4f;
  const double lr = config.learning_rate;
  const double min = config.min_learning_rate;
  for (std::int64_t t = 1; t <= 4; ++t) {
    CAPTURE(t);
    CHECK(LearningRateAt(config, t) == static_cast<float>(lr * static_cast<double>(t) / 4.0));
  }
  CHECK(LearningRateAt(config, 4) == config.learning_rate);  // the peak is the flag's value
  // Update 7 is halfway from the warm-up's end (4) to the decay's (10): the midpoint.
  CHECK(LearningRateAt(config, 7) == static_cast<float>(min + (lr - min) * 0.5));
  CHECK(LearningRateAt(config, 5) ==
        static_cast<float>(min + (lr - min) * 0.5 * (1.0 + std::cos(std::numbers::pi / 6.0))));
  CHECK(LearningRateAt(config, 10) == config.min_learning_rate);
  CHECK(LearningRateAt(config, 1000) == config.min_learning_rate);
  // Falls monotonically after the warm-up.
  for (std::int64_t t = 5; t <= 10; ++t) {
    CHECK(LearningRateAt(config, t) < LearningRateAt(config, t - 1));
  }

  AdamWConfig constant;
  constant.learning_rate = 3e-4f;
  for (std::int64_t t : {1, 2, 500}) CHECK(LearningRateAt(constant, t) == 3e-4f);
  CHECK(DescribeLearningRate(constant) == "constant 0.0003");
  CHECK(DescribeLearningRate(config) == "warm-up 4 steps to 0.001, cosine to 0.0001 at step 10");
  AdamWConfig warm_only = constant;
  warm_only.warmup_steps = 2;
  CHECK(LearningRateAt(warm_only, 1) == static_cast<float>(static_cast<double>(3e-4f) / 2.0));
  CHECK(LearningRateAt(warm_only, 3) == 3e-4f);
}

TEST_CASE("global norm: any order of the stages' sums, every tensor exactly once",
          "[gpt][schedule]") {
  std::vector<TensorSquareSum> sums = {{0, 1e-3}, {1, 2.5}, {2, 1e9}, {3, 3.25}, {4, 1e-12}};
  double total = 0.0;
  for (const TensorSquareSum& s : sums) total += s.sum;  // id order
  const double want = std::sqrt(total);
  auto shuffled = sums;
  std::reverse(shuffled.begin(), shuffled.end());
  std::swap(shuffled[1], shuffled[3]);
  auto a = CombineSquareSums(sums, 5);
  auto b = CombineSquareSums(shuffled, 5);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(std::memcmp(&*a, &want, sizeof(want)) == 0);
  CHECK(std::memcmp(&*b, &want, sizeof(want)) == 0);

  auto missing = CombineSquareSums({{0, 1.0}, {2, 1.0}}, 3);
  CHECK(missing.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(missing.status().message()).find("needs the sums of 3 tensors, got 2") !=
        std::string::npos);
  auto repeated = CombineSquareSums({{0, 1.0}, {0, 1.0}, {2, 1.0}}, 3);
  CHECK(repeated.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(repeated.status().message()).find("tensor id 1 is missing or repeated") !=
        std::string::npos);
}

TEST_CASE("clip scale: min(1, clip / norm); off at 0; a non-finite norm is an error",
          "[gpt][schedule]") {
  CHECK(*ClipScale(4.0, 1.0f) == 0.25f);
  CHECK(*ClipScale(3.0, 1.0f) == static_cast<float>(1.0 / 3.0));
  CHECK(*ClipScale(0.5, 1.0f) == 1.0f);
  CHECK(*ClipScale(1.0, 1.0f) == 1.0f);
  CHECK(*ClipScale(1e30, 0.0f) == 1.0f);  // clipping off
  for (double bad : {std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    auto scale = ClipScale(bad, 1.0f);
    CHECK(scale.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(scale.status().message()).find("global gradient norm is") !=
          std::string::npos);
  }
}

// Every parameter (and with `grads` every gradient) of a single-stage model, in tensor order.
std::vector<float> Flatten(GptStageModel& model, bool grads) {
  std::vector<float> out;
  ParameterBlock& block = model.chunk(0).params();
  for (int i = 0; i < static_cast<int>(block.tensors().size()); ++i) {
    const float* x = grads ? block.grad(i) : block.param(i);
    out.insert(out.end(), x, x + block.tensors()[static_cast<std::size_t>(i)].spec.numel());
  }
  return out;
}

TEST_CASE("a clip that triggers scales every gradient by clip / norm before AdamW",
          "[gpt][schedule]") {
  const bool tied = GENERATE(false, true);
  CAPTURE(tied);
  GptConfig config = testing::PipelineConfig(3, tied);
  config.optimizer.clip_norm = 1e-3f;  // far below the gradients' norm: every step clips
  GptConfig unclipped = config;
  unclipped.optimizer.clip_norm = 0.0f;
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto clipped = ReferenceTrainer::Create(config, data);
  auto by_hand = ReferenceTrainer::Create(unclipped, data);
  auto plain = ReferenceTrainer::Create(unclipped, data);
  REQUIRE(clipped.ok());
  REQUIRE(by_hand.ok());
  REQUIRE(plain.ok());
  for (std::int64_t step = 0; step < 2; ++step) {
    CAPTURE(step);
    REQUIRE((*clipped)->TrainStep().ok());
    REQUIRE((*plain)->TrainStep().ok());
    CHECK(std::isnan((*plain)->last_grad_norm()));  // not computed without clipping

    // The same gradients, the norm summed here tensor by tensor, each scaled by hand.
    REQUIRE((*by_hand)->AccumulateGradients(step).ok());
    GptStageModel& model = (*by_hand)->model();
    ParameterBlock& block = model.chunk(0).params();
    // Final gradients: tied, the one stage holds both parts and sums them into both copies.
    REQUIRE(model.GradSquareSums().ok());
    double total = 0.0;
    for (int i = 0; i < static_cast<int>(block.tensors().size()); ++i) {
      const ParamTensor& tensor = block.tensors()[static_cast<std::size_t>(i)];
      if (tensor.mirror) continue;
      double sum = 0.0;
      for (std::int64_t k = 0; k < tensor.spec.numel(); ++k) {
        sum += static_cast<double>(block.grad(i)[k]) * static_cast<double>(block.grad(i)[k]);
      }
      total += sum;
    }
    const double norm = std::sqrt(total);
    const double trainer_norm = (*clipped)->last_grad_norm();
    CHECK(std::memcmp(&norm, &trainer_norm, sizeof(norm)) == 0);
    REQUIRE(norm > 10 * config.optimizer.clip_norm);
    const float scale = static_cast<float>(static_cast<double>(config.optimizer.clip_norm) / norm);
    for (int i = 0; i < static_cast<int>(block.tensors().size()); ++i) {
      float* g = block.grad(i);
      for (std::int64_t k = 0; k < block.tensors()[static_cast<std::size_t>(i)].spec.numel(); ++k) {
        g[k] *= scale;
      }
    }
    REQUIRE(model.OptimizerStep().ok());
    const std::vector<float> want = Flatten(model, false);
    const std::vector<float> got = Flatten((*clipped)->model(), false);
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
  // Clipping changed the training: gradients ~1e-3 / sqrt(n) meet Adam's epsilon (1e-8).
  auto a = (*clipped)->Checksum();
  auto b = (*plain)->Checksum();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a != *b);
}

// The sample standard deviation of n floats.
double SampleStd(const float* x, std::int64_t n) {
  double mean = 0.0;
  for (std::int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  double var = 0.0;
  for (std::int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  return std::sqrt(var / static_cast<double>(n - 1));
}

TEST_CASE("GPT-2 init: residual projections at 0.02 / sqrt(2 L), first loss near ln V",
          "[gpt][schedule]") {
  GptConfig config;
  config.n_embd = 256;
  config.n_head = 4;
  config.n_layer = 6;
  config.seq_len = 32;
  config.batch_size = 2;
  config.num_microbatches = 2;
  auto data = std::make_shared<const GptData>(GptData::Synthetic());
  auto trainer = ReferenceTrainer::Create(config, data);
  REQUIRE(trainer.ok());
  const ParameterBlock& block = (*trainer)->model().chunk(0).params();
  const double residual = 0.02 / std::sqrt(2.0 * config.n_layer);
  int residual_tensors = 0;
  for (int i = 0; i < static_cast<int>(block.tensors().size()); ++i) {
    const ParamTensor& tensor = block.tensors()[static_cast<std::size_t>(i)];
    CAPTURE(tensor.spec.name);
    const std::int64_t n = tensor.spec.numel();
    const float* x = block.param(i);
    switch (tensor.spec.kind) {
      case TensorKind::kAttnProjWeight:
      case TensorKind::kFcProjWeight:
        ++residual_tensors;
        // n >= 65536 draws: the sampled std is within 1% of the true one (about 3.6 sigma).
        CHECK(SampleStd(x, n) == Catch::Approx(residual).epsilon(0.01));
        break;
      case TensorKind::kTokenEmbedding:
      case TensorKind::kQkvWeight:
      case TensorKind::kFcWeight:
      case TensorKind::kHeadWeight:
        CHECK(SampleStd(x, n) == Catch::Approx(0.02).epsilon(0.01));
        break;
      case TensorKind::kPositionEmbedding:
        CHECK(SampleStd(x, n) == Catch::Approx(0.01).epsilon(0.02));
        break;
      case TensorKind::kLn1Weight:
      case TensorKind::kLn2Weight:
      case TensorKind::kLnfWeight:
        CHECK(std::count(x, x + n, 1.0f) == n);
        break;
      default:  // biases
        CHECK(std::count(x, x + n, 0.0f) == n);
        break;
    }
  }
  CHECK(residual_tensors == 2 * config.n_layer);
  // Logits start at about N(0, (0.02 sqrt(C))^2) = N(0, 0.32^2): the loss is ln V plus about
  // half their variance (0.05).
  auto losses = (*trainer)->AccumulateGradients(0);
  REQUIRE(losses.ok());
  for (double loss : *losses) CHECK(std::abs(loss - std::log(256.0)) < 0.1);
}

}  // namespace
}  // namespace pipeoffload::gpt
