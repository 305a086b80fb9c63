// PlainTrainer: the non-sliding oracle of the layer-sliding engine. It drives a SlidingModel
// (fp32 parameters) with every unit's parameters, Adam moments and gradient accumulator in host
// memory, in the plainest order, and defines the arithmetic of a step that the engine
// (LayerSlidingEngine, same model, any placement and timing) must reproduce bit for bit.
//
// The step, exactly (the engine implements the same operations in the same order wherever it
// parallelizes; each line is part of the contract):
//  1. s = the number of Step calls before this one (applied or not); M = num_microbatches.
//     Every unit's accumulator (own [+ borrowed] floats) is set to +0.
//  2. model.BeginStep(s, M).
//  3. Forward: for u = 0 .. U-2, for mb = 0 .. M-1: model.Forward(u, mb) with input = unit
//     u-1's output of mb (null for u = 0), params = u's own values [| borrowed unit's values].
//  4. Backward: for u = U-1 .. 0:
//       if some unit b borrows u's parameters: u's accumulator is first set to b's borrowed
//       part (a copy, not an addition; borrowers in ascending b, a second one would be added);
//       for mb = 0 .. M-1: model.Backward(u, mb) with the same input as its forward,
//       grad_output = the gradient unit u+1 wrote for mb (null for u = U-1), grad_input
//       (null for u = 0), grad_accum = u's accumulator (the model adds into it).
//  5. loss = model.StepLoss().
//  6. Norm: sumsq_u = CpuAdam::SumOfSquares(u's accumulator, param_count_u) (own part, from
//     offset 0) for u = 0 .. U-1; total = ((0.0 + sumsq_0) + sumsq_1) + ... in double;
//     norm = sqrt(total); coefficient = ClipCoefficient(norm, max_grad_norm).
//  7. With clipping (max_grad_norm > 0) and a norm that is not finite: no parameter or moment
//     changes, Adam's t stays; applied = false. (Without clipping the engine updates units as
//     their gradients land, before the norm is known, so a non-finite norm is only reported:
//     the caller must stop; here too the update then runs, with coefficient 1.)
//     Else, with t' = t + 1: decay = MakeAdamStepScalars(adam with learning_rate, t',
//     coefficient) and no_decay = the same with weight_decay = 0; for each unit, each maximal
//     run of its own elements inside (decay ranges) or outside them gets one CpuAdam::Update
//     (param, m, v, grad = that run of the accumulator) with decay resp. no_decay. The update
//     is element-wise, so any other chunking of the same runs gives the same bits. t = t'.
//     A borrower's borrowed part is not updated itself: its gradient reached the owner in 4.
#ifndef PIPEOFFLOAD_EXAMPLES_LLAMA_PLAIN_TRAINER_H_
#define PIPEOFFLOAD_EXAMPLES_LLAMA_PLAIN_TRAINER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipeoffload/adam.h"
#include "pipeoffload/layer_sliding.h"

namespace pipeoffload::llama {

struct PlainTrainerOptions {
  int num_microbatches = 1;    // M, >= 1
  AdamOptions adam;            // learning_rate is overridden per Step
  double max_grad_norm = 0.0;  // <= 0: no clipping
  CpuAdamOptions cpu;          // the CpuAdam used for the norm and the update
};

struct PlainStepResult {
  std::int64_t step = 0;   // Adam steps applied so far (t)
  bool applied = false;    // false when the norm was not finite: nothing updated
  double loss = 0.0;       // the model's StepLoss
  double grad_norm = 0.0;  // step 6's norm
  float clip_coefficient = 1.0f;
};

class PlainTrainer {
 public:
  // `model` must outlive the trainer. Parameters start at zero (SetUnitParams them), m = v = 0.
  // Errors: InvalidArgument for num_microbatches < 1, an invalid shape
  // (ValidateSlidingModelShape's message) or a param_dtype other than kFp32; CpuAdam::Create's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PlainTrainer>> Create(
      SlidingModel& model, const PlainTrainerOptions& options);

  PlainTrainer(const PlainTrainer&) = delete;
  PlainTrainer& operator=(const PlainTrainer&) = delete;

  // Sets unit `unit`'s own parameters (param_count floats). Errors: InvalidArgument for a bad
  // unit or size.
  [[nodiscard]] absl::Status SetUnitParams(int unit, std::span<const float> values);

  // Steps 1-5 of the header for data step `data_step` (tests: finite differences of the
  // model's loss): afterwards grads(u) holds unit u's accumulated gradient. Returns the loss.
  // Changes no parameter and no counter. Errors: the model's, annotated with unit and mb.
  [[nodiscard]] absl::StatusOr<double> ComputeGradients(std::int64_t data_step);

  // One step (1-7 of the header). Errors: ComputeGradients' and MakeAdamStepScalars' (then
  // nothing was updated; the data step counter advanced).
  [[nodiscard]] absl::StatusOr<PlainStepResult> Step(float learning_rate);

  int num_units() const { return static_cast<int>(units_.size()); }
  // Own parameters, Adam moments and (after ComputeGradients or Step) the accumulated
  // gradient of `unit`: param_count floats each. REQUIRES: 0 <= unit < num_units().
  std::span<const float> params(int unit) const { return Own(units_[unit].params, unit); }
  std::span<const float> exp_avg(int unit) const { return Own(units_[unit].exp_avg, unit); }
  std::span<const float> exp_avg_sq(int unit) const { return Own(units_[unit].exp_avg_sq, unit); }
  std::span<const float> grads(int unit) const { return Own(units_[unit].grads, unit); }
  std::int64_t adam_step() const { return adam_step_; }    // t
  std::int64_t data_steps() const { return data_steps_; }  // Step calls so far

 private:
  struct Unit {
    std::int64_t own = 0;       // param_count
    std::int64_t borrowed = 0;  // the borrowed unit's param_count, or 0
    // own [| borrowed copy]: the view a call reads; the copy is refreshed at each step.
    std::vector<float> params;
    std::vector<float> exp_avg, exp_avg_sq;  // own
    std::vector<float> grads;                // own [| borrowed]
  };

  PlainTrainer(SlidingModel& model, const PlainTrainerOptions& options,
               std::unique_ptr<CpuAdam> adam);
  std::span<const float> Own(const std::vector<float>& v, int unit) const {
    return {v.data(), static_cast<std::size_t>(units_[unit].own)};
  }
  // Step 7 for one unit.
  [[nodiscard]] absl::Status UpdateUnit(int unit, const AdamStepScalars& decay,
                                        const AdamStepScalars& no_decay);

  SlidingModel& model_;
  PlainTrainerOptions options_;
  std::unique_ptr<CpuAdam> adam_;
  std::vector<Unit> units_;
  // Activations: outputs_[u][mb] (N * H floats as activation_bytes) for u < U-1; the gradients
  // of one unit boundary (M buffers) and of the next.
  std::vector<std::vector<std::vector<float>>> outputs_;
  std::vector<std::vector<float>> grad_out_, grad_in_;
  std::vector<float> workspace_;  // the largest unit's
  std::int64_t adam_step_ = 0;
  std::int64_t data_steps_ = 0;
};

}  // namespace pipeoffload::llama

#endif  // PIPEOFFLOAD_EXAMPLES_LLAMA_PLAIN_TRAINER_H_
