// Whole-model finite-difference check: the gradient the reference trainer accumulates over m
// microbatches equals the numeric gradient of the step objective (mean over microbatches of the
// mean token loss), element by element, for every parameter, tied and untied.
#include <cstring>
#include <string>
#include <vector>

#include "examples/gpt/gpt_chunk.h"
#include "examples/gpt/reference_trainer.h"
#include "tests/gpt/grad_check.h"
#include "tests/gpt/test_models.h"
#include "tests/testing/catch.h"

namespace pipeoffload::gpt {
namespace {

using Catch::Approx;  // Catch2 v3 has no global Approx

using testing::ExpectGradientsClose;
using testing::NumericGradient;

TEST_CASE("whole-model gradients match finite differences", "[gpt][model]") {
  const bool tied = GENERATE(false, true);
  CAPTURE(tied);
  const GptConfig config = testing::TinyConfig(tied);
  auto data = testing::SmallVocabData(config.vocab_size);
  auto trainer_or = ReferenceTrainer::Create(config, data);
  REQUIRE(trainer_or.ok());
  ReferenceTrainer& trainer = **trainer_or;
  GptStageModel& model = trainer.model();
  ParameterBlock& params = model.chunk(0).params();

  const int mirror = tied ? params.Find(kTokenEmbeddingId, /*mirror=*/true) : -1;
  const int wte = params.Find(kTokenEmbeddingId, /*mirror=*/false);
  // Move off the init point, where every LN weight is 1 and every bias 0 (a gradient routed to the
  // wrong LN or bias would go unnoticed there), and make gradients larger than float noise.
  {
    const std::vector<float> noise = testing::RandomVector(params.numel(), 5, 0.1f);
    for (std::int64_t i = 0; i < params.numel(); ++i) params.param(0)[i] += noise[i];
  }
  const std::int64_t step = 0;
  auto sync_mirror = [&] {
    if (tied) {  // one tensor, two copies: keep the head's copy equal to wte
      std::memcpy(params.param(mirror), params.param(wte),
                  sizeof(float) * static_cast<std::size_t>(params.tensors()[wte].spec.numel()));
    }
  };
  sync_mirror();
  auto losses = trainer.AccumulateGradients(step);
  REQUIRE(losses.ok());
  const std::vector<float> grads(params.grad(0), params.grad(0) + params.numel());

  std::vector<float> saved(static_cast<std::size_t>(model.SavedBytes(0, false) / 4));
  // The objective the backward differentiates: mean over microbatches of mean token losses.
  auto objective = [&]() -> double {
    sync_mirror();
    double sum = 0.0;
    for (int mb = 0; mb < config.num_microbatches; ++mb) {
      REQUIRE(model.Forward(mb, 0, nullptr, nullptr, saved.data()).ok());
      sum += model.losses()[static_cast<std::size_t>(mb)];
    }
    return sum / config.num_microbatches;
  };

  for (int local = 0; local < static_cast<int>(params.tensors().size()); ++local) {
    const ParamTensor& tensor = params.tensors()[static_cast<std::size_t>(local)];
    if (tensor.mirror) continue;
    std::vector<float> analytic(grads.begin() + tensor.offset,
                                grads.begin() + tensor.offset + tensor.spec.numel());
    if (tied && local == wte) {  // d/d(wte) = embedding part + head part
      const ParamTensor& m = params.tensors()[static_cast<std::size_t>(mirror)];
      for (std::size_t i = 0; i < analytic.size(); ++i) analytic[i] += grads[m.offset + i];
    }
    // h = 1e-3: small against the residual stream's scale (LN makes larger steps nonlinear).
    // The objective is a float computation with ~1e-7 noise, i.e. ~5e-5 in a difference quotient
    // with this h: hence abs 1e-4. Routing a gradient to the wrong LN weight or dropping a
    // residual term fails dozens of tensors at these tolerances.
    const std::vector<double> numeric =
        NumericGradient(params.param(local), tensor.spec.numel(), 1e-3f, objective);
    ExpectGradientsClose(tensor.spec.name, analytic.data(), numeric, 1e-2, 1e-4);
  }
  // The objective evaluated at the unperturbed point is the mean of the losses returned.
  const double at_point = objective();
  CHECK(at_point == Approx(((*losses)[0] + (*losses)[1]) / 2).epsilon(1e-12));
}

}  // namespace
}  // namespace pipeoffload::gpt
